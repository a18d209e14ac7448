"""The model code against Hugging Face transformers, on random checkpoints saved locally."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from llmnote.models import ModelConfig, load_model  # noqa: E402

SMALL = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=256)
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

CASES = {
    "llama-gqa": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=2)),
    "llama-mha-tied": ("LlamaConfig", dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True)),
    "llama-mqa-bias": ("LlamaConfig", dict(num_attention_heads=8, num_key_value_heads=1, attention_bias=True, mlp_bias=True)),
    "llama3-scaling": (
        "LlamaConfig",
        dict(num_attention_heads=4, num_key_value_heads=2, rope_scaling=LLAMA3_SCALING, rope_theta=500000.0),
    ),
    "qwen2": ("Qwen2Config", dict(num_attention_heads=4, num_key_value_heads=2)),
    "qwen2-tied-mha": ("Qwen2Config", dict(num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
    "qwen3-tied": ("Qwen3Config", dict(num_attention_heads=8, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)),
}


def save_random_checkpoint(tmp_path, case, **save_kwargs):
    cls_name, extra = CASES[case]
    config = getattr(transformers, cls_name)(**SMALL, **extra)
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
    with torch.no_grad():  # non-trivial norm weights and biases, so a wrong wiring shows
        for name, p in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(tmp_path, **save_kwargs)
    return hf


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(tmp_path, case):
    hf = save_random_checkpoint(tmp_path, case)
    ours = load_model(tmp_path, device="cpu", dtype=torch.float32)
    ids = torch.randint(0, SMALL["vocab_size"], (2, 45))  # longer than llama3's original context of 32
    with torch.no_grad():
        expected = hf(ids).logits
        got = ours(ids)
    assert got.shape == expected.shape == (2, 45, SMALL["vocab_size"])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_sharded_checkpoint_and_parameter_count(tmp_path):
    hf = save_random_checkpoint(tmp_path, "llama-gqa", max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ours = load_model(tmp_path, device="cpu")
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters()) == ours.config.num_params


@pytest.mark.parametrize("case", ["llama-gqa", "qwen3-tied"])
def test_cache_then_decode_equals_recompute(tmp_path, case):
    save_random_checkpoint(tmp_path, case)
    model = load_model(tmp_path, device="cpu")
    ids = torch.randint(0, SMALL["vocab_size"], (3, 20))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(batch=3, max_len=32)
        steps = [model(ids[:, :12], cache)]  # prefill
        steps += [model(ids[:, i : i + 1], cache) for i in range(12, 16)]  # four single tokens
        steps.append(model(ids[:, 16:], cache))  # and a chunk of four
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 20
    with pytest.raises(ValueError, match="holds at most 32"):
        model(torch.zeros(3, 13, dtype=torch.long), cache)


def test_bad_checkpoints_raise_clear_errors(tmp_path):
    save_random_checkpoint(tmp_path, "llama-gqa")
    config = json.loads((tmp_path / "config.json").read_text())

    def write(**changes):
        (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))

    write(model_type="gpt2")
    with pytest.raises(ValueError, match="unsupported architecture model_type='gpt2'"):
        load_model(tmp_path, device="cpu")
    write(intermediate_size=100)
    with pytest.raises(ValueError, match=r"tensor model.layers.0.mlp.\w+_proj.weight has shape \(\d+, \d+\), the config implies"):
        load_model(tmp_path, device="cpu")
    write(num_hidden_layers=3)
    with pytest.raises(ValueError, match="lacks tensors: model.layers.2"):
        load_model(tmp_path, device="cpu")
    write(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="unsupported rope scaling type 'yarn'"):
        load_model(tmp_path, device="cpu")
    write(num_hidden_layers=1)
    with pytest.raises(ValueError, match="model.layers.1.* is not part of the llama model"):
        load_model(tmp_path, device="cpu")
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        load_model(tmp_path / "nowhere", device="cpu")
    with pytest.raises(ValueError, match="multiple of"):
        ModelConfig.from_hf({**config, "num_attention_heads": 4, "num_key_value_heads": 3})


def test_input_ids_are_checked(tmp_path):
    save_random_checkpoint(tmp_path, "qwen2")
    model = load_model(tmp_path, device="cpu")
    with pytest.raises(ValueError, match="token ids"):
        model(torch.tensor([[0, SMALL["vocab_size"]]]))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(2, 3))


def test_zoo_kv_cache_arithmetic():
    from llmnote.models import MODEL_ZOO, kv_cache_bytes

    llama = MODEL_ZOO["Llama-3-8B"]
    assert kv_cache_bytes(llama, 1) == llama.kv_bytes_per_token("bf16") == 128 * 1024
    assert kv_cache_bytes(MODEL_ZOO["Llama-2-7B"], 1) == 4 * kv_cache_bytes(llama, 1)  # MHA vs GQA-8 of 32 heads
    assert kv_cache_bytes(MODEL_ZOO["DeepSeek-V3"], 1) == 61 * (512 + 64) * 2  # MLA: one latent + one RoPE key
    assert kv_cache_bytes(llama, 1000, "fp8") == kv_cache_bytes(llama, 1000) / 2
    with pytest.raises(ValueError):
        kv_cache_bytes(llama, -1)
    with pytest.raises(ValueError, match="dtype"):
        kv_cache_bytes(llama, 1, "bf17")


def test_zoo_entries_are_model_configs_with_the_model_cards_sizes():
    from llmnote.models import MODEL_ZOO

    cards = {  # billions, total and per token, as the model cards quote them
        "Llama-2-7B": (6.7, 6.7),
        "Llama-3-8B": (8.0, 8.0),
        "Llama-3-70B": (70.6, 70.6),
        "Qwen2.5-7B": (7.6, 7.6),
        "Qwen2.5-72B": (72.7, 72.7),
        "Qwen3-8B": (8.2, 8.2),
        "Qwen3-32B": (32.8, 32.8),
        "Falcon-7B": (7.2, 7.2),
        "DeepSeek-V3": (671.0, 37.0),
    }
    assert {name: (m.params_b, m.active_params_b) for name, m in MODEL_ZOO.items()} == cards
    for name, m in MODEL_ZOO.items():
        assert isinstance(m, ModelConfig) and m.name == name and m.hub_id.count("/") == 1
        if m.card_params_b is None:  # counted from the shape
            assert m.params_b == round(m.num_params / 1e9, 1)
    kinds = {name: m.attention for name, m in MODEL_ZOO.items()}
    assert kinds["Llama-2-7B"] == "mha" and kinds["Falcon-7B"] == "mqa" and kinds["DeepSeek-V3"] == "mla"
    assert {kinds[n] for n in ("Llama-3-8B", "Qwen2.5-7B", "Qwen3-32B")} == {"gqa"}
    # A checkpoint's config carries the same shape: the 8B's count from its config.json fields.
    hf = {"model_type": "llama", "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336}
    hf |= {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8}
    assert ModelConfig.from_hf(hf).num_params == MODEL_ZOO["Llama-3-8B"].num_params
