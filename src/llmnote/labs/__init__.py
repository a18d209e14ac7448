"""Checkers for the book's labs (``labs/*.ipynb``), where the reader writes the code.

Labs 1 to 4 ask for a ``@triton.jit`` kernel and a small Python *launcher* that allocates
the output, launches the kernel and returns the output. A checker takes the launcher and
grades it on random, odd-sized inputs against a PyTorch reference, and makes sure the
reader's Triton kernel computed the result (not torch)::

    from llmnote.labs import check_vector_add
    check_vector_add(vector_add)     # prints "vector_add: 12 cases passed (...)"

Lab 6 also grades a plain PyTorch function, ``check_softmax_merge(merge)``: the merge of two
partial softmax results that FlashAttention's online softmax is built on. Lab 1 grades FLOP
and byte counts and roofline placements (``check_roofline_placement``), and Lab 5 one decode
step of attention with a KV cache (``check_decode_step``), both plain Python. Lab 7 grades group-wise
quantization and 4-bit packing in plain PyTorch (``check_quantize_groups``, ``check_pack_int4``)
and a W4A16 GEMV kernel (``check_w4a16_gemv``). Lab 8 grades a paged KV block manager with prefix
caching, a plain Python class (``check_block_manager``), on request traces checked against a
simulated KV pool (``KVPool``).

A wrong or unfinished answer raises :class:`LabCheckError` (an ``AssertionError``) that
names the failing case and gives a hint. Reference answers live in
:mod:`llmnote.labs.solutions`; peek only after trying.
"""

from .grade_attention import check_attention
from .grade_block_manager import KVPool, check_block_manager
from .grade_fused_softmax import check_softmax
from .grade_kv_cache_decode import DecodeLayer, LayerCache, check_decode_step
from .grade_quantization import check_pack_int4, check_quantize_groups, check_w4a16_gemv
from .grade_roofline_placement import check_roofline_placement, placement_figure
from .grade_softmax_merge import check_softmax_merge
from .grade_tiled_matmul import check_matmul
from .grade_vector_add import check_vector_add
from .harness import LabCheckError, LabReport

__all__ = [
    "LabCheckError",
    "LabReport",
    "check_vector_add",
    "check_softmax",
    "check_matmul",
    "check_softmax_merge",
    "check_attention",
    "check_roofline_placement",
    "placement_figure",
    "check_decode_step",
    "DecodeLayer",
    "LayerCache",
    "check_quantize_groups",
    "check_pack_int4",
    "check_w4a16_gemv",
    "check_block_manager",
    "KVPool",
]
