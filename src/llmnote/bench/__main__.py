"""``python -m llmnote.bench SUITE [--out FILE]``: measure on the GPU and write a record."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..paths import benchmarks_dir

SUITES = {
    "ceilings": "copy bandwidth, host<->device bandwidth, cuBLAS matmul rates",
    "fusion": "an elementwise chain, op by op vs fused by torch.compile",
    "matmul": "our Triton matmul vs cuBLAS: square sizes and Llama-3-8B projections",
    "fused_ops": "softmax, rms_norm, rope, silu_mul: ours vs torch eager and torch.compile",
    "decode": "prefill vs decode vs generation with and without the KV cache, on the book's Transformer",
    "attention": "our FlashAttention forward vs SDPA's backends; our paged decode vs SDPA on contiguous KV",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmnote.bench", description="Record GPU benchmarks.")
    parser.add_argument("suite", choices=sorted(SUITES), help="; ".join(f"{k}: {v}" for k, v in SUITES.items()))
    parser.add_argument("--out", type=Path, default=None, help="output file (default assets/benchmarks/<suite>.json)")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("error: benchmarks need an NVIDIA GPU; none is visible to torch", file=sys.stderr)
        return 2
    if args.suite == "ceilings":
        from .ceilings import run_ceilings

        rec = run_ceilings()
    elif args.suite == "fusion":
        from .fusion import run_fusion

        rec = run_fusion()
    elif args.suite == "matmul":
        from .kernels import run_matmul

        rec = run_matmul()
    elif args.suite == "fused_ops":
        from .kernels import run_fused_ops

        rec = run_fused_ops()
    elif args.suite == "decode":
        from .decode import run_decode

        rec = run_decode()
    elif args.suite == "attention":
        from .attention import run_attention

        rec = run_attention()
    out = args.out or benchmarks_dir() / f"{args.suite}.json"
    rec.save(out)
    for row in rec.rows:
        rate = "".join(
            f"  {row[key]:.3f} {unit}" for key, unit in (("tflops", "TFLOP/s"), ("tbps", "TB/s")) if row[key] is not None
        )
        print(f"{row['kernel']:12s} {row['case']:36s} {row['provider']:18s} {row['dtype']:6s} {row['median_ms']:9.4f} ms{rate}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
