"""Sweep launch configurations of the FlashAttention kernels on the GPU (no autotuner):
every candidate is compiled on its own (a failure is reported, not fatal), checked against
cuDNN's attention and timed. Writes a benchmark record (kernel ``flash_attention-tma`` or
``flash_attention-pointers``, provider = the configuration); the winners go into
``llmnote.kernels.attention``'s config lists.

    python scripts/tune_attention.py assets/benchmarks/attention_tuning.json
"""

from __future__ import annotations

import itertools
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

import llmnote  # noqa: F401  (device setup)
from llmnote.bench.attention import attention_pairs
from llmnote.bench.record import Record
from llmnote.bench.timing import cuda_time_ms
from llmnote.kernels import attention as A


def run(kind: str):
    """A function that runs the ``kind`` kernel ("tma" or "pointers") with one configuration."""

    def launch(q, k, v, causal, bm, bn, warps, stages, ws):
        out = torch.empty_like(q)
        meta = {"BLOCK_M": bm, "BLOCK_N": bn} | ({"WARP_SPECIALIZE": ws} if kind == "tma" else {})
        config = triton.Config(meta, num_warps=warps, num_stages=stages)
        A._flash_launch(q, k, v, out, causal, q.shape[-1] ** -0.5, kind, config)
        return out

    return launch


def candidates(d: int) -> list[tuple[int, int, int, int, bool]]:
    """(BLOCK_M, BLOCK_N, warps, stages, warp_specialize) to try for head dim ``d``. Warp
    specialisation is left off: on Hopper, Triton 3.6 rejects it with 4 warps and emits the
    same code with 8 (the first sweep showed it). 256-row tiles give each of 2 or 4 warpgroups
    its own rows, the shape FlashAttention-3 uses to overlap one group's softmax with the
    other's matrix products."""
    if d <= 128:
        small = itertools.product([128], [64, 128], [4, 8], [2, 3, 4], [False])
        large = itertools.product([256], [64, 128], [8, 16], [2, 3], [False])
        return [*small, *large]
    return list(itertools.product([64, 128], [32, 64], [4, 8], [2, 3], [False]))


def main(path: str) -> None:
    rec = Record(command=f"python scripts/tune_attention.py {path}")
    cases = [(4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (4, 32, 4096, 64, False), (4, 32, 4096, 64, True)]
    cases += [(2, 16, 2048, 256, True)]
    for b, h, s, d, causal in cases:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION if d <= 128 else SDPBackend.FLASH_ATTENTION):
            expected = F.scaled_dot_product_attention(q, k, v, is_causal=causal).float()
        flops = 4 * b * h * attention_pairs(s, s, causal) * d
        grid = candidates(d)
        for kind, fn in (("tma", run("tma")), ("pointers", run("pointers"))):
            for cfg in grid if kind == "tma" else [(128, 64, 8, 4, False), (128, 64, 8, 3, False), (128, 128, 8, 3, False)]:
                name = "BLOCK_M={},BLOCK_N={},warps={},stages={},warp_specialize={}".format(*cfg)
                try:
                    out = fn(q, k, v, causal, *cfg)
                    err = ((out.float() - expected).norm() / expected.norm()).item()
                    if not err < 2e-2:
                        raise AssertionError(f"relative error {err:.1e}")
                    ms = cuda_time_ms(fn, [(q, k, v, causal, *cfg)], warmup=3, rep=20)
                except Exception as exc:  # a configuration that does not compile, run or agree
                    print(f"{kind} {name}: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                    continue
                case = f"B={b},H={h},S={s},D={d},causal={causal}"
                row = rec.add(f"flash_attention-{kind}", case, "bf16", name, ms, flops)
                print(f"{kind} {case} {name}: {row['tflops']:.1f} TFLOP/s", flush=True)
    rec.save(path)


if __name__ == "__main__":
    main(sys.argv[1])
