"""Pure PyTorch references: the readable truth each Triton kernel is checked against.

Reductions and transcendental functions are computed in float32 and the result is cast
back to the input's dtype once, as the kernels do.
"""

from __future__ import annotations

import torch

from .._checks import check_add_rms_norm, check_matmul_inputs, check_pair, check_rms_norm, check_rope, check_rotary, check_tensor

__all__ = [
    "vector_add",
    "softmax",
    "matmul",
    "rms_norm",
    "add_rms_norm",
    "rope_cos_sin",
    "apply_rope",
    "rotary_embedding",
    "silu_mul",
]


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` for two tensors of the same shape, dtype and device."""
    check_pair("x", x, "y", y)
    return x + y


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, any leading shape; float32 math, ``x.dtype`` out."""
    check_tensor("x", x)
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(M, K) @ (K, N)`` with float32 accumulation; returns ``a.dtype``."""
    check_matmul_inputs(a, b)
    return (a.float() @ b.float()).to(a.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension (Zhang & Sennrich, 2019)."""
    check_rms_norm(x, weight, eps)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """A residual connection followed by the next RMSNorm: returns ``(rms_norm(s), s)`` for
    ``s = x + residual`` (rounded to x's dtype, as an unfused model would store it)."""
    check_add_rms_norm(x, residual, weight, eps)
    s = x + residual
    return rms_norm(s, weight, eps), s


def rope_cos_sin(
    seq_len: int,
    head_dim: int,
    base: float = 10000.0,
    device=None,
    positions: torch.Tensor | None = None,
    inv_freq: torch.Tensor | None = None,
):
    """Cos and sin tables, ``(seq_len, head_dim)`` float32, for rotate-half RoPE (Su et al., 2021).

    Frequency ``i`` (of ``head_dim / 2``) is ``base^(-2i / head_dim)`` unless ``inv_freq``
    gives them (a rescaled model's, see :mod:`llmnote.models.rope_scaling`); the table
    repeats the frequencies across both halves, as Llama and Qwen do. ``positions`` (any
    integer tensor, e.g. ``(batch, seq_len)``) replaces ``arange(seq_len)``.
    """
    if head_dim % 2 or head_dim < 2:
        raise ValueError(f"head_dim must be even and >= 2, got {head_dim}")
    if inv_freq is None:
        inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    elif inv_freq.shape != (head_dim // 2,):
        raise ValueError(f"inv_freq must have shape ({head_dim // 2},), got {tuple(inv_freq.shape)}")
    inv_freq = inv_freq.to(device=device, dtype=torch.float32)
    pos = torch.arange(seq_len, device=device, dtype=torch.float32) if positions is None else positions.to(device, torch.float32)
    angles = pos[..., None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half convention: ``x * cos + rotate_half(x) * sin``.

    ``x`` is ``(..., seq_len, head_dim)``, typically ``(batch, heads, seq, head_dim)``;
    ``cos``/``sin`` are ``(seq_len, head_dim)`` or, per sequence, ``(batch, seq_len, head_dim)``.
    """
    check_rope(x, cos, sin)
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos.float() + rotated * sin.float()).to(x.dtype)


def rotary_embedding(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE on packed tokens: ``q`` (T, Hq, D) and ``k`` (T, Hk, D), token ``t`` rotated by
    the angles of position ``positions[t]``, read from float32 tables ``cos``/``sin``
    (max_position, D) as :func:`rope_cos_sin` builds them. Returns new ``(q, k)``."""
    check_rotary(q, k, positions, cos, sin)
    c, s = cos[positions][:, None], sin[positions][:, None]  # (T, 1, D)

    def rotate(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        half = x.shape[-1] // 2
        return (xf * c + torch.cat([-xf[..., half:], xf[..., :half]], dim=-1) * s).to(x.dtype)

    return rotate(q), rotate(k)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation: ``silu(gate) * up`` (Shazeer, 2020)."""
    check_pair("gate", gate, "up", up)
    g = gate.float()
    return (g * torch.sigmoid(g) * up.float()).to(gate.dtype)
