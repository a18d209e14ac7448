"""Sampling a batch whose requests each have their own parameters, on the device.

Each row of the logits belongs to a different request, so temperature, top-k, top-p and min-p
are vectors, applied in one pass: a row with the filter off gets a value that keeps every
token (top-k = vocabulary size, top-p = 1, min-p = 0). Top-p applies to what top-k keeps, and
min-p compares each token with the most likely one, as :func:`llmnote.layers.filter_logits`
does. Greedy rows (temperature 0) take the argmax. The others are drawn with the *exponential
race*: ``argmax(p_i / e_i)`` with ``e_i ~ Exp(1)`` independent is a sample from ``p`` (the
Gumbel-max trick, Gumbel 1954, with ``-log e`` as the Gumbel noise), which needs no cumulative
sum and no host round trip. A request with a seed draws its noise from its own generator, so
its tokens do not depend on what else shares the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.argmax import argmax_rows
from .sequence import SamplingParams

__all__ = ["SamplingTensors", "greedy", "sample"]


@dataclass
class SamplingTensors:
    """One step's sampling parameters, one entry per row: ``(B,)`` tensors on the device."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    generators: list[torch.Generator | None]
    greedy: bool  # every row greedy: a plain argmax
    filtered: bool  # some row uses top-k or top-p (they need the sorted logits)

    @classmethod
    def build(cls, params: list[SamplingParams], generators: list[torch.Generator | None], vocab: int,
              device: torch.device) -> SamplingTensors:  # fmt: skip
        if all(p.greedy for p in params):  # an argmax needs no parameters on the device
            none, no_k = torch.empty(0, device=device), torch.empty(0, dtype=torch.int64, device=device)
            return cls(none, no_k, none, none, generators, greedy=True, filtered=False)
        top_k = [vocab if p.top_k <= 0 else min(p.top_k, vocab) for p in params]
        # one copy to the device for all four (top-k as a float is exact below 2**24)
        rows = [[p.temperature for p in params], [p.top_p for p in params], [p.min_p for p in params], top_k]
        temperature, top_p, min_p, k = torch.tensor(rows, dtype=torch.float32).to(device, non_blocking=True)
        return cls(
            temperature=temperature,
            top_k=k.long(),
            top_p=top_p,
            min_p=min_p,
            generators=generators,
            greedy=all(p.greedy for p in params),
            filtered=any(k < vocab or p.top_p < 1 for k, p in zip(top_k, params)),
        )


def exponential_noise(shape, device, generators: list[torch.Generator | None]) -> torch.Tensor:
    """Exp(1) noise of ``shape`` (rows first); rows with a generator draw from it."""
    noise = torch.empty(shape, device=device).exponential_()
    for row, gen in enumerate(generators):
        if gen is not None:  # its own stream: the same tokens whatever else is in the batch
            noise[row].exponential_(generator=gen)
    return noise


def probabilities(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """The distribution each row samples from, ``(B, vocab)`` float32 (unnormalised where a
    filter removed tokens): temperature, top-k, top-p and min-p applied; one-hot at the argmax
    for greedy rows."""
    is_greedy = t.temperature == 0
    logits = logits.float() / torch.where(is_greedy, 1.0, t.temperature)[:, None]
    probs = torch.softmax(logits, -1)
    if t.filtered:
        sorted_probs, order = probs.sort(-1, descending=True)
        rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
        in_top_k = rank < t.top_k[:, None]
        # top-p over what top-k kept: the mass strictly ahead of a token, against top_p of the kept mass
        before = sorted_probs.cumsum(-1) - sorted_probs
        kept = (sorted_probs * in_top_k).sum(-1, keepdim=True)
        drop_sorted = ~in_top_k | (before >= t.top_p[:, None] * kept)
        probs = probs.masked_fill(torch.zeros_like(drop_sorted).scatter_(1, order, drop_sorted), 0.0)
    probs = probs.masked_fill(probs < t.min_p[:, None] * probs.amax(-1, keepdim=True), 0.0)
    one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.where(is_greedy[:, None], one_hot, probs)


def sample_probs(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per row of (unnormalised) probabilities, by the exponential race."""
    return (probs / exponential_noise(probs.shape, probs.device, generators)).argmax(-1)


SPLIT_ARGMAX_FROM = 32768  # vocabularies this large take the split-row argmax on a GPU


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Each row's argmax, ``(B,)`` int64. On a GPU, a large vocabulary goes to
    :func:`llmnote.kernels.argmax.argmax_rows` (a row split over many programs, where
    ``torch.argmax`` walks a row in one block: about 36 µs for a 128K row in an H200 profile); a
    small one to ``torch.argmax``, one launch instead of two."""
    return argmax_rows(logits) if logits.is_cuda and logits.shape[-1] >= SPLIT_ARGMAX_FROM else logits.argmax(-1)


def sample(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """One token per row of ``(B, vocab)`` logits: ``(B,)`` int64, on the logits' device."""
    if t.greedy:
        return greedy(logits)
    return sample_probs(probabilities(logits, t), t.generators)
