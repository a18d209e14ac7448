"""The engine end to end on a CPU with llmnote-tiny in float32: greedy outputs equal
transformers' generate token for token, whatever the batch, chunking, preemption or prefix
hits; sampling parameters, seeds, stop strings and streaming text."""

import random

import numpy as np
import pytest
import torch

from llmnote.engine import LLM, SamplingParams
from llmnote.engine.outputs import Detokenizer
from llmnote.engine.sampler import SamplingTensors, sample
from llmnote.layers.sampler import SamplingParams as LayerParams
from llmnote.layers.sampler import filter_logits
from llmnote.paths import models_dir

TINY = models_dir() / "llmnote-tiny"
EOS = 0


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32).eval()


def hf_greedy(hf, prompt: list[int], max_tokens: int, ignore_eos: bool) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False, min_new_tokens=0,
                          eos_token_id=None if ignore_eos else EOS, pad_token_id=EOS)[0, len(prompt):].tolist()  # fmt: skip
    if not ignore_eos and EOS in out:
        out = out[: out.index(EOS) + 1]
    return out


def tiny(**kw) -> LLM:
    return LLM(TINY, device="cpu", dtype=torch.float32, **kw)


@pytest.mark.parametrize("seed,blocks,budget,caching", [(0, 10, 16, True), (1, 14, 24, False), (2, 200, 512, True)])
def test_greedy_equals_transformers_under_pressure(hf_model, seed, blocks, budget, caching):
    rng = random.Random(seed)
    llm = tiny(block_size=4, num_kv_blocks=blocks, max_num_batched_tokens=budget, max_num_seqs=6,
               enable_prefix_caching=caching, max_model_len=64)  # fmt: skip
    shared = [rng.randrange(1, 4096) for _ in range(10)]
    prompts, params = [], []
    for _ in range(8):
        prefix = shared[: rng.randrange(11)] if rng.random() < 0.6 else []
        prompts.append(prefix + [rng.randrange(1, 4096) for _ in range(rng.randrange(1, 14))])
        params.append(SamplingParams(temperature=0, max_tokens=rng.randrange(1, 16), ignore_eos=rng.random() < 0.5))
    outs = llm.generate(prompts[:3], params[:3], use_tqdm=False)  # a first wave fills the prefix cache
    outs += llm.generate(prompts[3:], params[3:], use_tqdm=False)
    for prompt, p, out in zip(prompts, params, outs):
        assert out.prompt_token_ids == prompt
        assert out.token_ids == hf_greedy(hf_model, prompt, p.max_tokens, p.ignore_eos)
    assert llm.kv_blocks_in_use() == 0
    sched = llm.engine.scheduler
    if blocks <= 14:
        assert sched.num_preemptions > 0  # the small caches force preemption
    if caching:
        assert llm.engine.blocks.hits > 0


def test_a_replayed_decode_step_gets_the_inputs_the_plan_computes():
    """The inputs copied into a decode step's CUDA graph (built on the host, so checked here)
    equal the eager plan's for the real rows; padding rows write one token to the scratch block."""
    from llmnote.engine.model_runner import Work

    runner = tiny(block_size=4, num_kv_blocks=64, max_model_len=64).engine.runner
    rng = random.Random(5)
    work = []
    for _ in range(3):
        n = rng.randrange(1, 30)
        work.append(Work([rng.randrange(4096) for _ in range(n + 1)], rng.sample(range(64), n // 4 + 1), n, 1))
    ids, ctx, _, order = runner.plan(work)
    assert order == [0, 1, 2]
    wide = (np.full((3, 6), -1), np.full(6, -1, dtype=np.int32), np.full((6, 20), -1, dtype=np.int32))
    for buffers in ((None, None, None), wide):  # new arrays, or the head of larger (pinned) buffers
        meta, lens, tables = runner.decode_inputs(work, 4, *buffers)
        for row, want in zip((*meta[:, :3], lens[:3]), (ids, ctx.positions, ctx.slot_mapping, ctx.seq_lens)):
            assert row.tolist() == want.tolist()
        assert (tables[:3] == ctx.block_tables.numpy()).all()
        assert meta[:, 3].tolist() == [0, 0, runner.scratch * 4] and lens[3] == 1 and (tables[3] == runner.scratch).all()
    assert (wide[0][:, 4:] == -1).all() and (wide[2][:, tables.shape[1] :] == -1).all()  # nothing past the step's part
    meta, lens, tables = runner.decode_inputs(work[1:2], 2)  # one sequence takes a shorter path
    assert meta[:, 0].tolist() == [int(ids[1]), int(ctx.positions[1]), int(ctx.slot_mapping[1])]
    assert lens.tolist() == [int(ctx.seq_lens[1]), 1]
    used = len(work[1].blocks)
    assert (tables[0, :used] == work[1].blocks).all() and (tables[0, used:] == runner.scratch).all()


def test_text_prompts_stop_strings_and_finish_reasons():
    llm = tiny()
    [plain] = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)
    assert plain.finish_reason == "length" and len(plain.token_ids) == 30
    assert plain.text == llm.tokenizer.decode(plain.token_ids)
    stop = plain.text[8:11]
    first = plain.text.find(stop)
    [cut] = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=30, stop=[stop]), use_tqdm=False)
    assert cut.finish_reason == "stop" and cut.text == plain.text[:first]
    assert cut.token_ids == plain.token_ids[: len(cut.token_ids)] and len(cut.token_ids) < 30


