"""The block manager on its own: reference counts, the prefix cache, LRU eviction, and random
request traces checked against a simulated KV pool."""

import random
import subprocess
import sys
from pathlib import Path

import pytest

from llmnote.engine import block_manager as bm
from llmnote.engine.block_manager import BlockManager, NoFreeBlocksError

BS = 4


def run_prompt(mgr: BlockManager, tokens: list[int]):
    """Allocate a sequence for ``tokens`` and mark all of them computed."""
    table, cached = mgr.allocate(tokens)
    mgr.commit(table, tokens, len(tokens))
    return table, cached


def test_module_needs_no_torch():
    path = Path(bm.__file__)
    code = ("import sys, importlib.util; sys.modules['torch'] = None\n"
            f"spec = importlib.util.spec_from_file_location('bm', {str(path)!r}); m = importlib.util.module_from_spec(spec)\n"
            "sys.modules['bm'] = m; spec.loader.exec_module(m)\n"
            "mgr = m.BlockManager(8, 4); t, _ = mgr.allocate(list(range(10))); print(len(t))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "3"


def test_allocate_grow_free_counts():
    mgr = BlockManager(10, BS)
    table, cached = mgr.allocate(list(range(9)))  # 9 tokens: 3 blocks
    assert (len(table), cached, mgr.blocks_in_use(), mgr.num_free_blocks) == (3, 0, 3, 7)
    mgr.grow(table, 12)  # still 3 blocks
    assert len(table) == 3
    mgr.grow(table, 13)
    assert len(table) == 4 and len(set(table.blocks)) == 4
    mgr.free(table)
    assert mgr.blocks_in_use() == 0 and mgr.num_free_blocks == 10 and len(table) == 0


def test_allocate_only_the_first_chunk():
    mgr = BlockManager(10, BS)
    table, _ = mgr.allocate(list(range(30)), num_tokens=5)
    assert len(table) == 2
    with pytest.raises(ValueError, match="num_tokens"):
        mgr.allocate([1, 2], num_tokens=3)


def test_prefix_hit_stops_before_the_last_token_block():
    mgr = BlockManager(16, BS)
    prompt = list(range(100, 110))  # 10 tokens: blocks [0:4], [4:8], [8:10]
    first, cached = run_prompt(mgr, prompt)
    assert cached == 0
    second, cached = mgr.allocate(prompt)  # shares the two full blocks while the first still runs
    assert cached == 8 and second.blocks[:2] == first.blocks[:2] and second.blocks[2] != first.blocks[2]
    assert mgr.ref_count(first.blocks[0]) == 2
    exact = prompt[:8]  # 8 tokens = 2 full blocks: the second holds the last token, so only one is shared
    third, cached = mgr.allocate(exact)
    assert cached == 4 and third.blocks[0] == first.blocks[0] and third.blocks[1] != first.blocks[1]


def test_chained_hash_needs_the_same_prefix():
    mgr = BlockManager(16, BS)
    run_prompt(mgr, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    _, cached = mgr.allocate([0, 2, 3, 4, 5, 6, 7, 8, 9])  # block 2 equal, block 1 not
    assert cached == 0
    _, cached = mgr.allocate([1, 2, 3, 4, 5, 6, 7, 0, 9])
    assert cached == 4


def test_cached_blocks_survive_free_and_count_as_free():
    mgr = BlockManager(6, BS)
    prompt = list(range(13))  # 3 full blocks + 1
    table, _ = run_prompt(mgr, prompt)
    mgr.free(table)
    assert mgr.blocks_in_use() == 0 and mgr.num_free_blocks == 6
    again, cached = mgr.allocate(prompt)
    assert cached == 12 and mgr.hit_rate == pytest.approx(3 / 6)


def test_lru_eviction_order():
    mgr = BlockManager(4, BS)
    a, _ = run_prompt(mgr, list(range(0, 5)))  # one full block + one partial
    b, _ = run_prompt(mgr, list(range(50, 55)))
    mgr.free(a)  # a's full block becomes cached first (oldest)
    mgr.free(b)
    mgr.allocate(list(range(90, 98)))  # 2 blocks: the 2 free (unhashed) blocks go first
    assert mgr.cached_prefix(list(range(0, 5)))[1] and mgr.cached_prefix(list(range(50, 55)))[1]
    mgr.allocate(list(range(200, 203)))  # 1 block: evicts the least recently used cached block, a's
    assert not mgr.cached_prefix(list(range(0, 5)))[0]
    assert mgr.cached_prefix(list(range(50, 55)))[0]


def test_a_hit_protects_a_block_from_eviction():
    mgr = BlockManager(3, BS)
    a, _ = run_prompt(mgr, list(range(5)))
    mgr.free(a)
    b, cached = mgr.allocate(list(range(5)))  # takes the cached block back
    assert cached == 4 and mgr.blocks_in_use() == 2
    assert not mgr.can_allocate(list(range(40, 48)))  # 2 more blocks: only one is left
    with pytest.raises(NoFreeBlocksError):
        mgr.allocate(list(range(40, 48)))
    assert mgr.blocks_in_use() == 2  # a failed allocation changes nothing
    assert mgr.ref_count(b.blocks[0]) == 1


def test_hash_collisions_do_not_share(monkeypatch):
    monkeypatch.setattr(bm, "block_hash", lambda parent, tokens: 7)  # every block collides
    mgr = BlockManager(8, BS)
    run_prompt(mgr, [1, 2, 3, 4, 5])
    _, cached = mgr.allocate([9, 9, 9, 9, 5])
    assert cached == 0
    _, cached = mgr.allocate([1, 2, 3, 4, 5])
    assert cached == 4


def test_duplicate_content_stays_private():
    mgr = BlockManager(8, BS)
    prompt = [1, 2, 3, 4, 5]
    a, _ = mgr.allocate(prompt)
    b, _ = mgr.allocate(prompt)  # both computed at once: no hit yet
    mgr.commit(a, prompt, 5)
    mgr.commit(b, prompt, 5)
    mgr.free(b)  # b's copy was never registered: it goes back to the free list
    assert mgr.num_free_blocks == 6 and mgr.blocks_in_use() == 2
    mgr.free(a)
    _, cached = mgr.allocate(prompt)
    assert cached == 4


def test_double_free_is_an_error():
    mgr = BlockManager(4, BS)
    table, _ = mgr.allocate([1, 2, 3])
    blocks = list(table.blocks)
    mgr.free(table)
    table.blocks.extend(blocks)
    with pytest.raises(RuntimeError, match="freed"):
        mgr.free(table)


@pytest.mark.parametrize("bad", [0, -1, 2.0])
def test_bad_sizes(bad):
    with pytest.raises(ValueError):
        BlockManager(bad, 4)
    with pytest.raises(ValueError):
        BlockManager(4, bad)


class Simulation:
    """Sequences that write their tokens into a simulated KV pool and read them back through
    their block tables: sharing or eviction mistakes show up as a sequence seeing wrong tokens."""

    def __init__(self, mgr: BlockManager, rng: random.Random):
        self.mgr, self.rng = mgr, rng
        self.pool = [[None] * mgr.block_size for _ in range(mgr.num_blocks)]
        self.live: dict[int, tuple] = {}  # id -> (tokens, table, computed)
        self.next_id = 0
        self.prefixes = [[rng.randrange(50) for _ in range(rng.randrange(1, 14))] for _ in range(3)]

    def write(self, table, tokens, start, stop):
        bs = self.mgr.block_size
        for i in range(start, stop):
            self.pool[table.blocks[i // bs]][i % bs] = tokens[i]

    def check(self):
        mgr, bs = self.mgr, self.mgr.block_size
        refs = [0] * mgr.num_blocks
        for tokens, table, computed in self.live.values():
            for b in table.blocks:
                refs[b] += 1
            seen = [self.pool[table.blocks[i // bs]][i % bs] for i in range(computed)]
            assert seen == tokens[:computed]
            assert len(table) >= mgr.blocks_for(computed)
        assert refs == [mgr.ref_count(b) for b in range(mgr.num_blocks)]
        assert mgr.blocks_in_use() == sum(r > 0 for r in refs)

    def step(self):
        rng, mgr = self.rng, self.mgr
        op = rng.random()
        if op < 0.35 or not self.live:  # a new request, often sharing a prefix
            tokens = (list(rng.choice(self.prefixes)) if rng.random() < 0.7 else []) + [
                rng.randrange(50) for _ in range(rng.randrange(1, 9))]
            chunk = rng.randrange(1, len(tokens) + 1)
            hit_tokens = len(mgr.cached_prefix(tokens)[0]) * mgr.block_size
            if not mgr.can_allocate(tokens, max(chunk, hit_tokens)):
                return
            table, cached = mgr.allocate(tokens, max(chunk, hit_tokens))
            assert cached == hit_tokens
            stop = max(chunk, cached)
            self.write(table, tokens, cached, stop)
            mgr.commit(table, tokens, stop)
            self.live[self.next_id] = (tokens, table, stop)
            self.next_id += 1
        elif op < 0.8:  # a step of a running sequence: a prefill chunk or one decoded token
            sid = rng.choice(list(self.live))
            tokens, table, computed = self.live[sid]
            if computed == len(tokens):
                tokens = tokens + [rng.randrange(50)]
            stop = min(len(tokens), computed + rng.randrange(1, 6))
            if not mgr.can_grow(table, stop):
                return
            mgr.grow(table, stop)
            self.write(table, tokens, computed, stop)
            mgr.commit(table, tokens, stop)
            self.live[sid] = (tokens, table, stop)
        else:
            tokens, table, _ = self.live.pop(rng.choice(list(self.live)))
            mgr.free(table)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("caching", [True, False])
def test_random_traces_keep_every_sequence_consistent(seed, caching):
    rng = random.Random(seed)
    mgr = BlockManager(rng.choice([6, 12, 24]), rng.choice([1, 2, 4]), enable_prefix_caching=caching)
    sim = Simulation(mgr, rng)
    for _ in range(400):
        sim.step()
        sim.check()
    for _, table, _ in sim.live.values():
        mgr.free(table)
    assert mgr.blocks_in_use() == 0 and mgr.num_free_blocks == mgr.num_blocks
    if caching:
        assert mgr.hits > 0
    else:
        assert mgr.hits == 0
