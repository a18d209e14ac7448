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
from .sampler import SamplingTensors, sample
from .scheduler import Batch

__all__ = ["ModelRunner", "Work", "graph_batch_sizes"]


@dataclass
class Work:
    """One sequence's part of a forward pass: positions ``start .. start+n-1`` of ``tokens``,
    stored through the block table ``blocks``; logits for the last of them if ``sample``."""

    tokens: list[int]
    blocks: list[int]
    start: int
    n: int
    sample: bool = True

    @staticmethod
    def of(batch: Batch) -> list[Work]:
        return [Work(s.token_ids, s.table.blocks, s.num_computed, n, sample)
                for s, n, sample in zip(batch.seqs, batch.num_tokens, batch.samples)]  # fmt: skip


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
        self.cache = KVCache(self.config, max_num_seqs, max_model_len, block_size, num_blocks + 1,
                             device=self.device, dtype=self.dtype, kv_dtype=kv_dtype)  # fmt: skip
        self.use_graphs = self.device.type == "cuda" and not enforce_eager
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
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

    def plan(self, work: list[Work]) -> tuple[torch.Tensor, AttentionContext, torch.Tensor, list[int]]:
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
        ids = [t for w in work for t in w.tokens[w.start : w.start + w.n]]
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
    def logits(self, work: list[Work]) -> torch.Tensor:
        """``(S, vocab)`` logits of the items that sample, in the given order."""
        if self.use_graphs and all(w.n == 1 for w in work) and len(work) <= self.max_num_seqs:
            return self._replay(work)
        ids, ctx, rows, order = self.plan(work)
        logits = self.model.compute_logits(self.model.forward_tokens(ids, ctx)[rows])
        if order == sorted(order):
            return logits
        # back to the callers' order
        packed = [i for i in order if work[i].sample]
        return logits[torch.tensor(sorted(range(len(packed)), key=packed.__getitem__), dtype=torch.int64, device=logits.device)]

    @torch.inference_mode()
    def execute(self, batch: Batch, params: list, generators: list) -> list[int | None]:
        """Run ``batch`` and sample: one token per sequence that samples (``None`` for the
        others). ``params``/``generators``: the sampling parameters and generators of the
        sampling sequences, in batch order."""
        logits = self.logits(Work.of(batch))
        tokens: list[int | None] = [None] * len(batch)
        if logits.shape[0]:
            t = SamplingTensors.build(params, generators, logits.shape[-1], self.device)
            drawn = iter(sample(logits, t).tolist())  # the step's one copy to the host
            for i in (i for i, s in enumerate(batch.samples) if s):
                tokens[i] = next(drawn)
        return tokens

    # -- CUDA graphs for decode -------------------------------------------------------------

    def _capture(self) -> None:
        """Capture one decode step per batch size in :func:`graph_batch_sizes`, largest first,
        sharing one memory pool; the inputs are static buffers refilled before each replay."""
        n, dev = self.max_num_seqs, self.device
        self.g_ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.g_positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.g_slots = torch.full((n,), self.scratch * self.block_size, dtype=torch.int64, device=dev)
        self.g_lens = torch.ones(n, dtype=torch.int32, device=dev)
        self.g_tables = torch.full((n, self.max_blocks), self.scratch, dtype=torch.int32, device=dev)
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

    def decode_inputs(self, work: list[Work], size: int) -> tuple[np.ndarray, np.ndarray]:
        """A replayed decode step's inputs for one-token ``work`` padded to ``size`` rows:
        ``(4, size)`` int64 rows of token ids, positions, slots and lengths, and ``(size, widest)``
        int32 block tables. A padding row holds one token at position 0 of the scratch block."""
        b = len(work)
        tables = np.full((size, max(len(w.blocks) for w in work)), self.scratch, dtype=np.int32)
        tables[:b] = self._tables(work)
        meta = np.zeros((4, size), dtype=np.int64)
        meta[0, :b] = [w.tokens[w.start] for w in work]
        meta[1, :b] = [w.start for w in work]
        pos = meta[1, :b]
        meta[2] = self.scratch * self.block_size
        meta[2, :b] = tables[np.arange(b), pos // self.block_size].astype(np.int64) * self.block_size + pos % self.block_size
        meta[3] = meta[1] + 1
        return meta, tables

    def _replay(self, work: list[Work]) -> torch.Tensor:
        b = len(work)
        size = min(s for s in self.graphs if s >= b)
        meta, tables = (torch.from_numpy(a) for a in self.decode_inputs(work, size))
        for buffer, row in zip((self.g_ids, self.g_positions, self.g_slots), meta[:3]):
            buffer[:size].copy_(row, non_blocking=True)
        self.g_lens[:size].copy_(meta[3].to(torch.int32), non_blocking=True)
        self.g_tables[:size, : tables.shape[1]].copy_(tables, non_blocking=True)  # the kernel reads no further
        self.graphs[size].replay()
        wanted = [i for i, w in enumerate(work) if w.sample]
        logits = self.g_logits[size]
        return logits[:b] if len(wanted) == b else logits[torch.tensor(wanted, dtype=torch.int64, device=logits.device)]
