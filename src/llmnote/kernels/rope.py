"""Rotary position embedding (Su et al., RoFormer 2021), rotate-half convention as in
Llama and Qwen: the first half of each head vector pairs with the second half."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import check_rope, check_rotary
from .common import check_device

__all__ = ["apply_rope", "rotary_embedding"]

BLOCK_S = 16


@triton.jit
def rope_kernel(
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
    rope_kernel[grid](
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


@triton.jit
def _rotate_token_heads(
    x_ptr, out_ptr, t, heads, stride_xt, stride_xh, cos, sin, d, d_ok, HALF: tl.constexpr, BLOCK_H: tl.constexpr
):
    h = tl.arange(0, BLOCK_H)
    mask = (h[:, None] < heads) & d_ok[None, :]
    x = x_ptr + t * stride_xt + h[:, None] * stride_xh + d[None, :]
    x1 = tl.load(x, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x + HALF, mask=mask, other=0.0).to(tl.float32)
    o = out_ptr + (t * heads + h[:, None]) * (2 * HALF) + d[None, :]
    tl.store(o, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o + HALF, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_packed_kernel(
    q_ptr, k_ptr, q_out, k_out, pos_ptr, cos_ptr, sin_ptr, q_heads, k_heads, stride_qt, stride_qh, stride_kt, stride_kh,
    stride_c, HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)  # one token: all its query heads, then all its key heads
    pos = tl.load(pos_ptr + t).to(tl.int64)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HALF
    cos = tl.load(cos_ptr + pos * stride_c + d, mask=d_ok, other=0.0)[None, :]  # both halves share frequencies
    sin = tl.load(sin_ptr + pos * stride_c + d, mask=d_ok, other=0.0)[None, :]
    _rotate_token_heads(q_ptr, q_out, t, q_heads, stride_qt, stride_qh, cos, sin, d, d_ok, HALF, BLOCK_HQ)
    _rotate_token_heads(k_ptr, k_out, t, k_heads, stride_kt, stride_kh, cos, sin, d, d_ok, HALF, BLOCK_HK)


def rotary_embedding(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on packed tokens (see ``llmnote.ref.rotary_embedding``): ``q`` (T, Hq, D) and
    ``k`` (T, Hk, D), any strides with a contiguous last dimension (e.g. column slices of a
    fused QKV projection), ``positions`` (T,), float32 tables (max_position, D). One program
    per token rotates its queries and keys; the positions are read on the device, so the
    call is the same for every decode step. Returns new contiguous ``(q, k)``."""
    check_rotary(q, k, positions, cos, sin)
    check_device(q=q, k=k, positions=positions, cos=cos, sin=sin)
    if q.stride(-1) != 1 or k.stride(-1) != 1 or cos.stride(-1) != 1 or sin.stride(-1) != 1:
        raise ValueError("q, k, cos and sin need a contiguous last dimension")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if q.shape[0]:
        half = q.shape[-1] // 2
        _rotary_packed_kernel[(q.shape[0],)](
            q, k, q_out, k_out, positions, cos, sin, q.shape[1], k.shape[1], q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            cos.stride(0), HALF=half, BLOCK_HQ=triton.next_power_of_2(q.shape[1]), BLOCK_HK=triton.next_power_of_2(k.shape[1]),
            BLOCK_D=triton.next_power_of_2(half), num_warps=4,
        )
    return q_out, k_out
