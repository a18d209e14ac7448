"""Which W4A16 kernel runs for how many rows, and the tiles its autotuner may try.

Up to ``SMALL_M`` rows the decode kernel (``w4a16_gemv_kernel``), then the fused GEMM, and from
``DEQUANT_M`` rows on a dequantize pass and cuBLAS (see :mod:`llmnote.kernels.gemm.w4a16`).
:func:`plan_configs` narrows each kernel's candidate tiles to those that fit the GPU's shared
memory and fill its SMs for one problem shape.
"""

from __future__ import annotations

import functools
import math

import torch
import triton

from ... import runtime
from .matmul import _next_pow2, _smem_per_block

__all__ = ["gemv_configs", "gemm_configs", "swap_ab_configs", "plan_configs", "plan_swap_ab", "SMALL_M", "DEQUANT_M"]

SMALL_M = 16  # up to this many rows, the decode (GEMV-like) kernel
DEQUANT_M = 128  # from this many rows on, dequantize once and multiply at the 16-bit rate (measured on an H200)


def gemv_configs() -> list[triton.Config]:
    """Decode candidates: (BLOCK_N, BLOCK_K, warps, register target) tiles with every split of K,
    as FMAs (``BLOCK_M = 1``, for M = 1 only) or on the tensor cores (16 rows, 128-deep K tiles:
    each of the eight codes of a word gives a 16-deep slice, the least a ``tl.dot`` takes).

    The narrow one-row tiles carry ``maxnreg=56``: with 56 registers a thread rather than the 48
    ptxas settles on by itself, it issues the loads of x and of the next tile's words earlier in
    the loop, so more bytes are in flight (measured on an H100: 10% faster for Llama-3-8B's
    ``gate_up_proj``)."""
    row_tiles = [(64, 128, 4, None), (64, 256, 8, None), (128, 128, 4, None), (256, 128, 8, None), (128, 256, 8, None)]
    row_tiles += [(256, 256, 8, None), (32, 256, 4, 56), (32, 512, 8, 56)]
    mma_tiles = [(64, 128, 4, None), (128, 128, 4, None), (128, 128, 8, None)]
    return [
        triton.Config(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split}, num_warps=warps, num_stages=3, maxnreg=regs
        )
        for bm, tiles in ((1, row_tiles), (SMALL_M, mma_tiles))
        for bn, bk, warps, regs in tiles
        for split in (1, 2, 4, 8, 16)
    ]


def gemm_configs() -> list[triton.Config]:
    """Tiled candidates for 17 to ``DEQUANT_M - 1`` rows: narrow tiles, with splits of K."""
    return [
        triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "GROUP_M": 8, "SPLIT_K": split}, num_stages=4, num_warps=4)
        for bm, bn in ((32, 64), (32, 128), (64, 64), (64, 128))
        for split in (1, 2, 4)
    ]


def swap_ab_configs(rows: int = 1) -> list[triton.Config]:
    """Candidates of ``w4a16_swap_ab_kernel`` for ``rows`` = 1, 8 or 16 (its ``ROWS``): ``V``
    32-column blocks a program, its warps, loads one group ahead (``PREFETCH``) or not, with splits
    of K. Most prefetching ones carry a register target: with too few registers ptxas can move the
    loads meant for the next group to the end of the loop body, next to their use (seen in the
    sm_90 SASS). More rows hold more accumulators (8 or 16 a 32-column block instead of 4), hence
    the higher targets. At one row one prefetching tile has none: in its own 68 registers ptxas
    issues the next group's loads late, but seven four-warp programs fit an SM, so Llama-3-8B's
    ``gate_up_proj`` (896 programs) runs in one wave on 132 SMs, and on an H200 that tile was the
    fastest (20.7 µs against 22.1 without loading ahead and 24.1 at 128 registers). Two warps a
    program fill an SM's registers in finer steps at 16 rows (95 registers a thread). At 8 and 16
    rows each tile is also a candidate with its codes scaled before the MMAs (``DEQ``: 72 registers
    instead of 95 at 16 rows); on an H100 that made 16 rows of Llama-3-8B's ``gate_up_proj`` 29.6 µs
    against 32.6 for the best exact tile. At one row ``DEQ`` did not win (23.1 against 22.4 µs) and
    is not a candidate."""
    if rows == 1:
        tiles = [(1, 4, False, None), (2, 4, False, None), (1, 4, True, None), (1, 4, True, 128), (1, 8, True, 128),
                 (2, 4, True, 168)]  # fmt: skip
    else:
        tiles = [(1, 4, False, None), (1, 2, False, None), (2, 4, False, None), (1, 4, True, 168), (1, 8, True, 168),
                 (2, 4, True, 232)]  # fmt: skip
    return [
        triton.Config({"V": v, "WARPS": w, "SPLIT_K": split, "PREFETCH": pre, "DEQ": deq}, num_warps=w, num_stages=1,
                      maxnreg=regs)  # fmt: skip
        for v, w, pre, regs in tiles
        for deq in ((False,) if rows == 1 else (False, True))
        for split in (1, 2, 4, 7, 8, 14, 16)
    ]


_GEMV_CONFIGS, _GEMM_CONFIGS = gemv_configs(), gemm_configs()
_SWAP_AB_BY_ROWS = {1: swap_ab_configs(1), 8: swap_ab_configs(8)}
_SWAP_AB_BY_ROWS[16] = _SWAP_AB_BY_ROWS[8]
_SWAP_AB_CONFIGS = _SWAP_AB_BY_ROWS[1] + _SWAP_AB_BY_ROWS[8]


