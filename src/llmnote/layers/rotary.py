"""Rotary position embedding (Su et al., 2021) for packed tokens at arbitrary positions."""

from __future__ import annotations

import torch
import torch.nn as nn

from .. import ref
from .ops import ops_for

__all__ = ["RotaryEmbedding"]


class RotaryEmbedding(nn.Module):
    """Cos and sin tables for positions ``0 .. max_positions - 1`` (float32 buffers, rebuilt
    by :meth:`build`, not saved in checkpoints); ``forward(q, k, positions)`` rotates packed
    ``q`` (T, Hq, D) and ``k`` (T, Hk, D), token ``t`` by the angles of ``positions[t]``."""

    def __init__(self, head_dim: int, inv_freq: torch.Tensor, max_positions: int):
        super().__init__()
        if max_positions < 1:
            raise ValueError(f"max_positions must be >= 1, got {max_positions}")
        self.head_dim, self.max_positions = head_dim, max_positions
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        if inv_freq.device.type != "meta":
            self.build(inv_freq.device)

    def build(self, device: torch.device | str, inv_freq: torch.Tensor | None = None) -> None:
        """(Re)compute the tables on ``device`` (after the model was created on the meta device)."""
        if inv_freq is not None:
            self.inv_freq = inv_freq.float()
        self.inv_freq = self.inv_freq.to(device)
        self.cos, self.sin = ref.rope_cos_sin(self.max_positions, self.head_dim, device=device, inv_freq=self.inv_freq)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ops_for(q).rotary_embedding(q, k, positions, self.cos, self.sin)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_positions={self.max_positions}"
