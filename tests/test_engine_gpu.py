"""The serving engine on a real GPU: its CUDA-graph decode steps (padded rows on a scratch
block) and its mixed steps (decodes through the paged kernel, a prefill chunk through
variable-length attention in the same pass) against the engine's reference path on the CPU in
float32, and whole engines (graphs, preemption, speculation) that finish every request and
hand every block back. Skipped without CUDA; part of ``make gpu-check``."""

import random

import pytest
import torch

from llmnote import runtime
from llmnote.engine import LLM, SamplingParams
from llmnote.engine.model_runner import ModelRunner, Work
from llmnote.models import load_model
from llmnote.paths import models_dir

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TINY, DRAFT = models_dir() / "llmnote-tiny", models_dir() / "llmnote-draft"


def runners():
    """The reference (CPU, float32, eager), and on the GPU in 16 bits one eager and one with graphs."""
    args = (40, 4, 8, 96)  # blocks, block size, max sequences, max length
    cpu = ModelRunner(load_model(TINY, device="cpu", dtype=torch.float32), *args, enforce_eager=True)
    gpu_model = load_model(TINY, device="cuda", dtype=runtime.half_dtype())
    return cpu, ModelRunner(gpu_model, *args, enforce_eager=True), ModelRunner(gpu_model, *args)


def close(a: torch.Tensor, ref: torch.Tensor, tol: float) -> None:
    a = a.float().cpu()
    err = (a - ref).norm() / ref.norm()
    assert err < tol, err
    assert (a.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.75


@torch.no_grad()
def test_graph_replays_and_mixed_steps_match_the_reference_path():
    cpu, eager, graphed = runners()
    assert graphed.graphs and not eager.graphs
    rng = random.Random(0)
    # three sequences on scattered blocks; one token ids list each, grown as the steps go
    tables = [[7, 2, 30, 11, 5, 19, 36, 12], [1, 25, 3, 14, 8, 33, 38, 13], [0, 9, 22, 17, 28, 4, 35, 20]]
    seqs = [[rng.randrange(1, 4096) for _ in range(n)] for n in (13, 6, 20)]
    plan = [
        [Work(seqs[0], tables[0], 0, 13), Work(seqs[1], tables[1], 0, 6), Work(seqs[2], tables[2], 0, 8, sample=False)],
        # mixed: two decodes and the rest of the third prompt, chunked after 8 cached tokens
        [Work(seqs[0], tables[0], 13, 1), Work(seqs[1], tables[1], 6, 1), Work(seqs[2], tables[2], 8, 12)],
    ]
    for works in plan:
        for w in works:  # the token each row reads at position start + n - 1 must exist
            while len(w.tokens) < w.start + w.n:
                w.tokens.append(rng.randrange(1, 4096))
        ref = cpu.logits(works)
        close(eager.logits(works), ref, 2e-2)
        close(graphed.logits(works), ref, 2e-2)  # not all one-token rows: the eager path
    for step in range(6):  # decodes of 3, then 2, then 1 sequence: replayed in graphs of 4, 2 and 1 rows
        live = [0, 1, 2] if step < 3 else [0, 2] if step < 5 else [1]
        works = []
        for i in live:
            seqs[i].append(rng.randrange(1, 4096))
            works.append(Work(seqs[i], tables[i], len(seqs[i]) - 1, 1))
        # keep every runner's cache in step (a skipped sequence's next decode would read a hole)
        for i in set(range(3)) - set(live):
            seqs[i].append(rng.randrange(1, 4096))
            fill = [Work(seqs[i], tables[i], len(seqs[i]) - 1, 1, sample=False)]
            for r in (cpu, eager, graphed):
                r.logits(fill)
        ref = cpu.logits(works)
        close(graphed.logits(works), ref, 2e-2)
        close(eager.logits(works), ref, 2e-2)
    assert len(seqs[0]) == 13 + 1 + 6 and len(seqs[2]) == 20 + 6


def test_engines_on_the_gpu_finish_every_request_and_return_every_block():
    rng = random.Random(1)
    prompts = [[rng.randrange(1, 4096) for _ in range(rng.randrange(3, 40))] for _ in range(12)]
    params = [SamplingParams(temperature=0 if i % 2 else 0.8, max_tokens=rng.randrange(4, 40), ignore_eos=True, seed=i)
              for i in range(12)]  # fmt: skip
    small = dict(block_size=4, num_kv_blocks=40, max_num_batched_tokens=32, max_num_seqs=8, max_model_len=96)
    outs = {}
    for name, extra in (("graphs", {}), ("eager", {"enforce_eager": True}),
                        ("speculative", {"speculative_model": DRAFT, "num_speculative_tokens": 3})):  # fmt: skip
        llm = LLM(TINY, device="cuda", dtype=runtime.half_dtype(), **small, **extra)
        outs[name] = llm.generate(prompts, params, use_tqdm=False)
        assert [len(o.token_ids) for o in outs[name]] == [p.max_tokens for p in params]
        assert llm.kv_blocks_in_use() == 0
        assert llm.engine.scheduler.num_preemptions > 0  # 40 blocks of 4 cannot hold 8 sequences' growth
        if name == "graphs":
            assert llm.engine.runner.graphs
    # greedy rows: 16-bit rounding differs between the paths (different batch shapes, splits of
    # the keys), so a near-tie may flip late in a sequence; their starts agree
    for i in range(1, 12, 2):
        heads = {name: o[i].token_ids[:4] for name, o in outs.items()}
        assert heads["graphs"] == heads["eager"] == heads["speculative"], heads
    # seeded sampled rows are reproducible on the same path
    llm = LLM(TINY, device="cuda", dtype=runtime.half_dtype(), **small)
    again = llm.generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in again][::2] == [o.token_ids for o in outs["graphs"]][::2]
    # decode steps launched ahead (input tokens from the device, the next graph queued before
    # the host reads the last tokens) give exactly the tokens of steps launched one at a time
    single = [SamplingParams(temperature=0, max_tokens=60, ignore_eos=True),
              SamplingParams(temperature=0.8, max_tokens=60, seed=7)]  # fmt: skip
    ahead = [llm.generate(prompts[:1], p, use_tqdm=False)[0].token_ids for p in single]
    assert sum(s["ahead"] for s in llm.engine.step_log) >= 100
    llm.engine._look_ahead = lambda *args: None
    assert [llm.generate(prompts[:1], p, use_tqdm=False)[0].token_ids for p in single] == ahead


