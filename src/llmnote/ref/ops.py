"""Pure PyTorch references: the readable truth each Triton kernel is checked against.

Reductions and transcendental functions are computed in float32 and the result is cast
back to the input's dtype once, as the kernels do.
"""

from __future__ import annotations

import torch

from .._checks import check_last_dim, check_same, check_tensor

__all__ = ["vector_add", "softmax", "matmul", "rms_norm", "rope_cos_sin", "apply_rope", "silu_mul"]


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` for two tensors of the same shape, dtype and device."""
    check_tensor("x", x)
    check_tensor("y", y)
    check_same("x", x, "y", y)
    return x + y


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dimension, any leading shape; float32 math, ``x.dtype`` out."""
    check_tensor("x", x)
    xf = x.float()
    e = torch.exp(xf - xf.amax(dim=-1, keepdim=True))
    return (e / e.sum(dim=-1, keepdim=True)).to(x.dtype)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(M, K) @ (K, N)`` with float32 accumulation; returns ``a.dtype``."""
    check_tensor("a", a, ndim=2)
    check_tensor("b", b, ndim=2)
    check_same("a", a, "b", b, shape=False)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions must match: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.numel() == 0 or b.numel() == 0:
        raise ValueError(f"M, N and K must be >= 1, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    return (a.float() @ b.float()).to(a.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last dimension (Zhang & Sennrich, 2019)."""
    check_tensor("x", x)
    check_tensor("weight", weight, ndim=1)
    check_same("x", x, "weight", weight, shape=False)
    check_last_dim("weight", weight, x.shape[-1], "the size of x's last dimension")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rope_cos_sin(seq_len: int, head_dim: int, base: float = 10000.0, device=None, positions: torch.Tensor | None = None):
    """Cos and sin tables, ``(seq_len, head_dim)`` float32, for rotate-half RoPE (Su et al., 2021).

    Frequency ``i`` (of ``head_dim / 2``) is ``base^(-2i / head_dim)``; the table repeats the
    frequencies across both halves, as Llama and Qwen do. ``positions`` (any integer
    tensor) replaces ``arange(seq_len)``.
    """
    if head_dim % 2 or head_dim < 2:
        raise ValueError(f"head_dim must be even and >= 2, got {head_dim}")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    pos = torch.arange(seq_len, device=device, dtype=torch.float32) if positions is None else positions.to(device, torch.float32)
    angles = pos[..., None] * inv_freq
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def _check_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    check_tensor("x", x, min_ndim=2)
    check_tensor("cos", cos, min_ndim=2)
    check_tensor("sin", sin, min_ndim=2)
    check_same("cos", cos, "sin", sin)
    if cos.device != x.device:
        raise ValueError(f"cos and x must be on the same device, got {cos.device} and {x.device}")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dimension (head_dim) must be even, got {x.shape[-1]}")
    if cos.shape[-2:] != x.shape[-2:]:
        raise ValueError(f"cos and sin must end in (seq_len, head_dim) = {tuple(x.shape[-2:])}, got {tuple(cos.shape)}")
    if cos.dim() == 3 and (x.dim() != 4 or cos.shape[0] != x.shape[0]):
        raise ValueError(f"3-D cos/sin (batch, seq, dim) need x of shape (batch, heads, seq, dim); got x {tuple(x.shape)}")
    if cos.dim() > 3:
        raise ValueError(f"cos and sin must be (seq_len, head_dim) or (batch, seq_len, head_dim), got {tuple(cos.shape)}")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half convention: ``x * cos + rotate_half(x) * sin``.

    ``x`` is ``(..., seq_len, head_dim)``, typically ``(batch, heads, seq, head_dim)``;
    ``cos``/``sin`` are ``(seq_len, head_dim)`` or, per sequence, ``(batch, seq_len, head_dim)``.
    """
    _check_rope(x, cos, sin)
    if cos.dim() == 3:
        cos, sin = cos[:, None], sin[:, None]
    xf = x.float()
    half = x.shape[-1] // 2
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos.float() + rotated * sin.float()).to(x.dtype)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's activation: ``silu(gate) * up`` (Shazeer, 2020)."""
    check_tensor("gate", gate)
    check_tensor("up", up)
    check_same("gate", gate, "up", up)
    g = gate.float()
    return (g * torch.sigmoid(g) * up.float()).to(gate.dtype)
