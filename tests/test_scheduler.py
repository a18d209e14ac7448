"""The scheduler with a fake model: every sequence reads its context back through its block
table from a simulated KV pool, so outputs come out right only if scheduling, chunking,
preemption and prefix sharing never lose or mix up a token."""

import random

import pytest

from llmnote.engine.block_manager import BlockManager
from llmnote.engine.scheduler import Scheduler, SchedulerConfig
from llmnote.engine.sequence import SamplingParams, Sequence

VOCAB, EOS = 50, 0


def next_token(context: list[int]) -> int:
    """The fake model: a deterministic function of the whole context, EOS-free unless the
    context's sum says so."""
    h = hash(tuple(context)) % 997
    return EOS if h == 3 else 1 + h % (VOCAB - 1)


def reference(seq: Sequence) -> list[int]:
    tokens, out = list(seq.prompt_token_ids), []
    while True:
        t = next_token(tokens)
        tokens.append(t)
        out.append(t)
        if (t == EOS and not seq.params.ignore_eos) or len(out) == seq.params.max_tokens:
            return out


class FakeRunner:
    def __init__(self, blocks: BlockManager):
        self.bs = blocks.block_size
        self.pool = [[None] * self.bs for _ in range(blocks.num_blocks)]

    def slot(self, seq, i):
        return seq.table.blocks[i // self.bs], i % self.bs

    def run(self, batch) -> list[int | None]:
        out = []
        for seq, n, sample in zip(batch.seqs, batch.num_tokens, batch.samples):
            for i in range(seq.num_computed, seq.num_computed + n):  # write the new tokens' "KV"
                b, s = self.slot(seq, i)
                self.pool[b][s] = seq.token_ids[i]
            if sample:  # read the whole context back through the table
                end = seq.num_computed + n
                context = [self.pool[b][s] for b, s in (self.slot(seq, i) for i in range(end))]
                out.append(next_token(context))
            else:
                out.append(None)
        return out


def run(sched: Scheduler, runner: FakeRunner, max_steps=10_000, check=None):
    steps = 0
    while sched.has_unfinished():
        batch = sched.schedule()
        assert len(batch) > 0, "a step with nothing scheduled would loop forever"
        if check:
            check(batch)
        sched.update(batch, runner.run(batch))
        steps += 1
        assert steps < max_steps
    return steps


def make(num_blocks=64, block_size=4, caching=True, **cfg):
    blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    return Scheduler(blocks, SchedulerConfig(**cfg)), FakeRunner(blocks)


def test_params_validate():
    assert SamplingParams(stop="x").stop == ("x",)
    for bad in ({"temperature": -1}, {"top_p": 0}, {"top_k": -2}, {"min_p": 2}, {"max_tokens": 0},
                {"max_tokens": 1.5}, {"stop": [""]}, {"seed": "1"}, {"temperature": float("nan")}):  # fmt: skip
        with pytest.raises(ValueError):
            SamplingParams(**bad)
    with pytest.raises(ValueError, match="prompt"):
        Sequence([])


@pytest.mark.parametrize("seed", range(8))
def test_random_mixes_match_the_reference(seed):
    rng = random.Random(seed)
    caching, chunked = rng.random() < 0.7, rng.random() < 0.8
    budget = rng.choice([8, 16, 64]) if chunked else 64
    sched, runner = make(num_blocks=rng.choice([12, 20, 40]), block_size=rng.choice([2, 4, 8]), caching=caching,
                         max_num_seqs=rng.choice([2, 4, 16]), max_num_batched_tokens=budget, max_model_len=64,
                         enable_chunked_prefill=chunked)  # fmt: skip
    shared = [rng.randrange(1, VOCAB) for _ in range(12)]
    seqs = []
    for _ in range(24):
        prefix = shared[: rng.randrange(13)] if rng.random() < 0.5 else []
        prompt = prefix + [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 20))]
        params = SamplingParams(temperature=0, max_tokens=rng.randrange(1, 24), ignore_eos=rng.random() < 0.3)
        seqs.append(Sequence(prompt, params, eos_token_id=EOS))
    pending, refused = list(seqs), []

    def submit():
        seq = pending.pop(0)
        if sched.blocks.blocks_for(seq.max_len - 1) > sched.blocks.num_blocks:
            with pytest.raises(ValueError, match="KV blocks"):
                sched.add(seq)
            refused.append(seq)
        else:
            sched.add(seq)

    def check(batch):
        cfg = sched.config
        assert batch.total_tokens <= cfg.max_num_batched_tokens and len(batch) <= cfg.max_num_seqs
        if pending and rng.random() < 0.3:  # requests keep arriving while others run
            submit()

    while pending:
        submit()
        run(sched, runner, check=check)
    assert len(refused) < len(seqs) // 2
    for seq in (s for s in seqs if s not in refused):
        assert seq.finished and seq.output_token_ids == reference(seq)
        assert seq.finish_reason == ("stop" if seq.output_token_ids[-1] == EOS and not seq.params.ignore_eos else "length")
    assert sched.blocks.blocks_in_use() == 0


