"""The modelled timing of a forward pipeline: when each stage runs each micro-batch.

A model cut into ``P`` stages runs ``m`` micro-batches in GPipe's order (Huang et al., 2019):
every stage takes the micro-batches in turn, and stage ``s`` can start micro-batch ``k`` only
when it has finished micro-batch ``k - 1`` and stage ``s - 1`` has finished micro-batch ``k``:

    start[s][k] = max(end[s - 1][k], end[s][k - 1]),    end[s][k] = start[s][k] + time[s]

Communication is taken as free. With equal stage times ``t`` the last bar ends at
``(m + P - 1) t`` while each stage is busy ``m t``: a fraction ``(P - 1) / (m + P - 1)`` of the
stage-time is idle (the *bubble*) as the pipeline fills and drains. With unequal stages the
slowest one sets the pace: the makespan is ``sum(time) + (m - 1) max(time)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Bar", "gpipe_schedule", "makespan", "idle_fraction", "bubble_fraction"]


@dataclass(frozen=True)
class Bar:
    """Stage ``stage`` runs micro-batch ``micro_batch`` from ``start`` to ``end`` (any time unit)."""

    stage: int
    micro_batch: int
    start: float
    end: float


def gpipe_schedule(stages: int, micro_batches: int, stage_time: float | Sequence[float] = 1.0) -> list[Bar]:
    """Every (stage, micro-batch) bar of a forward GPipe schedule, stage by stage, each stage's in
    micro-batch order. ``stage_time`` is one time for every stage or a sequence of ``stages`` times."""
    if stages < 1:
        raise ValueError(f"stages must be >= 1, got {stages}")
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be >= 1, got {micro_batches}")
    times = [float(stage_time)] * stages if isinstance(stage_time, int | float) else [float(t) for t in stage_time]
    if len(times) != stages:
        raise ValueError(f"stage_time must give one time per stage ({stages}), got {len(times)}")
    if any(t <= 0 for t in times):
        raise ValueError(f"stage times must be positive, got {times}")
    bars: list[Bar] = []
    previous_stage_ends = [0.0] * micro_batches  # before stage 0, every micro-batch is ready at time 0
    for s, t in enumerate(times):
        free_at, ends = 0.0, []
        for k in range(micro_batches):
            start = max(previous_stage_ends[k], free_at)
            free_at = start + t
            bars.append(Bar(s, k, start, free_at))
            ends.append(free_at)
        previous_stage_ends = ends
    return bars


def makespan(bars: Sequence[Bar]) -> float:
    """From the first start to the last end of ``bars``."""
    if not bars:
        raise ValueError("bars must not be empty")
    return max(b.end for b in bars) - min(b.start for b in bars)


def idle_fraction(bars: Sequence[Bar]) -> float:
    """The share of stage-time that ``bars`` leave idle: ``1 - busy / (stages × makespan)``."""
    stages = len({b.stage for b in bars})
    return 1.0 - sum(b.end - b.start for b in bars) / (stages * makespan(bars))


def bubble_fraction(stages: int, micro_batches: int) -> float:
    """GPipe's bubble with equal stages, ``(P - 1) / (m + P - 1)``: the idle share of a fill and a drain."""
    if stages < 1 or micro_batches < 1:
        raise ValueError(f"stages and micro_batches must be >= 1, got {stages} and {micro_batches}")
    return (stages - 1) / (micro_batches + stages - 1)
