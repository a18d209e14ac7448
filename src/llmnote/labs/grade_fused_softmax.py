"""Grader of Lab 3 (``labs/03_fused_softmax.ipynb``): ``softmax(x)`` over each row of a 2-D ``x``."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .harness import Case, Draw, LabReport, check_launcher, grade_launcher, new_seed

__all__ = ["check_softmax"]

_TOL = {torch.float32: (1e-6, 1e-4), torch.float16: (1e-4, 5e-3), torch.bfloat16: (1e-3, 3e-2)}


def check_softmax(softmax: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade the launcher ``softmax(x)`` (softmax over each row of a 2-D ``x``) on 13 random
    cases: rows of 1 to ~4,000 columns (longer than 1,024 too), huge logits, very negative
    logits, rows with ``-inf`` entries, and rows spaced ``x.stride(0) > n_cols`` apart (a column
    slice). The output is ``(n_rows, n_cols)`` in ``x.dtype``, written by the reader's Triton
    kernel. Raises :class:`~llmnote.labs.LabCheckError`."""
    __tracebackhide__ = True
    check_launcher("softmax", softmax, "softmax(x)")
    seed = new_seed(seed)
    draw = Draw(seed)
    block_hint = "Each program holds one whole row: BLOCK = triton.next_power_of_2(n_cols), mask = cols < n_cols."
    pad_hint = "Masked lanes must load other=-float('inf'), so they add exp(-inf) = 0 to the sum and never win the max."
    cases: list[Case] = []

    def add(rows: int, cols: int, label: str, hint: str, scale: float = 3.0, shift: float = 0.0, stride=None, inf=False):
        dtype = draw.dtype()
        if stride is None:
            x = draw.randn((rows, cols), dtype, scale, shift)
        else:  # a column slice of a wider tensor: rows lie `stride` elements apart
            x = draw.randn((rows, stride), dtype, scale, shift)[:, :cols]
        if inf:  # mask about a third of the entries, never the first column
            masked = torch.rand((rows, cols), generator=draw.gen) < 1 / 3
            masked[:, 0] = False
            x.masked_fill_(masked.to(x.device), -math.inf)
        cases.append(Case(f"x of shape ({rows}, {cols}), {label}", (x,), hint, *_TOL[dtype]))

    add(1, 1, "a single element (its softmax is 1)", block_hint)
    add(3, 7, "rows shorter than any block", block_hint + " " + pad_hint)
    add(4, 128, "a power-of-two row", block_hint)
    add(5, 1000, "rows of 1000", block_hint + " " + pad_hint)
    add(3, 1025, "one past 1024", block_hint)
    add(2, 3001, "long rows (more than 1024)", block_hint)
    add(4, 1200, "huge logits (|x| in the thousands)", "Subtract the row max before tl.exp: exp(1000) overflows float32.", 1e3)
    add(3, 300, "very negative logits (around -60)", pad_hint, 3.0, -60.0)
    inf_hint = "exp(-inf - max) = 0: -inf entries need no special case. " + pad_hint
    add(4, 257, "rows with -inf entries (masked scores)", inf_hint, inf=True)
    stride_hint = "Rows are x.stride(0) elements apart, not n_cols: pass x.stride(0) to the kernel."
    add(6, 515, "a column slice x[:, :515] of a (6, 600) tensor", stride_hint, stride=600)
    for _ in range(3):
        add(draw.rng.randint(1, 8), draw.rng.randint(2, 4000), "random", block_hint + " " + pad_hint)

    def reference(x):
        return torch.softmax(x.double(), dim=-1).to(x.dtype)

    formula = "Each output row is exp(x - max) / sum(exp(x - max)) over that row (the last dimension)."
    return grade_launcher("softmax", "softmax_kernel", softmax, cases, reference, formula, seed, verbose)
