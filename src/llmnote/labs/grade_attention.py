"""Grader of Lab 6, part 2 (``labs/06_flash_attention.ipynb``): a FlashAttention kernel with
grouped-query heads and an optional causal mask, ``attention(q, k, v, causal=False)``."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .. import ref
from .harness import Case, Draw, LabReport, check_launcher, grade_launcher, new_seed

__all__ = ["check_attention"]

# Outputs are weighted averages of rows of v (|v| of order 1). float32 allows TF32 (tl.dot's
# default on a GPU); float16 and bfloat16 allow the rounding of p to the dtype of v before
# the second product, as tensor-core kernels do.
_TOL = {torch.float32: (5e-3, 5e-3), torch.float16: (3e-3, 5e-3), torch.bfloat16: (2e-2, 2e-2)}

_KEY_HINT = (
    "Keys past Skv: load k and v with mask=keys[:, None] < Skv, other=0.0, and set their scores to -inf "
    "(tl.where(keys[None, :] < Skv, s, float('-inf'))) so that exp gives them weight 0."
)
_ROW_HINT = (
    "Rows past Sq: load q with mask=rows[:, None] < Sq, other=0.0, and store with the same mask; the grid has "
    "triton.cdiv(Sq, BLOCK_M) programs along its first axis."
)
_ONLINE_HINT = (
    "For each key block: m_new = max(m, row max of s); p = exp(s - m_new[:, None]); alpha = exp(m - m_new); "
    "l = alpha * l + row sum of p; acc = alpha[:, None] * acc + p @ v; m = m_new. Divide acc by l once, after the loop."
)
_HEAD_HINT = (
    "One program per (block of query rows, query head): grid (triton.cdiv(Sq, BLOCK_M), Hq) and h = tl.program_id(1). "
    "Head h of q and of the output starts at h * Sq * D; its key/value head is h // GROUP with GROUP = Hq // Hkv, "
    "whose k and v start at (h // GROUP) * Skv * D."
)
_CAUSAL_HINT = (
    "The causal mask is bottom-right aligned: query row i sees key j iff j <= i + (Skv - Sq), so with Sq < Skv every "
    "row sees the earlier keys as well (they are the cached past). Keep the key mask too: "
    "visible = (keys[None, :] < Skv) & (keys[None, :] <= rows[:, None] + (Skv - Sq))."
)
_EMPTY_HINT = (
    "Rows i < Sq - Skv see no key at all: their running max stays -inf, and exp(-inf - (-inf)) is NaN. As in Part 1's "
    "merge, exponentiate relative to 0 where the new max is -inf (m_safe = tl.where(m_new == float('-inf'), 0.0, "
    "m_new)), and divide by l only where l > 0, so that these rows come out as 0. " + _CAUSAL_HINT
)
_GROWING_HINT = (
    "Subtract the running max before tl.exp (exp(89) overflows float32, exp(12) float16), and rescale acc and l "
    "whenever the max grows. " + _ONLINE_HINT
)


def check_attention(attention: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade the launcher ``attention(q, k, v, causal=False)``: per query head,
    ``softmax(q k^T / sqrt(D) + mask) v`` for ``q`` (Hq, Sq, D) and ``k``, ``v`` (Hkv, Skv, D),
    contiguous, of one dtype, D in {16, 32, 64}, Hq a multiple of Hkv (query head ``h`` reads
    key/value head ``h // (Hq // Hkv)``). With ``causal=True`` query ``i`` sees key ``j`` iff
    ``j <= i + (Skv - Sq)`` (bottom-right aligned, as ``llmnote.ref.flash_attention``), and a
    query that sees no key returns zeros. 19 random cases: a single query and a single key,
    lengths that are multiples of no block, integer-valued scores in the hundreds that grow
    along the keys, several heads, grouped-query and multi-query heads, causal masks with
    Sq = Skv, Sq < Skv and Sq > Skv. The output is (Hq, Sq, D) in ``q.dtype``, written by the
    reader's Triton kernel; the reference computes in float32. Raises
    :class:`~llmnote.labs.LabCheckError`."""
    __tracebackhide__ = True
    check_launcher("attention", attention, "attention(q, k, v, causal=False)")
    seed = new_seed(seed)
    draw = Draw(seed)
    cases: list[Case] = []

    def add(hq: int, hkv: int, sq: int, skv: int, d: int, causal: bool, label: str, hint: str, growing: bool = False):
        dtype = draw.dtype()
        if growing:  # small integers, exact in every dtype and in TF32: scores climb by about 2 a key
            q = draw.fence(torch.randint(1, 4, (hq, sq, d), generator=draw.gen).float(), dtype)
            steps = (torch.arange(skv) // 2)[:, None]
            k = draw.fence((torch.randint(-2, 3, (hkv, skv, d), generator=draw.gen) + steps).float(), dtype)
        else:
            q, k = draw.randn((hq, sq, d), dtype), draw.randn((hkv, skv, d), dtype)
        v = draw.randn((hkv, skv, d), dtype)
        heads = f"Hq={hq}, Hkv={hkv}, " if (hq, hkv) != (1, 1) else ""
        shape = f"{heads}Sq={sq}, Skv={skv}, D={d}{', causal' if causal else ''}"
        cases.append(Case(f"{shape}, {label}", (q, k, v), hint, *_TOL[dtype], kwargs=(("causal", causal),)))

    add(1, 1, 1, 1, 16, False, "one query and one key (the output is that key's value)", f"{_ROW_HINT} {_KEY_HINT}")
    add(1, 1, 16, 16, 16, False, "one small block each", f"{_ROW_HINT} {_KEY_HINT}")
    add(1, 1, 64, 64, 32, False, "multiples of the usual block sizes", "No edges here: look at the indexing. " + _ONLINE_HINT)
    add(1, 1, 1, 100, 64, False, "one query (a decode step)", f"{_ROW_HINT} {_KEY_HINT}")
    add(1, 1, 37, 13, 32, False, "fewer keys than any BLOCK_N", _KEY_HINT)
    add(1, 1, 45, 77, 16, False, "neither Sq nor Skv a multiple of a block", f"{_ROW_HINT} {_KEY_HINT}")
    add(1, 1, 20, 130, 32, False, "many key blocks: the running max changes", _ONLINE_HINT)
    add(1, 1, 24, 70, 16, False, "large scores (hundreds) that grow along the keys", _GROWING_HINT, growing=True)
    add(1, 1, 33, 65, 64, False, "Skv one past a multiple of 64", _KEY_HINT)
    add(3, 3, 21, 40, 16, False, "three heads, each with its own keys and values", _HEAD_HINT)
    add(4, 2, 30, 50, 32, False, "grouped-query heads: 4 query heads share 2 key/value heads", _HEAD_HINT)
    add(6, 1, 17, 45, 16, False, "multi-query: 6 query heads share 1 key/value head", _HEAD_HINT)
    add(1, 1, 70, 70, 32, True, "causal with Sq = Skv: query i sees keys 0..i", _CAUSAL_HINT)
    add(2, 2, 1, 77, 16, True, "causal with one query: the newest token sees every key", _CAUSAL_HINT)
    add(2, 1, 20, 55, 32, True, "causal chunk: 20 new queries after 35 earlier keys", _CAUSAL_HINT)
    add(4, 2, 45, 45, 16, True, "causal with grouped-query heads", f"{_CAUSAL_HINT} {_HEAD_HINT}")
    add(1, 1, 50, 20, 16, True, "causal with more queries than keys: rows 0..29 see no key (output 0)", _EMPTY_HINT)
    for _ in range(2):
        hq, hkv = draw.rng.choice([(1, 1), (2, 1), (4, 2), (3, 3)])
        sq, skv, d = draw.rng.randint(1, 60), draw.rng.randint(1, 100), draw.rng.choice([16, 32, 64])
        causal = draw.rng.random() < 0.5
        add(hq, hkv, sq, skv, d, causal, "random", f"{_ROW_HINT} {_KEY_HINT} {_CAUSAL_HINT if causal else _HEAD_HINT}")

    def reference(q, k, v, causal):
        return ref.flash_attention(q[None], k[None], v[None], causal=causal)[0]

    formula = (
        "Output row i of head h is softmax(q_i k^T / sqrt(D)) v over the keys row i sees, with k and v of head h // (Hq // Hkv)."
    )
    return grade_launcher("attention", "attention_kernel", attention, cases, reference, formula, seed, verbose)
