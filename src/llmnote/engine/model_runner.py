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

import torch

from ..layers.kv_cache import AttentionContext, KVCache
from .sampler import SamplingTensors, sample
from .scheduler import Batch

__all__ = ["ModelRunner", "Work", "graph_batch_sizes"]


@dataclass
class Work:
    """One sequence's part of a forward pass: positions ``start .. start+n-1`` of ``tokens``,
    stored through the block table ``blocks``; logits for the last of them if ``sample``, for
    all of them if ``all_logits`` (verifying draft tokens)."""

    tokens: list[int]
    blocks: list[int]
    start: int
    n: int
    sample: bool = True
    all_logits: bool = False

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

    def _slot(self, blocks: list[int], pos: int) -> int:
        return blocks[pos // self.block_size] * self.block_size + pos % self.block_size

    def _tables(self, work: list[Work]) -> torch.Tensor:
        return torch.tensor([w.blocks + [self.scratch] * (self.max_blocks - len(w.blocks)) for w in work], dtype=torch.int32)

    def plan(self, work: list[Work]) -> tuple[torch.Tensor, AttentionContext, torch.Tensor]:
        """Token ids ``(T,)``, the attention context, and the rows of the packed tokens whose
        logits are wanted (each item's last token, or all its tokens for ``all_logits``)."""
        ids, positions, slots, lens, new, rows = [], [], [], [], [], []
        for w in work:
            stop = w.start + w.n
            if w.all_logits:
                rows += range(len(ids), len(ids) + w.n)
            elif w.sample:
                rows.append(len(ids) + w.n - 1)
            ids += w.tokens[w.start : stop]
            positions += range(w.start, stop)
            slots += [self._slot(w.blocks, p) for p in range(w.start, stop)]
            lens.append(stop)
            new.append(w.n)
        dev = self.device

        def on_device(values, dtype=torch.int64):
            return torch.tensor(values, dtype=dtype).to(dev, non_blocking=True)

        ctx = AttentionContext(
            positions=on_device(positions),
            cu_seqlens_q=on_device([0, *itertools.accumulate(new)], torch.int32),
            max_seqlen_q=max(new),
            max_seqlen_k=max(lens),
            cache=self.cache,
            slot_mapping=on_device(slots),
            seq_lens=on_device(lens, torch.int32),
            block_tables=self._tables(work).to(dev, non_blocking=True),
            decode=max(new) == 1,
        )
        if not ctx.decode and any(w.start for w in work):  # chunks after cached tokens attend to those too
            ctx.key_slots = on_device([self._slot(w.blocks, p) for w, stop in zip(work, lens) for p in range(stop)])
            ctx.cu_seqlens_k = on_device([0, *itertools.accumulate(lens)], torch.int32)
        return on_device(ids), ctx, on_device(rows)

    # -- running ----------------------------------------------------------------------------

    @torch.inference_mode()
    def logits(self, work: list[Work]) -> torch.Tensor:
        """``(R, vocab)`` logits of the wanted rows (see :meth:`plan`), in order."""
        if self.use_graphs and all(w.n == 1 for w in work) and len(work) <= self.max_num_seqs:
            return self._replay(work)
        ids, ctx, rows = self.plan(work)
        hidden = self.model.forward_tokens(ids, ctx)
        return self.model.compute_logits(hidden[rows])

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

    def _replay(self, work: list[Work]) -> torch.Tensor:
        b = len(work)
        size = min(s for s in self.graphs if s >= b)
        host = torch.tensor([[w.tokens[w.start] for w in work], [w.start for w in work],
                             [self._slot(w.blocks, w.start) for w in work]], dtype=torch.int64)  # fmt: skip
        self.g_ids[:b].copy_(host[0], non_blocking=True)
        self.g_positions[:b].copy_(host[1], non_blocking=True)
        self.g_slots[:b].copy_(host[2], non_blocking=True)
        self.g_lens[:b].copy_((host[1] + 1).to(torch.int32), non_blocking=True)
        self.g_tables[:b].copy_(self._tables(work), non_blocking=True)
        # rows b..size-1 keep the scratch block: one token at position 0, written to scratch
        self.g_slots[b:size].fill_(self.scratch * self.block_size)
        self.g_positions[b:size].zero_()
        self.g_lens[b:size].fill_(1)
        self.g_tables[b:size].fill_(self.scratch)
        self.graphs[size].replay()
        wanted = [i for i, w in enumerate(work) if w.sample or w.all_logits]
        logits = self.g_logits[size]
        return logits[:b] if len(wanted) == b else logits[torch.tensor(wanted, device=logits.device)]
