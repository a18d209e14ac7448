"""Pure PyTorch reference implementations (same names and semantics as ``llmnote.kernels``)."""

from .ops import apply_rope, matmul, rms_norm, rope_cos_sin, silu_mul, softmax, vector_add

__all__ = ["apply_rope", "matmul", "rms_norm", "rope_cos_sin", "silu_mul", "softmax", "vector_add"]