def test_small_cache_preempts_and_still_finishes_everything():
    sched, runner = make(num_blocks=10, block_size=4, max_num_batched_tokens=32, max_model_len=40)
    seqs = [Sequence([i + 1] * 5, SamplingParams(max_tokens=20, ignore_eos=True)) for i in range(6)]
    for s in seqs:
        sched.add(s)
    run(sched, runner)
    assert sched.num_preemptions > 0
    assert all(s.output_token_ids == reference(s) for s in seqs)
    assert seqs[0].num_preemptions == 0  # the oldest is never the victim while others run
    assert sched.blocks.blocks_in_use() == 0


def test_preempted_sequence_keeps_its_place_in_line():
    sched, runner = make(num_blocks=6, block_size=4, max_num_seqs=3, max_num_batched_tokens=64, max_model_len=24)
    a, b, c, d = (Sequence([k] * 4, SamplingParams(max_tokens=12, ignore_eos=True)) for k in (1, 2, 3, 4))
    for s in (a, b, c, d):  # d waits: three sequences at most run at once
        sched.add(s)
    for _ in range(40):
        batch = sched.schedule()
        if batch.preempted:
            break
        sched.update(batch, runner.run(batch))
    assert batch.preempted == [c]  # the newest running sequence is the victim
    assert list(sched.waiting) == [c, d]  # ahead of d, which arrived after it
    run(sched, runner)
    assert all(s.output_token_ids == reference(s) for s in (a, b, c, d))


def test_chunked_prefill_splits_a_long_prompt_and_keeps_decoding():
    sched, runner = make(num_blocks=64, block_size=4, max_num_batched_tokens=8, max_model_len=64)
    short = Sequence([1, 2], SamplingParams(max_tokens=30, ignore_eos=True))
    sched.add(short)
    sched.update(b := sched.schedule(), runner.run(b))  # short's prefill
    long = Sequence(list(range(1, 41)), SamplingParams(max_tokens=2, ignore_eos=True))
    sched.add(long)
    chunks = []
    while not long.output_token_ids:
        batch = sched.schedule()
        assert short in batch.seqs  # the decode runs every step beside the chunks
        chunks.append(batch.num_tokens[batch.seqs.index(long)])
        sched.update(batch, runner.run(batch))
    assert chunks == [7, 7, 7, 7, 7, 5]  # 8-token budget minus the decode's one
    assert long.output_token_ids == reference(long)[:1]


def test_without_chunked_prefill_a_prompt_waits_for_room():
    with pytest.raises(ValueError, match="chunked"):
        SchedulerConfig(max_num_batched_tokens=8, max_model_len=64, enable_chunked_prefill=False)
    sched, runner = make(max_num_batched_tokens=40, max_model_len=40, enable_chunked_prefill=False)
    a = Sequence([1] * 30, SamplingParams(max_tokens=5, ignore_eos=True))
    b = Sequence([2] * 30, SamplingParams(max_tokens=5, ignore_eos=True))
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert batch.seqs == [a] and batch.num_tokens == [30]


def test_prefix_cache_hit_is_reported():
    sched, runner = make(num_blocks=32, block_size=4, max_num_batched_tokens=64, max_model_len=64)
    system = list(range(1, 17))
    first = Sequence(system + [20], SamplingParams(max_tokens=3, ignore_eos=True))
    sched.add(first)
    run(sched, runner)
    second = Sequence(system + [30, 31], SamplingParams(max_tokens=3, ignore_eos=True))
    sched.add(second)
    batch = sched.schedule()
    assert second.num_cached_tokens == 16 and batch.num_tokens == [2]
    sched.update(batch, runner.run(batch))
    run(sched, runner)
    assert second.output_token_ids == reference(second)


def test_requests_that_can_never_fit_are_refused_up_front():
    sched, _ = make(num_blocks=4, block_size=4, max_num_batched_tokens=64, max_model_len=64)
    with pytest.raises(ValueError, match="KV blocks"):
        sched.add(Sequence([1] * 10, SamplingParams(max_tokens=8)))  # 17 slots > 16
    sched.add(Sequence([1] * 10, SamplingParams(max_tokens=7)))  # 16 slots: fits alone
    with pytest.raises(ValueError, match="maximum length"):
        make(max_model_len=16)[0].add(Sequence([1] * 10, SamplingParams(max_tokens=7)))


def test_queue_is_first_come_first_served():
    sched, runner = make(num_blocks=8, block_size=4, max_num_batched_tokens=64, max_model_len=32)
    big = Sequence([1] * 20, SamplingParams(max_tokens=10, ignore_eos=True))  # 5 blocks
    blocked = Sequence([2] * 20, SamplingParams(max_tokens=1))  # 5 blocks: does not fit beside big
    small = Sequence([3], SamplingParams(max_tokens=1))  # would fit, but arrived later
    for s in (big, blocked, small):
        sched.add(s)
    batch = sched.schedule()
    assert batch.seqs == [big]
    sched.update(batch, runner.run(batch))
    run(sched, runner)
    assert blocked.first_scheduled_time < small.first_scheduled_time


def test_abort_frees_blocks():
    sched, runner = make()
    seqs = [Sequence([5] * 9, SamplingParams(max_tokens=50, ignore_eos=True)) for _ in range(3)]
    for s in seqs:
        sched.add(s)
    sched.update(b := sched.schedule(), runner.run(b))
    sched.finish(seqs[1], "abort")
    sched.finish(seqs[1], "abort")  # twice is harmless
    assert seqs[1].finished and seqs[1].finish_reason == "abort"
    run(sched, runner)
    assert sched.blocks.blocks_in_use() == 0
