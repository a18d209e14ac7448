"""``argmax_rows``: the index of each row's largest value, for greedy decoding over a vocabulary.

A decode step's logits are a few rows of 100,000 and more values. A reduction with one program
a row walks a whole row in a single block of threads on one SM: tens of microseconds for
250 KB, while the rest of the GPU idles. Here a row is cut into chunks of ``CHUNK`` values, one
program per (row, chunk) leaves the chunk's maximum and its index, and a second launch picks,
per row, the best chunk. Ties go to the smallest index at both levels, as ``torch.argmax`` does.
Unlike ``torch.argmax``, a NaN is never the maximum (logits hold none).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import check_device

__all__ = ["argmax_rows", "CHUNK"]

CHUNK = 2048  # values one program reduces
_BLOCK = 1024  # values loaded at a time


@triton.jit
def argmax_partial_kernel(x_ptr, val_ptr, idx_ptr, V, stride_row, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    row, part = tl.program_id(0), tl.program_id(1)
    parts = tl.num_programs(1)
    start = part * CHUNK
    base = x_ptr + row.to(tl.int64) * stride_row
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    best_idx = start + tl.arange(0, BLOCK)  # a row of -inf answers its first index
    for off in tl.static_range(0, CHUNK, BLOCK):
        cols = start + off + tl.arange(0, BLOCK)
        v = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        better = v > best  # strictly: each lane keeps the earliest of equal values
        best = tl.where(better, v, best)
        best_idx = tl.where(better, cols, best_idx)
    top = tl.max(best, axis=0)
    first = tl.min(tl.where(best == top, best_idx, 2147483647), axis=0)
    tl.store(val_ptr + row * parts + part, top)
    tl.store(idx_ptr + row * parts + part, first)


@triton.jit
def argmax_combine_kernel(val_ptr, idx_ptr, out_ptr, parts, PARTS: tl.constexpr):
    row = tl.program_id(0)
    p = tl.arange(0, PARTS)
    v = tl.load(val_ptr + row * parts + p, mask=p < parts, other=float("-inf"))
    i = tl.load(idx_ptr + row * parts + p, mask=p < parts, other=2147483647)
    top = tl.max(v, axis=0)
    tl.store(out_ptr + row, tl.min(tl.where(v == top, i, 2147483647), axis=0).to(tl.int64))


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(-1)`` for a 2-D float tensor ``(B, V)``: ``(B,)`` int64 on x's device."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"argmax_rows takes a 2-D floating-point tensor, got {getattr(x, 'shape', type(x))}")
    B, V = x.shape
    if V == 0:
        raise ValueError("argmax_rows: rows of no values have no argmax")
    check_device(x=x)
    x = x if x.stride(-1) == 1 else x.contiguous()
    parts = triton.cdiv(V, CHUNK)
    vals = torch.empty((B, parts), dtype=torch.float32, device=x.device)
    idx = torch.empty((B, parts), dtype=torch.int32, device=x.device)
    out = torch.empty(B, dtype=torch.int64, device=x.device)
    if B:
        argmax_partial_kernel[(B, parts)](x, vals, idx, V, x.stride(0), CHUNK=CHUNK, BLOCK=_BLOCK, num_warps=4)
        argmax_combine_kernel[(B,)](vals, idx, out, parts, PARTS=triton.next_power_of_2(parts))
    return out
