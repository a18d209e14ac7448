"""Fused softmax over the last dimension: one read and one write of each element.

Rows up to ``MAX_ONE_PASS`` elements are held in registers whole (several short rows per
program); longer rows stream through in blocks with the online-softmax recurrence
(Milakov & Gimelshein, 2018), reading the row twice.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import check_tensor
from .common import as_rows, check_device, num_warps_for

__all__ = ["softmax"]

MAX_ONE_PASS = 32768
LOOP_BLOCK = 8192


@triton.jit
def softmax_rows_kernel(x_ptr, out_ptr, n_rows, n_cols, stride_x, stride_out, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + cols[None, :], mask=mask, other=-float("inf")).to(tl.float32)
    x = tl.where(rows[:, None] < n_rows, x, 0.0)  # rows past the end: harmless zeros, not -inf - -inf
    x = x - tl.max(x, axis=1)[:, None]  # subtract the row max: exp never overflows
    e = tl.exp(x)
    y = e / tl.sum(e, axis=1)[:, None]
    tl.store(out_ptr + rows64 * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_online_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row, out_row = x_ptr + row * stride_x, out_ptr + row * stride_out
    # Per-lane running max m and running sum s of exp(x - m).
    m = tl.full((BLOCK,), -float("inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        seen = m_new > -float("inf")  # lanes that have met a real value
        s = tl.where(seen, s * tl.exp(m - m_new) + tl.exp(x - m_new), 0.0)
        m = m_new
    row_max = tl.max(m, axis=0)
    row_sum = tl.sum(tl.where(m > -float("inf"), s * tl.exp(m - row_max), 0.0), axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - row_max) / row_sum
        tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension of ``x`` (any leading shape), float32 math, ``x.dtype`` out."""
    check_tensor("x", x)
    check_device(x=x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    rows = as_rows(x)
    out_rows = out.view(-1, x.shape[-1])
    n_rows, n_cols = rows.shape
    block_c = triton.next_power_of_2(n_cols)
    if block_c <= MAX_ONE_PASS:
        block_r = max(1, min(16, 8192 // block_c))  # pack short rows: about 8K elements per program
        grid = (triton.cdiv(n_rows, block_r),)
        softmax_rows_kernel[grid](
            rows,
            out_rows,
            n_rows,
            n_cols,
            rows.stride(0),
            out_rows.stride(0),
            BLOCK_R=block_r,
            BLOCK_C=block_c,
            num_warps=num_warps_for(block_r * block_c),
        )
    else:
        softmax_online_kernel[(n_rows,)](
            rows, out_rows, n_cols, rows.stride(0), out_rows.stride(0), BLOCK=LOOP_BLOCK, num_warps=16
        )
    return out
