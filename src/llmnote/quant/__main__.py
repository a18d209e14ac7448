"""``python -m llmnote.quant eval MODEL_DIR --method METHOD``: quantize a checkpoint and print
its perplexity on the corpus's held-out split (one JSON line with ``--json``)."""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from .eval import METHODS

    parser = argparse.ArgumentParser(prog="python -m llmnote.quant", description="Quantize a model and measure it.")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="quantize MODEL_DIR and print its held-out perplexity")
    ev.add_argument("model", help="a checkpoint directory (config.json, *.safetensors, tokenizer.json)")
    ev.add_argument("--method", choices=METHODS, default="none")
    ev.add_argument("--bits", type=int, default=4, help="weight bits for rtn, awq and gptq (2 to 8)")
    ev.add_argument("--group-size", type=int, default=128, help="input features per scale for rtn, awq and gptq")
    ev.add_argument("--max-eval-tokens", type=int, default=32768, help="held-out tokens to evaluate (0: all)")
    ev.add_argument("--calib-tokens", type=int, default=16384, help="training tokens for calibration")
    ev.add_argument("--device", default=None, help="cpu (default) or cuda")
    ev.add_argument("--json", action="store_true", help="print one JSON line")
    args = parser.parse_args(argv)

    from .eval import run_eval

    try:
        result = run_eval(
            args.model, args.method, args.bits, args.group_size, args.max_eval_tokens or None,
            calib_tokens=args.calib_tokens, device=args.device, progress=not args.json,
        )
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    else:
        shape = f"W{result['bits']}" + (f" g{result['group_size']}" if result["group_size"] else "")
        print(f"{args.model}: {args.method} ({shape}) held-out perplexity {result['perplexity']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
