"""Triton kernels with the same names and semantics as ``llmnote.ref``.

They take CUDA tensors on a GPU, or CPU tensors when Triton runs in its interpreter
(``import llmnote`` arranges that on a machine without a GPU).
"""

from .attention import flash_attention, flash_attention_varlen, paged_attention_decode
from .elementwise import silu_mul, vector_add
from .fused_softmax import softmax
from .gemm.matmul import matmul
from .gemm.scaled import fp8_gemm, fp8_linear, int8_gemm, int8_linear, quantize_rows
from .gemm.w4a16 import w4a16_linear
from .kv_cache import store_kv
from .norm import add_rms_norm, rms_norm
from .rope import apply_rope, rotary_embedding

__all__ = [
    "add_rms_norm",
    "rotary_embedding",
    "store_kv",
    "apply_rope",
    "flash_attention",
    "flash_attention_varlen",
    "matmul",
    "paged_attention_decode",
    "rms_norm",
    "silu_mul",
    "softmax",
    "vector_add",
    "fp8_gemm",
    "fp8_linear",
    "int8_gemm",
    "int8_linear",
    "quantize_rows",
    "w4a16_linear",
]
