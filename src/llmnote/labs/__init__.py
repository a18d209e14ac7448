"""Checkers for the book's labs (``labs/*.ipynb``), where the reader writes the kernels.

Each lab asks for a ``@triton.jit`` kernel and a small Python *launcher* that allocates
the output, launches the kernel and returns the output. A checker takes the launcher and
grades it on random, odd-sized inputs against a PyTorch reference::

    from llmnote.labs import check_vector_add
    check_vector_add(vector_add)     # prints "vector_add: 14 cases passed (...)"

Lab 4 also grades a plain PyTorch function, ``check_softmax_merge(merge)``: the merge of two
partial softmax results that FlashAttention's online softmax is built on.

A wrong or unfinished answer raises :class:`LabCheckError` (an ``AssertionError``) that
names the failing case (shape, dtype, error) and gives a hint. Reference answers live in
:mod:`llmnote.labs.solutions`; peek only after trying.
"""

from .checks import (
    LabCheckError,
    LabReport,
    check_attention,
    check_matmul,
    check_softmax,
    check_softmax_merge,
    check_vector_add,
)

__all__ = [
    "LabCheckError",
    "LabReport",
    "check_attention",
    "check_matmul",
    "check_softmax",
    "check_softmax_merge",
    "check_vector_add",
]