def test_greedy_rounds_replayed_and_launched_ahead_emit_the_eager_rounds_tokens():
    """A greedy speculative round is one graph replay, and the next is launched from the state it
    leaves on the device before the host reads its tokens: the tokens equal those of the same
    rounds run eagerly, and of graph rounds launched one at a time."""
    prompts = [[5, 9, 2, 7, 1, 33, 8], [3, 3, 8], [11, 40, 400, 7, 7]]
    params = SamplingParams(temperature=0, max_tokens=70, ignore_eos=True)
    spec = dict(speculative_model=DRAFT, num_speculative_tokens=3, max_num_seqs=4)
    got = {}
    for name, extra in (("graphs", {}), ("eager", {"enforce_eager": True})):
        llm = LLM(TINY, device="cuda", dtype=torch.float32, **spec, **extra)
        assert bool(llm.engine.spec.graphs) == (name == "graphs")
        got[name] = [llm.generate(prompts[:b], params, use_tqdm=False) for b in (1, 3)]
        assert sum(s["ahead"] for s in llm.engine.step_log) >= 20
    llm.engine._spec_look_ahead = lambda *args: None
    got["one at a time"] = [llm.generate(prompts[:b], params, use_tqdm=False) for b in (1, 3)]
    ids = {name: [[o.token_ids for o in outs] for outs in runs] for name, runs in got.items()}
    assert ids["graphs"] == ids["eager"] == ids["one at a time"]


def test_a_bfloat16_checkpoint_loads_in_float16_where_the_gpu_lacks_bfloat16(monkeypatch):
    """A T4 (capability 7.5, forced here) cannot compute in bfloat16: the tiny model, saved in
    bfloat16, loads in float16 with a warning, and an engine on it generates."""
    tiny = models_dir() / "llmnote-tiny"
    assert next(load_model(tiny, device="cuda").parameters()).dtype == runtime.half_dtype()  # bfloat16 on a Hopper GPU
    monkeypatch.setenv(runtime.CAPABILITY_ENV, "7.5")
    with pytest.warns(UserWarning, match="loading it in float16"):
        model = load_model(tiny, device="cuda")
    assert {p.dtype for p in model.parameters()} == {torch.float16}
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    out = LLM(tiny, device="cuda", max_num_seqs=2, max_model_len=64).generate(["Once upon a time"], params)
    assert len(out[0].token_ids) == 4
