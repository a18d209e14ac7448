"""The layers every model of the book is built from.

Each layer takes packed tokens (a ``(tokens, features)`` batch of any number of sequences)
and picks its implementation from the device: the book's Triton kernels on a GPU, the
PyTorch references on a CPU. The seams for the later chapters live here: a
:class:`Linear` takes a quantized method or a tensor-parallel slice, and
:class:`Attention` a paged :class:`KVCache`.
"""

from .attention import Attention
from .embedding import Embedding, LMHead
from .kv_cache import AttentionContext, KVCache
from .linear import Dense, Linear, LinearMethod, TensorParallel
from .norm import RMSNorm
from .ops import ops_for
from .rotary import RotaryEmbedding
from .sampler import SamplingParams, filter_logits, sample_next

__all__ = [
    "Attention",
    "AttentionContext",
    "Dense",
    "Embedding",
    "KVCache",
    "LMHead",
    "Linear",
    "LinearMethod",
    "RMSNorm",
    "RotaryEmbedding",
    "SamplingParams",
    "TensorParallel",
    "filter_logits",
    "ops_for",
    "sample_next",
]
