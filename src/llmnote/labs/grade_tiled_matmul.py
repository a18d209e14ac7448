"""Grader of Lab 4 (``labs/04_tiled_matmul.ipynb``): ``matmul(a, b) -> a @ b``."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .harness import Case, Draw, LabReport, check_launcher, grade_launcher, new_seed

__all__ = ["check_matmul"]

# atol is per unit of sqrt(K): a dot product of K random terms grows like sqrt(K). float32
# allows TF32 (tl.dot's default for float32 on a GPU: 10-bit mantissas, float32 sums).
_TOL = {torch.float32: (5e-3, 1e-3), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)}


def check_matmul(matmul: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade the launcher ``matmul(a, b) -> a @ b`` for ``a`` (M, K), ``b`` (K, N) on 12 random
    cases: odd and prime M, N, K from 1 to 130, K not a multiple of the block, one-row products,
    and transposed, sliced and strided operands. The output is (M, N) in ``a.dtype``, with
    float32 accumulation, written by the reader's Triton kernel. Raises
    :class:`~llmnote.labs.LabCheckError`."""
    __tracebackhide__ = True
    check_launcher("matmul", matmul, "matmul(a, b)")
    seed = new_seed(seed)
    draw = Draw(seed)
    tail_hint = "Mask the loads along K in the last step (rk < K - k, other=0.0), and rows >= M, columns >= N everywhere."
    stride_hint = "Use the strides you are given (a.stride(0), a.stride(1), b.stride(0), b.stride(1)): do not assume contiguity."
    acc_hint = "Accumulate in a float32 tile (tl.zeros(..., dtype=tl.float32)) and cast once on the store."
    cases: list[Case] = []

    def add(m: int, n: int, k: int, label: str, hint: str, a_layout: str = "", b_layout: str = ""):
        dtype = draw.dtype()
        a = {
            "": lambda: draw.randn((m, k), dtype),
            "T": lambda: draw.randn((k, m), dtype).t(),  # column-major
            "rows": lambda: draw.randn((2 * m, k), dtype)[::2],  # every other row of a taller matrix
        }[a_layout]()
        b = {
            "": lambda: draw.randn((k, n), dtype),
            "T": lambda: draw.randn((n, k), dtype).t(),
            "slice": lambda: draw.randn((k, n + 19), dtype)[:, 3 : 3 + n],  # a column slice, offset
        }[b_layout]()
        atol, rtol = _TOL[dtype]
        cases.append(Case(f"M={m}, N={n}, K={k}, {label}", (a, b), f"{hint} {acc_hint}", atol * math.sqrt(k), rtol))

    add(1, 1, 1, "1x1 times 1x1", tail_hint)
    add(16, 16, 16, "one small tile", tail_hint)
    add(64, 64, 64, "multiples of the usual block sizes", "No edges here: if this fails, look at the indexing.")
    add(37, 41, 43, "primes everywhere", tail_hint)
    add(1, 96, 130, "a single row (decode-shaped)", tail_hint)
    add(100, 30, 20, "K smaller than a block", tail_hint)
    add(45, 70, 100, "a partial last K block", tail_hint)
    add(48, 40, 56, "A transposed (column-major view)", stride_hint, a_layout="T")
    add(33, 45, 70, "B a column slice of a wider matrix", stride_hint, b_layout="slice")
    add(50, 30, 40, "A every other row, B transposed", stride_hint, a_layout="rows", b_layout="T")
    for _ in range(2):
        add(draw.rng.randint(1, 128), draw.rng.randint(1, 128), draw.rng.randint(1, 128), "random", tail_hint)

    def reference(a, b):
        return (a.double() @ b.double()).to(a.dtype)

    formula = "The output is (M, N): C[m, n] = sum over k of A[m, k] * B[k, n]."
    return grade_launcher("matmul", "matmul_kernel", matmul, cases, reference, formula, seed, verbose)
