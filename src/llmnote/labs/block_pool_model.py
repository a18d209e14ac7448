"""The reference side of Lab 8's grader: a simulated KV pool (:class:`KVPool`), the grader's own
account of what every block must be (in use, cached or free, and in which LRU order), and
:class:`_Trace`, which drives a reader's block manager one operation at a time and checks it
against both after every call. :mod:`.grade_block_manager` holds the traces and the entry point.
"""

from __future__ import annotations

import random
import re
from collections import OrderedDict
from dataclasses import dataclass

from .harness import LabCheckError, not_written

__all__ = ["KVPool"]

def _fingerprints(token_ids: list[int]) -> list[int]:
    """One number per position that changes with the token and with every token before it."""
    out, h = [], 0
    for t in token_ids:
        h = hash((h, t))
        out.append(h)
    return out


class KVPool:
    """A stand-in for the GPU's KV cache: ``num_blocks`` blocks of ``block_size`` slots. Token ``i``
    of a sequence lives in slot ``i % block_size`` of block ``block_table[i // block_size]``.

    A slot stores what the token's keys and values stand for: the token id, and a fingerprint of
    the whole prefix up to it (from the second layer on, a token's keys and values mix in every
    token before it, so a block can only be reused after exactly the same prefix)."""

    def __init__(self, num_blocks: int, block_size: int):
        if not isinstance(num_blocks, int) or num_blocks < 1 or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be positive ints, got {num_blocks!r} and {block_size!r}")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.slots: list[list[tuple[int, int] | None]] = [[None] * block_size for _ in range(num_blocks)]

    def _where(self, block_table: list[int], position: int) -> tuple[int, int]:
        index = position // self.block_size
        if index >= len(block_table):
            raise ValueError(f"position {position} needs block {index} of the table, which has only {len(block_table)}")
        block = block_table[index]
        if not isinstance(block, int) or not 0 <= block < self.num_blocks:
            raise ValueError(f"block_table[{index}] = {block!r} is not a block id in 0..{self.num_blocks - 1}")
        return block, position % self.block_size

    def write(self, block_table: list[int], token_ids: list[int], start: int, stop: int) -> None:
        """Store the keys and values of tokens ``start .. stop - 1`` of ``token_ids`` in their
        slots, as a forward pass over those tokens does."""
        if not 0 <= start <= stop <= len(token_ids):
            raise ValueError(f"need 0 <= start <= stop <= len(token_ids) = {len(token_ids)}, got {start} and {stop}")
        prints = _fingerprints(token_ids[:stop])
        for i in range(start, stop):
            block, slot = self._where(block_table, i)
            self.slots[block][slot] = (token_ids[i], prints[i])

    def read(self, block_table: list[int], num_tokens: int) -> list[int | None]:
        """The token ids held by the slots of positions ``0 .. num_tokens - 1`` (None: never written)."""
        return [(s[0] if (s := self.slots[b][j]) else None) for b, j in (self._where(block_table, i) for i in range(num_tokens))]

    def __str__(self) -> str:
        width = max([len(str(s[0])) for row in self.slots for s in row if s] + [1])
        rows = (" ".join(str(s[0]).rjust(width) if s else ".".rjust(width) for s in row) for row in self.slots)
        return "\n".join(f"block {b:>{len(str(self.num_blocks - 1))}}: {row}" for b, row in enumerate(rows))


