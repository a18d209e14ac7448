"""Fused RMSNorm (Zhang & Sennrich, 2019): one read of ``x``, one write, float32 statistics."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import check_add_rms_norm, check_rms_norm
from .common import as_rows, check_device, num_warps_for

__all__ = ["rms_norm", "add_rms_norm"]

MAX_ONE_PASS = 16384
LOOP_BLOCK = 4096


@triton.jit
def rms_norm_rows_kernel(
    x_ptr, w_ptr, out_ptr, n_rows, n_cols, stride_x, stride_out, eps, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    col_ok = cols < n_cols
    mask = (rows[:, None] < n_rows) & col_ok[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    x = tl.load(x_ptr + rows64 * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=1) / n_cols + eps)
    y = x * inv_rms[:, None] * w[None, :]
    tl.store(out_ptr + rows64 * stride_out + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_loop_kernel(x_ptr, w_ptr, out_ptr, n_cols, stride_x, stride_out, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row, out_row = x_ptr + row * stride_x, out_ptr + row * stride_out
    sum_sq = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_row + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        sum_sq += x * x
    inv_rms = tl.rsqrt(tl.sum(sum_sq, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_row + cols, (x * inv_rms * w).to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dimension of ``x`` (any leading shape) with a ``(last_dim,)`` weight."""
    check_rms_norm(x, weight, eps)
    check_device(x=x, weight=weight)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    rows, weight = as_rows(x), weight.contiguous()
    out_rows = out.view(-1, x.shape[-1])
    n_rows, n_cols = rows.shape
    block_c = triton.next_power_of_2(n_cols)
    if block_c <= MAX_ONE_PASS:
        block_r = max(1, min(16, 8192 // block_c))
        rms_norm_rows_kernel[(triton.cdiv(n_rows, block_r),)](
            rows,
            weight,
            out_rows,
            n_rows,
            n_cols,
            rows.stride(0),
            out_rows.stride(0),
            eps,
            BLOCK_R=block_r,
            BLOCK_C=block_c,
            num_warps=num_warps_for(block_r * block_c),
        )
    else:
        _rms_norm_loop_kernel[(n_rows,)](
            rows, weight, out_rows, n_cols, rows.stride(0), out_rows.stride(0), eps, BLOCK=LOOP_BLOCK, num_warps=8
        )
    return out


@triton.jit
def _add_rms_norm_kernel(x_ptr, r_ptr, w_ptr, out_ptr, sum_ptr, n_cols, stride_x, stride_r, eps, BLOCK_C: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_C)
    ok = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)
    s = (x + r).to(sum_ptr.dtype.element_ty)  # the residual stream, rounded as the unfused model stores it
    tl.store(sum_ptr + row * n_cols + cols, s, mask=ok)
    sf = s.to(tl.float32)
    w = tl.load(w_ptr + cols, mask=ok, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(sf * sf, axis=0) / n_cols + eps)
    tl.store(out_ptr + row * n_cols + cols, (sf * inv_rms * w).to(out_ptr.dtype.element_ty), mask=ok)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(rms_norm(x + residual), x + residual)`` in one pass: the residual connection that
    ends one sub-layer fused with the RMSNorm that starts the next. One read of ``x`` and
    ``residual``, two writes; rows up to 16384 wide."""
    check_add_rms_norm(x, residual, weight, eps)
    check_device(x=x, residual=residual, weight=weight)
    n_cols = x.shape[-1]
    block_c = triton.next_power_of_2(n_cols)
    if block_c > MAX_ONE_PASS:
        raise ValueError(f"add_rms_norm takes rows of at most {MAX_ONE_PASS} elements, got {n_cols}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    total = torch.empty_like(out)
    if x.numel() == 0:
        return out, total
    rows, res = as_rows(x), as_rows(residual)
    _add_rms_norm_kernel[(rows.shape[0],)](
        rows, res, weight.contiguous(), out, total, n_cols, rows.stride(0), res.stride(0), eps,
        BLOCK_C=block_c, num_warps=num_warps_for(block_c),
    )
    return out, total
