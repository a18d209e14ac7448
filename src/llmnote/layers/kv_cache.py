"""The KV cache, in blocks: PagedAttention's layout (Kwon et al., 2023) from the model's side.

Keys and values of every layer live in a pool of fixed-size *blocks* of ``block_size``
token slots: ``k`` and ``v`` are ``(layers, num_blocks, block_size, kv_heads, head_dim)``.
A sequence owns a list of blocks, its *block table*; token ``p`` of sequence ``s`` is
stored at offset ``p % block_size`` of block ``table[s][p // block_size]``, its *slot*
``block * block_size + offset``. Blocks are handed out as sequences grow, so memory is
committed per ``block_size`` tokens instead of per maximum length, and sequences of
different lengths share one pool.

A *contiguous* cache is the special case of one block of ``max_len`` slots per sequence
(:meth:`KVCache.contiguous`): the same code, with the table that maps sequence ``b`` to
block ``b``.

Lengths are kept twice: a Python list (``lens``) that the host uses to plan a step, and a
device tensor (``seq_lens``) that the kernels read. A decode step can be planned entirely on
the device (:meth:`KVCache.decode_context`): the positions are the lengths, the slots come
from the block tables, and the lengths advance by one, with no host involvement, so one
captured CUDA graph serves every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import KV_QUANT_MAX

__all__ = ["AttentionContext", "KVCache"]


@dataclass
class AttentionContext:
    """What the layers need to know about one forward pass over packed tokens.

    ``positions`` (T,) int64: each token's position in its sequence. ``cu_seqlens_q`` (B+1,)
    int32: sequence ``i``'s new tokens are rows ``cu[i]:cu[i+1]``. With a cache:
    ``slot_mapping`` (T,) int64 where each token's keys and values go; ``seq_lens`` (B,) int32
    tokens per sequence including the new ones; ``block_tables`` (B, max_blocks) int32.
    ``decode``: one new token per sequence. ``key_slots`` and ``cu_seqlens_k``: for new tokens
    that follow cached ones (outside decode), the slots of every key each sequence attends to.
    ``max_seqlen_q``/``max_seqlen_k`` bound the lengths (a decode graph uses the capacity).
    ``batch_shape``: ``(batch, seq)`` when, without a cache, every sequence has ``seq`` tokens.
    ``num_decodes``: in a step that mixes decodes with prefills, the number of leading sequences
    with one new token each; ``key_slots``/``cu_seqlens_k`` then cover the sequences after them.
    """

    positions: torch.Tensor
    cu_seqlens_q: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    cache: KVCache | None = None
    slot_mapping: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    block_tables: torch.Tensor | None = None
    decode: bool = False
    key_slots: torch.Tensor | None = None
    cu_seqlens_k: torch.Tensor | None = None
    batch_shape: tuple[int, int] | None = None  # (batch, seq) when every sequence has seq tokens
    num_decodes: int = 0

    @classmethod
    def without_cache(cls, lens: list[int], device: torch.device | str) -> AttentionContext:
        """Causal attention within each of several packed sequences of ``lens`` tokens."""
        if not lens or min(lens) < 1:
            raise ValueError(f"every sequence needs at least one token, got lengths {lens}")
        if len(set(lens)) == 1:  # built on the device, with no copy from the host: a CUDA graph can capture it
            b, s = len(lens), lens[0]
            positions = torch.arange(s, device=device).repeat(b)
            cu = torch.arange(b + 1, device=device, dtype=torch.int32) * s
            return cls(positions=positions, cu_seqlens_q=cu, max_seqlen_q=s, max_seqlen_k=s, batch_shape=(b, s))
        positions = torch.cat([torch.arange(n) for n in lens]).to(device)
        return cls(positions=positions, cu_seqlens_q=_cumulative(lens, device), max_seqlen_q=max(lens), max_seqlen_k=max(lens))


def _cumulative(lens: list[int], device) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)


class KVCache:
    """Paged keys and values of every layer for up to ``max_seqs`` sequences of at most
    ``max_len`` tokens each, in blocks of ``block_size`` tokens (``num_blocks`` in the pool;
    by default enough for every sequence at ``max_len``).

    ``kv_dtype`` int8 or float8_e4m3fn stores the keys and values in 8 bits, quantized as they
    are written with one float32 scale per token and head (``k_scale``/``v_scale``, (layers,
    num_blocks, block_size, Hkv)); attention dequantizes them as it reads. ``dtype`` stays the
    model's compute dtype."""

    def __init__(
        self,
        config,
        max_seqs: int,
        max_len: int,
        block_size: int = 16,
        num_blocks: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
        kv_dtype: torch.dtype | None = None,
    ):
        if kv_dtype not in (None, dtype, *KV_QUANT_MAX):
            raise ValueError(f"kv_dtype must be None, the model's dtype, int8 or float8_e4m3fn; got {kv_dtype}")
        if max_seqs < 1 or max_len < 1 or block_size < 1:
            raise ValueError(f"max_seqs, max_len and block_size must be >= 1, got {max_seqs}, {max_len}, {block_size}")
        if max_len > config.max_position_embeddings:
            raise ValueError(f"max_len {max_len} exceeds the model's {config.max_position_embeddings} positions")
        self.block_size, self.max_len = block_size, max_len
        self.max_blocks = -(-max_len // block_size)
        num_blocks = max_seqs * self.max_blocks if num_blocks is None else num_blocks
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        shape = (config.num_layers, num_blocks, block_size, config.num_kv_heads, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=kv_dtype or dtype)
        self.v = torch.zeros(shape, device=device, dtype=kv_dtype or dtype)
        device = self.k.device
        quantized = kv_dtype in KV_QUANT_MAX
        self.k_scale = torch.zeros(shape[:4], device=device) if quantized else None
        self.v_scale = torch.zeros(shape[:4], device=device) if quantized else None
        self.block_tables = torch.zeros(max_seqs, self.max_blocks, dtype=torch.int32, device=device)
        self.seq_lens = torch.zeros(max_seqs, dtype=torch.int32, device=device)
        self.lens = [0] * max_seqs
        self.tables: list[list[int]] = [[] for _ in range(max_seqs)]
        self.free = list(range(num_blocks))

    @classmethod
    def contiguous(
        cls, config, batch: int, max_len: int, device=None, dtype: torch.dtype = torch.float32,
        kv_dtype: torch.dtype | None = None,
    ) -> KVCache:
        """One block of ``max_len`` slots per sequence: the classic preallocated cache."""
        return cls(config, batch, max_len, block_size=max_len, device=device, dtype=dtype, kv_dtype=kv_dtype)

    def scales(self, layer: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Layer ``layer``'s key and value scales (None, None for a 16- or 32-bit cache)."""
        if self.k_scale is None:
            return None, None
        return self.k_scale[layer], self.v_scale[layer]

    @property
    def max_seqs(self) -> int:
        return len(self.lens)

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1]

    @property
    def length(self) -> int:
        """Tokens stored per sequence, when all sequences hold the same number."""
        if len(set(self.lens)) != 1:
            raise ValueError(f"sequences hold different numbers of tokens: {self.lens}")
        return self.lens[0]

    @length.setter
    def length(self, n: int) -> None:
        """Set every sequence's length to ``n`` (``n`` <= what it holds: a rewind)."""
        for s in range(self.max_seqs):
            self.truncate(s, n)

    def truncate(self, seq: int, n: int) -> None:
        """Keep the first ``n`` tokens of ``seq`` (blocks beyond them return to the pool)."""
        if not 0 <= n <= len(self.tables[seq]) * self.block_size:
            raise ValueError(f"sequence {seq} has room for {len(self.tables[seq]) * self.block_size} tokens, cannot hold {n}")
        keep = -(-n // self.block_size)
        self.free.extend(reversed(self.tables[seq][keep:]))
        del self.tables[seq][keep:]
        self.lens[seq] = n
        self.seq_lens[seq] = n

    def reserve(self, seq: int, total: int) -> None:
        """Make room for ``total`` tokens in sequence ``seq``, taking blocks from the pool."""
        if not 0 <= seq < self.max_seqs:
            raise ValueError(f"sequence index must be in [0, {self.max_seqs}), got {seq}")
        if total > self.max_len:
            raise ValueError(f"sequence {seq} would hold {total} tokens; the cache holds at most {self.max_len} per sequence")
        table = self.tables[seq]
        needed = -(-total // self.block_size) - len(table)
        if needed > len(self.free):
            raise ValueError(f"out of KV blocks: sequence {seq} needs {needed} more, {len(self.free)} free")
        if needed > 0:
            first = len(table)
            table.extend(self.free.pop() for _ in range(needed))
            self.block_tables[seq, first : len(table)] = torch.tensor(table[first:], dtype=torch.int32)

    def slot(self, seq: int, position: int) -> int:
        """Where token ``position`` of sequence ``seq`` is stored."""
        return self.tables[seq][position // self.block_size] * self.block_size + position % self.block_size

    def context(self, new_lens: list[int], seqs: list[int] | None = None) -> AttentionContext:
        """Plan a forward pass that appends ``new_lens[i]`` tokens to sequence ``seqs[i]``
        (default: sequences 0, 1, ...), packed in that order. Reserves blocks and advances
        the lengths: the pass must follow."""
        seqs = list(range(len(new_lens))) if seqs is None else list(seqs)
        if len(seqs) != len(new_lens) or len(set(seqs)) != len(seqs):
            raise ValueError("seqs must be distinct and as many as new_lens")
        if not new_lens or min(new_lens) < 1:
            raise ValueError(f"every sequence needs at least one new token, got {new_lens}")
        starts = [self.lens[s] for s in seqs]
        totals = [a + n for a, n in zip(starts, new_lens)]
        for s, t in zip(seqs, totals):
            self.reserve(s, t)
        device = self.k.device
        positions = [p for a, t in zip(starts, totals) for p in range(a, t)]
        slots = [self.slot(s, p) for s, a, t in zip(seqs, starts, totals) for p in range(a, t)]
        ctx = AttentionContext(
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            cu_seqlens_q=_cumulative(new_lens, device),
            max_seqlen_q=max(new_lens),
            max_seqlen_k=max(totals),
            cache=self,
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            seq_lens=torch.tensor(totals, dtype=torch.int32, device=device),
            block_tables=self.block_tables[seqs] if seqs != list(range(len(seqs))) else self.block_tables[: len(seqs)],
            decode=max(new_lens) == 1,
        )
        if not ctx.decode and any(starts):  # new tokens after cached ones attend to those too
            keys = [self.slot(s, p) for s, t in zip(seqs, totals) for p in range(t)]
            ctx.key_slots = torch.tensor(keys, dtype=torch.int64, device=device)
            ctx.cu_seqlens_k = _cumulative(totals, device)
        for s, t in zip(seqs, totals):
            self.lens[s] = t
        self.seq_lens[seqs] = ctx.seq_lens
        return ctx

    def decode_context(self, batch: int) -> AttentionContext:
        """Plan one decode step of sequences ``0 .. batch-1`` on the device alone: positions
        from ``seq_lens``, slots from the block tables. Blocks for the new tokens must have
        been reserved; call :meth:`finish_decode` with the context after the pass. Nothing
        here reads the device from the host, so the step can be captured in a CUDA graph."""
        lens = self.seq_lens[:batch]
        positions = lens.long()
        tables = self.block_tables[:batch]
        blocks = tables.gather(1, (positions // self.block_size)[:, None]).squeeze(1).long()
        return AttentionContext(
            positions=positions,
            cu_seqlens_q=torch.arange(batch + 1, dtype=torch.int32, device=lens.device),
            max_seqlen_q=1,
            max_seqlen_k=self.max_blocks * self.block_size,
            cache=self,
            slot_mapping=blocks * self.block_size + positions % self.block_size,
            seq_lens=lens + 1,
            block_tables=tables,
            decode=True,
        )

    def reserve_decode(self, batch: int, steps: int = 1) -> None:
        """Before device-planned decode steps: blocks for ``steps`` more tokens of sequences
        ``0 .. batch-1`` (a CUDA graph cannot take blocks from the pool itself)."""
        for s in range(batch):
            self.reserve(s, self.lens[s] + steps)

    def advance(self, batch: int, steps: int = 1) -> None:
        """After device-planned decode steps: the host's lengths catch up with the device's."""
        for s in range(batch):
            self.lens[s] += steps

    def finish_decode(self, ctx: AttentionContext) -> None:
        """Advance the device lengths after a step planned by :meth:`decode_context` (the host
        lengths are the caller's to advance, e.g. after replaying a graph)."""
        self.seq_lens[: ctx.seq_lens.shape[0]].copy_(ctx.seq_lens)
