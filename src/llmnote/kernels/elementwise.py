"""Elementwise kernels: ``vector_add`` (the first Triton program) and ``silu_mul`` (SwiGLU)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import check_pair
from .common import check_device

__all__ = ["vector_add", "silu_mul"]

BLOCK = 1024


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    # Each program owns one block of BLOCK consecutive elements.
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n  # the last block may run past the end
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (x + y).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    g = tl.load(gate_ptr + offsets, mask=mask).to(tl.float32)
    u = tl.load(up_ptr + offsets, mask=mask).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def launch_elementwise(kernel, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Run a binary elementwise ``kernel`` over ``a`` and ``b``: one program per ``BLOCK`` elements."""
    a, b = a.contiguous(), b.contiguous()
    out = torch.empty_like(a)
    n = a.numel()
    if n:
        kernel[(triton.cdiv(n, BLOCK),)](a, b, out, n, BLOCK=BLOCK, num_warps=4)
    return out


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``x + y`` (same shape, dtype and device). Non-contiguous inputs are copied first."""
    check_pair("x", x, "y", y)
    check_device(x=x, y=y)
    return launch_elementwise(add_kernel, x, y)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` in float32, stored in the inputs' dtype (one read of each, one write)."""
    check_pair("gate", gate, "up", up)
    check_device(gate=gate, up=up)
    return launch_elementwise(silu_mul_kernel, gate, up)
