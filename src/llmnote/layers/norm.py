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
        # Under autocast the activations may be 16-bit while the weight (and the residual
        # stream, which starts as the float32 embedding) stay float32: add unfused, promoting.
        weight = self.weight if self.weight.dtype == x.dtype else self.weight.to(x.dtype)
        if residual is None:
            return ops_for(x).rms_norm(x, weight, self.eps)
        if residual.dtype != x.dtype:
            total = x + residual
            return ops_for(total).rms_norm(total, self.weight.to(total.dtype), self.eps), total
        return ops_for(x).add_rms_norm(x, residual, weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
