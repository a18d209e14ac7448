"""Grader of Lab 8 (``labs/08_block_manager.ipynb``): a paged KV block manager with prefix caching,
a class in plain Python (the bookkeeping of PagedAttention, Kwon et al., 2023, with vLLM's
automatic prefix caching).

The check drives the reader's class through request traces: scripted ones, each about one idea,
then random ones with shared prefixes, chunked prefills, decode steps and frees, on pools small
enough that cached blocks get evicted. It writes every computed token into a simulated KV pool
(:class:`KVPool`) through the reader's block tables and reads every live request back after each
operation, and it keeps its own account of what each block must be (in use, cached or free) to
check the hits, ``num_free_blocks`` and the order of eviction.
"""

from __future__ import annotations

import random

from .block_pool_model import KVPool, _Trace
from .harness import LabReport, new_seed, report

__all__ = ["KVPool", "check_block_manager"]


# ------------------------------------------------------------------ the traces


def _grows(t: _Trace, fresh) -> None:
    t.allocate("A", fresh(6))
    for _ in range(9):
        t.step("A", fresh(1))


def _shared_while_running(t: _Trace, fresh) -> None:
    a = fresh(10)
    t.allocate("A", a)
    t.allocate("B", a[:8] + fresh(3))  # A's two full blocks, while A still runs
    t.allocate("C", a)  # the same two: A's third block holds C's last token
    t.allocate("D", a[:5])
    t.step("B", fresh(1))
    t.step("B", fresh(1))


def _last_token_block(t: _Trace, fresh) -> None:
    a = fresh(8)
    t.allocate("A", a)
    t.allocate("B", a)  # 4 cached, not 8: block 1 holds B's last token
    t.allocate("C", a + fresh(1))
    t.allocate("D", a[:4])


def _chained(t: _Trace, fresh) -> None:
    x, y, z = fresh(4), fresh(4), fresh(4)
    t.allocate("A", x + y + z + fresh(1))
    t.allocate("B", x + z + fresh(2))  # x hits; z after x is not z after x + y
    t.allocate("C", y + z + fresh(1))
    t.allocate("D", z + fresh(3))
    t.allocate("E", x + y + fresh(2))


def _lru(t: _Trace, fresh) -> None:
    a, b = fresh(9), fresh(9)
    t.allocate("A", a)
    t.free("A")
    t.allocate("B", b)
    t.free("B")
    t.allocate("A2", a)  # both of A's full blocks come back from the LRU list
    t.free("A2")
    t.allocate("C", fresh(12))  # the two free blocks, then B's last full block: the least recently used
    t.allocate("B2", b)
    t.free("C")
    t.free("B2")
    t.allocate("A3", a)  # A's blocks were evicted: no hit


def _hit_protects(t: _Trace, fresh) -> None:
    a, z = fresh(5), fresh(5)
    t.allocate("A", a)
    t.free("A")
    t.allocate("Z", z)
    t.free("Z")
    t.allocate("B", a)  # A's block, off the LRU list
    t.allocate("C", fresh(12))
    t.allocate("D", fresh(3))  # must evict Z's block, not the one B holds


def _duplicate(t: _Trace, fresh) -> None:
    a = fresh(9)
    t.allocate("A", a, stop=1)  # two chunked prefills: no full block is computed yet
    t.allocate("B", a, stop=1)
    t.step("A", [], 9)
    t.step("B", [], 9)  # B's copies of A's full blocks stay private
    t.allocate("C", a)
    t.free("A")
    t.free("C")
    t.allocate("D", fresh(28))  # evicts A's blocks
    t.step("B", fresh(1))
    t.free("D")
    t.allocate("E", a)  # no hit: B's copies are private


_SCRIPTS = [  # what the case tests, num_blocks, block_size, the trace
    ("one request grows by decoding, block by block", 8, 4, _grows),
    ("later requests reuse the full blocks of one that still runs", 12, 4, _shared_while_running),
    ("the block holding a prompt's last token is never matched", 12, 4, _last_token_block),
    ("equal tokens after a different prefix do not match: hashes chain", 16, 4, _chained),
    ("freed prefixes stay cached; a short pool evicts the least recently used", 6, 4, _lru),
    ("a hit takes a cached block off the LRU list: blocks in use are never evicted", 6, 4, _hit_protects),
    ("two requests compute the same prompt at once: the second copy stays private", 10, 4, _duplicate),
]