def test_seeded_sampling_is_independent_of_the_batch():
    llm = tiny()
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, max_tokens=12, seed=123, ignore_eos=True)
    [alone] = llm.generate(["The king"], params, use_tqdm=False)
    others = [SamplingParams(temperature=0.8, max_tokens=12, ignore_eos=True)] * 3
    batch = llm.generate(["A", "The king", "B c", "D"], [others[0], params, others[1], others[2]], use_tqdm=False)
    assert batch[1].token_ids == alone.token_ids
    [other_seed] = llm.generate(["The king"], SamplingParams(temperature=1.0, max_tokens=12, seed=7, ignore_eos=True),
                                use_tqdm=False)  # fmt: skip
    assert other_seed.token_ids != alone.token_ids


def test_requests_that_never_fit_are_refused_before_anything_runs():
    llm = tiny(block_size=4, num_kv_blocks=4, max_model_len=64)
    with pytest.raises(ValueError, match="KV blocks"):
        llm.generate([[5, 6], list(range(1, 20))], SamplingParams(max_tokens=8), use_tqdm=False)
    assert not llm.engine.has_unfinished() and llm.kv_blocks_in_use() == 0
    with pytest.raises(ValueError, match="maximum length"):
        llm.generate([[5] * 60], SamplingParams(max_tokens=8), use_tqdm=False)
    with pytest.raises(TypeError):
        llm.generate([[1.5, 2]], use_tqdm=False)
    with pytest.raises(ValueError, match="token ids"):
        llm.generate([[1, 99999]], use_tqdm=False)


def test_the_default_pool_is_capped_by_the_batch_and_refused_when_memory_is_short(monkeypatch):
    from llmnote.engine import llm as llm_module

    # twice a full batch of the longest sequences: 2 seqs x 64 tokens / 4 a block, twice
    engine = tiny(block_size=4, max_num_seqs=2, max_model_len=64).engine
    assert engine.blocks.num_blocks == 2 * 2 * 16
    cfg = engine.model.config
    per_block = 2 * cfg.num_layers * 4 * engine.model.cache_config().num_kv_heads * cfg.head_dim * 4  # float32
    monkeypatch.setattr(llm_module, "_CPU_KV_BYTES", 50 * per_block)  # now memory binds before the cap
    assert tiny(block_size=4, max_num_seqs=2, max_model_len=64).engine.blocks.num_blocks == 50
    monkeypatch.setattr(llm_module, "_CPU_KV_BYTES", 15 * per_block)  # not one 64-token sequence: refused
    with pytest.raises(RuntimeError, match="fewer than one sequence"):
        tiny(block_size=4, max_num_seqs=2, max_model_len=64)


