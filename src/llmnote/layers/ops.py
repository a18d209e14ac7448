"""Which implementation a layer calls: the book's Triton kernels on a GPU, the PyTorch
references (the same names and semantics) on a CPU, and the references too wherever a
gradient must flow (training), since the kernels compute forward passes only."""

from __future__ import annotations

from types import ModuleType

import torch

from .. import kernels, ref

__all__ = ["ops_for"]


def ops_for(t: torch.Tensor) -> ModuleType:
    """``llmnote.kernels`` for CUDA tensors in inference, ``llmnote.ref`` otherwise."""
    if t.is_cuda and not (torch.is_grad_enabled() and t.requires_grad):
        return kernels
    return ref
