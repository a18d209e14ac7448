"""Two ways of timing the same attention call: the package's ``flash_attention`` and cuDNN's
SDPA at B=4, H=32, S=4096, D=128, timed call by call (CUDA events around each call, calls
queued without waiting) and as CUDA-graph replays, the four taking turns over ``ROUNDS``
rounds; plus the host time to queue one call of each. (Why the benchmark takes the faster of
the two: the engineering notes, ``chapters/appendix/engineering_notes_triton_attention.ipynb``.)
Writes a benchmark record (kernels ``flash_attention-timing`` and ``flash_attention-host``):

    python scripts/attention_timing.py assets/benchmarks/attention_timing.json
"""

from __future__ import annotations

import statistics
import sys
import time
from functools import partial

import torch

import llmnote  # noqa: F401  (device setup)
from llmnote import kernels
from llmnote.bench.attention import SDPA_BACKENDS, attention_pairs, sdpa_with
from llmnote.bench.timing import cuda_time_ms
from llmnote.records import Record

ROUNDS = 5


def host_ms(fn, args: tuple, calls: int = 50) -> float:
    """Host milliseconds to queue one call (the GPU runs behind; synchronised only at the end)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / calls * 1e3


def main(path: str) -> None:
    rec = Record(command=f"python scripts/attention_timing.py {path}")
    for causal in (True, False):
        case = f"B=4,H=32,S=4096,D=128,causal={causal}"
        g = torch.Generator(device="cuda").manual_seed(0)
        args = tuple(torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        fns = {
            "llmnote": partial(kernels.flash_attention, causal=causal),
            "sdpa-cudnn": sdpa_with(SDPA_BACKENDS["sdpa-cudnn"], causal),
        }
        for fn in fns.values():
            fn(*args)  # compile and autotune outside the timings
        times = {(name, mode): [] for name in fns for mode in ("call by call", "graph")}
        for _ in range(ROUNDS):
            for (name, mode), ms in times.items():
                ms.append(cuda_time_ms(fns[name], [args], warmup=3, rep=30, graph_calls=2 if mode == "graph" else 0))
        flops = 4 * 4 * 32 * attention_pairs(4096, 4096, causal) * 128
        for (name, mode), ms in times.items():
            rec.add("flash_attention-timing", case, "bf16", f"{name}, {mode}", statistics.median(ms), flops)
        for name, fn in fns.items():
            rec.add("flash_attention-host", case, "bf16", f"{name}, host time to queue a call", host_ms(fn, args), None)
    rec.save(path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "attention_timing.json")
