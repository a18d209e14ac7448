"""Token embedding and the language-model head, whole or split over a tensor-parallel group.

Split by vocabulary (Megatron-LM's vocabulary-parallel layers, Shoeybi et al., 2019): process
``r`` of ``N`` holds rows ``r V/N .. (r+1) V/N - 1`` of the ``(V, hidden)`` table. The embedding
looks up the ids that fall in its rows, leaves zeros for the rest and sums the group's results
(one all-reduce: exactly one process contributes each row). The head computes its slice of the
logits and gathers the group's slices (one all-gather), so that every process holds all the
logits and samples the same token.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .linear import SINGLE, TensorParallel

__all__ = ["Embedding", "LMHead"]


def _vocab_rows(vocab_size: int, tp: TensorParallel) -> int:
    if vocab_size % tp.size:
        raise ValueError(f"a vocabulary of {vocab_size} tokens cannot be split over {tp.size} processes")
    return vocab_size // tp.size


class Embedding(nn.Module):
    """Row ``i`` of a ``(vocab_size, hidden)`` table for token id ``i``."""

    def __init__(self, vocab_size: int, hidden: int, dtype: torch.dtype | None = None, tp: TensorParallel = SINGLE):
        super().__init__()
        self.tp, self.full_shape = tp, (vocab_size, hidden)
        rows = _vocab_rows(vocab_size, tp)
        self.start = tp.rank * rows  # the first token id this process holds
        self.weight = nn.Parameter(torch.empty(rows, hidden, dtype=dtype))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        mine = (local >= 0) & (local < self.weight.shape[0])
        out = F.embedding(local.clamp(0, self.weight.shape[0] - 1), self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        dist.all_reduce(out, group=self.tp.group)
        return out

    def load_weight(self, tensor: torch.Tensor) -> None:
        """Keep this process's rows of the checkpoint's whole table."""
        with torch.no_grad():
            self.weight.copy_(tensor[self.start : self.start + self.weight.shape[0]])

    def extra_repr(self) -> str:
        return f"{self.full_shape[0]}, {self.full_shape[1]}" + (f", rows from {self.start}" if self.tp.size > 1 else "")


class LMHead(nn.Module):
    """Logits over the vocabulary: ``hidden @ W^T`` with ``W`` (vocab_size, hidden), its own
    matrix or the embedding's (``tied_to``: weight tying, Press & Wolf, 2017)."""

    def __init__(self, vocab_size: int, hidden: int, tied_to: Embedding | None = None, dtype: torch.dtype | None = None,
                 tp: TensorParallel = SINGLE):  # fmt: skip
        super().__init__()
        self.tp, self.full_shape = tp, (vocab_size, hidden)
        rows = _vocab_rows(vocab_size, tp)
        self.start = tp.rank * rows
        self.weight = tied_to.weight if tied_to is not None else nn.Parameter(torch.empty(rows, hidden, dtype=dtype))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = F.linear(hidden, self.weight)
        if self.tp.size == 1:
            return logits
        parts = [torch.empty_like(logits) for _ in range(self.tp.size)]
        dist.all_gather(parts, logits.contiguous(), group=self.tp.group)
        return torch.cat(parts, dim=-1)

    load_weight = Embedding.load_weight

    def extra_repr(self) -> str:
        return f"{self.full_shape[1]} -> {self.full_shape[0]}"
