"""Shapes of real open models, from their published ``config.json`` files on the Hugging Face
hub, for the book's accounting (parameters, FLOPs, KV-cache bytes). No weights.

Each entry is a :class:`~llmnote.models.ModelConfig` holding the architecture fields that set
those counts; the fields that only matter to run the model (RoPE base, norm epsilon, context
length) keep their defaults, so build a runnable model from the checkpoint's own
``config.json`` instead. ``params_b`` is counted from the shape where the block is
Llama-style; the model card's figure is recorded for the others (Falcon's GELU MLP,
DeepSeek-V3's mixture of experts and MLA).

Attention kinds: ``"mha"``/``"gqa"``/``"mqa"`` cache ``2 x num_kv_heads x head_dim`` numbers
per token and layer; ``"mla"`` (DeepSeek-V2/V3) caches one latent of ``kv_lora_rank`` plus
one shared RoPE key of ``rope_head_dim``.
"""

from __future__ import annotations

from .config import ModelConfig

__all__ = ["MODEL_ZOO", "kv_cache_bytes"]


def kv_cache_bytes(model: ModelConfig, tokens: int, dtype: str = "bf16") -> float:
    """Bytes of KV cache for ``tokens`` tokens (summed over all sequences) in ``dtype``."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return model.kv_bytes_per_token(dtype) * tokens


def _entry(
    name: str,
    hub_id: str,
    model_type: str,
    layers: int,
    hidden: int,
    intermediate: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    vocab: int,
    **extra,
) -> ModelConfig:
    return ModelConfig(
        model_type=model_type,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        name=name,
        hub_id=hub_id,
        **extra,
    )


MODEL_ZOO: dict[str, ModelConfig] = {
    m.name: m
    for m in [
        # name, hub id, model_type, layers, hidden, intermediate, heads, KV heads, head dim, vocabulary
        _entry("Llama-2-7B", "meta-llama/Llama-2-7b-hf", "llama", 32, 4096, 11008, 32, 32, 128, 32000),
        _entry("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", "llama", 32, 4096, 14336, 32, 8, 128, 128256),
        _entry("Llama-3-70B", "meta-llama/Meta-Llama-3-70B", "llama", 80, 8192, 28672, 64, 8, 128, 128256),
        _entry("Qwen2.5-7B", "Qwen/Qwen2.5-7B", "qwen2", 28, 3584, 18944, 28, 4, 128, 152064, qkv_bias=True),
        _entry("Qwen2.5-72B", "Qwen/Qwen2.5-72B", "qwen2", 80, 8192, 29568, 64, 8, 128, 152064, qkv_bias=True),
        _entry("Qwen3-8B", "Qwen/Qwen3-8B", "qwen3", 36, 4096, 12288, 32, 8, 128, 151936, qk_norm=True),
        _entry("Qwen3-32B", "Qwen/Qwen3-32B", "qwen3", 64, 5120, 25600, 64, 8, 128, 151936, qk_norm=True),
        # a GELU MLP of two 4h-wide matrices, not SwiGLU: the card's total
        _entry(
            *("Falcon-7B", "tiiuae/falcon-7b", "falcon", 32, 4544, 18176, 71, 1, 64, 65024),
            tie_word_embeddings=True,
            card_params_b=7.2,
        ),
        # MLA and a mixture of 256 routed experts (8 per token) plus one shared: the card's figures
        _entry(
            *("DeepSeek-V3", "deepseek-ai/DeepSeek-V3", "deepseek_v3", 61, 7168, 18432, 128, 128, 128, 129280),
            kv_lora_rank=512,
            rope_head_dim=64,
            card_params_b=671.0,
            card_active_params_b=37.0,
        ),
    ]
}
