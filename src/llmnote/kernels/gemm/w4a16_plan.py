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

__all__ = ["gemv_configs", "gemm_configs", "plan_configs", "SMALL_M", "DEQUANT_M"]

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


_GEMV_CONFIGS, _GEMM_CONFIGS = gemv_configs(), gemm_configs()


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


def _prune(small: bool):
    def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        x, caps = named_args["x_ptr"], runtime.capability() or (0, 0)
        m, n, k = named_args["M_BUCKET"], named_args["N"], named_args["K"]
        return list(plan_configs(small, m, n, k, x.element_size(), _sms(x.device), tuple(caps)))

    return prune
