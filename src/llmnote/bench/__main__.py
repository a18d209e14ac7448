"""``python -m llmnote.bench SUITE [--out FILE]``: measure on the GPU and write a record."""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

from ..paths import benchmarks_dir
from ..records import META_KEYS, Record, _gpu_name, load_record


@dataclass(frozen=True)
class Suite:
    """A benchmark suite: ``llmnote.bench.<module>.<runner>()`` returns its record."""

    module: str
    runner: str
    description: str

    def run(self, **options) -> Record:
        # Imported on demand: a suite pulls in what it measures (the models, the kernels).
        return getattr(importlib.import_module(f"{__package__}.{self.module}"), self.runner)(**options)


SUITES = {
    "ceilings": Suite("ceilings", "run_ceilings", "copy bandwidth, host<->device bandwidth, cuBLAS matmul rates"),
    "fusion": Suite("fusion", "run_fusion", "an elementwise chain, op by op vs fused by torch.compile"),
    "matmul": Suite("matmul", "run_matmul", "our Triton matmul vs cuBLAS: square sizes and Llama-3-8B projections"),
    "fused_ops": Suite("fused_ops", "run_fused_ops", "softmax, rms_norm, rope, silu_mul: ours vs torch eager and torch.compile"),
    "decode": Suite(
        "decode", "run_decode", "prefill vs decode vs generation with and without the KV cache, on the book's Transformer"
    ),
    "attention": Suite(
        "attention", "run_attention", "our FlashAttention forward vs SDPA's backends; our paged decode vs SDPA on contiguous KV"
    ),
    "quant": Suite(
        "quant", "run_quant", "W4A16, FP8 and INT8 linears vs cuBLAS bf16, torch int4, torch._scaled_mm, torch._int_mm"
    ),
    "serving": Suite(
        "serving", "run_serving", "the engine: offline throughput vs transformers, batch-1 decode, speculation, HTTP under load"
    ),
    "parallel": Suite(
        "parallel", "run_parallel", "2, 4, 8 GPUs: NCCL collectives' bus bandwidth, tensor-parallel decode, the engine at TP 2"
    ),
}
PARTED = ("quant", "serving", "parallel")  # the suites recorded in parts (--parts)


