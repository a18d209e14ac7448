"""Sampling filters, streaming generation with the KV cache, and the generate CLI."""

import subprocess
import sys

import pytest
import torch

from llmnote.layers import SamplingParams, filter_logits, sample_next
from llmnote.models import generate

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")


def kept(logits, **kw):
    return torch.isfinite(filter_logits(logits, SamplingParams(**kw)))


def test_greedy_is_argmax():
    logits = torch.randn(4, 50)
    assert torch.equal(sample_next(logits, SamplingParams(temperature=0)), logits.argmax(-1))
    assert kept(logits, temperature=0).sum(-1).tolist() == [1, 1, 1, 1]


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.randn(3, 100)
    mask = kept(logits, top_k=7)
    assert mask.sum(-1).tolist() == [7, 7, 7]
    assert torch.equal(mask, logits >= logits.topk(7, -1).values[:, -1:])
    assert kept(torch.zeros(1, 5), top_k=2).sum() == 2  # ties at the k-th value do not sneak in


def test_top_p_keeps_the_smallest_set_reaching_p():
    torch.manual_seed(0)
    logits = torch.randn(5, 200) * 3
    for p in (0.1, 0.5, 0.9):
        mask = kept(logits, top_p=p)
        probs = torch.softmax(logits, -1)
        for row in range(5):
            kept_probs = probs[row][mask[row]]
            assert kept_probs.sum() >= p - 1e-6  # reaches p
            assert kept_probs.sum() - kept_probs.min() < p  # and no token can be dropped
            assert probs[row][~mask[row]].max() <= kept_probs.min()  # the most likely ones


def test_min_p_and_temperature():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    assert kept(logits, min_p=0.2).tolist() == [[True, True, True, False]]  # 0.05 < 0.2 * 0.5
    sharp = torch.softmax(filter_logits(logits, SamplingParams(temperature=0.5)), -1)
    assert sharp[0, 0] > 0.5  # lower temperature concentrates mass


def test_repetition_penalty_follows_ctrl():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    out = filter_logits(logits, SamplingParams(repetition_penalty=2.0), previous=torch.tensor([[0, 1]]))
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_bad_parameters_are_rejected():
    for kw in (dict(top_p=0.0), dict(temperature=-1), dict(top_k=-1), dict(min_p=2), dict(repetition_penalty=0)):
        with pytest.raises(ValueError):
            SamplingParams(**kw)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A random Llama checkpoint with a word-level tokenizer trained here, saved locally."""
    path = tmp_path_factory.mktemp("tiny")
    words = "the quick brown fox jumps over the lazy dog and then the dog sleeps".split()
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece(prefix="##")
    tok.train_from_iterator([" ".join(words)] * 10, tokenizers.trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"]))
    tok.save(str(path / "tokenizer.json"))
    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def test_streaming_generation_matches_greedy_recompute(checkpoint):
    from llmnote.models import load_model

    model = load_model(checkpoint, device="cpu")
    prompt = torch.tensor([[2, 3, 4], [5, 6, 7]])
    tokens = torch.stack(list(generate(model, prompt, SamplingParams(temperature=0, max_new_tokens=6))), dim=1)
    ids = prompt
    with torch.no_grad():
        for _ in range(6):  # no cache: the whole sequence every step
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(tokens, ids[:, 3:])
    sampled = [
        list(generate(model, prompt, SamplingParams(temperature=1.0, top_p=0.9, seed=s, max_new_tokens=5))) for s in (1, 1, 2)
    ]
    assert all(torch.equal(a, b) for a, b in zip(sampled[0], sampled[1]))  # same seed, same text


def test_generation_stops_at_eos(checkpoint):
    from llmnote.models import load_model

    model = load_model(checkpoint, device="cpu")
    first = next(generate(model, torch.tensor([[2, 3]]), SamplingParams(temperature=0)))
    steps = list(
        generate(model, torch.tensor([[2, 3]]), SamplingParams(temperature=0, max_new_tokens=10), eos_token_id=int(first))
    )
    assert len(steps) == 1


def test_generate_cli_prints_text_and_rate(checkpoint):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "llmnote",
            "generate",
            str(checkpoint),
            "--prompt",
            "the quick brown",
            "--max-new-tokens",
            "5",
            "--seed",
            "0",
            "--device",
            "cpu",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("the quick brown")
    assert len(result.stdout.split()) >= 4
    assert "tokens/s" in result.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "llmnote", "generate", str(checkpoint.parent / "missing"), "--prompt", "x"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "no checkpoint directory" in bad.stderr