def _random_trace(t: _Trace, rng: random.Random, steps: int) -> None:
    bs = t.bs
    pieces = [[rng.randrange(1, 50) for _ in range(bs)] for _ in range(3)]  # the same blocks recur after other prefixes
    prefixes = [sum((rng.choice(pieces) for _ in range(rng.randint(1, 3))), []) for _ in range(4)]
    longest = max(2 * bs + 1, t.num_blocks * bs // 3)
    for number in range(steps):
        live, r = sorted(t.live), rng.random()
        if r < 0.35 or not live:
            base = list(rng.choice(prefixes)) if rng.random() < 0.75 else []
            tokens = (base + [rng.randrange(1, 50) for _ in range(rng.randint(0 if base else 1, 2 * bs))])[:longest]
            if t.account.fits(tokens):
                t.allocate(f"r{number}", tokens, rng=rng)
            elif live:
                t.free(rng.choice(live))  # a request finishes (or is preempted) to make room
        elif r < 0.8:
            name = rng.choice(live)
            s = t.live[name]
            new = [rng.randrange(1, 50)] if s.computed == len(s.tokens) else []  # a decoded token, or a prefill's next chunk
            n = len(s.tokens) + len(new)
            if n > longest or -(-n // bs) - len(s.copy) > t.account.num_free:
                t.free(name)
            else:
                t.step(name, new, min(n, s.computed + rng.randint(1, 2 * bs)))
        else:
            t.free(rng.choice(live))


def check_block_manager(cls: type, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade a block manager class: ``cls(num_blocks, block_size)`` with ``allocate(token_ids) ->
    (block_table, num_cached_tokens)``, ``append(block_table, token_ids, num_computed)``,
    ``free(block_table)`` and ``num_free_blocks`` (the interface of ``labs/08_block_manager.ipynb``).

    12 cases: 7 scripted traces (growth by decoding, hits while the first request runs, the last
    token's block, chained hashes, LRU eviction of freed prefixes, a hit protecting a block, a
    prompt computed twice at once), then 5 random traces of 150 to 300 steps on pools of 7 to
    20 blocks of 1 to 16 slots. After every operation it checks the tables, the hits, the blocks
    handed out (free ones first, then the least recently used cached ones), ``num_free_blocks``,
    and that every live request reads its own tokens back from a simulated KV pool; at the end of
    each trace every request is freed and every block must be free or cached. Raises
    :class:`~llmnote.labs.LabCheckError`."""
    __tracebackhide__ = True
    if not isinstance(cls, type):
        raise TypeError(f"check_block_manager takes your class (e.g. MyBlockManager), not an instance of it; got {cls!r}")
    seed = new_seed(seed)
    rng = random.Random(seed)
    rerun = f"Rerun this draw with check_block_manager({cls.__name__}, seed={seed})."
    sizes = [(7, 1), (16, 2), (12, 3), (10, 4), (20, 4), (16, 8), (20, 16)]
    cases = [*_SCRIPTS, *(("random trace", n, bs, None) for n, bs in rng.sample(sizes, 5))]
    calls, labels = [0], []
    for number, (label, num_blocks, bs, script) in enumerate(cases, 1):
        where = f"block_manager failed on case {number} of {len(cases)} ({num_blocks} blocks of {bs}: {label})"
        t = _Trace(cls, num_blocks, bs, where, rerun, calls)
        if script is None:
            steps = 300 if bs < 8 else 150
            _random_trace(t, rng, steps)
            label = f"random trace of {steps} steps ({t.hits} prefix hits, {t.evictions} evictions)"
        else:
            script(t, lambda n: [rng.randrange(1, 1000) for _ in range(n)])
        for name in rng.sample(sorted(t.live), len(t.live)):
            t.free(name)  # at the end every block is free or cached: num_free_blocks == num_blocks
        labels.append(f"{num_blocks} blocks of {bs}: {label}")
    return report("block_manager", labels, [f"blocks of {bs}" for _, _, bs, _ in cases], seed, verbose)
