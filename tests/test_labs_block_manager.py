"""The grader of Lab 8 (labs/08_block_manager.ipynb): a paged KV block manager with prefix caching.

- the checker passes the reference answer in llmnote.labs.solutions, which follows the same rules as
  the book's engine (llmnote.engine.BlockManager);
- it fails the notebook's unfinished stub with one short line, and a half-written class naming the
  missing method;
- it fails typical wrong answers, written here the way a reader gets them wrong, with a message that
  names the operation, the request and the mistake;
- the notebook's exercise stub and its solution walkthrough agree with the reference answer.
"""

from __future__ import annotations

import inspect
import random
import re

import nbformat
import pytest
from conftest import ROOT

from llmnote.engine import BlockManager
from llmnote.labs import KVPool, LabCheckError, LabReport, check_block_manager
from llmnote.labs import solutions as S

NOTEBOOK = ROOT / "labs/08_block_manager.ipynb"
Answer = S.MyBlockManager


# ------------------------------------------------------------------ right answers


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_checker_passes_the_solution(seed, capsys):
    report = check_block_manager(Answer, seed=seed)
    assert isinstance(report, LabReport) and report.lab == "block_manager" and len(report.cases) == 12
    assert re.fullmatch(rf"block_manager: 12 cases passed \(blocks of \d+(, blocks of \d+)*; seed {seed}\)",
                        capsys.readouterr().out.strip())  # fmt: skip
    randoms = [re.search(r"\((\d+) prefix hits, (\d+) evictions\)", c) for c in report.cases[7:]]
    assert all(m and int(m[1]) > 0 for m in randoms) and sum(int(m[2]) for m in randoms) > 100


def test_checker_draws_new_traces_for_each_seed():
    one, two = (check_block_manager(Answer, seed=s, verbose=False) for s in (3, 4))
    assert one.cases != two.cases
    assert check_block_manager(Answer, seed=3, verbose=False).cases == one.cases


def test_the_solution_follows_the_engines_rules():
    """Driven through the same random trace, the lab's answer and the engine's BlockManager hand out
    the same blocks and report the same hits: the lab's rules are the engine's."""
    rng = random.Random(0)
    lab, engine = Answer(12, 4), BlockManager(12, 4)
    prefixes = [[rng.randrange(20) for _ in range(rng.randrange(1, 13))] for _ in range(3)]
    live: dict[int, tuple] = {}
    for number in range(400):
        if rng.random() < 0.5 or not live:
            tokens = rng.choice(prefixes) + [rng.randrange(20) for _ in range(rng.randrange(1, 6))]
            if not engine.can_allocate(tokens):
                lab_table, engine_table, _ = live.pop(rng.choice(sorted(live)))
                lab.free(lab_table), engine.free(engine_table)
                continue
            lab_table, lab_cached = lab.allocate(tokens)
            engine_table, engine_cached = engine.allocate(tokens)
            assert (lab_table, lab_cached) == (engine_table.blocks, engine_cached)
            lab.append(lab_table, tokens, len(tokens))
            engine.commit(engine_table, tokens, len(tokens))
            live[number] = (lab_table, engine_table, tokens)
        else:
            lab_table, engine_table, _ = live.pop(rng.choice(sorted(live)))
            lab.free(lab_table), engine.free(engine_table)
        assert lab.num_free_blocks == engine.num_free_blocks
    assert engine.hits > 0 and engine.num_free_blocks < 12


def test_kv_pool():
    pool = KVPool(4, 2)
    pool.write([3, 0], [5, 6, 7], 0, 3)
    assert pool.read([3, 0], 3) == [5, 6, 7] and pool.slots[3][1][0] == 6 and pool.slots[1] == [None, None]
    assert str(pool).splitlines()[0] == "block 0: 7 ." and pool.read([1], 1) == [None]
    with pytest.raises(ValueError, match="needs block 1"):
        pool.write([3], [5, 6, 7], 0, 3)
    with pytest.raises(ValueError, match="not a block id"):
        pool.read([9], 1)
    with pytest.raises(ValueError):
        KVPool(0, 4)


# ------------------------------------------------------------------ unfinished answers


def notebook_cells() -> list[nbformat.NotebookNode]:
    return nbformat.read(NOTEBOOK, as_version=4).cells


def exercise_source() -> str:
    (source,) = [c.source for c in notebook_cells() if c.cell_type == "code" and c.source.startswith(S.EXERCISE_MARK)]
    return source


def stub_class() -> type:
    namespace: dict = {}
    exec(compile(exercise_source(), "exercise", "exec"), namespace)
    return namespace["MyBlockManager"]


def test_checker_fails_the_notebook_stub():
    with pytest.raises(LabCheckError, match=r"^block_manager: not written yet\. Write MyBlockManager in") as failure:
        check_block_manager(stub_class(), seed=0)
    rendered = failure.value._render_traceback_()
    assert len(rendered) == 1 and "/" not in rendered[0] and len(rendered[0]) < 250


