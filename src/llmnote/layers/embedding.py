"""Token embedding and the language-model head."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["Embedding", "LMHead"]


class Embedding(nn.Module):
    """Row ``i`` of a ``(vocab_size, hidden)`` table for token id ``i``."""

    def __init__(self, vocab_size: int, hidden: int, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden, dtype=dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, {self.weight.shape[1]}"


class LMHead(nn.Module):
    """Logits over the vocabulary: ``hidden @ W^T`` with ``W`` (vocab_size, hidden), its own
    matrix or the embedding's (``tied_to``: weight tying, Press & Wolf, 2017)."""

    def __init__(self, vocab_size: int, hidden: int, tied_to: Embedding | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.weight = tied_to.weight if tied_to is not None else nn.Parameter(torch.empty(vocab_size, hidden, dtype=dtype))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[1]} -> {self.weight.shape[0]}"
