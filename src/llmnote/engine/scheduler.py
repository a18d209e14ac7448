"""Continuous batching: which sequences run in the next step, and how many tokens each.

Every step the scheduler fills a *token budget* (``max_num_batched_tokens``) and at most
``max_num_seqs`` sequences (the continuous, or iteration-level, batching of Orca, Yu et al.,
2022; the paged KV memory of vLLM, Kwon et al., 2023):

1. **Running sequences first, oldest first.** A decoding sequence needs one token; a sequence
   part-way through its prompt needs the rest of it, cut to what the budget has left (*chunked
   prefill*, as in Sarathi-Serve, Agrawal et al., 2024: long prompts no longer stall the
   decodes beside them). If the KV cache has no block for a sequence's new tokens, the newest
   running sequence is *preempted*: its blocks are freed and it goes back to the head of the
   queue, to be recomputed from its tokens later (cheaper than copying its cache to host
   memory for the short sequences of most workloads; its full blocks usually stay in the prefix
   cache, so the recomputation mostly hits). The oldest request therefore always keeps its
   place and makes progress.
2. **Then the queue, in arrival order.** A waiting sequence is admitted with the tokens its
   cached prefix does not cover, again cut to the budget. The queue is strictly first come,
   first served: if its head cannot get blocks, nothing behind it jumps ahead.

A request that could not fit in the whole cache even alone is refused when it is added,
before anything runs, so preemption can always make room for the oldest sequence.

Pure Python: the model runner executes a :class:`Batch`; :meth:`Scheduler.update` takes back
one sampled token per sequence that reached the end of its tokens.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager
from .sequence import Sequence, Status

__all__ = ["Batch", "Scheduler", "SchedulerConfig"]


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    num_lookahead_tokens: int = 0  # extra slots a decode reserves (for speculative tokens)

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ValueError("without chunked prefill, max_num_batched_tokens must be >= max_model_len "
                             f"(a whole prompt runs in one step); got {self.max_num_batched_tokens} < {self.max_model_len}")


@dataclass
class Batch:
    """One step's work: ``seqs[i]`` computes ``num_tokens[i]`` tokens starting at its
    ``num_computed``; the sequences with ``samples[i]`` get a new token from their last logits."""

    seqs: list[Sequence] = field(default_factory=list)
    num_tokens: list[int] = field(default_factory=list)
    samples: list[bool] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    def add(self, seq: Sequence, n: int) -> None:
        self.seqs.append(seq)
        self.num_tokens.append(n)
        self.samples.append(seq.num_computed + n == len(seq.token_ids))

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.num_tokens)


class Scheduler:
    def __init__(self, blocks: BlockManager, config: SchedulerConfig | None = None):
        self.blocks, self.config = blocks, config or SchedulerConfig()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order: oldest first
        self.num_preemptions = 0

    # -- requests in and out --------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a request; raises ``ValueError`` if it could never run."""
        self.check(seq)
        self.waiting.append(seq)

    def check(self, seq: Sequence) -> None:
        """Raise ``ValueError`` if ``seq`` could never run: too long for the model, or more
        KV blocks than the whole cache has."""
        cfg = self.config
        if seq.max_len > cfg.max_model_len:
            raise ValueError(f"the prompt ({seq.num_prompt_tokens} tokens) plus max_tokens ({seq.params.max_tokens}) "
                             f"is longer than the model's maximum length, {cfg.max_model_len}")
        # the last generated token is never fed back, so it needs no slot (unless it is verified as a draft)
        need = self.blocks.blocks_for(seq.max_len - (0 if cfg.num_lookahead_tokens else 1))
        if need > self.blocks.num_blocks:
            raise ValueError(f"the request needs {need} KV blocks of {self.blocks.block_size} tokens, "
                             f"more than the cache has ({self.blocks.num_blocks})")

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence (done, stopped by a stop string, or aborted) and free its blocks."""
        if seq.finished:
            return
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq.table)
        seq.status, seq.finish_reason = Status.FINISHED, reason

    # -- one step -------------------------------------------------------------------------

    def _preempt(self, seq: Sequence, batch: Batch) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.table)
        seq.num_computed, seq.status = 0, Status.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        # back to the queue ahead of everything that arrived after it
        pos = next((i for i, w in enumerate(self.waiting) if w.arrival_time > seq.arrival_time), len(self.waiting))
        self.waiting.insert(pos, seq)
        batch.preempted.append(seq)

    def schedule(self) -> Batch:
        cfg, batch = self.config, Batch()
        budget = cfg.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed, budget)
            # a decode reserves room for the draft tokens it may verify, never past its last token
            ahead = 0
            if cfg.num_lookahead_tokens and n == seq.num_uncomputed == 1:
                ahead = min(cfg.num_lookahead_tokens, seq.max_len - len(seq.token_ids))
            while not self.blocks.can_grow(seq.table, seq.num_computed + n + ahead):
                victim = self.running[-1]
                self._preempt(victim, batch)
                if victim is seq:
                    break
            if seq.status is not Status.RUNNING:
                break  # it preempted itself: everything newer is gone too
            self.blocks.grow(seq.table, seq.num_computed + n + ahead)
            batch.add(seq, n)
            budget -= n + ahead
            i += 1

        while self.waiting and budget > 0 and len(self.running) < cfg.max_num_seqs and not batch.preempted:
            seq = self.waiting[0]
            hit, _ = self.blocks.cached_prefix(seq.token_ids)
            cached = len(hit) * self.blocks.block_size
            n = min(len(seq.token_ids) - cached, budget)
            if n < len(seq.token_ids) - cached and not cfg.enable_chunked_prefill:
                break
            if not self.blocks.can_allocate(seq.token_ids, cached + n):
                break
            seq.table, got = self.blocks.allocate(seq.token_ids, cached + n)
            assert got == cached
            self.waiting.popleft()
            seq.num_computed, seq.status = cached, Status.RUNNING
            if seq.first_scheduled_time is None:
                seq.first_scheduled_time = time.perf_counter()
                seq.num_cached_tokens = cached
            self.running.append(seq)
            batch.add(seq, n)
            budget -= n
        return batch

    def update(self, batch: Batch, tokens: list, now: float | None = None) -> list[Sequence]:
        """Record a finished step: ``tokens[i]`` is the token sampled for ``batch.seqs[i]``
        (ignored where ``batch.samples[i]`` is false), or after a speculative step the list of
        tokens it emitted (kept drafts and the one after them: the keys and values of the
        fed-back token and of the kept drafts are now in the cache). Returns the sequences
        that finished."""
        if len(tokens) != len(batch):
            raise ValueError(f"one token per scheduled sequence expected: {len(batch)}, got {len(tokens)}")
        done, now = [], time.perf_counter() if now is None else now
        for seq, n, sample, token in zip(batch.seqs, batch.num_tokens, batch.samples, tokens, strict=True):
            if seq.status is not Status.RUNNING:
                continue  # aborted while the step ran
            emitted = token if isinstance(token, list) else [token]
            computed = seq.num_computed + (len(emitted) if isinstance(token, list) else n)
            if sample:
                for t in emitted:
                    seq.append(int(t), now)
                    if seq.finish_reason is not None:
                        break  # tokens past EOS or max_tokens are dropped
            seq.num_computed = min(computed, len(seq.token_ids))
            self.blocks.commit(seq.table, seq.token_ids, seq.num_computed)
            if seq.finish_reason is not None:
                reason, seq.finish_reason = seq.finish_reason, None
                self.finish(seq, reason)
                done.append(seq)
        return done
