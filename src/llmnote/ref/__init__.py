"""Pure PyTorch reference implementations (same names and semantics as ``llmnote.kernels``)."""

from .attention import (
    MLAWeights,
    flash_attention,
    flash_attention_varlen,
    mla_absorbed,
    mla_naive,
    mla_random_weights,
    paged_attention_decode,
)
from .cache import dequantize_kv, quantize_kv, store_kv
from .moe import MoEOutput, moe_layer, moe_route
from .ops import (
    add_rms_norm,
    apply_rope,
    matmul,
    rms_norm,
    rope_cos_sin,
    rotary_embedding,
    silu_mul,
    softmax,
    vector_add,
)
from .quant import w4a16_linear
from .scaled import fp8_gemm, fp8_linear, int8_gemm, int8_linear, quantize_rows

__all__ = [
    "MoEOutput",
    "moe_layer",
    "moe_route",
    "MLAWeights",
    "flash_attention",
    "flash_attention_varlen",
    "mla_absorbed",
    "mla_naive",
    "mla_random_weights",
    "paged_attention_decode",
    "add_rms_norm",
    "apply_rope",
    "rotary_embedding",
    "store_kv",
    "quantize_kv",
    "dequantize_kv",
    "matmul",
    "rms_norm",
    "rope_cos_sin",
    "silu_mul",
    "softmax",
    "vector_add",
    "w4a16_linear",
    "fp8_gemm",
    "fp8_linear",
    "int8_gemm",
    "int8_linear",
    "quantize_rows",
]