class _Account:
    """The state a correct manager is in, in its own block ids: reference counts, each block's
    chained hash once it is full and computed, the prefix cache (hash -> registered block), the
    cached blocks no table holds (least recently used first) and the free blocks (any will do)."""

    def __init__(self, num_blocks: int, block_size: int):
        self.bs, self.ref, self.by_hash = block_size, [0] * num_blocks, {}
        self.hash: list[int | None] = [None] * num_blocks
        self.own: list[tuple[int, ...] | None] = [None] * num_blocks  # a hashed block's own tokens (for hints)
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.free = set(range(num_blocks))
        self.evicted: dict[int, int] = {}  # hashes once cached, since evicted (for hints)
        self.released: dict[int, tuple[int, int]] = {}  # block -> (operation, index in its table) when its count fell to 0
        self.was_private: set[int] = set()  # free blocks that were private copies (for hints)

    @property
    def num_free(self) -> int:
        return len(self.free) + len(self.lru)

    def chain(self, tokens: list[int], count: int) -> list[int]:
        hashes, parent = [], None
        for i in range(count):
            parent = hash((parent, tuple(tokens[i * self.bs : (i + 1) * self.bs])))
            hashes.append(parent)
        return hashes

    def lookup(self, tokens: list[int], registry: dict | None = None, chained: bool = True) -> list[int]:
        """The blocks of the longest cached prefix of whole blocks, before the last token's block."""
        count, bs = (len(tokens) - 1) // self.bs, self.bs
        keys = self.chain(tokens, count) if chained else [tuple(tokens[i * bs : (i + 1) * bs]) for i in range(count)]
        registry, found = self.by_hash if registry is None else registry, []
        for key in keys:
            if key not in registry:
                break
            found.append(registry[key])
        return found

    def fits(self, tokens: list[int]) -> bool:
        hits = self.lookup(tokens)
        return -(-len(tokens) // self.bs) - len(hits) <= self.num_free - sum(self.ref[b] == 0 for b in hits)

    def share(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.lru[b]
            self.ref[b] += 1

    def take(self, blocks: list[int]) -> None:
        for b in blocks:
            if b in self.free:
                self.free.remove(b)
                self.was_private.discard(b)
            else:
                del self.lru[b], self.by_hash[self.hash[b]]
                self.evicted[self.hash[b]], self.hash[b], self.own[b] = b, None, None
            self.ref[b] = 1

    def register(self, table: list[int], tokens: list[int], num_computed: int) -> None:
        for i, h in enumerate(self.chain(tokens, num_computed // self.bs)):
            b = table[i]
            if self.hash[b] is None:  # full and computed for the first time: registered unless another block has h
                self.hash[b], self.own[b] = h, tuple(tokens[i * self.bs : (i + 1) * self.bs])
                if h not in self.by_hash:
                    self.by_hash[h] = b
                    self.evicted.pop(h, None)

    def release(self, table: list[int], operation: int) -> None:
        for index in range(len(table) - 1, -1, -1):  # last block first
            b = table[index]
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.released[b] = (operation, index)
                if self.hash[b] is not None and self.by_hash.get(self.hash[b]) == b:
                    self.lru[b] = None
                else:
                    if self.hash[b] is not None:
                        self.was_private.add(b)
                    self.hash[b], self.own[b] = None, None
                    self.free.add(b)


_REFCOUNT = ("Count the tables that hold each block: an allocate hit adds one, free removes one, and only a block whose "
             "count falls to 0 goes back (to the LRU list if it is in the prefix cache, else to the free list).")  # fmt: skip
_CHAIN = ("Hash each full block together with the hash of the block before it (block_hash(parent, tokens), parent None for the "
          "first block): equal tokens after a different prefix have different keys and values.")  # fmt: skip
_LAST = ("Match at most (len(token_ids) - 1) // block_size blocks: the block holding the prompt's last token is never shared, "
         "since that token must be computed anyway (its logits give the first new token).")  # fmt: skip
_REGISTER = ("append registers each block once it is full and its tokens are computed (within the first num_computed), under "
             "its chained hash; allocate then finds it, even while the request that computed it runs.")  # fmt: skip
_KEEP = ("When the count of a registered block falls to 0, free keeps it cached: on an LRU list of evictable blocks, still "
         "findable by its hash, until an allocation needs its memory.")  # fmt: skip
_ONCE = ("A block is registered once, when it first becomes full and computed. If another block holds its hash then, it "
         "stays private for good: no hit returns it, even once the other is evicted; free puts it on the free list.")  # fmt: skip
_UNHIT = "A block held again by a hit is no longer evictable: take it off the LRU list."


@dataclass
class _Seq:
    tokens: list[int]
    table: list[int]  # the reader's list, which append grows
    copy: list[int]  # what it must hold
    computed: int


class _Trace:
    """One case: the reader's manager, the account of what it must be, the pool, the live requests."""

    def __init__(self, cls: type, num_blocks: int, block_size: int, where: str, rerun: str, calls: list[int]):
        self.cls, self.where, self.rerun, self.calls = cls, where, rerun, calls
        self.bs, self.num_blocks = block_size, num_blocks
        self.account, self.pool = _Account(num_blocks, block_size), KVPool(num_blocks, block_size)
        self.live: dict[str, _Seq] = {}
        self.operation, self.doing = 0, f"{cls.__name__}({num_blocks}, {block_size})"
        self.hits = self.evictions = 0
        self.mgr = self._call(None, num_blocks, block_size)
        self._check_free()

    def fail(self, what: str, hint: str):
        __tracebackhide__ = True
        raise LabCheckError(f"{self.where}, operation {self.operation}: {self.doing}\n  {what}.\n  Hint: {hint}\n  {self.rerun}")

    def _call(self, method: str | None, *args):
        """``cls(*args)`` when ``method`` is None, else the manager's ``method(*args)`` (or the value
        of ``num_free_blocks``); the stub's NotImplementedError becomes "not written yet"."""
        __tracebackhide__ = True
        try:
            if method is None:
                return self.cls(*args)
            result = getattr(self.mgr, method)
            result = result(*args) if method != "num_free_blocks" or callable(result) else result
        except NotImplementedError as err:
            stub = re.fullmatch(r"write (\w+) here", str(err))  # the stub's own words name the method
            what = f"{self.cls.__name__}.{stub[1] if stub else method}" if self.calls[0] else self.cls.__name__
            raise not_written("block_manager", what) from None
        except Exception as err:
            raise LabCheckError(f"{self.where}, operation {self.operation}: {self.doing}\n  `{method or self.cls.__name__}` "
                                f"raised {type(err).__name__}: {err}\n  {self.rerun}") from err  # fmt: skip
        self.calls[0] += 1
        return result

    def _begin(self, doing: str) -> None:
        self.operation, self.doing = self.operation + 1, doing

    def holders(self, block: int) -> list[str]:
        return [name for name, s in self.live.items() if block in s.copy]

    def _check_free(self, freed: list[int] = (), revived: int = 0) -> None:
        __tracebackhide__ = True
        got = self._call("num_free_blocks")
        acc, want = self.account, self.account.num_free
        if not isinstance(got, int) or isinstance(got, bool):
            self.fail(f"num_free_blocks is {got!r}, not an int", "Return how many blocks an allocation could take now.")
        if got != want:
            hint = "num_free_blocks counts what an allocation can take now: the free list plus the cached blocks no table holds."
            held = sorted({b for b in freed if acc.ref[b] > 0})
            if got == len(acc.free):
                hint = "Count the cached blocks that no table holds too: an allocation may evict them. " + hint
            elif held and got > want:
                hint = f"Blocks {held} of the freed table are still held by {self.holders(held[0])}. {_REFCOUNT}"
            elif revived and got == want + revived:
                hint = _UNHIT
            self.fail(f"num_free_blocks is {got}, expected {want} ({len(acc.free)} free, {len(acc.lru)} cached and "
                      f"evictable, {self.num_blocks - want} in use)", hint)  # fmt: skip

    def _check_pool(self) -> None:
        """Every live request reads its own keys and values back through its table."""
        __tracebackhide__ = True
        for name, s in self.live.items():
            if s.table != s.copy:
                self.fail(f"request {name}'s block table changed to {s.table} (it was {s.copy})",
                          "Only append changes a table, by adding blocks at its end.")  # fmt: skip
            for i, p in enumerate(_fingerprints(s.tokens[: s.computed])):
                b, j = s.copy[i // self.bs], i % self.bs
                if (slot := self.pool.slots[b][j]) is None or slot[1] != p:
                    others = [o for o in self.holders(b) if o != name]
                    self.fail(f"request {name} reads wrong keys and values at position {i}: block {b}, slot {j} was "
                              f"overwritten{f'; block {b} is in the tables of {others} too' if others else ''}",
                              f"A block belongs to one request unless it is a full, computed block shared through the "
                              f"prefix cache. {_REFCOUNT}")  # fmt: skip

    def _check_new(self, name: str, new: list[int]) -> None:
        """The blocks ``new`` taken for fresh contents: free ones first, then the least recently used cached ones."""
        __tracebackhide__ = True
        acc = self.account
        for b in new:
            if acc.ref[b] > 0:
                self.fail(f"block {b} is handed to request {name} while {self.holders(b)} still hold it",
                          f"A block that a table holds is never evicted or handed out again. {_REFCOUNT}")  # fmt: skip
        evicted, should, order = [b for b in new if b in acc.lru], max(0, len(new) - len(acc.free)), list(acc.lru)
        if len(evicted) > should:
            private = sorted(acc.was_private & acc.free)
            hint = "Take a free block first; evict a cached block only when the free list is empty: it may still be hit."
            self.fail(f"cached block {evicted[0]} was evicted while {len(acc.free)} block(s) with no hash were free",
                      f"Blocks {private} were private copies when they were freed. {_ONCE}" if private else hint)  # fmt: skip
        if set(evicted) != set(order[:should]):
            forward = sorted(order, key=lambda b: acc.released[b])
            if set(evicted) == set(order[-should:]):
                hint = "You evicted the most recently used block: evict the least recently used, whose count fell to 0 first."
            elif set(evicted) == set(forward[:should]):
                hint = ("free releases a table's blocks last to first, so that the end of a prefix is evicted before its start "
                        "(with its start gone, the rest of the chain could not be found anyway).")  # fmt: skip
            else:
                hint = "Keep the cached blocks no table holds in least-recently-used order (an OrderedDict) and evict the oldest."
            self.fail(f"evicted cached block(s) {sorted(evicted)}, expected the least recently used: {order[:should]} "
                      f"(the LRU list, oldest first: {order})", hint)  # fmt: skip
        self.evictions += len(evicted)
        acc.take(new)

    def _check_table(self, table: object, n: int, what: str) -> None:
        __tracebackhide__ = True
        if not isinstance(table, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in table):
            self.fail(f"{what} is {table!r}, not a list of block ids", "A block table is a plain list of ints, one per block.")
        if len(table) != -(-n // self.bs):
            extra = " append adds blocks to block_table in place (block_table.append(...)); its return value is not used."
            self.fail(f"{what} holds {len(table)} blocks for {n} tokens, expected ceil({n} / {self.bs}) = {-(-n // self.bs)}",
                      "A table has exactly the blocks its tokens need." + (extra if "append" in what else ""))  # fmt: skip
        if bad := [b for b in table if not 0 <= b < self.num_blocks]:
            self.fail(f"{what} holds block {bad[0]}, outside 0..{self.num_blocks - 1}", "Block ids run from 0 to num_blocks - 1.")
        if twice := [b for b in table if table.count(b) > 1]:
            self.fail(f"block {twice[0]} appears twice in {what}", f"A block a table holds must never be evicted. {_UNHIT}")

    def allocate(self, name: str, tokens: list[int], stop: int | None = None, rng: random.Random | None = None) -> None:
        """A new request with prompt ``tokens``, computed up to ``stop`` (all; a random chunk with ``rng``)."""
        __tracebackhide__ = True
        acc, bs = self.account, self.bs
        shown = f"{tokens}" if len(tokens) <= 16 else f"[{', '.join(map(str, tokens[:12]))}, ...]"
        self._begin(f"allocate(token_ids) for request {name}, a {len(tokens)}-token prompt {shown}")
        assert acc.fits(tokens), "the trace asked for more blocks than are left"
        result = self._call("allocate", list(tokens))
        if not isinstance(result, tuple | list) or len(result) != 2:
            self.fail(f"allocate returned {result!r}", "Return (block_table, num_cached_tokens).")
        table, cached = result
        self._check_table(table, len(tokens), "the block table allocate returned")
        hits = acc.lookup(tokens)
        if not isinstance(cached, int) or isinstance(cached, bool) or cached % bs or not 0 <= cached < len(tokens):
            whole = "It counts the tokens of the cached whole blocks: a multiple of block_size."
            hint = _LAST if cached in (len(tokens), len(tokens) - 1) else whole
            self.fail(f"num_cached_tokens is {cached!r} for a {len(tokens)}-token prompt, expected {len(hits) * bs}", hint)
        if cached != len(hits) * bs:
            self.fail(f"num_cached_tokens is {cached}, expected {len(hits) * bs}", self._hit_hint(tokens, cached, hits))
        for i, (b, h) in enumerate(zip(table, hits)):
            if b != h:
                hint = _ONCE if acc.hash[b] == acc.hash[h] else "A hit reuses the block registered under the chained hash."
                self.fail(f"table[{i}] is block {b}; the prefix cache holds those tokens in block {h}", hint)
        revived = sum(acc.ref[b] == 0 for b in hits)
        acc.share(hits)
        self._check_new(name, table[len(hits) :])
        self.hits += bool(hits)
        self.live[name] = _Seq(list(tokens), table, list(table), cached)
        self._check_free(revived=revived)
        self._check_pool()  # the hits hold this prompt's keys and values
        if rng is not None:
            stop = len(tokens) if rng.random() < 0.6 else rng.randint(cached + 1, len(tokens))
        self._compute(name, len(tokens) if stop is None else max(stop, cached))

    def _hit_hint(self, tokens: list[int], cached: int, hits: list[int]) -> str:
        acc, bs = self.account, self.bs
        if cached < len(hits) * bs:
            missed = hits[cached // bs]
            where = f"Block {missed} holds tokens {cached}..{cached + bs - 1} of this prompt"
            return f"{where}, cached and held by no table. {_KEEP}" if acc.ref[missed] == 0 else f"{where}. {_REGISTER}"
        early = dict(acc.by_hash)
        for s in self.live.values():
            early.update(zip(acc.chain(s.tokens, len(s.tokens) // bs), s.copy))
        private = {h: b for s in self.live.values() for b in s.copy if (h := acc.hash[b]) is not None} | acc.by_hash
        for registry, chained, hint in (
            ({acc.own[b]: b for b in acc.by_hash.values()}, False, _CHAIN),
            (private, True, _ONCE),
            (acc.by_hash | acc.evicted, True, "When you evict a cached block, remove its hash from the prefix cache."),
            (early, True, "Register a block only once its tokens are computed: " + _REGISTER),
        ):  # fmt: skip
            if len(acc.lookup(tokens, registry, chained)) * bs == cached:
                return hint
        return f"Only leading full blocks registered in the prefix cache count. {_CHAIN}"

    def _append(self, name: str, num_computed: int) -> None:
        __tracebackhide__ = True
        s = self.live[name]
        self._begin(f"append(block_table, token_ids, num_computed={num_computed}) for request {name}, {len(s.tokens)} tokens")
        self._call("append", s.table, list(s.tokens), num_computed)
        self._check_table(s.table, len(s.tokens), f"after append, request {name}'s table")
        if s.table[: len(s.copy)] != s.copy:
            self.fail(f"append changed the blocks already in the table: {s.copy} became {s.table[: len(s.copy)]}",
                      "append only adds blocks at the end of the table.")  # fmt: skip
        self._check_new(name, s.table[len(s.copy) :])
        s.copy = list(s.table)
        self.account.register(s.copy, s.tokens, num_computed)
        self._check_free()
        self._check_pool()

    def _compute(self, name: str, stop: int) -> None:
        """The model computes the tokens up to ``stop``; then append registers the blocks they filled."""
        s = self.live[name]
        self.pool.write(s.copy, s.tokens, s.computed, stop)
        s.computed = stop
        self._append(name, stop)

    def step(self, name: str, new_tokens: list[int], stop: int | None = None) -> None:
        """Request ``name`` gets ``new_tokens`` (decoded; none for a prefill's next chunk) and slots
        for them, then computes up to ``stop`` (all by default)."""
        s = self.live[name]
        s.tokens += new_tokens
        assert -(-len(s.tokens) // self.bs) - len(s.copy) <= self.account.num_free, "the trace grew past the pool"
        self._append(name, s.computed)
        self._compute(name, len(s.tokens) if stop is None else stop)

    def free(self, name: str) -> None:
        __tracebackhide__ = True
        s = self.live.pop(name)
        self._begin(f"free(block_table) for request {name}, table {s.copy}")
        self._call("free", s.table)
        self.account.release(s.copy, self.operation)
        self._check_free(s.copy)
        self._check_pool()
