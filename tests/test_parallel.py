"""Parallelism on CPU processes (gloo): ``torchrun ... -m llmnote generate --tensor-parallel 2``
prints exactly one process's text, the engine split over two processes started as torchrun
starts them gives one process's greedy outputs on every rank (the engine that starts its own
workers: tests/test_tp_engine.py), and pipeline stages and expert parallelism give the
single-process results.
(The split model's states after every layer: tests/test_parallel_demo.py.)"""

import os
import subprocess
import sys

import pytest
import torch

from llmnote.layers import TensorParallel
from llmnote.models import Transformer, load_model
from llmnote.models.config import ModelConfig
from llmnote.parallel.launch import free_port, spawn
from llmnote.paths import models_dir

TINY = models_dir() / "llmnote-tiny"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def generate(*extra: str, procs: int = 0) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(procs), "--master-port", str(free_port())]
    cmd = [*(launcher if procs else [sys.executable]), "-m", "llmnote", "generate", str(TINY), "--prompt", "The king said",
           "--max-new-tokens", "40", *extra]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=ENV)


@pytest.mark.parametrize("extra", [("--temperature", "0"), ("--temperature", "0.9", "--seed", "4")])
def test_torchrun_tensor_parallel_generate_prints_one_process_text(extra):
    one, two = generate(*extra), generate(*extra, "--tensor-parallel", "2", procs=2)
    assert one.returncode == 0 and two.returncode == 0, two.stderr[-2000:]
    assert two.stdout == one.stdout and len(one.stdout) > 40  # rank 0 alone prints, the same text
    assert "split over 2 processes" in two.stderr


def test_tensor_parallel_needs_its_processes_and_divisible_heads():
    alone = generate("--tensor-parallel", "2")
    assert alone.returncode == 2 and "torchrun --nproc-per-node 2" in alone.stderr
    config = ModelConfig.from_hf(__import__("json").loads((TINY / "config.json").read_text()))
    with pytest.raises(ValueError, match="KV heads cannot be split over 4 processes"):
        with torch.device("meta"):
            Transformer(config, TensorParallel(rank=0, size=4))
    odd = ModelConfig(model_type="llama", vocab_size=1001, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=16)  # fmt: skip
    with pytest.raises(ValueError, match="vocabulary of 1001 tokens cannot be split over 2 processes"):
        with torch.device("meta"):
            Transformer(odd, TensorParallel(rank=1, size=2))


def test_spawn_reports_a_failing_process():
    with pytest.raises(RuntimeError, match="(?s)rank 1:.*ZeroDivisionError"):
        spawn(_fails_on_rank_1, 2)


def _fails_on_rank_1(rank: int, size: int):
    return size / (1 - rank)


PROMPTS = ["The king said", "Once upon a time", "ROMEO.", "In the beginning"]
ENGINE = dict(device="cpu", dtype=torch.float32, block_size=4, num_kv_blocks=14, max_num_batched_tokens=16, max_num_seqs=3)
GREEDY = dict(temperature=0, max_tokens=24, ignore_eos=True)


def _engine_rank(rank: int, size: int):
    """Every rank runs this same code, as under torchrun: rank 0's engine runs the requests, the
    other rank's follows its steps inside generate and returns rank 0's outputs."""
    from llmnote.engine import LLM, SamplingParams

    llm = LLM(TINY, tensor_parallel_size=size, **ENGINE)
    greedy = llm.generate(PROMPTS, SamplingParams(**GREEDY), use_tqdm=False)
    with pytest.raises(ValueError, match="KV blocks"):  # rank 0 refuses it up front, and every rank raises
        llm.generate([list(range(1, 60))], SamplingParams(max_tokens=4), use_tqdm=False)
    sampled = llm.generate(PROMPTS, SamplingParams(temperature=1.0, max_tokens=12), use_tqdm=False)  # no seed
    engine = llm.engine
    if rank == 0:
        follower = None
        preempted = engine.scheduler.num_preemptions
    else:
        with pytest.raises(RuntimeError, match="follows rank 0"):
            engine.step()
        with pytest.raises(RuntimeError, match="follows rank 0"):
            engine.add_request("The king said")
        follower, preempted = engine.worker.steps, None
    llm.close()  # nothing to stop under torchrun: every rank's script goes on
    return engine.runner.cache.k.shape[3], [o.token_ids for o in greedy], [o.token_ids for o in sampled], preempted, follower


