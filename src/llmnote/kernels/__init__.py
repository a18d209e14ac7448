"""Triton kernels with the same names and semantics as ``llmnote.ref``.

They take CUDA tensors on a GPU, or CPU tensors when Triton runs in its interpreter
(``import llmnote`` arranges that on a machine without a GPU).
"""

from .attention import flash_attention, paged_attention_decode
from .elementwise import silu_mul, vector_add
from .fused_softmax import softmax
from .norm import rms_norm
from .rope import apply_rope
from .tiled_matmul import matmul

__all__ = [
    "apply_rope",
    "flash_attention",
    "matmul",
    "paged_attention_decode",
    "rms_norm",
    "silu_mul",
    "softmax",
    "vector_add",
]
