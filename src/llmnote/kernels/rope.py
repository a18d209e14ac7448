"""Rotary position embedding (Su et al., RoFormer 2021), rotate-half convention as in
Llama and Qwen: the first half of each head vector pairs with the second half."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import check_rope
from ._common import check_device

__all__ = ["apply_rope"]

BLOCK_S = 16


@triton.jit
def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    seq_len,
    heads,
    stride_xg,
    stride_xs,
    stride_cb,
    stride_cs,
    HALF: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    g = tl.program_id(0)  # one (batch, head) pair
    b = g // heads  # its batch index, for per-sequence cos/sin
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_H)
    mask = (s[:, None] < seq_len) & (d[None, :] < HALF)
    x_base = x_ptr + g.to(tl.int64) * stride_xg + s[:, None] * stride_xs + d[None, :]
    c_base = b.to(tl.int64) * stride_cb + s[:, None] * stride_cs + d[None, :]
    x1 = tl.load(x_base, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_base + HALF, mask=mask, other=0.0).to(tl.float32)
    cos1 = tl.load(cos_ptr + c_base, mask=mask, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + c_base + HALF, mask=mask, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + c_base, mask=mask, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + c_base + HALF, mask=mask, other=0.0).to(tl.float32)
    # rotate_half(x) = (-x2, x1)
    out1 = x1 * cos1 - x2 * sin1
    out2 = x2 * cos2 + x1 * sin2
    o_base = out_ptr + g.to(tl.int64) * seq_len * 2 * HALF + s[:, None] * 2 * HALF + d[None, :]
    tl.store(o_base, out1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_base + HALF, out2.to(out_ptr.dtype.element_ty), mask=mask)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin``; ``x`` is ``(..., seq_len, head_dim)``, ``cos``/``sin``
    ``(seq_len, head_dim)`` or ``(batch, seq_len, head_dim)`` with ``x`` ``(batch, heads, seq, dim)``."""
    check_rope(x, cos, sin)
    check_device(x=x, cos=cos, sin=sin)
    seq_len, head_dim = x.shape[-2:]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    x3 = x.reshape(-1, seq_len, head_dim)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    heads = x.shape[1] if cos.dim() == 3 else x3.shape[0]
    cos, sin = cos.contiguous(), sin.contiguous()
    stride_cb = cos.stride(0) if cos.dim() == 3 else 0
    half = head_dim // 2
    grid = (x3.shape[0], triton.cdiv(seq_len, BLOCK_S))
    _rope_kernel[grid](
        x3,
        cos,
        sin,
        out,
        seq_len,
        heads,
        x3.stride(0),
        x3.stride(1),
        stride_cb,
        cos.stride(-2),
        HALF=half,
        BLOCK_S=BLOCK_S,
        BLOCK_H=triton.next_power_of_2(half),
        num_warps=4,
    )
    return out
