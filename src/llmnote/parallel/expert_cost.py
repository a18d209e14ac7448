"""The cost model of expert parallelism: the bytes of the all-to-all, the expert weights a batch
touches, and the load each process gets when routing is skewed.

With ``N`` processes each holding ``E/N`` experts, a process's ``T`` tokens make ``T k``
token-expert assignments; under uniform routing ``(N - 1)/N`` of them go to another process, each
as one row of ``hidden`` numbers, and as many come back after the experts (the combine). The
process that receives the most rows does the most expert work and sets the pace of the layer, so
the placement of experts on processes matters: contiguous blocks, a greedy balanced placement, or
one with extra replicas of the popular experts (the redundant experts of DeepSeek-V3).
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

__all__ = [
    "alltoall_bytes",
    "expected_experts_touched",
    "zipf_popularity",
    "route_counts",
    "rank_loads",
    "balanced_placement",
    "imbalance",
]


def _positive_int(name: str, value) -> None:
    if not (isinstance(value, int | np.integer) and value >= 1):
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def alltoall_bytes(tokens, top_k: int, hidden: int, n: int, dtype_bytes: float = 2):
    """Expected bytes one process sends in one all-to-all (the dispatch; the combine sends as many
    back) for ``tokens`` tokens (a number or an array) routed uniformly to ``top_k`` experts each
    over ``n`` processes: ``tokens * top_k * (n - 1)/n * hidden * dtype_bytes``. One row per
    assignment, with no merging of a token's rows bound for the same process."""
    for name, value in (("top_k", top_k), ("hidden", hidden), ("n", n)):
        _positive_int(name, value)
    tokens = np.asarray(tokens, dtype=np.float64)
    if np.any(tokens < 0) or dtype_bytes <= 0:
        raise ValueError(f"tokens must be >= 0 and dtype_bytes > 0, got {tokens} and {dtype_bytes}")
    return tokens * top_k * (n - 1) / n * hidden * dtype_bytes


def expected_experts_touched(batch, experts: int, top_k: int):
    """Expected number of distinct experts that ``batch`` tokens (a number or an array) hit when
    each picks ``top_k`` of ``experts`` uniformly at random: ``E (1 - (1 - k/E)^B)``."""
    _positive_int("experts", experts)
    _positive_int("top_k", top_k)
    if top_k > experts:
        raise ValueError(f"top_k ({top_k}) must be <= experts ({experts})")
    batch = np.asarray(batch, dtype=np.float64)
    if np.any(batch < 0):
        raise ValueError(f"batch must be >= 0, got {batch}")
    return experts * (1 - (1 - top_k / experts) ** batch)


def zipf_popularity(experts: int, exponent: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Routing probabilities ``(experts,)`` proportional to ``1 / rank^exponent`` (Zipf), the ranks
    shuffled over the expert ids (with ``generator``) so that popular experts are not neighbours.
    ``exponent = 0`` is uniform."""
    _positive_int("experts", experts)
    if exponent < 0:
        raise ValueError(f"exponent must be >= 0, got {exponent}")
    weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** exponent
    weights = weights[torch.randperm(experts, generator=generator)]
    return weights / weights.sum()


def route_counts(tokens: int, popularity: torch.Tensor, top_k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Assignments per expert ``(E,)`` (int64, summing to ``tokens * top_k``) when each of
    ``tokens`` tokens draws ``top_k`` distinct experts with probabilities ``popularity``."""
    _positive_int("tokens", tokens)
    _positive_int("top_k", top_k)
    if popularity.ndim != 1 or top_k > popularity.numel() or (popularity < 0).any():
        raise ValueError(f"popularity must be a non-negative vector of at least top_k={top_k} entries")
    picks = torch.multinomial(popularity.expand(tokens, -1), top_k, replacement=False, generator=generator)
    return torch.bincount(picks.reshape(-1), minlength=popularity.numel())


def rank_loads(counts: torch.Tensor, n: int) -> torch.Tensor:
    """Rows each of ``n`` processes receives ``(n,)`` when process ``r`` holds the contiguous
    experts ``r E/n .. (r+1) E/n - 1`` (the placement of :mod:`llmnote.parallel.expert`)."""
    _positive_int("n", n)
    if counts.ndim != 1 or counts.numel() % n:
        raise ValueError(f"counts must be a vector whose length is a multiple of n={n}, got shape {tuple(counts.shape)}")
    return counts.reshape(n, -1).sum(1)


def balanced_placement(counts: torch.Tensor, n: int, redundant: int = 0) -> tuple[torch.Tensor, list[list[int]]]:
    """Place ``E`` experts with loads ``counts`` and ``redundant`` extra replicas on ``n`` processes,
    ``(E + redundant)/n`` slots each. Replicas go one by one to the expert with the largest load per
    copy (a replicated expert's tokens are split evenly among its copies); then the copies, largest
    first, each go to the least-loaded process with a free slot. Returns the loads ``(n,)``
    (float64) and the expert ids on each process."""
    _positive_int("n", n)
    if counts.ndim != 1 or redundant < 0 or (counts.numel() + redundant) % n:
        raise ValueError(f"need a vector of loads and redundant >= 0 with E + redundant divisible by n={n}")
    load = counts.double().tolist()
    copies = [1] * len(load)
    for _ in range(redundant):
        hot = max(range(len(load)), key=lambda e: load[e] / copies[e])
        copies[hot] += 1
    items = sorted(((load[e] / copies[e], e) for e in range(len(load)) for _ in range(copies[e])), reverse=True)
    slots = (len(load) + redundant) // n
    heap = [(0.0, r) for r in range(n)]
    placed: list[list[int]] = [[] for _ in range(n)]
    totals = [0.0] * n
    for share, e in items:
        total, r = heapq.heappop(heap)
        placed[r].append(e)
        totals[r] = total + share
        if len(placed[r]) < slots:
            heapq.heappush(heap, (totals[r], r))
    return torch.tensor(totals, dtype=torch.float64), placed


def imbalance(loads: torch.Tensor) -> float:
    """Max over mean of per-process loads: 1.0 when balanced; the layer runs at the busiest one's pace."""
    loads = loads.double()
    if loads.numel() == 0 or loads.mean() <= 0:
        raise ValueError("loads must be non-empty with a positive mean")
    return float(loads.max() / loads.mean())
