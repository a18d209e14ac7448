"""What every kernel wrapper needs: a device check that matches how Triton runs here,
and a 2-D row view of a tensor without copying when its strides allow."""

from __future__ import annotations

import torch

from .. import runtime

__all__ = ["check_device", "as_rows", "num_warps_for"]


def check_device(**tensors: torch.Tensor) -> torch.device:
    """All tensors on one device, and one that Triton can run on in this process."""
    names = list(tensors)
    device = tensors[names[0]].device
    for name in names[1:]:
        if tensors[name].device != device:
            raise ValueError(f"{names[0]} and {name} must be on the same device, got {device} and {tensors[name].device}")
    if device.type == "cuda":
        if runtime.interpreting():
            raise ValueError("got CUDA tensors, but Triton runs in its CPU interpreter here (LLMNOTE_DEVICE=cpu?)")
        cap = runtime.capability()
        bf16 = [name for name, t in tensors.items() if t.dtype == torch.bfloat16]
        if bf16 and cap < (8, 0):
            raise TypeError(
                f"{bf16[0]} is bfloat16, which this GPU (compute capability {cap[0]}.{cap[1]}) cannot compute in; "
                "use float16 (llmnote.runtime.half_dtype() picks the right one)"
            )
    elif device.type == "cpu":
        if not runtime.interpreting():
            raise ValueError("Triton kernels take CUDA tensors on a GPU machine; got CPU tensors (llmnote.ref runs on CPU)")
    else:
        raise ValueError(f"unsupported device {device}; Triton kernels take CUDA tensors (or CPU tensors in the interpreter)")
    return device


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a 2-D ``(rows, last_dim)`` tensor whose last dim is contiguous.

    A view when the strides allow it (contiguous tensors, column slices such as
    ``x[:, :n]``); otherwise a contiguous copy.
    """
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def num_warps_for(block: int) -> int:
    """Warps for a row kernel whose row tile holds ``block`` elements."""
    return 16 if block >= 16384 else 8 if block >= 2048 else 4
