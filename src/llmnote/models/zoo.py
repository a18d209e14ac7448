"""Shapes of real open models, from their published ``config.json`` files on the Hugging
Face hub, for the book's accounting (parameters, FLOPs, KV-cache bytes). No weights.

Attention kinds: ``"mha"``/``"gqa"``/``"mqa"`` cache ``2 x kv_heads x head_dim`` numbers per
token and layer; ``"mla"`` (DeepSeek-V2/V3) caches one latent of ``kv_lora_rank`` plus one
shared RoPE key of ``rope_head_dim``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..hw import DTYPE_BYTES

__all__ = ["ModelShape", "MODEL_ZOO", "kv_cache_bytes"]


@dataclass(frozen=True)
class ModelShape:
    name: str
    hub_id: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    params_b: float  # total parameters, billions (the model card's figure)
    active_params_b: float  # per token (differs for mixture-of-experts models)
    attention: str  # mha, gqa, mqa or mla
    kv_lora_rank: int = 0  # MLA only
    rope_head_dim: int = 0  # MLA only

    def kv_numbers_per_token(self) -> int:
        """Numbers one token adds to the KV cache, over all layers."""
        if self.attention == "mla":
            return self.layers * (self.kv_lora_rank + self.rope_head_dim)
        return 2 * self.layers * self.kv_heads * self.head_dim


def kv_cache_bytes(model: ModelShape, tokens: int, dtype: str = "bf16") -> float:
    """Bytes of KV cache for ``tokens`` tokens (summed over all sequences) in ``dtype``."""
    if tokens < 0:
        raise ValueError(f"tokens must be >= 0, got {tokens}")
    return model.kv_numbers_per_token() * tokens * DTYPE_BYTES[dtype]


MODEL_ZOO: dict[str, ModelShape] = {
    m.name: m
    for m in [
        ModelShape("Llama-2-7B", "meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 128, 32000, 6.7, 6.7, "mha"),
        ModelShape("Llama-3-8B", "meta-llama/Meta-Llama-3-8B", 32, 4096, 32, 8, 128, 128256, 8.0, 8.0, "gqa"),
        ModelShape("Llama-3-70B", "meta-llama/Meta-Llama-3-70B", 80, 8192, 64, 8, 128, 128256, 70.6, 70.6, "gqa"),
        ModelShape("Qwen2.5-7B", "Qwen/Qwen2.5-7B", 28, 3584, 28, 4, 128, 152064, 7.6, 7.6, "gqa"),
        ModelShape("Qwen2.5-72B", "Qwen/Qwen2.5-72B", 80, 8192, 64, 8, 128, 152064, 72.7, 72.7, "gqa"),
        ModelShape("Qwen3-8B", "Qwen/Qwen3-8B", 36, 4096, 32, 8, 128, 151936, 8.2, 8.2, "gqa"),
        ModelShape("Qwen3-32B", "Qwen/Qwen3-32B", 64, 5120, 64, 8, 128, 151936, 32.8, 32.8, "gqa"),
        ModelShape("Falcon-7B", "tiiuae/falcon-7b", 32, 4544, 71, 1, 64, 65024, 7.2, 7.2, "mqa"),
        ModelShape(
            "DeepSeek-V3",
            "deepseek-ai/DeepSeek-V3",
            61,
            7168,
            128,
            128,
            128,
            129280,
            671.0,
            37.0,
            "mla",
            kv_lora_rank=512,
            rope_head_dim=64,
        ),
    ]
}
