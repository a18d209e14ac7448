"""``python -m llmnote generate MODEL_DIR --prompt TEXT``: stream text from a checkpoint
(``torchrun --nproc-per-node N -m llmnote generate ... --tensor-parallel N``: split over N processes).
``python -m llmnote serve MODEL``: an OpenAI-compatible server on the engine (``--tensor-parallel N``:
the server starts N - 1 worker processes itself)."""

from __future__ import annotations

import argparse
import sys
import time


def _generate(args: argparse.Namespace) -> int:
    from .models import load_tokenizer, resolve_checkpoint
    from .parallel import finish, init_tensor_parallel

    path = resolve_checkpoint(args.model)
    tokenizer = load_tokenizer(path)
    tp, device = init_tensor_parallel(args.tensor_parallel, args.device)
    try:
        return _generate_on(args, path, tokenizer, tp, device)
    finally:
        finish(tp)


def _generate_on(args: argparse.Namespace, path, tokenizer, tp, device) -> int:
    """Generate with the model on ``device``, split over the tensor-parallel group ``tp``;
    only rank 0 prints."""
    import torch

    from .layers import SamplingParams
    from .models import generate, load_model
    from .parallel import is_first, shared_seed

    speak = is_first(tp)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    model = load_model(path, device=device, dtype=dtype, tp=tp)
    params = SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        max_new_tokens=args.max_new_tokens,
        seed=shared_seed(args.seed, tp) if args.temperature > 0 else args.seed,
    )
    prompt_ids = tokenizer.encode(args.prompt).ids
    if not prompt_ids:
        print("error: the prompt encodes to no tokens", file=sys.stderr)
        return 2
    eos = tokenizer.token_to_id(args.eos) if args.eos else None
    shown = tokenizer.decode(prompt_ids)
    if speak:
        print(shown, end="", flush=True)
    new: list[int] = []
    start = time.perf_counter()
    for token in generate(model, torch.tensor([prompt_ids]), params, eos_token_id=eos):
        new.append(int(token[0]))
        text = tokenizer.decode(new)
        if speak:
            print(text[len(shown) :], end="", flush=True)  # stream only what is new
        shown = text
    elapsed = time.perf_counter() - start
    if speak:
        print()
        split = f", split over {tp.size} processes" if tp.size > 1 else ""
        print(f"[{len(new)} tokens in {elapsed:.2f} s: {len(new) / max(elapsed, 1e-9):.1f} tokens/s, prefill included{split}]",
              file=sys.stderr)  # fmt: skip
    return 0


def _serve(args: argparse.Namespace) -> int:
    import os

    import torch

    from .engine.llm import LLMEngine
    from .engine.server import serve

    if args.tensor_parallel > 1 and "RANK" in os.environ:
        raise ValueError(f"serve starts its tensor-parallel workers itself: run it as one process (python -m llmnote serve "
                         f"MODEL --tensor-parallel {args.tensor_parallel}), not under torchrun")  # fmt: skip
    dtype = getattr(torch, args.dtype) if args.dtype else None
    engine = LLMEngine(args.model, device=args.device, dtype=dtype, block_size=args.block_size, num_kv_blocks=args.num_kv_blocks,
                       max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       max_model_len=args.max_model_len, enable_prefix_caching=args.enable_prefix_caching,
                       enable_chunked_prefill=args.enable_chunked_prefill, enforce_eager=args.enforce_eager,
                       tensor_parallel_size=args.tensor_parallel)  # fmt: skip
    try:
        serve(engine, args.host, args.port, args.api_key, args.served_model_name, args.log_level)
    finally:
        engine.close()  # the worker processes, if any, exit
    return 0


def _serve_parser(sub) -> None:
    srv = sub.add_parser("serve", help="serve a checkpoint over OpenAI-compatible HTTP")
    srv.add_argument("model", help="checkpoint directory (or hub id)")
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default: this machine only)")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1/ routes")
    srv.add_argument("--served-model-name", default=None, help="the model name clients use (default: MODEL)")
    srv.add_argument("--device", default=None)
    srv.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None, help="default: the checkpoint's")
    srv.add_argument("--block-size", type=int, default=16)
    srv.add_argument("--num-kv-blocks", type=int, default=None, help="default: what memory allows")
    srv.add_argument("--max-num-seqs", type=int, default=256)
    srv.add_argument("--max-num-batched-tokens", type=int, default=None)
    srv.add_argument("--max-model-len", type=int, default=None)
    srv.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    srv.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True)
    srv.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    srv.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                     help="split the model over N processes (started by the server; on GPUs, one GPU each)")  # fmt: skip
    srv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


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
    gen.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default=None, help="default: the checkpoint's")
    gen.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                     help="split the model over N processes started by torchrun --nproc-per-node N")  # fmt: skip
    _serve_parser(sub)
    args = parser.parse_args(argv)
    try:
        return _serve(args) if args.command == "serve" else _generate(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
