"""Speculative decoding with a draft model (Leviathan et al., 2023; Chen et al., 2023).

A small draft model proposes ``k`` tokens one at a time; the target model scores all of them
in one forward pass of ``k + 1`` positions per sequence, which costs about as much as one
decode step because decode is bound by reading the weights. Draft token ``d_i``, proposed
from the draft's distribution ``q_i``, is kept with probability ``min(1, p_i(d_i) / q_i(d_i))``
under the target's ``p_i``; at the first rejection a token is drawn from the normalised
residual ``max(0, p_i - q_i)``, and when all ``k`` are kept a bonus token is drawn from
``p_{k+1}``. Every token emitted this way is distributed exactly as if the target had sampled
it alone, so speculation changes the speed, never the output's distribution; with greedy
decoding (one-hot ``p`` and ``q``) it emits exactly the target's greedy tokens.

Both models keep keys and values in pools indexed by the same block tables. The draft lags the
target by at most one token (after a round that kept all ``k`` drafts, the last draft was never
fed to the draft model), so each round starts by feeding it what it has not seen. Every pass is
made of one-token rows (see :func:`_rows`), so on a GPU it replays a decode step's CUDA graph; the
drafts stay on the device between passes (each draft pass reads the last one's token there, and
the verifying pass its inputs), so a round copies to the host once, at its end.

A greedy round needs nothing from the host but the block tables: :meth:`SpeculativeDecoder.launch`
runs one as a function of a small state on the device (each row's length, last token and the token
before it), which the round itself advances by the tokens it emits. On a GPU the whole round (the
draft's passes, the verifying pass and the acceptance) is one CUDA graph, and the engine can
launch the next round before the host has read this one's tokens, as it does for plain decode
steps: the GPU then never waits for the host's bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .model_runner import ModelRunner, Work, graph_batch_sizes
from .sampler import SamplingTensors, exponential_noise, greedy, probabilities, sample_probs
from .scheduler import Batch
from .sequence import Sequence

__all__ = ["Round", "SpeculativeDecoder", "rejection_sample"]


def rejection_sample(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                     generators: list[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Accept or reject ``drafts`` (B, k), proposed from ``q`` (B, k, V), under the target's
    ``p`` (B, k+1, V) (rows need not be normalised). Returns the number of drafts kept per row,
    ``(B,)``, and the token that follows them, ``(B,)``: a residual sample at the first
    rejection, else a bonus sample from the last position."""
    b, k, _ = q.shape
    p = p / p.sum(-1, keepdim=True)
    q = q / q.sum(-1, keepdim=True)
    rows = torch.arange(b, device=p.device)[:, None]
    cols = torch.arange(k, device=p.device)[None, :]
    p_d, q_d = p[rows, cols, drafts], q[rows, cols, drafts]
    uniform = -torch.expm1(-exponential_noise((b, k), p.device, generators))  # U(0, 1) from Exp(1): 1 - e^-x
    accepted = (uniform * q_d < p_d).int().cumprod(-1)  # keep d_i while every earlier draft was kept
    kept = accepted.sum(-1)
    at = torch.clamp(kept, max=k - 1)
    residual = torch.clamp(p[rows[:, 0], at] - q[rows[:, 0], at], min=0)
    # p == q at the rejected position leaves no residual mass; it cannot be rejected then, but guard anyway
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, p[rows[:, 0], at])
    last = torch.where((kept == k)[:, None], p[:, k], residual)
    return kept, sample_probs(last, generators)


@dataclass
class Round:
    """A greedy round launched on the device (see :meth:`SpeculativeDecoder.launch`): per
    sequence, the drafts kept, the token after them and the ``k`` drafts, on their way to the
    host (readable once ``done`` has passed)."""

    decoder: SpeculativeDecoder
    seqs: list[Sequence]
    host: torch.Tensor
    done: torch.cuda.Event | None

    def tokens(self) -> list[list[int]]:
        """The tokens each sequence emits: waits for the copy."""
        return self.decoder.collect(self)


