"""Llama / Qwen2 / Qwen3 decoder-only transformers and Hugging Face checkpoint loading."""

from .config import SUPPORTED_MODEL_TYPES, ModelConfig
from .loading import load_model, load_tokenizer, resolve_checkpoint
from .rope_scaling import ROPE_SCALINGS, rope_frequencies, yarn_attention_scale
from .transformer import KVCache, Transformer, rope_inv_freq
from .zoo import MODEL_ZOO, ModelShape, kv_cache_bytes

__all__ = [
    "ROPE_SCALINGS",
    "rope_frequencies",
    "yarn_attention_scale",
    "MODEL_ZOO",
    "ModelShape",
    "kv_cache_bytes",
    "SUPPORTED_MODEL_TYPES",
    "KVCache",
    "ModelConfig",
    "Transformer",
    "load_model",
    "load_tokenizer",
    "resolve_checkpoint",
    "rope_inv_freq",
]
