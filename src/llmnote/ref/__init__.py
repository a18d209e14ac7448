"""Pure PyTorch reference implementations (same names and semantics as ``llmnote.kernels``)."""

from .attention import MLAWeights, flash_attention, mla_absorbed, mla_naive, mla_random_weights, paged_attention_decode
from .moe import MoEOutput, moe_layer, moe_route
from .ops import apply_rope, matmul, rms_norm, rope_cos_sin, silu_mul, softmax, vector_add

__all__ = [
    "MoEOutput",
    "moe_layer",
    "moe_route",
    "MLAWeights",
    "flash_attention",
    "mla_absorbed",
    "mla_naive",
    "mla_random_weights",
    "paged_attention_decode",
    "apply_rope",
    "matmul",
    "rms_norm",
    "rope_cos_sin",
    "silu_mul",
    "softmax",
    "vector_add",
]
