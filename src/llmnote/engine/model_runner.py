"""Running one scheduled step on the model: pack the tokens, plan attention, sample.

The scheduler hands over a :class:`~llmnote.engine.scheduler.Batch`: sequences, how many new
tokens each computes, and which of them sample. The runner packs every new token of every
sequence into one ``(T,)`` batch (no padding), writes where each token's keys and values go
(its *slot*, from the sequence's block table) and runs the model once:

- a step of decodes only (one token each) goes through ``paged_attention_decode``; on a GPU it
  replays a CUDA graph captured for the next larger batch size, its inputs copied into the
  graph's static buffers (rows beyond the batch point at a scratch block that no sequence
  owns);
- any other step (prefills, prefill chunks, recomputation, decodes mixed in) runs eagerly
  through variable-length FlashAttention; sequences that already have cached tokens attend to
  them through their slots.

Logits are computed only for the rows that sample, and the sampled tokens come back to the
host in one copy per step.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

from ..layers.kv_cache import AttentionContext, KVCache
from .sampler import SamplingTensors, greedy, sample
from .scheduler import Batch

__all__ = ["Launched", "ModelRunner", "Work", "graph_batch_sizes"]


@dataclass
class Work:
    """One sequence's part of a forward pass: positions ``start .. start+n-1``, stored through
    the block table ``blocks``; logits for the last of them if ``sample``. ``tokens`` holds the
    sequence's token ids from position ``offset`` on: the whole history (``offset`` 0), or only
    the ids this step consumes (``offset == start``, as a tensor-parallel worker receives them)."""

    tokens: list[int]
    blocks: list[int]
    start: int
    n: int
    sample: bool = True
    offset: int = 0

    @staticmethod
    def of(batch: Batch) -> list[Work]:
        return [Work(s.token_ids, s.table.blocks, s.num_computed, n, sample)
                for s, n, sample in zip(batch.seqs, batch.num_tokens, batch.samples)]  # fmt: skip

    def input_ids(self) -> list[int]:
        """The token ids this step consumes, those of positions ``start .. start+n-1``."""
        first = self.start - self.offset
        return self.tokens[first : first + self.n]


@dataclass
class Launched:
    """A launched step's sampled tokens: ``device`` ``(S,)`` int64 for the ``S`` items that
    sample, and their copy on its way to the host (readable once ``done`` has passed)."""

    device: torch.Tensor | None
    host: torch.Tensor | None
    done: torch.cuda.Event | None
    samples: list[bool]

    def tokens(self) -> list[int | None]:
        """One token per item that samples, ``None`` for the others: waits for the copy."""
        if self.done is not None:
            self.done.synchronize()
        drawn = iter(self.host.tolist() if self.host is not None else ())
        return [next(drawn) if s else None for s in self.samples]


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The decode batch sizes that get a CUDA graph: 1, 2, 4, 8, then every 16 up to the
    limit (a batch runs in the smallest graph that holds it)."""
    sizes = [b for b in (1, 2, 4, 8) if b < max_num_seqs] + list(range(16, max_num_seqs, 16))
    return sorted(set(sizes + [max_num_seqs]))


