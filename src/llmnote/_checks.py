"""Input checks shared by ``llmnote.ref`` and ``llmnote.kernels``: clear errors that name
the argument and say what was expected, instead of silently computing garbage."""

from __future__ import annotations

import torch

__all__ = ["FLOAT_DTYPES", "check_tensor", "check_same", "check_last_dim"]

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
