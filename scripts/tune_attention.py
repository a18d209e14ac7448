"""Sweep launch configurations of the FlashAttention kernels on the GPU (no autotuner):
every candidate is compiled on its own (a failure is reported, not fatal), checked against
cuDNN's attention and timed. Writes a benchmark record (kernel ``flash_attention-tma`` or
``flash_attention-pointers``, provider = the configuration; kernel ``flash_attention``
with providers ``sdpa-cudnn`` and ``sdpa-flash`` for reference, timed in the same run);
the winners go into the config lists of ``llmnote.kernels.attention.flash``.

    python scripts/tune_attention.py assets/benchmarks/attention_tuning.json
"""

from __future__ import annotations

import sys

import torch
import triton
from tqdm.auto import tqdm

import llmnote  # noqa: F401  (device setup)
from llmnote.bench.attention import SDPA_BACKENDS, attention_pairs, sdpa_with
from llmnote.bench.timing import cuda_time_ms
from llmnote.kernels import attention as A
from llmnote.records import Record

REFERENCES = {name: SDPA_BACKENDS[name] for name in ("sdpa-cudnn", "sdpa-flash")}


def run(kind: str):
    """A function that runs the ``kind`` kernel ("tma" or "pointers") with one configuration."""

    def launch(q, k, v, causal, bm, bn, warps, stages, rotate, maxnreg):
        out = torch.empty_like(q)
        meta = {"BLOCK_M": bm, "BLOCK_N": bn} | (
            {"WARP_SPECIALIZE": False, "ROTATE": rotate, "PREFETCH": False} if kind == "tma" else {}
        )
        config = triton.Config(meta, num_warps=warps, num_stages=stages, maxnreg=maxnreg)
        A.flash_launch(q, k, v, out, causal, q.shape[-1] ** -0.5, kind, config)
        return out

    return launch


def candidates(d: int) -> list[tuple[int, int, int, int, bool, int | None]]:
    """(BLOCK_M, BLOCK_N, warps, stages, rotate, maxnreg) to try with the TMA kernel at head dim ``d``,
    with and without the rotated (software-pipelined) loop. Chosen from an offline sm_90
    compile of the whole grid (``llmnote.compile_stages``): each fits in the 227 KiB of shared
    memory a program may use and spills no registers, and 4-warp 128 x 128 tiles are left
    out (their loops are about twice as long: register shuffling at the 255 limit). Warp
    specialisation stays off: on Hopper, Triton 3.6 rejects it with 4 warps and emits the
    same code with 8."""
    if d <= 64:
        rotated = [
            (128, 64, 4, 2),
            (128, 64, 4, 3),
            (128, 64, 8, 2),
            (128, 64, 8, 3),
            (128, 64, 8, 4),
            (128, 128, 8, 2),
            (128, 128, 8, 3),
            (64, 64, 4, 2),
            (64, 64, 4, 3),
            (64, 128, 8, 2),
            (256, 64, 8, 2),
            (256, 64, 8, 3),
        ]
        plain = [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3)]
    elif d <= 128:
        rotated = [
            (128, 128, 8, 2),
            (128, 64, 8, 2),
            (128, 64, 8, 3),
            (128, 64, 8, 4),
            (128, 64, 4, 2),
            (128, 64, 4, 3),
            (64, 64, 4, 2),
            (64, 64, 4, 3),
            (64, 64, 8, 2),
            (64, 64, 8, 3),
            (64, 128, 4, 2),
            (64, 128, 8, 2),
            (256, 64, 8, 2),
        ]
        plain = [
            (128, 128, 8, 3),
            (128, 128, 8, 2),
            (128, 64, 4, 2),
            (128, 64, 8, 3),
            (256, 64, 8, 2),
            (64, 64, 4, 3),
            (64, 64, 4, 2),
        ]
    else:
        rotated = [
            (64, 32, 4, 2),
            (64, 32, 4, 3),
            (64, 32, 8, 2),
            (64, 32, 8, 3),
            (64, 64, 4, 2),
            (64, 64, 8, 2),
            (128, 32, 8, 2),
            (128, 32, 8, 3),
            (128, 64, 8, 2),
        ]
        plain = [(64, 64, 4, 3), (64, 64, 8, 2), (64, 32, 4, 3), (128, 64, 8, 2), (128, 32, 8, 3)]
    # With at most 128 registers per thread (no spills at these shapes), two 8-warp programs
    # share an SM; their warpgroups are not kept in step, so one's softmax can overlap the
    # other's matrix products.
    capped = [(128, 64, 8, 2)] if d <= 128 else []
    return [(*c, True, None) for c in rotated] + [(*c, False, None) for c in plain] + [(*c, False, 128) for c in capped]


POINTER_CONFIGS = [(128, 64, 8, 4, False, None), (128, 64, 8, 3, False, None), (128, 128, 8, 3, False, None)]


def main(path: str) -> None:
    rec = Record(command=f"python scripts/tune_attention.py {path}")
    cases = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (4, 32, 4096, 64, False), (4, 32, 4096, 64, True)]
    cases += [(2, 16, 2048, 256, True)]
    for b, h, s, d, causal in tqdm(cases, desc="cases"):
        case = f"B={b},H={h},S={s},D={d},causal={causal}"
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        expected = sdpa_with(REFERENCES["sdpa-cudnn" if d <= 128 else "sdpa-flash"], causal)(q, k, v).float()
        flops = 4 * b * h * attention_pairs(s, s, causal) * d
        for name, backend in REFERENCES.items():
            try:
                ms = cuda_time_ms(sdpa_with(backend, causal), [(q, k, v)], warmup=3, rep=20)
            except RuntimeError as exc:  # a backend that does not take this shape
                print(f"{name} {case}: {str(exc)[:120]}", flush=True)
                continue
            rec.add("flash_attention", case, "bf16", name, ms, flops)
        for kind, grid in (("tma", candidates(d)), ("pointers", POINTER_CONFIGS)):
            fn = run(kind)
            for cfg in grid:
                name = "BLOCK_M={},BLOCK_N={},warps={},stages={},rotate={},maxnreg={}".format(*cfg)
                try:
                    out = fn(q, k, v, causal, *cfg)
                    err = ((out.float() - expected).norm() / expected.norm()).item()
                    if not err < 2e-2:
                        raise AssertionError(f"relative error {err:.1e}")
                    ms = cuda_time_ms(fn, [(q, k, v, causal, *cfg)], warmup=3, rep=20)
                except Exception as exc:  # a configuration that does not compile, run or agree
                    print(f"{kind} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                row = rec.add(f"flash_attention-{kind}", case, "bf16", name, ms, flops)
                print(f"{kind} {case} {name}: {row['tflops']:.1f} TFLOP/s", flush=True)
        rec.save(path)  # after every case, so that an interrupted sweep keeps what it measured


if __name__ == "__main__":
    main(sys.argv[1])
