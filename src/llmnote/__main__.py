"""``python -m llmnote generate MODEL_DIR --prompt TEXT``: stream text from a checkpoint."""

from __future__ import annotations

import argparse
import sys
import time


def _generate(args: argparse.Namespace) -> int:
    import torch

    from .layers import SamplingParams
    from .models import generate, load_model, load_tokenizer, resolve_checkpoint

    path = resolve_checkpoint(args.model)
    tokenizer = load_tokenizer(path)
    model = load_model(path, device=args.device)
    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    prompt_ids = tokenizer.encode(args.prompt).ids
    if not prompt_ids:
        print("error: the prompt encodes to no tokens", file=sys.stderr)
        return 2
    eos = tokenizer.token_to_id(args.eos) if args.eos else None
    shown = tokenizer.decode(prompt_ids)
    print(shown, end="", flush=True)
    new: list[int] = []
    start = time.perf_counter()
    for token in generate(model, torch.tensor([prompt_ids]), params, eos_token_id=eos):
        new.append(int(token[0]))
        text = tokenizer.decode(new)
        print(text[len(shown) :], end="", flush=True)  # stream only what is new
        shown = text
    elapsed = time.perf_counter() - start
    print()
    print(
        f"[{len(new)} tokens in {elapsed:.2f} s: {len(new) / max(elapsed, 1e-9):.1f} tokens/s, prefill included]", file=sys.stderr
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmnote")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text from a Llama/Qwen checkpoint directory (or hub id)")
    gen.add_argument("model", help="checkpoint directory with config.json, *.safetensors and tokenizer.json")
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.8, help="0 for greedy decoding")
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--eos", default=None, help="end-of-sequence token string")
    gen.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    try:
        return _generate(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
