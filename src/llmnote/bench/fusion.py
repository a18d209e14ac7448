"""Kernel fusion measured: a chain of elementwise ops run op by op (torch eager, one
kernel and one round trip through HBM per op) against the same chain fused into one
kernel by ``torch.compile``. Chapter 1 predicts the ratio from bytes alone."""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..records import Record
from .timing import cuda_time_ms, rotating_inputs

__all__ = ["scale_bias_gelu_residual", "chain_bytes", "chain_inputs", "run_fusion"]


def scale_bias_gelu_residual(x: torch.Tensor, scale: float, bias: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``gelu(x * scale + bias) + residual``: four elementwise kernels in eager mode."""
    return F.gelu(x * scale + bias) + residual


def chain_bytes(numel: int, elem_bytes: int, fused: bool) -> int:
    """HBM bytes the chain moves (the bias vector is negligible and left out).

    Unfused: ``x*scale`` reads 1 writes 1, ``+bias`` reads 1 writes 1, ``gelu`` reads 1
    writes 1, ``+residual`` reads 2 writes 1: 9 tensors. Fused: read x and residual,
    write the output: 3 tensors.
    """
    return (3 if fused else 9) * numel * elem_bytes


def chain_inputs(rows: int, hidden: int, bias: torch.Tensor) -> tuple:
    """One argument set of the chain on the GPU: bf16 ``x`` and ``residual`` of (rows, hidden)."""
    x, residual = (torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return x, 0.5, bias, residual


def run_fusion(command: str | None = None) -> Record:
    if not torch.cuda.is_available():
        raise RuntimeError("the fusion benchmark needs a CUDA GPU")
    rec = Record() if command is None else Record(command=command)
    sizes = [1 << 20, 1 << 22, 1 << 24, 1 << 26]
    with tqdm(total=2 * len(sizes), desc="fusion") as progress:
        for numel in sizes:
            hidden = 4096
            rows = numel // hidden
            bias = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
            make = partial(chain_inputs, rows, hidden, bias)
            sets = rotating_inputs(make, 3 * numel * 2)
            # A fresh, static-shape compile per size: reusing one compiled function across
            # sizes makes torch.compile fall back to a slower shape-generic kernel.
            fused = torch.compile(scale_bias_gelu_residual, dynamic=False)
            for provider, fn, is_fused in (("torch", scale_bias_gelu_residual, False), ("torch-compile", fused, True)):
                ms = cuda_time_ms(fn, sets, warmup=10, rep=50, graph_calls=10)
                # ~20 FLOP per element for the erf-based GELU plus 3 for scale, bias, residual
                rec.add(
                    "scale-bias-gelu-residual",
                    f"rows={rows},hidden={hidden}",
                    "bf16",
                    provider,
                    ms,
                    flops=23 * numel,
                    nbytes=chain_bytes(numel, 2, fused=is_fused),
                )
                progress.update()
    return rec
