"""The KV cache's bookkeeping: fixed-size blocks, reference counts and a prefix cache.

The GPU holds one pool of ``num_blocks`` KV blocks of ``block_size`` token slots each (the
paged layout of PagedAttention, Kwon et al., 2023). This module decides, in plain Python and
without touching the GPU, which physical block holds which tokens of which sequence: a
sequence's *block table* lists its blocks in order, so token ``i`` lives in slot
``i % block_size`` of block ``table[i // block_size]``.

**Sharing by content.** Once a block is full and its keys and values have been computed, it
is named by a *chained hash*: the hash of its own tokens together with the hash of the block
before it. Two blocks with the same chained hash hold the same tokens at the same positions
after the same prefix, hence the same keys and values, so a later sequence whose prompt
starts the same way points its table at the cached blocks instead of computing them again
(the automatic prefix caching of vLLM; SGLang's RadixAttention keeps the same information as
a radix tree of token runs). Every block counts the tables that hold it. When the count
falls to zero a hashed block is not wiped: it stays findable, on a least-recently-used list,
until a new allocation needs its memory and evicts it.

**Never share the block being written.** Matching stops before the block that holds a
prompt's last token: that token must run through the model anyway (its logits give the
first new token), and writing its keys and values into a block that other sequences read
could change what they see. So a fully cached prompt still computes between 1 and
``block_size`` tokens.

This module imports nothing from torch: the scheduler and the tests drive it on its own.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

__all__ = ["BlockManager", "BlockTable", "NoFreeBlocksError", "block_hash"]


class NoFreeBlocksError(RuntimeError):
    """Raised when an allocation needs more blocks than are free or evictable."""


def block_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """The chained hash of a full block: its tokens and the hash of the block before it
    (``None`` for a sequence's first block)."""
    return hash((parent, tokens))


@dataclass
class BlockTable:
    """One sequence's blocks, in order, and the chained hashes of its leading full blocks
    whose keys and values are computed (``hashes[i]`` names ``blocks[i]``)."""

    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.blocks)


@dataclass
class _Block:
    ref_count: int = 0
    hash: int | None = None  # set while the block is registered in the prefix cache
    tokens: tuple[int, ...] = ()  # the block's tokens, kept to rule out hash collisions


