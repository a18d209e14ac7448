"""Input checks shared by ``llmnote.ref`` and ``llmnote.kernels``: clear errors that name
the argument and say what was expected, instead of silently computing garbage."""

from __future__ import annotations

import torch

__all__ = [
    "FLOAT_DTYPES",
    "check_tensor",
    "check_same",
    "check_last_dim",
    "check_pair",
    "check_matmul",
    "check_rms_norm",
    "check_rope",
]

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(name: str, t: object, dtypes=FLOAT_DTYPES, ndim: int | None = None, min_ndim: int = 1) -> torch.Tensor:
    """``t`` must be a tensor of one of ``dtypes`` with ``ndim`` (or at least ``min_ndim``) dims."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {_names(dtypes)}; got {str(t.dtype).removeprefix('torch.')}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")
    return t


def check_same(a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor, shape: bool = True) -> None:
    """``a`` and ``b`` must share device and dtype (and shape, unless ``shape=False``)."""
    if a.device != b.device:
        raise ValueError(f"{a_name} and {b_name} must be on the same device, got {a.device} and {b.device}")
    if a.dtype != b.dtype:
        raise TypeError(f"{a_name} and {b_name} must have the same dtype, got {a.dtype} and {b.dtype}")
    if shape and a.shape != b.shape:
        raise ValueError(f"{a_name} and {b_name} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")


def check_last_dim(name: str, t: torch.Tensor, size: int, what: str) -> None:
    if t.shape[-1] != size:
        raise ValueError(f"{name} must have last dimension {size} ({what}), got shape {tuple(t.shape)}")


def check_pair(a_name: str, a: object, b_name: str, b: object) -> None:
    """Two float tensors of the same shape, dtype and device (elementwise binary ops)."""
    check_tensor(a_name, a)
    check_tensor(b_name, b)
    check_same(a_name, a, b_name, b)


def check_matmul(a: object, b: object) -> None:
    """``a`` (M, K) and ``b`` (K, N), one float dtype and device, M, N, K >= 1."""
    check_tensor("a", a, ndim=2)
    check_tensor("b", b, ndim=2)
    check_same("a", a, "b", b, shape=False)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions must match: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.numel() == 0 or b.numel() == 0:
        raise ValueError(f"M, N and K must be >= 1, got a {tuple(a.shape)} and b {tuple(b.shape)}")


def check_rms_norm(x: object, weight: object, eps: float) -> None:
    """``x`` (..., D), ``weight`` (D,) of x's dtype and device, ``eps >= 0``."""
    check_tensor("x", x)
    check_tensor("weight", weight, ndim=1)
    check_same("x", x, "weight", weight, shape=False)
    check_last_dim("weight", weight, x.shape[-1], "the size of x's last dimension")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def check_rope(x: object, cos: object, sin: object) -> None:
    """``x`` (..., S, D) with D even; ``cos``/``sin`` (S, D), or (B, S, D) for x (B, H, S, D)."""
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