def test_checker_names_the_missing_method():
    Stub = stub_class()

    class HalfWritten(Stub):
        __init__, num_free_blocks, allocate, append = Answer.__init__, Answer.num_free_blocks, Answer.allocate, Answer.append
        _hashes, _take = Answer._hashes, Answer._take

    with pytest.raises(LabCheckError, match=r"^block_manager: not written yet\. Write HalfWritten\.free in"):
        check_block_manager(HalfWritten, seed=0)
    HalfWritten.append, HalfWritten.free = Stub.append, Answer.free  # allocate calls the unwritten append
    with pytest.raises(LabCheckError, match=r"^block_manager: not written yet\. Write HalfWritten\.append in"):
        check_block_manager(HalfWritten, seed=0)


def test_checker_wants_the_class():
    with pytest.raises(TypeError, match="takes your class"):
        check_block_manager(Answer(4, 4))


# ------------------------------------------------------------------ wrong answers


class NoReferenceCounts(Answer):
    def free(self, block_table):
        for block in reversed(block_table):
            self.ref_count[block] = 0
            if self.cached.get(self.hash_of[block]) == block:
                self.lru[block] = None
            elif block not in self.free_list:
                self.hash_of[block] = None
                self.free_list.append(block)


class MatchesTheLastBlock(Answer):
    def allocate(self, token_ids):
        table = []
        for h in self._hashes(token_ids, len(token_ids) // self.block_size):  # includes the last token's block
            if (block := self.cached.get(h)) is None:
                break
            if self.ref_count[block] == 0:
                del self.lru[block]
            self.ref_count[block] += 1
            table.append(block)
        cached = len(table) * self.block_size
        self.append(table, token_ids, cached)
        return table, cached


class UnchainedHashes(Answer):
    def _hashes(self, token_ids, num_blocks):
        bs = self.block_size
        return [hash(tuple(token_ids[i * bs : (i + 1) * bs])) for i in range(num_blocks)]


class HitStaysOnTheLRUList(Answer):
    def allocate(self, token_ids):
        table = []
        for h in self._hashes(token_ids, (len(token_ids) - 1) // self.block_size):
            if (block := self.cached.get(h)) is None:
                break
            self.ref_count[block] += 1  # but the block stays on the LRU list
            table.append(block)
        cached = len(table) * self.block_size
        self.append(table, token_ids, cached)
        return table, cached


class MostRecentlyUsedFirst(Answer):
    def _take(self):
        if self.free_list:
            block = self.free_list.popleft()
        else:
            block, _ = self.lru.popitem()  # last=True: the newest
            del self.cached[self.hash_of[block]]
            self.hash_of[block] = None
        self.ref_count[block] = 1
        return block


class ReleasesFirstToLast(Answer):
    def free(self, block_table):
        for block in block_table:
            super().free([block])


class EvictsBeforeTheFreeList(Answer):
    def _take(self):
        if self.lru:
            block, _ = self.lru.popitem(last=False)
            del self.cached[self.hash_of[block]]
            self.hash_of[block] = None
            self.ref_count[block] = 1
            return block
        return super()._take()


class ForgetsCachedBlocksAtFree(Answer):
    def free(self, block_table):
        super().free(block_table)
        while self.lru:
            block, _ = self.lru.popitem(last=False)
            del self.cached[self.hash_of[block]]
            self.hash_of[block] = None
            self.free_list.append(block)


class NeverRegisters(Answer):
    def append(self, block_table, token_ids, num_computed):
        super().append(block_table, token_ids, 0)


class RegistersBeforeComputing(Answer):
    def append(self, block_table, token_ids, num_computed):
        super().append(block_table, token_ids, len(token_ids))


class KeepsEvictedHashes(Answer):
    def _take(self):
        if self.free_list:
            block = self.free_list.popleft()
        else:
            block, _ = self.lru.popitem(last=False)  # its hash stays in self.cached
            self.hash_of[block] = None
        self.ref_count[block] = 1
        return block


class RegistersPrivateCopiesLater(Answer):
    def append(self, block_table, token_ids, num_computed):
        super().append(block_table, token_ids, num_computed)
        for block in block_table:
            h = self.hash_of[block]
            if h is not None and h not in self.cached:
                self.cached[h] = block


class CountsOnlyTheFreeList(Answer):
    @property
    def num_free_blocks(self):
        return len(self.free_list)


class ReturnsANewTable(Answer):
    def append(self, block_table, token_ids, num_computed):
        table = list(block_table)
        super().append(table, token_ids, num_computed)
        return table


WRONG = {
    NoReferenceCounts: r"(?s)free\(block_table\) for request.*num_free_blocks is \d+, expected \d+.*still held by.*Count",
    MatchesTheLastBlock: r"(?s)num_cached_tokens is (\d+) for a \1-token prompt.*never shared",
    UnchainedHashes: r"(?s)hashes chain\).*num_cached_tokens is 8, expected 4.*hash of the block before it",
    HitStaysOnTheLRUList: r"(?s)allocate\(token_ids\).*num_free_blocks is \d+.*no longer evictable: take it off the LRU list",
    MostRecentlyUsedFirst: r"(?s)evicted cached block\(s\) \[\d+\], expected the least recently used.*most recently used",
    ReleasesFirstToLast: r"(?s)expected the least recently used.*last to first",
    EvictsBeforeTheFreeList: r"(?s)was evicted while \d+ block\(s\) with no hash were free.*free block first",
    ForgetsCachedBlocksAtFree: r"(?s)num_cached_tokens is 0, expected 8.*free keeps it cached",
    NeverRegisters: r"(?s)request B.*num_cached_tokens is 0, expected 8.*append registers each block",
    RegistersBeforeComputing: r"(?s)num_cached_tokens is 8, expected 0.*only once its tokens are computed",
    KeepsEvictedHashes: r"(?s)num_cached_tokens is 8, expected 4.*remove its hash",
    RegistersPrivateCopiesLater: r"(?s)the second copy stays private.*request E.*expected 0.*stays private for good",
    CountsOnlyTheFreeList: r"(?s)num_free_blocks is 5, expected 8.*cached blocks that no table holds too",
    ReturnsANewTable: r"(?s)holds 0 blocks for \d+ tokens",
}


@pytest.mark.parametrize("wrong", WRONG, ids=lambda cls: cls.__name__)
def test_checker_names_the_mistake(wrong):
    with pytest.raises(LabCheckError, match=WRONG[wrong]) as failure:
        check_block_manager(wrong, seed=0, verbose=False)
    message = str(failure.value)
    assert message.startswith("block_manager failed on case ") and ", operation " in message and "\n  Hint: " in message
    assert message.endswith(f"Rerun this draw with check_block_manager({wrong.__name__}, seed=0).")


def test_checker_catches_an_eviction_of_a_block_in_use():
    class LRUBeforeRelease(Answer):  # puts a block on the LRU list when it is registered, while a table holds it
        def append(self, block_table, token_ids, num_computed):
            super().append(block_table, token_ids, num_computed)
            for b in block_table:
                if self.hash_of[b] is not None and self.cached.get(self.hash_of[b]) == b:
                    self.lru.setdefault(b, None)

        def free(self, block_table):
            for b in reversed(block_table):
                if self.ref_count[b] == 1:
                    self.lru.pop(b, None)  # so that free puts it back at the newest end
            super().free(block_table)

        @property
        def num_free_blocks(self):
            return len(self.free_list) + sum(self.ref_count[b] == 0 for b in self.lru)

    failures = []
    for seed in range(3):
        with pytest.raises(LabCheckError) as failure:
            check_block_manager(LRUBeforeRelease, seed=seed, verbose=False)
        failures.append(str(failure.value))
    assert all(
        re.search(r"is handed to request \w+ while \[.+\] still hold it|appears twice in the block table", f) for f in failures
    )
    assert any("is handed to request" in f for f in failures), failures


# ------------------------------------------------------------------ the notebook


def test_the_stub_has_the_solutions_interface():
    Stub = stub_class()
    assert isinstance(Stub.num_free_blocks, property) and isinstance(Answer.num_free_blocks, property)
    for name in ("__init__", "allocate", "append", "free"):
        assert inspect.signature(getattr(Stub, name)) == inspect.signature(getattr(Answer, name)), name
    assert exercise_source().count("raise NotImplementedError") == 4


def test_the_walkthrough_shows_the_solution():
    markdown = "\n".join(c.source for c in notebook_cells() if c.cell_type == "markdown")
    walkthrough = markdown[markdown.index("<summary>Solution</summary>") :]
    (shown,) = re.findall(r"```python\n(.*?)```", walkthrough[: walkthrough.index("</details>")], re.S)
    assert shown.strip() == S.source("block_manager").split("\n", 1)[1].strip()


def test_the_solution_runs_with_the_notebooks_imports():
    """The answer, pasted into the exercise cell, needs nothing the notebook does not import; and
    the notebook calls the check the way the test suite does."""
    cells = [c for c in notebook_cells() if c.cell_type == "code"]
    exercise = next(i for i, c in enumerate(cells) if c.source.startswith(S.EXERCISE_MARK))
    namespace: dict = {}
    for cell in cells[1:exercise]:  # the Colab guard aside
        exec(compile(cell.source, "notebook", "exec"), namespace)
    exec(compile(S.source("block_manager"), "exercise", "exec"), namespace)
    assert check_block_manager(namespace["MyBlockManager"], seed=5, verbose=False).lab == "block_manager"
    (check,) = [c for c in cells if "check_block_manager(MyBlockManager)" in c.source]
    assert check.source == "report = check_block_manager(MyBlockManager)" and check.metadata.get("tags") == ["raises-exception"]
    assert cells.index(check) > exercise


def test_no_answer_in_plain_view():
    text = "\n".join(re.sub(r"<details>.*?</details>", "", c.source, flags=re.S) for c in notebook_cells())
    lines = [line.split("  #")[0].strip() for line in S.source("block_manager").splitlines()[1:]]
    lines = [line for line in lines if len(line) >= 12 and not line.startswith(("def ", "class ", "@property"))]
    shown = [line for line in lines if line in text]
    assert len(shown) <= 0.2 * len(lines), shown
