"""RMSNorm (Zhang & Sennrich, 2019) as a layer, with the residual add fused in."""

from __future__ import annotations

import torch
import torch.nn as nn

from .ops import ops_for

__all__ = ["RMSNorm"]


class RMSNorm(nn.Module):
    """``forward(x)`` -> ``rms_norm(x)``; ``forward(x, residual)`` -> ``(rms_norm(x + residual),
    x + residual)``: the add that closes a sub-layer and the norm that opens the next, in one
    pass over the hidden states."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        ops = ops_for(x)
        if residual is None:
            return ops.rms_norm(x, self.weight, self.eps)
        return ops.add_rms_norm(x, residual, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
