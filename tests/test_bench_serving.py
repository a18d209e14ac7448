"""The serving benchmark's pieces at toy sizes on the CPU: the random checkpoint loads the same
model into llmnote and transformers, the workload is nano-vllm's, and the throughput run
accounts for every step's memory traffic."""

import pytest
import torch

from llmnote.bench.serving import THROUGHPUT, _llmnote_throughput, _traffic, random_checkpoint, throughput_workload
from llmnote.models import ModelConfig, load_model
from llmnote.records import Record

SMALL = ModelConfig(model_type="qwen3", vocab_size=300, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True, max_position_embeddings=128,
                    dtype="bfloat16")  # fmt: skip


def test_random_checkpoint_is_the_same_model_for_both(tmp_path):
    transformers = pytest.importorskip("transformers")
    ckpt = random_checkpoint(SMALL, tmp_path)
    ours = load_model(ckpt, device="cpu", dtype=torch.float32)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    ids = torch.randint(0, SMALL.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), theirs(ids).logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(theirs.lm_head.weight, theirs.model.embed_tokens.weight)


def test_workload_and_throughput_accounting(tmp_path):
    prompts, lengths = throughput_workload(**THROUGHPUT)
    assert len(prompts) == 256 and all(100 <= len(p) <= 1024 for p in prompts) and all(100 <= n <= 1024 for n in lengths)
    assert throughput_workload(**THROUGHPUT) == (prompts, lengths)  # seeded
    ckpt = random_checkpoint(SMALL, tmp_path)
    prompts, lengths = throughput_workload(num=5, prompt=(4, 20), output=(2, 9), seed=1, vocab=SMALL.vocab_size)
    rec = Record()
    _llmnote_throughput(rec, ckpt, SMALL, prompts, lengths, "cpu", None)
    [row] = rec.rows
    assert row["provider"] == "llmnote" and row["median_ms"] > 0 and row["tbps"] > 0
    weights = 2 * SMALL.num_matmul_params
    assert row["tbps"] * row["median_ms"] * 1e9 > weights  # at least one step's weights were counted

    class Engine:  # two steps: weights twice, plus 10 and 30 tokens of keys and values
        step_log = [{"context_tokens": 10}, {"context_tokens": 30}]

    per_token = 2 * SMALL.num_layers * SMALL.num_kv_heads * SMALL.head_dim * 2
    assert _traffic(Engine, SMALL) == 2 * weights + 40 * per_token


def test_http_runs_start_each_server_and_record_every_statistic(tmp_path):
    """The HTTP half at toy sizes: three servers (chunked prefill on and off, prefix caching on
    and off), every run's rows and its report on disk."""
    from llmnote.bench.serving import run_serving
    from llmnote.bench.serving_http import HTTP_RUNS, RATES, STATS

    rec = run_serving(smoke=True, parts=("http",), out_dir=tmp_path)
    cases = {r["case"] for r in rec.rows if r["kernel"].startswith("http-")}
    assert len(cases) == sum(len(RATES) if kind == "rates" else 1 for _, _, runs in HTTP_RUNS for kind in runs)
    assert {c for c in cases if "chunked=off" in c} and {c for c in cases if "prefix-cache=off" in c}
    for case in cases:
        stats = {r["kernel"] for r in rec.rows if r["case"] == case}
        assert {f"http-{s}-{q}" for s, q in STATS if s == "ttft"} <= stats
    assert len(list(tmp_path.glob("*.json"))) == len(cases) and len(list(tmp_path.glob("*.png"))) == len(cases)
    with pytest.raises(ValueError, match="unknown parts"):
        run_serving(smoke=True, parts=("nonsense",))