class BlockManager:
    """Allocates ``num_blocks`` blocks of ``block_size`` slots to sequences.

    - :meth:`allocate` gives a new sequence blocks for its first tokens, reusing cached
      blocks for the longest matching prefix of full blocks;
    - :meth:`grow` adds blocks as a sequence gets longer;
    - :meth:`commit` registers the blocks that became full once their keys and values exist;
    - :meth:`free` returns a sequence's blocks.

    A block is in exactly one state: *in use* (``ref_count > 0``), *cached* (unreferenced but
    hashed: on the LRU list, reusable by a hit, evictable) or *free* (on the free list).
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be a positive int, got {num_blocks!r}")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [_Block() for _ in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        self._cached: OrderedDict[int, None] = OrderedDict()  # unreferenced hashed blocks, oldest first
        self._by_hash: dict[int, int] = {}  # chained hash -> block id
        self.hits = self.queries = 0  # prefix-cache counters, in blocks

    # -- what is left ---------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: free ones plus evictable cached ones."""
        return len(self._free) + len(self._cached)

    def blocks_in_use(self) -> int:
        """Blocks held by at least one sequence (cached but unreferenced blocks do not count)."""
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def ref_count(self, block: int) -> int:
        return self._blocks[block].ref_count

    # -- the prefix cache -----------------------------------------------------------------

    def _full_blocks(self, token_ids: list[int], stop: int, start: int = 0) -> list[tuple[int, ...]]:
        """The tokens of full blocks ``start .. stop-1``."""
        bs = self.block_size
        return [tuple(token_ids[i * bs : (i + 1) * bs]) for i in range(start, stop)]

    def cached_prefix(self, token_ids: list[int]) -> tuple[list[int], list[int]]:
        """The cached blocks (and their hashes) that hold the longest prefix of ``token_ids``
        in whole blocks, never including the block of the last token. Does not change state."""
        if not self.enable_prefix_caching:
            return [], []
        blocks, hashes, parent = [], [], None
        for tokens in self._full_blocks(token_ids, (len(token_ids) - 1) // self.block_size):
            h = block_hash(parent, tokens)
            block = self._by_hash.get(h)
            if block is None or self._blocks[block].tokens != tokens:
                break
            blocks.append(block)
            hashes.append(h)
            parent = h
        return blocks, hashes

    def can_allocate(self, token_ids: list[int], num_tokens: int | None = None) -> bool:
        """Whether :meth:`allocate` would succeed now for a sequence of ``token_ids`` that
        needs slots for its first ``num_tokens`` tokens (all of them by default)."""
        hit, _ = self.cached_prefix(token_ids)
        need = self.blocks_for(len(token_ids) if num_tokens is None else num_tokens) - len(hit)
        # a hit on a cached (unreferenced) block takes it off the evictable list
        return max(need, 0) <= self.num_free_blocks - sum(1 for b in hit if self._blocks[b].ref_count == 0)

    # -- allocation -----------------------------------------------------------------------

    def _take(self) -> int:
        """A block for new contents: a free one, else the least recently used cached one."""
        if self._free:
            block = self._free.popleft()
        elif self._cached:
            block, _ = self._cached.popitem(last=False)
            del self._by_hash[self._blocks[block].hash]
            self._blocks[block] = _Block()
        else:
            raise NoFreeBlocksError("no free or evictable KV block left")
        self._blocks[block].ref_count = 1
        return block

    def _share(self, block: int) -> None:
        b = self._blocks[block]
        if b.ref_count == 0:
            del self._cached[block]
        b.ref_count += 1

    def allocate(self, token_ids: list[int], num_tokens: int | None = None) -> tuple[BlockTable, int]:
        """A block table for a new sequence with enough slots for its first ``num_tokens``
        tokens (default all), and how many leading tokens its cached blocks already hold.
        Raises :class:`NoFreeBlocksError` (and changes nothing) if the blocks are not there."""
        num_tokens = len(token_ids) if num_tokens is None else num_tokens
        if not 0 < num_tokens <= len(token_ids):
            raise ValueError(f"num_tokens must be in 1..{len(token_ids)}, got {num_tokens}")
        if not self.can_allocate(token_ids, num_tokens):
            raise NoFreeBlocksError(f"{self.blocks_for(num_tokens)} blocks needed, {self.num_free_blocks} free")
        hit, hashes = self.cached_prefix(token_ids)
        self.queries += (len(token_ids) - 1) // self.block_size if self.enable_prefix_caching else 0
        self.hits += len(hit)
        for block in hit:
            self._share(block)
        table = BlockTable(list(hit), list(hashes))
        self.grow(table, num_tokens)
        return table, len(hit) * self.block_size

    def can_grow(self, table: BlockTable, num_tokens: int) -> bool:
        need = -(-num_tokens // self.block_size) - len(table.blocks)
        return need <= 0 or need <= self.num_free_blocks

    def grow(self, table: BlockTable, num_tokens: int) -> None:
        """Append blocks to ``table`` until it has slots for ``num_tokens`` tokens."""
        need = -(-num_tokens // self.block_size) - len(table.blocks)
        if need <= 0:  # the common case of a decode step: the last block has room
            return
        if need > self.num_free_blocks:
            raise NoFreeBlocksError(f"{need} more blocks needed, {self.num_free_blocks} free")
        for _ in range(need):
            table.blocks.append(self._take())

    def commit(self, table: BlockTable, token_ids: list[int], num_computed: int) -> None:
        """Register in the prefix cache the blocks of ``table`` that ``num_computed`` computed
        tokens of ``token_ids`` fill. A block whose hash another block already holds stays
        private (it is freed normally)."""
        if not self.enable_prefix_caching:
            return
        full, done = min(num_computed // self.block_size, len(table)), len(table.hashes)
        if full <= done:
            return
        parent = table.hashes[-1] if table.hashes else None
        for i, tokens in enumerate(self._full_blocks(token_ids, full, done), start=done):
            h = block_hash(parent, tokens)
            table.hashes.append(h)
            parent = h
            block = table.blocks[i]
            if h not in self._by_hash and self._blocks[block].hash is None:
                self._by_hash[h] = block
                self._blocks[block].hash, self._blocks[block].tokens = h, tokens

    def free(self, table: BlockTable) -> None:
        """Drop the sequence's hold on its blocks (last block first, so the oldest prefix
        blocks are evicted last) and empty the table."""
        for block in reversed(table.blocks):
            b = self._blocks[block]
            if b.ref_count <= 0:
                raise RuntimeError(f"block {block} freed more often than it was allocated")
            b.ref_count -= 1
            if b.ref_count == 0:
                if b.hash is None:
                    self._free.append(block)
                else:
                    self._cached[block] = None  # newest at the end: evicted last
        table.blocks.clear()
        table.hashes.clear()

    def reset_prefix_cache(self) -> None:
        """Forget every cached block that no sequence holds (they become free)."""
        for block in self._cached:
            del self._by_hash[self._blocks[block].hash]
            self._blocks[block] = _Block()
            self._free.append(block)
        self._cached.clear()

    @property
    def hit_rate(self) -> float:
        """Prefix-cache hits over lookups, in blocks (0 before any lookup)."""
        return self.hits / self.queries if self.queries else 0.0
