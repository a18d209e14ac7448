"""Write a trained :class:`~llmnote.models.Transformer` as a Hugging Face checkpoint
directory: ``config.json`` for transformers' ``LlamaForCausalLM``, ``model.safetensors``,
``generation_config.json`` and the tokenizer (the byte-level BPE of :mod:`llmnote.corpus`).
:func:`llmnote.models.load_model` and transformers both load the result.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from . import corpus
from .models import ModelConfig, Transformer

__all__ = ["hf_config", "export_hf"]


def hf_config(config: ModelConfig, eos_token_id: int) -> dict:
    """``config.json`` for transformers' ``LlamaForCausalLM``."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": eos_token_id,
        "eos_token_id": eos_token_id,
        "initializer_range": 0.02,
        "torch_dtype": config.dtype or "float32",
    }


def export_hf(model: Transformer, tokenizer, out: Path) -> None:
    """Write ``config.json``, ``model.safetensors`` (in the config's dtype) and the tokenizer."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = model.config
    dtype = getattr(torch, config.dtype or "float32")
    # Under the checkpoint's names: merged projections split into their parts, a tied head left out.
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.checkpoint_state().items()}
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    eos = tokenizer.token_to_id(corpus.EOS)
    (out / "config.json").write_text(json.dumps(hf_config(config, eos), indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": eos, "eos_token_id": eos}, indent=2) + "\n")
    corpus.save_hf_tokenizer(tokenizer, out, model_max_length=config.max_position_embeddings)