class ModelRunner:
    """Owns the KV pool of ``num_blocks`` blocks (plus one scratch block) and runs steps."""

    def __init__(self, model, num_blocks: int, block_size: int, max_num_seqs: int, max_model_len: int,
                 enforce_eager: bool = False, kv_dtype: torch.dtype | None = None):  # fmt: skip
        self.model, self.config = model, model.config
        p = model.lm_head.weight
        self.device, self.dtype = p.device, p.dtype
        self.block_size, self.max_num_seqs, self.max_model_len = block_size, max_num_seqs, max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        self.scratch = num_blocks  # the extra block: padded graph rows write there
        self.cache = KVCache(model.cache_config(), max_num_seqs, max_model_len, block_size, num_blocks + 1,
                             device=self.device, dtype=self.dtype, kv_dtype=kv_dtype)  # fmt: skip
        self.use_graphs = self.device.type == "cuda" and not enforce_eager
        if self.device.type == "cuda":  # pinned buffers the sampled tokens are copied into, in turn
            self.h_tokens, self._ring = [torch.empty(max_num_seqs, dtype=torch.int64).pin_memory() for _ in range(3)], 0
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._cu: dict[int, torch.Tensor] = {}  # rows -> 0, 1, .., rows (see decode_context)
        if self.use_graphs:
            self._capture()

    # -- planning ---------------------------------------------------------------------------

    def _tables(self, work: list[Work]) -> np.ndarray:
        """Block tables ``(len(work), widest)``, padded with the scratch block (the kernels read
        a row only as far as its sequence's length). Built with one pass over the block ids and
        one masked store: a tensor made from nested Python lists costs several times as much,
        which at hundreds of sequences is milliseconds every step."""
        lens = np.fromiter((len(w.blocks) for w in work), dtype=np.int64, count=len(work))
        flat = np.fromiter(itertools.chain.from_iterable(w.blocks for w in work), dtype=np.int32, count=int(lens.sum()))
        tables = np.full((len(work), int(lens.max())), self.scratch, dtype=np.int32)
        tables[np.arange(tables.shape[1])[None, :] < lens[:, None]] = flat
        return tables

    def _slots(self, tables: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions ``starts[i] .. starts[i]+counts[i]-1`` of every row, packed, and where they
        live: block ``tables[row, pos // block_size]``, offset ``pos % block_size``."""
        first = np.cumsum(counts) - counts  # where each row's tokens start in the packed batch
        rows = np.repeat(np.arange(len(counts)), counts)
        pos = np.arange(int(counts.sum())) + np.repeat(starts - first, counts)
        return pos, tables[rows, pos // self.block_size].astype(np.int64) * self.block_size + pos % self.block_size

    def plan(self, work: list[Work], known_ids: bool = True) -> tuple[torch.Tensor, AttentionContext, torch.Tensor, list[int]]:
        """Token ids ``(T,)``, the attention context, the rows of the packed tokens whose logits
        are wanted (the last token of each item that samples), and the order in which the items
        were packed: one-token items first (the paged kernel takes them), then the others. The
        host's arithmetic is numpy (on arrays this small a torch call costs several times more),
        and each input crosses to the device once."""
        order = [i for i, w in enumerate(work) if w.n == 1] + [i for i, w in enumerate(work) if w.n > 1]
        work = [work[i] for i in order]
        num_decodes = sum(w.n == 1 for w in work)
        starts = np.fromiter((w.start for w in work), dtype=np.int64, count=len(work))
        counts = np.fromiter((w.n for w in work), dtype=np.int64, count=len(work))
        lens = starts + counts
        cu = np.concatenate([[0], np.cumsum(counts)])
        rows = [int(cu[i + 1]) - 1 for i, w in enumerate(work) if w.sample]
        tables = self._tables(work)
        positions, slots = self._slots(tables, starts, counts)
        ids = list(itertools.chain.from_iterable(w.input_ids() for w in work)) if known_ids else []
        dev = self.device

        def put(a: np.ndarray, dtype=None) -> torch.Tensor:
            return torch.from_numpy(a if dtype is None else a.astype(dtype)).to(dev)

        pre = slice(num_decodes, None)
        ctx = AttentionContext(
            positions=put(positions),
            cu_seqlens_q=put(cu, np.int32),
            max_seqlen_q=int(counts.max()),
            max_seqlen_k=int(lens.max()),
            cache=self.cache,
            slot_mapping=put(slots),
            seq_lens=put(lens, np.int32),
            block_tables=put(tables),
            decode=num_decodes == len(work),
            num_decodes=num_decodes if num_decodes < len(work) else 0,
        )
        if not ctx.decode and bool((starts[pre] > 0).any()):  # chunks after cached tokens attend to those too
            ctx.key_slots = put(self._slots(tables[pre], np.zeros_like(starts[pre]), lens[pre])[1])
            ctx.cu_seqlens_k = put(np.concatenate([[0], np.cumsum(lens[pre])]), np.int32)
            ctx.max_seqlen_k = int(lens[pre].max())
        if not ctx.decode:
            ctx.max_seqlen_q = int(counts[pre].max())
        return torch.tensor(ids, dtype=torch.int64).to(dev), ctx, torch.tensor(rows, dtype=torch.int64).to(dev), order

    # -- running ----------------------------------------------------------------------------

    @torch.inference_mode()
    def logits(self, work: list[Work], ids: torch.Tensor | None = None) -> torch.Tensor:
        """``(S, vocab)`` logits of the items that sample, in the given order. ``ids``: the
        input tokens of one-token items as a tensor on the device, for a step launched before
        the host has them (the items' ``tokens`` are then not read)."""
        if ids is not None and not all(w.n == 1 for w in work):
            raise ValueError("input ids on the device are for steps of one-token items")
        if self.use_graphs and all(w.n == 1 for w in work) and len(work) <= self.max_num_seqs:
            return self._replay(work, ids)
        planned, ctx, rows, order = self.plan(work, known_ids=ids is None)
        logits = self.model.compute_logits(self.model.forward_tokens(planned if ids is None else ids, ctx)[rows])
        if order == sorted(order):
            return logits
        # back to the callers' order
        packed = [i for i in order if work[i].sample]
        return logits[torch.tensor(sorted(range(len(packed)), key=packed.__getitem__), dtype=torch.int64, device=logits.device)]

    @torch.inference_mode()
    def launch(self, work: list[Work], params: list, generators: list, ids: torch.Tensor | None = None) -> Launched:
        """Run ``work`` and sample without waiting for the result: the tokens stay on the device
        and a copy to the host is queued behind them. ``params``/``generators``: those of the
        items that sample, in order; ``ids`` as for :meth:`logits`."""
        logits = self.logits(work, ids)
        samples = [w.sample for w in work]
        if not logits.shape[0]:
            return Launched(None, None, None, samples)
        drawn = sample(logits, SamplingTensors.build(params, generators, logits.shape[-1], self.device))
        if not drawn.is_cuda:
            return Launched(drawn, drawn, None, samples)
        self._ring = (self._ring + 1) % len(self.h_tokens)  # two launches may be unread at once: three buffers
        if self.h_tokens[self._ring].numel() < len(drawn):
            self.h_tokens[self._ring] = torch.empty(2 * len(drawn), dtype=torch.int64).pin_memory()
        host = self.h_tokens[self._ring][: len(drawn)]
        host.copy_(drawn, non_blocking=True)  # valid once `done` has passed
        done = torch.cuda.Event()
        done.record()
        return Launched(drawn, host, done, samples)

    # -- CUDA graphs for decode -------------------------------------------------------------

    def _capture(self) -> None:
        """Capture one decode step per batch size in :func:`graph_batch_sizes`, largest first,
        sharing one memory pool. The graphs read static buffers, refilled before each replay from
        two pinned host buffers of the same layout, in two asynchronous copies: token ids,
        positions and slots (int64), then lengths and block tables (int32)."""
        n, dev, width = self.max_num_seqs, self.device, self.max_blocks
        self.h_meta = torch.zeros((3, n), dtype=torch.int64).pin_memory()
        self.h_i32 = torch.zeros(n + n * width, dtype=torch.int32).pin_memory()
        self.g_meta, self.g_i32 = self.h_meta.to(dev), self.h_i32.to(dev)
        self.g_ids, self.g_positions, self.g_slots = self.g_meta
        self.g_lens, self.g_tables = self.g_i32[:n], self.g_i32[n:].view(n, width)
        self.g_slots.fill_(self.scratch * self.block_size)
        self.g_lens.fill_(1)
        self.g_tables.fill_(self.scratch)
        self.staged = torch.cuda.Event()  # the last copies out of the pinned buffers
        self.g_logits: dict[int, torch.Tensor] = {}
        pool = None
        for b in reversed(graph_batch_sizes(n)):
            ctx = AttentionContext(
                positions=self.g_positions[:b], cu_seqlens_q=torch.arange(b + 1, dtype=torch.int32, device=dev),
                max_seqlen_q=1, max_seqlen_k=self.max_model_len, cache=self.cache, slot_mapping=self.g_slots[:b],
                seq_lens=self.g_lens[:b], block_tables=self.g_tables[:b], decode=True,
            )  # fmt: skip
            with torch.inference_mode():
                for _ in range(2):  # warm up: compile and autotune the kernels outside the capture
                    self.model.compute_logits(self.model.forward_tokens(self.g_ids[:b], ctx))
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.g_logits[b] = self.model.compute_logits(self.model.forward_tokens(self.g_ids[:b], ctx))
            pool = graph.pool()
            self.graphs[b] = graph
        self.g_slots.fill_(self.scratch * self.block_size)

    def decode_inputs(self, work: list[Work], size: int, meta: np.ndarray | None = None, lens: np.ndarray | None = None,
                      tables: np.ndarray | None = None, known_ids: bool = True) -> tuple[np.ndarray, ...]:  # fmt: skip
        """A replayed decode step's inputs for one-token ``work`` padded to ``size`` rows, written
        into ``meta`` ``(3, >= size)`` int64 (rows: token ids, positions, slots), ``lens``
        ``(>= size,)`` int32 and ``tables`` ``(>= size, >= widest)`` int32, or into new arrays:
        returns the three cut to ``size`` rows (and the tables to the widest row's width). A
        padding row holds one token at position 0 of the scratch block. ``known_ids=False``: the
        token ids are left at 0 (they come from the device)."""
        b, widest = len(work), max(len(w.blocks) for w in work)
        meta = np.empty((3, size), dtype=np.int64) if meta is None else meta[:, :size]
        lens = np.empty(size, dtype=np.int32) if lens is None else lens[:size]
        tables = np.empty((size, widest), dtype=np.int32) if tables is None else tables[:size, :widest]
        if b == 1:  # the common case of one sequence, without the batched bookkeeping
            blocks = work[0].blocks
            tables[0, : len(blocks)] = blocks
            tables[0, len(blocks) :] = self.scratch
        else:
            tables[:b] = self._tables(work)
        tables[b:] = self.scratch
        meta[0, :b] = [w.tokens[w.start - w.offset] for w in work] if known_ids else 0  # one token each (input_ids, inlined)
        meta[1, :b] = [w.start for w in work]
        meta[:2, b:] = 0
        pos = meta[1, :b]
        meta[2, :b] = tables[np.arange(b), pos // self.block_size].astype(np.int64) * self.block_size + pos % self.block_size
        meta[2, b:] = self.scratch * self.block_size
        lens[:] = meta[1] + 1
        return meta, lens, tables

    def _replay(self, work: list[Work], ids: torch.Tensor | None = None) -> torch.Tensor:
        b, n = len(work), self.max_num_seqs
        size = min(s for s in self.graphs if s >= b)
        self.staged.synchronize()  # the last step's copies out of the pinned buffers are done
        i32 = self.h_i32.numpy()
        self.decode_inputs(work, size, self.h_meta.numpy(), i32[:n], i32[n:].reshape(n, self.max_blocks), ids is None)
        self.g_meta.copy_(self.h_meta, non_blocking=True)
        rows = n + size * self.max_blocks  # the lengths and the first size rows of the tables, whole
        self.g_i32[:rows].copy_(self.h_i32[:rows], non_blocking=True)
        self.staged.record()
        if ids is not None:  # the tokens the step before sampled, still on the device
            self.g_ids[:b].copy_(ids)
        self.graphs[size].replay()
        wanted = [i for i, w in enumerate(work) if w.sample]
        logits = self.g_logits[size]
        return logits[:b] if len(wanted) == b else logits[torch.tensor(wanted, dtype=torch.int64, device=logits.device)]

    # -- greedy decode steps on the device (a draft model's proposals) ------------------------

    def greedy_steps(self, ids: torch.Tensor, contexts: list[AttentionContext], out: torch.Tensor) -> None:
        """Greedy decode steps of one row per sequence: step ``j`` feeds the tokens the step before
        chose (``ids`` first) through ``contexts[j]`` and writes its choices to ``out[j]``. Tensor
        operations only, no value read on the host, so a CUDA graph can hold them."""
        for j, ctx in enumerate(contexts):
            ids = greedy(self.model.compute_logits(self.model.forward_tokens(ids, ctx)))
            out[j] = ids

    def slots(self, pos: torch.Tensor, tables: torch.Tensor) -> torch.Tensor:
        """The cache slot of each position in ``pos`` ``(S, R)`` (on the device) of the rows whose
        block tables are ``tables`` ``(R, width)``, by tensor operations only (a CUDA graph can
        hold them); a position past the table's width goes to the scratch block."""
        bs, width = self.block_size, tables.shape[1]
        index = pos // bs
        blocks = tables.gather(1, index.clamp(max=width - 1).T).T.to(torch.int64)
        return torch.where(index < width, blocks, self.scratch) * bs + pos % bs

    def decode_context(self, pos: torch.Tensor, tables: torch.Tensor, max_len: int, slots: torch.Tensor | None = None,
                       lens: torch.Tensor | None = None) -> AttentionContext:  # fmt: skip
        """The attention context of a decode pass of one-token rows at positions ``pos`` ``(R,)``
        (on the device) through the block ``tables`` ``(R, width)``; their ``slots`` and ``lens``
        (``pos + 1``, int32) unless given."""
        slots = self.slots(pos[None], tables)[0] if slots is None else slots
        lens = (pos + 1).to(torch.int32) if lens is None else lens
        cu = self._cu.get(pos.shape[0])
        if cu is None:  # kept: a tensor made outside a graph's capture is one the graph can read
            cu = self._cu[pos.shape[0]] = torch.arange(pos.shape[0] + 1, dtype=torch.int32, device=pos.device)
        return AttentionContext(positions=pos, cu_seqlens_q=cu, max_seqlen_q=1, max_seqlen_k=max_len, cache=self.cache,
                                slot_mapping=slots, seq_lens=lens, block_tables=tables, decode=True)  # fmt: skip

    @torch.inference_mode()
    def chain(self, ids: torch.Tensor, base: list[int], tables: list[list[int]], steps: int) -> torch.Tensor:
        """``(B, steps)`` int64 on the device: greedy decode steps for ``B`` sequences whose last
        known token sits at position ``base[i]``, starting from the tokens ``ids`` ``(B,)`` (on the
        device) at ``base + 1``; their keys and values go through the block ``tables``."""
        dev, b = self.device, len(base)
        padded = np.full((b, max(len(t) for t in tables)), self.scratch, dtype=np.int32)
        for i, blocks in enumerate(tables):
            padded[i, : len(blocks)] = blocks
        table_t = torch.from_numpy(padded).to(dev)
        pos = torch.tensor(base, dtype=torch.int64, device=dev) + torch.arange(1, steps + 1, device=dev)[:, None]
        out = torch.empty((steps, b), dtype=torch.int64, device=dev)
        self.greedy_steps(ids, [self.decode_context(p, table_t, max(base) + steps + 1) for p in pos], out)
        return out.T