def merged(old: dict, new: Record, by_case: bool = False) -> Record:
    """``new`` plus the rows of the record ``old`` whose kernels ``new`` did not measure (with
    ``by_case``, whose ``(kernel, case)`` pairs: runs that measure other cases of one kernel, such
    as other GPU counts on another machine); the command says both runs. Extra ``meta`` keys are
    kept from both: ``new``'s win, dictionaries merge key by key, lists join, ``gpus`` is the larger. An
    earlier command that ``new``'s repeats (whatever its ``--out``) leaves the command: its rows are replaced."""
    if old["meta"]["gpu"] != _gpu_name():  # one record, one device: its meta names the GPU of every row
        raise ValueError(f"cannot merge into a record made on {old['meta']['gpu']}: this run is on {_gpu_name()}")
    key = (lambda row: (row["kernel"], row["case"])) if by_case else (lambda row: row["kernel"])
    fresh = {key(row) for row in new.rows}
    kept = [row for row in old["rows"] if key(row) not in fresh]
    extra = {k: v for k, v in old["meta"].items() if k not in (*META_KEYS, "device")}
    for key, value in new.extra_meta.items():
        before = extra.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            value = {**before, **value}
        elif isinstance(value, list) and isinstance(before, list):
            value = sorted(set(before) | set(value))
        elif key == "gpus" and isinstance(before, int):
            value = max(before, value)
        extra[key] = value
    def bare(command: str) -> list[str]:  # the command without its output file
        words = command.split()
        return [w for i, w in enumerate(words) if w != "--out" and (not i or words[i - 1] != "--out")]

    runs = [run for run in old["meta"]["command"].split(" && ") if bare(run) != bare(new.command)]
    return Record(command=" && ".join([*runs, new.command]), rows=kept + new.rows, extra_meta=extra)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["load"]:  # the load generator: a client of any server, no GPU needed here
        from .load import main as load_main

        return load_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m llmnote.bench", description="Record GPU benchmarks; "
                                     "`python -m llmnote.bench load --url URL` drives a server.")  # fmt: skip
    parser.add_argument(
        "suite", choices=sorted(SUITES), help="; ".join(f"{name}: {suite.description}" for name, suite in SUITES.items())
    )
    parser.add_argument("--out", type=Path, default=None, help="output file (default assets/benchmarks/<suite>.json)")
    parser.add_argument("--models", nargs="+", default=None, help="decode only: the models to measure (default: all)")
    parser.add_argument("--parts", nargs="+", default=None, help="quant, serving and parallel: which parts to run (default: all)")
    parser.add_argument("--gpus", nargs="+", type=int, default=None, help="parallel only: the group sizes to measure "
                        "(default: 2, 4 and 8, those the machine holds)")  # fmt: skip
    parser.add_argument("--smoke", nargs="?", const="cpu", choices=("cpu", "cuda"), default=None,
                        help="parallel only: every part at toy sizes, to check the harness: on CPU processes (gloo) "
                        "or with `--smoke cuda` on GPUs (NCCL); writes only to an explicit --out")  # fmt: skip
    parser.add_argument("--merge", action="store_true", help="keep the rows of the record at --out whose kernels this "
                        "run does not measure (a suite recorded in parts, each short enough for one session; for "
                        "parallel, whose kernel and case: other GPU counts)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.models and args.suite != "decode":
        parser.error("--models applies to the decode suite only")
    if args.parts and args.suite not in PARTED:
        parser.error(f"--parts applies to the {', '.join(PARTED)} suites only")
    if (args.gpus or args.smoke) and args.suite != "parallel":
        parser.error("--gpus and --smoke apply to the parallel suite only")

    import torch

    if args.suite == "parallel" and args.smoke != "cpu" and torch.cuda.device_count() < 2:
        print(f"error: the parallel suite needs at least 2 GPUs: it measures groups of 2, 4 and 8 GPUs (as many as are "
              f"present) and the engine on 2; torch sees {torch.cuda.device_count()}. `--smoke` checks the harness "
              "on CPU processes", file=sys.stderr)  # fmt: skip
        return 2
    if args.smoke != "cpu" and not torch.cuda.is_available():
        print("error: benchmarks need an NVIDIA GPU; none is visible to torch", file=sys.stderr)
        return 2
    out = args.out or benchmarks_dir() / f"{args.suite}.json"
    if args.merge and out.exists() and load_record(out.stem, out.parent)["meta"]["gpu"] != _gpu_name():
        print(f"error: --merge: {out} was recorded on {load_record(out.stem, out.parent)['meta']['gpu']}, and this "
              f"machine's GPU is {_gpu_name()}; a record holds one device's measurements", file=sys.stderr)  # fmt: skip
        return 2
    options = {"models": args.models} if args.models else {}
    if args.suite == "quant":
        options = {"parts": tuple(args.parts or ()) or None}
    if args.suite == "serving":  # the HTTP runs' reports and plots go beside the record
        options = {"parts": tuple(args.parts or ()) or None, "out_dir": out.parent / "serving_load"}
    if args.suite == "parallel":
        options = {"parts": tuple(args.parts or ()) or None, "gpus": args.gpus, "smoke": bool(args.smoke),
                   "device": args.smoke}  # fmt: skip
    options = {k: v for k, v in options.items() if v is not None}
    rec = SUITES[args.suite].run(**options)
    if args.smoke and args.out is None:
        print("smoke run: nothing written (a smoke run is no measurement; give --out to keep its record)")
        out = None
    else:
        if args.merge and out.exists():
            rec = merged(load_record(out.stem, out.parent), rec, by_case=args.suite == "parallel")
        rec.save(out)
    for row in rec.rows:
        rate = "".join(
            f"  {row[key]:.3f} {unit}" for key, unit in (("tflops", "TFLOP/s"), ("tbps", "TB/s")) if row[key] is not None
        )
        print(f"{row['kernel']:12s} {row['case']:36s} {row['provider']:18s} {row['dtype']:6s} {row['median_ms']:9.4f} ms{rate}")
    if out is not None:
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