def test_engine_with_tensor_parallel_size_2_gives_the_greedy_outputs_of_one_process():
    from llmnote.engine import LLM, SamplingParams

    one = LLM(TINY, **ENGINE)
    want = [o.token_ids for o in one.generate(PROMPTS, SamplingParams(**GREEDY), use_tqdm=False)]
    (heads0, greedy0, sampled0, preempted, _), (heads1, greedy1, sampled1, _, steps) = spawn(_engine_rank, 2)
    assert heads0 == heads1 == one.engine.runner.cache.k.shape[3] // 2  # each rank caches half of the KV heads
    assert greedy0 == want and preempted > 0  # under preemption, as one process
    assert greedy1 == greedy0 and sampled1 == sampled0  # the worker rank returns rank 0's outputs
    assert steps > 2 * 24  # it ran every step of both generate calls


def test_pipeline_stages_give_the_whole_model_logits():
    from llmnote.parallel.pipeline import pipeline_forward, stage_layers

    assert stage_layers(7, 3) == [(0, 3), (3, 5), (5, 7)] and stage_layers(4, 4) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    with pytest.raises(ValueError, match="cannot make 5 stages"):
        stage_layers(4, 5)
    whole = load_model(TINY, device="cpu", dtype=torch.float32)
    ids = torch.randint(0, whole.config.vocab_size, (5, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = whole(ids)
    first, last = spawn(pipeline_forward, 2, TINY, ids, 3)
    assert first["logits"] is None and first["layers"][0] == 0 and last["layers"][1] == whole.config.num_layers
    torch.testing.assert_close(torch.from_numpy(last["logits"]), want, rtol=1e-5, atol=1e-4)
    assert len(first["timeline"]) == len(last["timeline"]) == 3
    # stage 1 begins a micro-batch only once stage 0 has finished it, and finishes them in order
    assert all(began >= ended for (began, _), (_, ended) in zip(last["timeline"], first["timeline"]))
    assert all(a[1] <= b[0] for a, b in zip(last["timeline"], last["timeline"][1:]))


def test_expert_parallel_layer_equals_the_whole_layer():
    from llmnote.parallel.expert import expert_parallel_moe
    from llmnote.ref.moe import moe_layer

    g = torch.Generator().manual_seed(2)
    tokens, d, inner, experts = 37, 16, 24, 4
    x, router = torch.randn(tokens, d, generator=g), torch.randn(experts, d, generator=g)
    w_gate, w_up = torch.randn(experts, inner, d, generator=g) / 4, torch.randn(experts, inner, d, generator=g) / 4
    w_down = torch.randn(experts, d, inner, generator=g) / 4
    want = moe_layer(x, router, w_gate, w_up, w_down, top_k=2).out
    parts = spawn(expert_parallel_moe, 2, x, router, w_gate, w_up, w_down, 2)
    torch.testing.assert_close(torch.cat([torch.from_numpy(p["out"]) for p in parts]), want.float(), rtol=1e-5, atol=1e-5)
    assert [sum(p["sent"]) for p in parts] == [2 * n for n in (19, 18)]  # every assignment of its tokens leaves once
    assert parts[0]["sent"][1] == parts[1]["received"][0] and parts[1]["sent"][0] == parts[0]["received"][1]
    with pytest.raises(RuntimeError, match="4 experts cannot be split evenly over 3"):
        spawn(expert_parallel_moe, 3, x, router, w_gate, w_up, w_down, 2)