def test_prefix_cache_reports_cached_tokens():
    llm = tiny(block_size=4)
    system = list(range(10, 30))
    llm.generate([system + [1, 2]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    [out] = llm.generate([system + [3]], SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert out.num_cached_tokens == 20


@pytest.mark.parametrize("seed", range(3))
def test_batched_sampler_filters_match_the_layer_reference(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(5, 40, generator=g) * 3
    rows = [SamplingParams(temperature=0.7, top_k=5), SamplingParams(temperature=1.3, top_p=0.6),
            SamplingParams(temperature=1.0, min_p=0.2), SamplingParams(temperature=0.0),
            SamplingParams(temperature=0.9, top_k=12, top_p=0.8, min_p=0.05)]  # fmt: skip
    t = SamplingTensors.build(rows, [None] * 5, 40, torch.device("cpu"))
    for trial in range(200):
        tokens = sample(logits, t)
        for r, p in enumerate(rows):
            ref = LayerParams(temperature=p.temperature, top_k=max(p.top_k, 0), top_p=p.top_p, min_p=p.min_p)
            allowed = torch.isfinite(filter_logits(logits[r : r + 1], ref))[0]
            assert allowed[tokens[r]], (trial, r)
    assert tokens[3] == logits[3].argmax()


def test_exponential_race_samples_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(20000, 4).contiguous()
    t = SamplingTensors.build([SamplingParams(temperature=1.0)] * 20000, [None] * 20000, 4, torch.device("cpu"))
    counts = torch.bincount(sample(logits, t), minlength=4).float() / 20000
    assert torch.allclose(counts, probs, atol=0.015)


def test_streamed_text_never_splits_a_character():
    llm = tiny()
    text = "café naïve — 東京 🙂 done"
    ids = llm.tokenizer.encode(text).ids
    detok, deltas = Detokenizer(llm.tokenizer), []
    for n in range(1, len(ids) + 1):
        deltas.append(detok.update(ids[:n], final=n == len(ids)))
    assert "".join(deltas) == llm.tokenizer.decode(ids)
    assert not any("\ufffd" in d for d in deltas)


def test_stop_string_across_tokens_is_held_back():
    llm = tiny()
    ids = llm.tokenizer.encode("alpha beta gamma delta").ids
    detok, out = Detokenizer(llm.tokenizer, stop=("gamma",)), ""
    for n in range(1, len(ids) + 1):
        out += detok.update(ids[:n])
        assert "gam" not in out
        if detok.stopped:
            break
    assert detok.stopped and out == "alpha beta "


def test_a_chain_of_greedy_steps_equals_steps_one_at_a_time():
    """ModelRunner.chain (a draft's steps 2..k, one graph replay on a GPU) chooses the tokens of
    separate decode steps, each fed the last one's argmax at the next position."""
    from llmnote.engine.model_runner import ModelRunner, Work
    from llmnote.models import load_model

    model = load_model(models_dir() / "llmnote-draft", device="cpu", dtype=torch.float32)
    prompts, tables = [[5, 9, 2, 7, 1], [3, 3, 8], [11, 40]], [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    chained, stepped = (ModelRunner(model, 12, 4, 4, 64) for _ in range(2))
    firsts = [r.logits([Work(p, t, 0, len(p)) for p, t in zip(prompts, tables)]).argmax(-1) for r in (chained, stepped)]
    assert torch.equal(*firsts)
    got = chained.chain(firsts[0], [len(p) - 1 for p in prompts], tables, 6)
    seqs = [p + [int(f)] for p, f in zip(prompts, firsts[1])]
    for _ in range(6):
        nxt = stepped.logits([Work(s, t, len(s) - 1, 1) for s, t in zip(seqs, tables)]).argmax(-1)
        seqs = [s + [int(x)] for s, x in zip(seqs, nxt)]
    assert got.tolist() == [s[len(p) + 1 :] for s, p in zip(seqs, prompts)]


@pytest.mark.parametrize("k,blocks", [(1, None), (3, 12), (5, None)])
def test_speculative_greedy_equals_plain_greedy(k, blocks):
    draft = models_dir() / "llmnote-draft"
    extra = {"block_size": 4, "num_kv_blocks": blocks, "max_model_len": 96} if blocks else {}
    plain = tiny(**extra)
    spec = tiny(speculative_model=draft, num_speculative_tokens=k, **extra)
    prompts = ["Once upon a time", "The cat sat on the", "And the LORD said", [5, 17, 99, 300], "Hello"]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=i % 2 == 0) for i, m in enumerate((24, 9, 30, 17, 2))]
    want = plain.generate(prompts, params, use_tqdm=False)
    got = spec.generate(prompts, params, use_tqdm=False)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.text for g in got] == [w.text for w in want]
    assert 0 < spec.engine.spec.acceptance_rate <= 1 and spec.kv_blocks_in_use() == 0
    if blocks:
        assert spec.engine.scheduler.num_preemptions > 0
    else:  # greedy rounds launched from the last round's state on the device, before its tokens were read
        assert any(step["ahead"] for step in spec.engine.step_log)


def test_speculative_sampling_is_seeded_and_valid():
    spec = tiny(speculative_model=models_dir() / "llmnote-draft", num_speculative_tokens=3)
    params = SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, seed=5, ignore_eos=True)
    a, b = (spec.generate(["The king"], params, use_tqdm=False)[0] for _ in range(2))
    assert a.token_ids == b.token_ids and len(a.token_ids) == 20


def test_rejection_sampling_keeps_the_target_distribution():
    from llmnote.engine.speculative import rejection_sample

    g = torch.Generator().manual_seed(0)
    n, k, v = 40000, 2, 5
    p = torch.softmax(torch.randn(k + 1, v, generator=g) * 1.5, -1)
    q = torch.softmax(torch.randn(k, v, generator=g) * 1.5, -1)
    drafts = torch.stack([torch.multinomial(q[i], n, replacement=True, generator=g) for i in range(k)], 1)
    kept, nxt = rejection_sample(p.expand(n, k + 1, v), q.expand(n, k, v), drafts, [None] * n)
    first = torch.where(kept > 0, drafts[:, 0], nxt)
    assert torch.allclose(torch.bincount(first, minlength=v).float() / n, p[0], atol=0.01)
    both = kept == 2  # all drafts kept: the bonus token follows the last position's target distribution
    assert torch.allclose(torch.bincount(nxt[both], minlength=v).float() / both.sum(), p[2], atol=0.02)
    expected_accept = torch.minimum(p[0], q[0]).sum()  # P(first draft kept) = sum_x min(p, q)
    assert abs((kept > 0).float().mean() - expected_accept) < 0.01


def test_decode_steps_launched_ahead_change_no_token():
    """A decode step is launched before the last one's tokens reach the host, its input tokens
    taken from the device. The outputs equal an engine that never looks ahead, for greedy and
    seeded sampling, for requests that end on EOS, by length or on a stop string; sequences
    crossing into new blocks together in a nearly full pool get them (or the engine waits for
    the scheduler), and every block comes back."""

    def run(ahead: bool):
        # 4 prompts of 5 tokens in blocks of 4, 12 new tokens each: all cross into a new block at
        # the same step, and at their fourth block the 14-block pool cannot hold all of them
        llm = tiny(block_size=4, num_kv_blocks=14, max_model_len=64, enable_prefix_caching=False)
        if not ahead:
            llm.engine._look_ahead = lambda *args: None
        prompts = [[11 + i, 40, 7, 300 + i, 9] for i in range(4)]
        params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
                  SamplingParams(temperature=0.9, seed=3, max_tokens=12, ignore_eos=True),
                  SamplingParams(temperature=0, max_tokens=12),  # may end on EOS
                  SamplingParams(temperature=0.7, seed=5, max_tokens=12)]  # fmt: skip
        outs = llm.generate(prompts, params, use_tqdm=False)
        single = llm.generate([prompts[0]], params[0], use_tqdm=False)[0]
        log = list(llm.engine.step_log)
        assert llm.engine.kv_blocks_in_use() == 0
        return [o.token_ids for o in outs] + [single.token_ids], sum(s["ahead"] for s in log), llm

    (plain, none, _), (fast, some, llm) = run(False), run(True)
    assert fast == plain and none == 0 and some >= 10
    # stop strings: the stopped text is cut as without looking ahead
    text = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=30), use_tqdm=False)[0].text
    cut = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=30, stop=[text[8:11]]), use_tqdm=False)
    assert cut[0].finish_reason == "stop" and cut[0].text == text[: text.find(text[8:11])]
    assert llm.engine.kv_blocks_in_use() == 0
