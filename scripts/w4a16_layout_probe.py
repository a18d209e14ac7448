"""Does the order in which the tensor-core decode kernel reads its words cost bandwidth? A probe
that reads the 4-bit words of Llama-3-8B's two shapes and nothing else, in two orders, with the
kernel's own 16-byte loads and its grid (``V`` 32-column blocks a program, ``WARPS`` warps, K
split ``SPLIT_K`` ways, each warp a run of whole groups):

- ``rows``: the stored layout, ``(K / 8, N)`` int32. A warp's group is sixteen 128-byte lines
  (``V`` = 1), one from each of sixteen word rows ``4 N`` bytes apart, exactly the addresses of
  ``w4a16_swap_ab_kernel``;
- ``tiled``: the same bytes shuffled offline so that a warp's group is one contiguous 2 KB run
  (``V`` = 1) and its groups follow each other, the order in which Marlin stores its weights.

Each lane XORs what it reads, so nothing can be skipped, and the XOR of all lanes is checked
against the XOR of the whole tensor before timing. ``torch-sum`` (an int32 sum of the same
tensor) is a read-only baseline. Timed like the record (CUDA-graph replays over inputs that
rotate through more memory than the L2 holds)::

    python scripts/w4a16_layout_probe.py assets/benchmarks/profiles/w4a16_layout_probe_h200.json
"""

# ruff: noqa: I001 (llmnote is imported before triton: it picks the interpreter where there is no GPU)
from __future__ import annotations

import argparse
import functools
import sys

import numpy as np
import torch

import llmnote  # noqa: F401
import triton
import triton.language as tl
from llmnote.bench.quant import GROUP_SIZE, SHAPES
from llmnote.bench.timing import cuda_time_ms, rotating_inputs
from llmnote.kernels.gemm.w4a16_codes import _swap_ab_load
from llmnote.kernels.gemm.w4a16_plan import plan_swap_ab
from llmnote.records import Record


@triton.jit
def read_words_kernel(q_ptr, out_ptr, K, stride_qk, GROUP: tl.constexpr, V: tl.constexpr, WARPS: tl.constexpr,
                      SPLIT_K: tl.constexpr, TILED: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """Every word of ``q`` once, in the order of the decode kernel's grid; each lane's XOR of what
    it read goes to ``out[pid_k, pid_n, lane]``."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    lane = tl.arange(0, 32 * WARPS) % 32
    warp = tl.arange(0, 32 * WARPS) // 32
    groups = K // GROUP
    per_prog = tl.cdiv(groups, SPLIT_K)
    per_warp = tl.cdiv(per_prog, WARPS)
    g_first = pid_k * per_prog + warp * per_warp
    g_last = tl.minimum(g_first + per_warp, tl.minimum((pid_k + 1) * per_prog, groups))
    acc = tl.zeros((32 * WARPS,), tl.int32)
    for it in range(per_warp):
        gi = tl.maximum(tl.minimum(g_first + it, g_last - 1), 0)
        keep = g_first + it < g_last  # a warp past its run reads its last group again and drops it
        for st in tl.static_range(GROUP // 32):
            for v in tl.static_range(V):
                if TILED:  # block b's group gi: GROUP // 32 runs of 128 words, one 16-byte piece a lane
                    b = pid_n * V + v
                    ptr = q_ptr + ((b * groups + gi).to(tl.int64) * (GROUP // 32) + st) * 128 + 4 * lane
                else:  # lane (g, t): columns 4g .. 4g + 3 of word row 4 st + t of the group
                    row = gi * (GROUP // 8) + 4 * st + lane % 4
                    ptr = q_ptr + row.to(tl.int64) * stride_qk + pid_n * (32 * V) + 32 * v + 4 * (lane // 4)
                w = _swap_ab_load(ptr, False, ASM)
                acc = acc ^ tl.where(keep, w[0] ^ w[1] ^ w[2] ^ w[3], 0)
    offs = (pid_k * tl.num_programs(0) + pid_n) * (32 * WARPS) + tl.arange(0, 32 * WARPS)
    tl.store(out_ptr + offs, acc)


def read_words(q: torch.Tensor, k: int, v: int, warps: int, split: int, tiled: bool, group: int = GROUP_SIZE) -> torch.Tensor:
    """Launch :func:`read_words_kernel` over ``q`` (``(k / 8, n)`` int32 words, read as stored or as
    the tiled shuffle of the same size); returns the lanes' XORs."""
    n = q.shape[1]
    if q.dtype != torch.int32 or q.shape[0] * 8 != k or n % (32 * v) or k % group or group % 32:
        raise ValueError(f"need (K/8, N) int32 words with N a multiple of {32 * v} and K of {group}; got {tuple(q.shape)}")
    grid = (n // (32 * v), split)
    out = torch.empty(split, grid[0], 32 * warps, dtype=torch.int32, device=q.device)
    read_words_kernel[grid](q, out, k, q.stride(0), GROUP=group, V=v, WARPS=warps, SPLIT_K=split, TILED=tiled,
                            ASM=q.is_cuda, num_warps=warps)  # fmt: skip
    return out


def xor_all(t: torch.Tensor) -> int:
    return int(np.bitwise_xor.reduce(t.cpu().numpy().ravel()))


@functools.lru_cache
def tiles(n: int, k: int, sms: int) -> list[tuple[int, int, int]]:
    """The (V, WARPS, SPLIT_K) of the one-row plan, prefetching or not (the probe does not load ahead)."""
    return sorted({(c.kwargs["V"], c.kwargs["WARPS"], c.kwargs["SPLIT_K"]) for c in plan_swap_ab(n, k, GROUP_SIZE, sms, rows=1)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="where to write the record (JSON)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: this probe needs an NVIDIA GPU; none is visible to torch", file=sys.stderr)
        return 2
    rec = Record(command="python scripts/w4a16_layout_probe.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n, k in SHAPES:
        case = f"N={n},K={k}"
        words = lambda n=n, k=k: (torch.randint(-(2**31), 2**31 - 1, (k // 8, n), dtype=torch.int32, device="cuda"),)  # noqa: E731
        sets = rotating_inputs(words, n * k // 2)
        want = xor_all(sets[0][0])
        rec.add("w4a16_words_read", case, "int32", "torch-sum", cuda_time_ms(lambda q: q.sum(), sets, 5, 20, graph_calls=10),
                nbytes=n * k // 2)  # fmt: skip
        for v, warps, split in tiles(n, k, sms):
            for tiled in (False, True):
                fn = lambda q: read_words(q, k, v, warps, split, tiled)  # noqa: B023, E731
                name = f"{'tiled' if tiled else 'rows'}-v{v}w{warps}s{split}"
                if xor_all(fn(*sets[0])) != want:
                    raise AssertionError(f"{case} {name}: not every word read once")
                rec.add("w4a16_words_read", case, "int32", name, cuda_time_ms(fn, sets, 5, 20, graph_calls=10), nbytes=n * k // 2)
        del sets
        torch.cuda.empty_cache()
        rec.save(args.out)  # after each shape: a run cut short keeps what it timed
    us = {(r["case"], r["provider"]): r["median_ms"] * 1e3 for r in rec.rows}
    for (case, provider), t in us.items():  # each tile as stored, beside its tiled twin
        if provider.startswith("rows-"):
            tiled = us[case, provider.replace("rows-", "tiled-")]
            print(f"{case} {provider[5:]}: stored {t:.1f} µs, tiled {tiled:.1f} µs ({t / tiled:.2f}x); "
                  f"torch-sum {us[case, 'torch-sum']:.1f} µs")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
