"""Requests as the engine sees them: sampling parameters and sequences.

A :class:`Sequence` is one request's tokens (prompt, then generated) and how far the KV cache
has caught up with them: ``num_computed`` tokens have their keys and values in the blocks of
``table``. Every engine step computes ``len(token_ids) - num_computed`` more of them or fewer
(a prefill chunk, or the one token a decode step feeds back), so prefill, chunked prefill,
decode and recomputation after preemption are one mechanism.

Pure Python: the scheduler and its tests use it without torch.
"""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field

from .block_manager import BlockTable

__all__ = ["SamplingParams", "Sequence", "Status"]


@dataclass(frozen=True)
class SamplingParams:
    """How one request picks its tokens and when it stops (the fields of vLLM's class of the
    same name that this engine supports). ``temperature`` 0 is greedy; ``top_k`` -1 (or 0) keeps
    every token; ``stop`` strings end the text (they are not returned); ``seed`` makes one request's
    sampling reproducible whatever else runs beside it."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int = 16
    ignore_eos: bool = False
    stop: tuple[str, ...] | str | None = None
    seed: int | None = None

    def __post_init__(self):
        def bad(name, want):
            raise ValueError(f"{name} must be {want}, got {getattr(self, name)!r}")

        for name in ("temperature", "top_p", "min_p"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or v != v:
                bad(name, "a number")
        for name in ("top_k", "max_tokens"):
            if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int):
                bad(name, "an int")
        if self.temperature < 0:
            bad("temperature", ">= 0")
        if not 0 < self.top_p <= 1:
            bad("top_p", "in (0, 1]")
        if self.top_k < -1:
            bad("top_k", "-1 or 0 (off), or >= 1")
        if not 0 <= self.min_p <= 1:
            bad("min_p", "in [0, 1]")
        if self.max_tokens < 1:
            bad("max_tokens", ">= 1")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            bad("seed", "an int or None")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        if not all(isinstance(s, str) and s for s in stop):
            bad("stop", "a non-empty string or a list of them")
        object.__setattr__(self, "stop", stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Status(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


@dataclass(eq=False)
class Sequence:
    """One request: its tokens, its place in the KV cache, and its timings."""

    prompt_token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    eos_token_id: int | None = None
    seq_id: int = field(default_factory=lambda: next(_ids))
    arrival_time: float = field(default_factory=time.perf_counter)

    def __post_init__(self):
        if not self.prompt_token_ids:
            raise ValueError("a prompt needs at least one token")
        self.token_ids: list[int] = list(self.prompt_token_ids)
        self.num_computed = 0  # tokens whose keys and values are in the cache
        self.num_cached_tokens = 0  # prompt tokens found in the prefix cache at first admission
        self.table = BlockTable()
        self.status = Status.WAITING
        self.finish_reason: str | None = None  # "stop" | "length" | "abort"
        self.num_preemptions = 0
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.token_times: list[float] = []

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def max_len(self) -> int:
        """The most tokens this sequence can ever hold: its prompt plus ``max_tokens``."""
        return self.num_prompt_tokens + self.params.max_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def append(self, token: int, now: float | None = None) -> None:
        """Add a generated token; finishes the sequence on EOS (unless ignored) or at ``max_tokens``."""
        now = time.perf_counter() if now is None else now
        self.token_ids.append(token)
        self.token_times.append(now)
        if self.first_token_time is None:
            self.first_token_time = now
        if not self.params.ignore_eos and token == self.eos_token_id:
            self.finish_reason = "stop"
        elif len(self.token_ids) - len(self.prompt_token_ids) >= self.params.max_tokens:
            self.finish_reason = "length"
