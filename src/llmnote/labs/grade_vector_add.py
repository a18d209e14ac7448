"""Grader of Lab 2 (``labs/02_vector_add.ipynb``): ``vector_add(x, y) -> x + y``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .harness import Case, Draw, LabReport, check_launcher, grade_launcher, new_seed

__all__ = ["check_vector_add"]

_TOL = {torch.float32: (1e-6, 1e-6), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1e-2)}


def check_vector_add(vector_add: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade the launcher ``vector_add(x, y) -> x + y`` on 12 random cases (1 element, primes, one
    past a block, a 2-D tensor, random lengths up to 20,000). Inputs are contiguous, of one shape
    and dtype; the output must have the same shape and dtype and be written by the reader's
    Triton kernel. Raises :class:`~llmnote.labs.LabCheckError`."""
    __tracebackhide__ = True
    check_launcher("vector_add", vector_add, "vector_add(x, y)")
    seed = new_seed(seed)
    draw = Draw(seed)
    mask_hint = "offsets = pid * BLOCK + tl.arange(0, BLOCK); mask = offsets < n_elements, in the loads and the store."
    fixed = [
        ((1,), "n=1, a single element", mask_hint),
        ((17,), "n=17, less than one block", mask_hint),
        ((127,), "n=127, one short of 128", mask_hint),
        ((128,), "n=128", "A whole number of blocks for any BLOCK <= 128: if only this fails, look at the offsets."),
        ((1024,), "n=1024", "A whole number of blocks for any BLOCK <= 1024: if only this fails, look at the offsets."),
        ((1025,), "n=1025, one past a multiple of 1024", "The grid needs triton.cdiv(n, BLOCK) programs. " + mask_hint),
        ((4093,), "n=4093, a prime", mask_hint),
        ((3, 1000), "a 2-D (3, 1000) tensor", "Treat any shape as x.numel() flat elements; allocate with torch.empty_like(x)."),
    ]
    randoms = []
    for _ in range(4):
        n = draw.rng.randint(2, 20_000)
        randoms.append(((n,), f"n={n}, a random length", mask_hint))
    cases = []
    for shape, label, hint in fixed + randoms:
        dtype = draw.dtype()
        x, y = draw.randn(shape, dtype), draw.randn(shape, dtype)
        cases.append(Case(label, (x, y), hint, *_TOL[dtype]))

    def reference(x, y):
        return (x.double() + y.double()).to(x.dtype)

    formula = "The output is x + y, element by element."
    return grade_launcher("vector_add", "add_kernel", vector_add, cases, reference, formula, seed, verbose)