class SpeculativeDecoder:
    """Runs the draft model beside the target: keeps the draft's cache in step with the target's
    on ordinary steps, and on decode steps proposes, verifies and accepts."""

    def __init__(self, draft_runner: ModelRunner, num_tokens: int):
        if num_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_tokens}")
        self.draft, self.k = draft_runner, num_tokens
        self.seen: dict[int, int] = {}  # seq_id -> tokens whose draft KV is in the draft's cache
        self.proposed = self.accepted = 0
        self._pinned: torch.Tensor | None = None  # see _staged
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}  # batch size -> a captured greedy round
        self.target: ModelRunner | None = None  # set by prepare()

    # -- greedy rounds on the device --------------------------------------------------------

    def prepare(self, target: ModelRunner, max_seqs: int) -> None:
        """Allocate the rounds' state for up to ``max_seqs`` sequences and, where the runners use
        CUDA graphs, capture one round per batch size of :func:`graph_batch_sizes`. The state has
        four rows: lengths, last tokens, the tokens before them, and 1 for a sequence (0 for a
        padding row, which stays at positions 0 .. k+1 of the scratch block)."""
        self.target, dev, k = target, target.device, self.k
        cuda = dev.type == "cuda"
        n, width = max_seqs, target.max_blocks
        self.h_state = torch.zeros((4, n), dtype=torch.int64, pin_memory=cuda)
        self.h_tables = torch.full((n, width), target.scratch, dtype=torch.int32, pin_memory=cuda)
        self.h_out = [torch.zeros((n, k + 2), dtype=torch.int64, pin_memory=cuda) for _ in range(3)]  # two rounds unread at once
        self._ring = 0
        self.g_state, self.g_tables = self.h_state.to(dev, copy=True), self.h_tables.to(dev, copy=True)
        self.g_state[0].fill_(2)
        self._offsets = torch.arange(-2, k, device=dev)[:, None]  # a round's positions, from L-2
        self.staged = torch.cuda.Event() if cuda else None  # the last copies out of h_state and h_tables
        self.g_out: dict[int, torch.Tensor] = {}
        if not (target.use_graphs and self.draft.use_graphs) or k + 2 > target.block_size:
            return
        pool = None
        for b in reversed(graph_batch_sizes(n)):
            self.g_out[b] = torch.zeros((b, k + 2), dtype=torch.int64, device=dev)
            with torch.inference_mode():
                for _ in range(2):  # compile and autotune outside the capture (every row inactive: nothing moves)
                    self._round(b, self.g_out[b])
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self._round(b, self.g_out[b])
            pool = graph.pool()
            self.graphs[b] = graph

    def _round(self, b: int, out: torch.Tensor) -> None:
        """One greedy round for the first ``b`` rows of the state, tensor operations only: the
        draft reads the last two tokens (positions L-2 and L-1; the first only to refresh its
        keys and values) and drafts ``k`` tokens one step at a time, the target scores positions
        L-1 .. L-1+k in one pass, drafts are kept while they equal the target's argmax, and the
        state moves on by the tokens emitted. Writes ``(kept, next, drafts...)`` per row into
        ``out`` ``(b, k+2)``. The positions of the round, their slots (one block size and one
        block numbering in both pools) and lengths are computed once, a row per position."""
        k, target, draft = self.k, self.target, self.draft
        lens, last, before, active = self.g_state[:, :b]
        tables = self.g_tables[:b]
        pos = lens + self._offsets  # (k + 2, b): positions L-2 .. L+k-1
        slots, seq_lens = target.slots(pos, tables), (pos + 1).to(torch.int32)

        def context(runner: ModelRunner, rows: slice, row_tables: torch.Tensor):
            return runner.decode_context(pos[rows].reshape(-1), row_tables, runner.max_model_len, slots[rows].reshape(-1),
                                         seq_lens[rows].reshape(-1))  # fmt: skip

        ids = torch.stack([before, last]).flatten()  # rows at L-2 (all sequences), then at L-1
        hidden = draft.model.forward_tokens(ids, context(draft, slice(0, 2), tables.repeat(2, 1)))
        drafts = torch.empty((k, b), dtype=torch.int64, device=lens.device)
        drafts[0] = greedy(draft.model.compute_logits(hidden[b:]))
        draft.greedy_steps(drafts[0], [context(draft, slice(j, j + 1), tables) for j in range(2, k + 1)], drafts[1:])
        ids = torch.cat([last[None], drafts])  # (k + 1, b): the inputs at positions L-1 .. L-1+k
        hidden = target.model.forward_tokens(ids.flatten(), context(target, slice(1, k + 2), tables.repeat(k + 1, 1)))
        best = greedy(target.model.compute_logits(hidden)).view(k + 1, b)
        kept = (drafts == best[:k]).cumprod(0).sum(0)
        out[:, 0], out[:, 1], out[:, 2:] = kept, best.gather(0, kept[None])[0], drafts.T
        before.copy_(ids.gather(0, kept[None])[0])  # the last token, or the last draft kept
        last.copy_(out[:, 1])
        lens.add_((kept + 1) * active)

    def can_launch(self, batch: Batch) -> bool:
        """Whether :meth:`launch` can run this batch: every sequence greedy, with room for ``k + 1``
        more tokens, and the draft's cache filled up to its last two tokens."""
        if self.target is None or len(batch) > self.h_state.shape[1] or (self.target.use_graphs and not self.graphs):
            return False
        return all(s.params.greedy and len(s.token_ids) + self.k + 1 <= s.max_len
                   and self._draft_start(s) >= len(s.token_ids) - 2 for s in batch.seqs)  # fmt: skip

    @torch.inference_mode()
    def launch(self, batch: Batch, fresh: bool = True) -> Round:
        """Run a greedy round (:meth:`_round`) for ``batch`` without waiting for it: one graph
        replay on a GPU. ``fresh``: the state is written from the sequences; else it is the one the
        last round, launched for the same batch, left on the device (whose tokens the host may
        not have read yet: the tables must hold blocks for that round's tokens and this one's)."""
        seqs, b = batch.seqs, len(batch)
        size = min((s for s in self.graphs if s >= b), default=b)
        if self.staged is not None:
            self.staged.synchronize()  # the last launch's copies out of the host buffers are done
        tables = self.h_tables.numpy()[:size]
        tables[:] = self.target.scratch
        for i, s in enumerate(seqs):
            tables[i, : len(s.table.blocks)] = s.table.blocks
        self.g_tables[:size].copy_(self.h_tables[:size], non_blocking=True)
        if fresh:
            state = self.h_state.numpy()
            state[:] = np.array([2, 0, 0, 0])[:, None]
            state[:, :b] = np.array([[len(s.token_ids), s.token_ids[-1], s.token_ids[-2], 1] for s in seqs]).T
            self.g_state.copy_(self.h_state, non_blocking=True)
        if self.staged is not None:
            self.staged.record()
        if size in self.graphs:
            self.graphs[size].replay()
            out = self.g_out[size][:b]
        else:
            out = torch.empty((b, self.k + 2), dtype=torch.int64, device=self.g_state.device)
            self._round(b, out)
        if not out.is_cuda:
            return Round(self, seqs, out, None)
        self._ring = (self._ring + 1) % len(self.h_out)
        host = self.h_out[self._ring][:b]
        host.copy_(out, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return Round(self, seqs, host, done)

    def collect(self, launched: Round) -> list[list[int]]:
        """The tokens each sequence of a launched round emits (the drafts kept and the target's
        token after them); counts the drafts proposed and kept."""
        if launched.done is not None:
            launched.done.synchronize()
        out = []
        for s, (a, x, *d) in zip(launched.seqs, launched.host.tolist()):
            out.append(d[:a] + [x])
            if not s.finished:  # (a round launched ahead may hold a sequence that has finished since)
                self.seen[s.seq_id] = len(s.token_ids) + min(a, self.k - 1)
                self.proposed += self.k
                self.accepted += a
        return out

    # -- ordinary steps, and rounds that sample ---------------------------------------------

    def _draft_start(self, seq: Sequence) -> int:
        return min(self.seen.get(seq.seq_id, 0), seq.num_computed)  # a preempted sequence starts over

    def follow(self, batch: Batch) -> None:
        """After an ordinary step: feed the draft the same tokens (and any it lagged behind)."""
        work = []
        for seq, n in zip(batch.seqs, batch.num_tokens):
            start = self._draft_start(seq)
            work.append(Work(seq.token_ids, seq.table.blocks, start, seq.num_computed + n - start, sample=False))
            self.seen[seq.seq_id] = seq.num_computed + n
        with torch.inference_mode():
            ids, ctx, _, _ = self.draft.plan(work)
            self.draft.model.forward_tokens(ids, ctx)

    def rounds(self, batch: Batch) -> int:
        """How many tokens to draft this step: ``k``, fewer near a sequence's last token."""
        return min(self.k, *(s.max_len - len(s.token_ids) for s in batch.seqs))

    @torch.inference_mode()
    def step(self, batch: Batch, target: ModelRunner, params: list, generators: list, k: int) -> list[list[int]]:
        """One speculative step for a batch of decodes, pass by pass: the tokens each sequence
        emits. For rounds that sample, and greedy rounds :meth:`launch` cannot take (a sequence
        within ``k`` tokens of its end, or one whose draft cache lags by more than one token)."""
        seqs, vocab = batch.seqs, target.config.vocab_size
        t = SamplingTensors.build(params, generators, vocab, target.device)
        drafts, qs = [], []  # the drafted tokens, and (when sampling) the draft's distributions
        for j in range(1 if t.greedy else k):  # greedy: the first pass, then the rest as one chain
            if j == 0:  # what the draft has not seen: the last token, or two after a round that kept every draft
                work = [w for s in seqs for w in _rows(s.token_ids, s.table.blocks, self._draft_start(s), len(s.token_ids))]
                logits = self.draft.logits(work)
            else:  # the token drafted last is the input, read on the device: the host waits for nothing
                work = [Work(s.token_ids, s.table.blocks, len(s.token_ids) - 1 + j, 1) for s in seqs]
                logits = self.draft.logits(work, ids=drafts[-1])
            if t.greedy:  # one-hot q: the draft's argmax, with no distribution to keep
                drafts.append(greedy(logits))
            else:
                qs.append(probabilities(logits, t))
                drafts.append(sample_probs(qs[-1], generators))
        if t.greedy and k > 1:  # steps 2 .. k, each fed the last one's argmax on the device
            last = [len(s.token_ids) - 1 for s in seqs]
            drafts.append(self.draft.chain(drafts[0], last, [s.table.blocks for s in seqs], k - 1))
        drafts_t = torch.cat([d if d.dim() == 2 else d[:, None] for d in drafts], 1)
        # the target scores the last emitted token and the k drafts, positions L-1 .. L-1+k, as
        # one-token rows whose inputs are assembled on the device
        last = self._staged([s.token_ids[-1] for s in seqs], target.device)
        ids = torch.cat([last[:, None], drafts_t.to(torch.int64)], 1).flatten()
        verify = [w for s in seqs for w in _rows(s.token_ids, s.table.blocks, len(s.token_ids) - 1, len(s.token_ids) + k,
                                                 every=True)]  # fmt: skip
        logits = target.logits(verify, ids=ids).view(len(seqs), k + 1, -1)
        if t.greedy:  # rejection sampling with one-hot p and q: drafts are kept while they equal the
            best = greedy(logits.flatten(0, 1)).view(len(seqs), k + 1)  # target's argmax, and the target's comes next
            kept = (drafts_t == best[:, :k]).int().cumprod(1).sum(1)
            nxt = best.gather(1, kept[:, None]).squeeze(1)
        else:
            p_all = probabilities(logits.flatten(0, 1), _repeat(t, k + 1)).view(len(seqs), k + 1, -1)
            kept, nxt = rejection_sample(p_all, torch.stack(qs, 1), drafts_t, generators)
        # the round's one copy to the host: per sequence, drafts kept, the token after them, the drafts
        rows = torch.cat([kept.long()[:, None], nxt.long()[:, None], drafts_t.long()], 1).tolist()
        out = []
        for s, (a, x, *d) in zip(seqs, rows):
            out.append(d[:a] + [x])
            self.seen[s.seq_id] = len(s.token_ids) + min(a, k - 1)
        kept = [row[0] for row in rows]
        self.proposed += k * len(seqs)
        self.accepted += sum(kept)
        return out

    def _staged(self, values: list[int], device: torch.device) -> torch.Tensor:
        """``values`` as an int64 tensor on ``device``, copied from a pinned buffer so that the host
        does not wait (a copy from ordinary memory would block it until the drafts are done). The
        buffer is free again next round: a round ends by reading its results on the host."""
        if device.type != "cuda":
            return torch.tensor(values, dtype=torch.int64)
        if self._pinned is None or self._pinned.numel() < len(values):
            self._pinned = torch.empty(max(64, 2 * len(values)), dtype=torch.int64).pin_memory()
        host = self._pinned[: len(values)]
        host.numpy()[:] = values
        return host.to(device, non_blocking=True)

    def forget(self, seq: Sequence) -> None:
        self.seen.pop(seq.seq_id, None)

    @property
    def acceptance_rate(self) -> float:
        """Drafts kept over drafts proposed. Not the per-token acceptance probability of the
        analysis: drafts after a rejection are never kept, so this falls as ``k`` grows."""
        return self.accepted / self.proposed if self.proposed else 0.0


def _rows(tokens: list[int], blocks: list[int], start: int, stop: int, every: bool = False) -> list[Work]:
    """Positions ``start .. stop-1`` as one-token rows: in one forward pass every layer writes all
    the rows' keys and values before attending, so each row is a decode query that sees the rows
    before it, and the pass has the shape of a decode step (a replayed CUDA graph). Logits for
    every row if ``every``, else for the last."""
    return [Work(tokens, blocks, p, 1, sample=every or p == stop - 1) for p in range(start, stop)]


def _repeat(t: SamplingTensors, times: int) -> SamplingTensors:
    """Each row's parameters ``times`` times in a row (one per verified position)."""
    rep = lambda x: x.repeat_interleave(times)  # noqa: E731
    return SamplingTensors(rep(t.temperature), rep(t.top_k), rep(t.top_p), rep(t.min_p),
                           [g for g in t.generators for _ in range(times)], t.greedy, t.filtered)  # fmt: skip
