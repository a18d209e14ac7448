"""Does the order in which the tensor-core decode kernel reads its words cost bandwidth? A probe
that makes the kernel's own loads of Llama-3-8B's two shapes and nothing else: per group, the
words, scales and zero points of :func:`~llmnote.kernels.gemm.w4a16_codes._swap_ab_group`, with
the kernel's grid (``V`` 32-column blocks a program, ``WARPS`` warps, K split ``SPLIT_K`` ways,
each warp a run of whole groups), the words in two orders:

- ``rows``: as stored, ``(K / 8, N)`` int32. A warp's group is sixteen 128-byte lines (``V`` = 1),
  one from each of sixteen word rows ``4 N`` bytes apart;
- ``tiled``: the copy of :func:`~llmnote.kernels.gemm.w4a16_swap_ab.tile_words`, where a warp's
  group is one contiguous 2 KB run (``V`` = 1) and its groups follow each other, the order in
  which Marlin stores its weights.

Each lane XORs what it reads, so nothing can be skipped. Every word is read once and every scale
and zero point four times (once by each lane of a quad), so the XOR of all lanes is the XOR of
the words, which is checked before timing. ``torch-sum`` (an int32 sum of the words) is a
read-only baseline. Timed like the record (CUDA-graph replays over inputs that rotate through
more memory than the L2 holds)::

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
from llmnote.kernels.gemm.w4a16_codes import _swap_ab_group, _warp_run
from llmnote.kernels.gemm.w4a16_plan import plan_swap_ab
from llmnote.kernels.gemm.w4a16_swap_ab import tile_words
from llmnote.records import Record


@triton.jit
def read_groups_kernel(q_ptr, s_ptr, z_ptr, out_ptr, K, stride_qk, stride_g, GROUP: tl.constexpr, V: tl.constexpr,
                       WARPS: tl.constexpr, SPLIT_K: tl.constexpr, TILED: tl.constexpr, ASM: tl.constexpr):  # fmt: skip
    """The loads of ``w4a16_swap_ab_kernel`` (no ``PREFETCH``) and none of its arithmetic: each
    lane's XOR of what it read goes to ``out[pid_k, pid_n, lane]``."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    lane = tl.arange(0, 32 * WARPS) % 32
    col = pid_n * (32 * V) + 4 * (lane // 4)
    groups = K // GROUP
    g_first, g_last, per_warp = _warp_run(pid_k, K, GROUP, SPLIT_K, WARPS)
    acc = tl.zeros((32 * WARPS,), tl.int32)
    for it in range(per_warp):
        gi = tl.maximum(tl.minimum(g_first + it, g_last - 1), 0)
        words, sz = _swap_ab_group(q_ptr, s_ptr, z_ptr, gi, lane % 4, col, stride_qk, stride_g, groups, GROUP, V, TILED, ASM)
        h = tl.zeros((32 * WARPS,), tl.int32)
        for i in tl.static_range(GROUP // 8 * V):  # the group's words of this lane
            h = h ^ words[i]
        for i in tl.static_range(8 * V):  # its scales and zero points, as 16-bit patterns
            h = h ^ sz[i].to(tl.int16, bitcast=True).to(tl.int32)
        acc = acc ^ tl.where(g_first + it < g_last, h, 0)  # a warp past its run reads its last group again and drops it
    offs = (pid_k * tl.num_programs(0) + pid_n) * (32 * WARPS) + tl.arange(0, 32 * WARPS)
    tl.store(out_ptr + offs, acc)


def read_groups(q: torch.Tensor, s: torch.Tensor, z: torch.Tensor, k: int, v: int, warps: int, split: int,
                group: int = GROUP_SIZE) -> torch.Tensor:  # fmt: skip
    """Launch :func:`read_groups_kernel` over the words ``q`` (as stored, ``(k / 8, n)``, or their
    :func:`tile_words` copy) and the ``(k / group, n)`` scales ``s`` and zero points ``z``; returns
    the lanes' XORs."""
    n = s.shape[1]
    if q.dtype != torch.int32 or q.numel() * 8 != n * k or n % (32 * v) or k % group or group % 32:
        raise ValueError(f"need int32 words of an (N, K) = ({n}, {k}) weight with N a multiple of {32 * v} and K of "
                         f"{group}; got {tuple(q.shape)} {q.dtype}")  # fmt: skip
    grid = (n // (32 * v), split)
    out = torch.empty(split, grid[0], 32 * warps, dtype=torch.int32, device=q.device)
    read_groups_kernel[grid](q, s, z, out, k, q.stride(0) if q.dim() == 2 else 0, s.stride(0), GROUP=group, V=v, WARPS=warps,
                             SPLIT_K=split, TILED=q.dim() == 4, ASM=q.is_cuda, num_warps=warps)  # fmt: skip
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
        nbytes = n * k // 2 + 2 * 2 * n * (k // GROUP_SIZE)  # words, bf16 scales and zero points

        def make(n=n, k=k):
            q = torch.randint(-(2**31), 2**31 - 1, (k // 8, n), dtype=torch.int32, device="cuda")
            s = torch.rand(k // GROUP_SIZE, n, device="cuda").to(torch.bfloat16)
            z = torch.randint(0, 16, (k // GROUP_SIZE, n), device="cuda").to(torch.bfloat16)
            return q, tile_words(q, GROUP_SIZE), s, z

        sets = rotating_inputs(make, nbytes)
        want = xor_all(sets[0][0])
        torch_sum = cuda_time_ms(lambda q, tq, s, z: q.sum(), sets, 5, 20, graph_calls=10)
        rec.add("w4a16_words_read", case, "int32", "torch-sum", torch_sum, nbytes=n * k // 2)
        for v, warps, split in tiles(n, k, sms):
            for tiled in (False, True):
                fn = lambda q, tq, s, z: read_groups(tq if tiled else q, s, z, k, v, warps, split)  # noqa: B023, E731
                name = f"{'tiled' if tiled else 'rows'}-v{v}w{warps}s{split}"
                if xor_all(fn(*sets[0])) != want:
                    raise AssertionError(f"{case} {name}: not every word read once")
                rec.add("w4a16_words_read", case, "int32", name, cuda_time_ms(fn, sets, 5, 20, graph_calls=10), nbytes=nbytes)
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
