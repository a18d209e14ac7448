"""Turning logits into tokens: the sampling filters.

Filters follow their usual definitions: temperature scaling; top-k (Fan et al., 2018);
top-p / nucleus (Holtzman et al., 2020): the smallest set of tokens whose probability
reaches p; min-p (Nguyen et al., 2024): tokens at least ``min_p`` times as likely as the
most likely one; and the repetition penalty of CTRL (Keskar et al., 2019): logits of
tokens already in the sequence are divided by the penalty if positive, multiplied if
negative.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["SamplingParams", "filter_logits", "sample_next"]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy (argmax)
    top_k: int = 0  # 0 keeps every token
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 32
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")


def filter_logits(logits: torch.Tensor, params: SamplingParams, previous: torch.Tensor | None = None) -> torch.Tensor:
    """Apply penalty, temperature, top-k, top-p and min-p to ``(batch, vocab)`` logits.

    Removed tokens get ``-inf``. ``previous`` (``(batch, n)`` token ids) feeds the
    repetition penalty. With ``temperature == 0`` only the argmax survives.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be (batch, vocab), got shape {tuple(logits.shape)}")
    logits = logits.float().clone()
    if previous is not None and params.repetition_penalty != 1.0:
        seen = torch.gather(logits, 1, previous)
        seen = torch.where(seen > 0, seen / params.repetition_penalty, seen * params.repetition_penalty)
        logits.scatter_(1, previous, seen)
    if params.temperature == 0:
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, logits.argmax(-1, keepdim=True), True)
        return logits.masked_fill(~keep, float("-inf"))
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        top = torch.topk(logits, params.top_k, dim=-1).indices  # exactly k, even with ties
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(1, top, True)
        logits = logits.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the strictly more likely tokens
        drop_sorted = before >= params.top_p  # keep tokens until the mass reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if params.min_p > 0:
        logits = logits.masked_fill(probs < params.min_p * probs.max(-1, keepdim=True).values, float("-inf"))
    return logits


def sample_next(
    logits: torch.Tensor, params: SamplingParams, previous: torch.Tensor | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One token per row of ``(batch, vocab)`` logits: ``(batch,)`` int64."""
    filtered = filter_logits(logits, params, previous)
    if params.temperature == 0:
        return filtered.argmax(-1)
    return torch.multinomial(torch.softmax(filtered, dim=-1), 1, generator=generator).squeeze(-1)
