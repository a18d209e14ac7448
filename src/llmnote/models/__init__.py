"""Llama / Qwen2 / Qwen3 decoder-only transformers and Hugging Face checkpoint loading."""

from ..layers import KVCache
from .config import SUPPORTED_MODEL_TYPES, ModelConfig
from .generate import complete, generate
from .loading import iter_checkpoint, load_model, load_tokenizer, resolve_checkpoint
from .rope_scaling import ROPE_SCALINGS, rope_frequencies, yarn_attention_scale
from .transformer import Transformer, random_model, rope_inv_freq
from .zoo import MODEL_ZOO, kv_cache_bytes

__all__ = [
    "ROPE_SCALINGS",
    "rope_frequencies",
    "yarn_attention_scale",
    "MODEL_ZOO",
    "kv_cache_bytes",
    "SUPPORTED_MODEL_TYPES",
    "KVCache",
    "ModelConfig",
    "Transformer",
    "complete",
    "generate",
    "iter_checkpoint",
    "load_model",
    "load_tokenizer",
    "resolve_checkpoint",
    "random_model",
    "rope_inv_freq",
]
