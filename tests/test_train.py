"""python -m llmnote.train: the smoke configuration on the CPU, resumption, export, errors."""

import json
import math
from dataclasses import replace

import pytest
import torch

from llmnote import train as tr
from llmnote.models import load_model, load_tokenizer

transformers = pytest.importorskip("transformers")
SMOKE = tr.PRESETS["smoke"]


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("smoke")
    record = tr.train(SMOKE, out, device="cpu", progress=False)
    return out, record


def test_smoke_run_learns_and_records(smoke_run):
    out, record = smoke_run
    curve = [loss for _, loss in record["curves"]["train_loss"]]
    assert curve[-1] < curve[0] - 0.3  # it learns something in 20 steps
    assert [s for s, _ in record["curves"]["valid_loss"]] == [10, 20]
    assert record["best_step"] in (10, 20) and record["valid_loss"] == min(v for _, v in record["curves"]["valid_loss"])
    assert math.isclose(record["heldout_perplexity"], math.exp(record["heldout_loss"]))
    assert record["parameters"] == SMOKE.model_config().num_params
    assert json.loads((out / "training.json").read_text())["config"] == record["config"]
    assert (out / tr.STATE_FILE).exists()


def test_export_loads_in_both_libraries(smoke_run):
    out, _ = smoke_run
    ours = load_model(out, device="cpu", dtype=torch.float32)
    hf = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    text = "KING. Speak, and be brief."
    ids = torch.tensor([load_tokenizer(out).encode(text).ids])
    assert transformers.AutoTokenizer.from_pretrained(out)(text).input_ids == ids[0].tolist()
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-4, rtol=1e-4)
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["eos_token_id"] == 0 and config["tie_word_embeddings"]


def test_resumed_run_equals_an_uninterrupted_one(smoke_run, tmp_path):
    full, record = smoke_run
    assert tr.train(SMOKE, tmp_path, device="cpu", progress=False, stop_after=7) == {"stopped_at": 7}
    assert not (tmp_path / "model.safetensors").exists()
    resumed = tr.train(SMOKE, tmp_path, device="cpu", progress=False, resume=True)
    assert (tmp_path / "model.safetensors").read_bytes() == (full / "model.safetensors").read_bytes()
    assert resumed["curves"] == record["curves"]


def test_resume_errors(smoke_run, tmp_path):
    out, _ = smoke_run
    with pytest.raises(ValueError, match="changed: lr"):
        tr.train(replace(SMOKE, lr=0.1), out, device="cpu", progress=False, resume=True)
    with pytest.raises(FileNotFoundError, match="train_state.pt"):
        tr.train(SMOKE, tmp_path, device="cpu", progress=False, resume=True)


def test_tokenizer_must_match_the_vocabulary(smoke_run, tmp_path):
    out, _ = smoke_run
    with pytest.raises(ValueError, match="the tokenizer has 320 tokens"):
        tr.train(replace(SMOKE, vocab_size=512), tmp_path, tokenizer_file=out / "tokenizer.json", device="cpu", progress=False)


def test_learning_rate_schedule():
    cfg = replace(SMOKE, steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    lrs = [tr._lr(cfg, s) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))  # decays monotonically after warm-up
    assert tr._lr(cfg, 100) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "bad, match",
    [(dict(hidden_size=30), "multiple of num_heads"), (dict(dropout=1.0), "dropout"), (dict(steps=0), "steps")],
)
def test_bad_configuration(bad, match):
    with pytest.raises(ValueError, match=match):
        replace(SMOKE, **bad)


def test_cli(tmp_path, capsys):
    assert tr.main(["--preset", "smoke", "--out", str(tmp_path), "--steps", "6", "--eval-every", "3"]) == 0
    assert "held-out perplexity" in capsys.readouterr().out
    assert json.loads((tmp_path / "training.json").read_text())["config"]["steps"] == 6
    with pytest.raises(SystemExit) as exit_info:
        tr.main(["--preset", "smoke", "--out", str(tmp_path), "--hidden-size", "30"])
    assert exit_info.value.code == 2