@functools.lru_cache(maxsize=256)
def plan_swap_ab(
    n: int, k: int, group_size: int, sms: int = 132, every: bool = False, rows: int = 1
) -> tuple[triton.Config, ...]:
    """The candidates of ``w4a16_swap_ab_kernel`` for one shape and ``rows`` (its ``ROWS``): blocks
    that divide N, 12 to 48 warps an SM in all, and of those, for each tile, the split that gives a
    warp the longest run of whole groups (in a first version's sweep on an H100 the longest runs
    won: 24.6 µs with eight groups a warp against 35 µs with one, for Llama-3-8B's
    ``gate_up_proj``). ``every``: all splits in that band with runs of two groups or more (what a
    sweep times). A shape too small for the band gets the candidates with the most warps."""
    groups = k // group_size

    def warps(c: triton.Config) -> int:
        return n // (32 * c.kwargs["V"]) * c.kwargs["SPLIT_K"] * c.kwargs["WARPS"]

    def run(c: triton.Config) -> int:  # groups a warp takes
        return triton.cdiv(triton.cdiv(groups, c.kwargs["SPLIT_K"]), c.kwargs["WARPS"])

    valid = [c for c in _SWAP_AB_BY_ROWS[rows] if n % (32 * c.kwargs["V"]) == 0 and c.kwargs["SPLIT_K"] <= groups]
    valid = [c for c in valid if triton.cdiv(groups, c.kwargs["SPLIT_K"]) >= c.kwargs["WARPS"]] or valid
    band = [c for c in valid if 12 * sms <= warps(c) <= 48 * sms and run(c) >= 2]
    if every:
        return tuple(band)
    kept, seen = [], set()
    for c in sorted(band, key=lambda c: (-run(c), c.kwargs["SPLIT_K"])):
        tile = (c.kwargs["V"], c.kwargs["WARPS"], c.kwargs["PREFETCH"], c.kwargs["DEQ"], c.maxnreg)
        if tile not in seen:
            kept.append(c)
            seen.add(tile)
    if not kept:
        kept = sorted(valid, key=lambda c: (-min(warps(c), 48 * sms), c.kwargs["SPLIT_K"]))[:2]
    return tuple(kept)


@functools.lru_cache(maxsize=256)
def plan_configs(
    small: bool, m_bucket: int, n: int, k: int, elem: int, sms: int = 132, capability: tuple[int, int] = (9, 0)
) -> tuple[triton.Config, ...]:
    """The candidates autotuning times for one problem (``small``: the decode kernel): tiles that
    fit shared memory and the problem, and a split of K only where the tiles alone leave SMs idle,
    putting one to four programs on each of ``sms`` SMs. The decode kernel keeps splits of K even
    when its tiles fill the GPU (up to 16 programs an SM): more programs keep more loads of the
    weight in flight, and bytes in flight are what a bandwidth-bound kernel runs short of. The
    workspace is sized from this list."""
    limit = _smem_per_block(capability)

    def tiles(c: triton.Config) -> int:
        return triton.cdiv(m_bucket, c.kwargs["BLOCK_M"]) * triton.cdiv(n, c.kwargs["BLOCK_N"])

    def smem(c: triton.Config) -> int:  # pipeline buffers of x and words, and the dequantized tile
        bm, bn, bk = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
        return c.num_stages * (bm * bk * elem + bk * bn // 2) + bk * bn * elem

    base = _GEMV_CONFIGS if small else _GEMM_CONFIGS
    cands = [c for c in base if c.kwargs["SPLIT_K"] <= triton.cdiv(k, c.kwargs["BLOCK_K"])]
    if small:  # one-row (FMA) tiles for one row, 16-row (tensor-core) tiles for more
        cands = [c for c in cands if c.kwargs["BLOCK_M"] == (1 if m_bucket == 1 else SMALL_M)]
    else:
        cands = [c for c in cands if c.kwargs["BLOCK_M"] <= max(m_bucket, 32)]
        fitting = [c for c in cands if smem(c) <= limit]
        if not fitting and cands:  # little shared memory (a T4's 64 KiB): the smallest tile, two stages
            c = min(cands, key=smem)
            fitting = [triton.Config(dict(c.kwargs), num_warps=c.num_warps, num_stages=2)]
        cands = fitting
    cands = [c for c in cands if c.kwargs["BLOCK_N"] <= max(_next_pow2(n), 64)] or cands
    lo, hi, per_shape = 0.75 * sms, (16 if small else 4) * sms, 3 if small else 2
    split = {id(c): c.kwargs["SPLIT_K"] for c in cands}
    useful = [c for c in cands if split[id(c)] == 1 or tiles(c) < lo or small]
    kept, per_tile = [], {}
    for c in useful:  # (each tile shape keeps its smallest splits in the band)
        tile = tuple(v for key, v in c.kwargs.items() if key != "SPLIT_K")
        if lo <= tiles(c) * split[id(c)] <= (hi if split[id(c)] > 1 else math.inf) and per_tile.get(tile, 0) < per_shape:
            kept.append(c)
            per_tile[tile] = per_tile.get(tile, 0) + 1
    if not kept:  # too small to fill the GPU: the candidates closest to two programs an SM
        kept = sorted(useful, key=lambda c: abs(math.log(tiles(c) * split[id(c)] / (2 * sms))))[:4]
    return tuple(kept or cands[:1] or base[:1])


def _sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _prune_swap_ab(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    n, k, group = named_args["N"], named_args["K"], kwargs["GROUP"]
    return list(plan_swap_ab(n, k, group, _sms(named_args["x_ptr"].device), rows=kwargs["ROWS"]))


def _prune(small: bool):
    def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        x, caps = named_args["x_ptr"], runtime.capability() or (0, 0)
        m, n, k = named_args["M_BUCKET"], named_args["N"], named_args["K"]
        return list(plan_configs(small, m, n, k, x.element_size(), _sms(x.device), tuple(caps)))

    return prune
