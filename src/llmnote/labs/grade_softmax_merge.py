"""Grader of Lab 6, part 1 (``labs/06_flash_attention.ipynb``): ``merge(m1, l1, o1, m2, l2, o2)``,
the merge of two partial softmax-attention results that FlashAttention's online softmax, split-KV
decoding and ring attention are built on (plain PyTorch)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .harness import LabCheckError, LabReport, dtype_name, first_index, new_seed, not_written, report

__all__ = ["check_softmax_merge"]

# Relative tolerance of l and o in each merge call: the merge is exact algebra, only the
# rounding of a few multiplications and additions differs from the float64 reference.
_TOL = {torch.float32: 2e-5, torch.float64: 1e-12}
_ARGS = ("m1", "l1", "o1", "m2", "l2", "o2")


@dataclass(frozen=True)
class _Case:
    label: str
    scores: torch.Tensor  # (..., rows, keys) in the case's dtype; -inf marks a masked score
    values: torch.Tensor  # (..., keys, D)
    parts: tuple[tuple[int, ...], ...]  # disjoint key sets that together cover every key
    order: str  # "random", "left" (a running accumulator), "tree" (pairs of pairs), "empties first"
    order_seed: int
    hint: str

    @property
    def dtype(self) -> torch.dtype:
        return self.scores.dtype


def _partial(case: _Case, keys: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """The exact ``(m, l, o)`` of the keys ``keys`` in float64, and ``sum exp(s - m) |v|``
    (the size of o's terms, for its tolerance). No key, or only masked ones: (-inf, 0, 0)."""
    index = torch.tensor(list(keys), dtype=torch.long)
    s = case.scores.double()[..., index]
    v = case.values.double()[..., index, :]
    m = s.amax(-1) if len(keys) else torch.full(s.shape[:-1], -math.inf, dtype=torch.float64)
    p = torch.exp(s - torch.where(m == -math.inf, 0.0, m)[..., None])  # masked rows: exp(-inf) = 0
    return m, p.sum(-1), p @ v, p @ v.abs()


def _merge_problem(args: tuple, before: list, got: object, want: tuple, tol: float):
    """``(what is wrong, a hint)`` for one call of the reader's merge, or ``None``."""
    if got is None:
        return "`merge` returned None", "End with `return m, l, o`."
    if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
        return f"`merge` returned a {type(got).__name__}, not three tensors (m, l, o)", "End with `return m, l, o`."
    for name, now, then in zip(_ARGS, args, before):
        if not torch.equal(now, then):
            return (
                f"`merge` changed its input {name}",
                "Compute new tensors and never write into an input (no `o1 *= ...`, no `.copy_`, no `out=`): "
                "the caller may still need the parts it passed.",
            )
    for name, t, w in zip("mlo", got, want):
        if t.shape != w.shape:
            return (
                f"{name} has shape {tuple(t.shape)}, expected {tuple(w.shape)}",
                "m and l have the shape of m1, (..., rows); o that of o1, (..., rows, D). Scale o by a per-row "
                "factor with factor[..., None], which also works with batch and head dimensions in front.",
            )
        if t.dtype != args[0].dtype:
            return f"{name} has dtype {dtype_name(t.dtype)}, expected {dtype_name(args[0].dtype)}", "Keep the inputs' dtype."
    m1, m2 = args[0].double(), args[3].double()
    m, lsum, o = (t.double() for t in got)
    want_m, want_l, want_o, size_o = want
    nan = torch.isnan(m) | torch.isnan(lsum) | torch.isnan(o).any(-1)
    if nan.any():
        count, first = int(nan.sum()), first_index(nan)
        both_empty = (m1 == -math.inf) & (m2 == -math.inf)
        if (nan & both_empty).any():
            return (
                f"NaN in {count} row(s), the first at {first}, rows where both parts are empty "
                "(m1 = m2 = -inf, l1 = l2 = 0, o1 = o2 = 0)",
                "NaN: an empty part has m=-inf; exp(-inf - -inf) is NaN. Use the larger max, and treat -inf "
                "carefully: where the new max is -inf, take the exponentials relative to 0 instead "
                "(torch.where), so both factors are exp(-inf) = 0 and the result is again (-inf, 0, 0).",
            )
        return (
            f"NaN in {count} row(s), the first at {first} (m1 = {m1[first]:.6g}, m2 = {m2[first]:.6g})",
            "inf - inf, 0 * inf or inf / inf: an exponential overflowed. Exponentiate only the differences "
            "m1 - m and m2 - m, with m the larger of the two maxes: they are <= 0, so the factors lie in [0, 1].",
        )
    inf = torch.isinf(lsum) | torch.isinf(o).any(-1)
    if inf.any():
        first = first_index(inf)
        return (
            f"l or o is infinite in {int(inf.sum())} row(s), the first at {first} "
            f"(m1 = {m1[first]:.6g}, m2 = {m2[first]:.6g}): an exponential overflowed",
            "Rescale by exp(m1 - m) and exp(m2 - m) with m the larger max (both <= 1); never exponentiate a max "
            "on its own, nor a difference with the smaller max.",
        )
    wrong_m = m != want_m
    if wrong_m.any():
        at = first_index(wrong_m)
        return (
            f"m is wrong in {int(wrong_m.sum())} row(s), the first at {at}: got {m[at]:.6g}, expected "
            f"{want_m[at]:.6g}, the larger of m1 = {m1[at]:.6g} and m2 = {m2[at]:.6g}",
            "m is the maximum score over both key sets: torch.maximum(m1, m2).",
        )
    wrong_l = (lsum - want_l).abs() > tol * want_l
    if wrong_l.any():
        at = first_index(wrong_l)
        return (
            f"l is off in {int(wrong_l.sum())} row(s), the first at {at}: got {lsum[at]:.8g}, expected {want_l[at]:.8g}",
            "Each part's l is a sum of exp(s - its own max). Re-express both relative to the new max before "
            "adding: l = exp(m1 - m) * l1 + exp(m2 - m) * l2.",
        )
    wrong_o = (o - want_o).abs() > tol * size_o
    if wrong_o.any():
        at = first_index(wrong_o)
        normalised = torch.allclose(o, want_o / torch.where(want_l == 0, 1.0, want_l)[..., None], rtol=1e-3, atol=1e-6)
        return (
            f"o is off in {int(wrong_o.any(-1).sum())} row(s), the first at {at}: got {o[at]:.8g}, "
            f"expected {want_o[at]:.8g}" + (" (your o looks divided by l)" if normalised else ""),
            "o is rescaled exactly like l: o = exp(m1 - m)[..., None] * o1 + exp(m2 - m)[..., None] * o2, and stays "
            "unnormalised (divide by l only once, after the last merge).",
        )
    return None


def _describe_part(keys: Sequence[int]) -> str:
    if not keys:
        return "an empty part (m=-inf, l=0, o=0)"
    return f"a part of {len(keys)} key{'s' * (len(keys) != 1)}"


def _merge_all(merge: Callable, case: _Case, where: str, rerun: str) -> tuple[torch.Tensor, ...]:
    """Merge the case's parts with the reader's ``merge`` in the case's order, checking each
    call against the exact partial result of the keys merged so far; return the last one."""
    __tracebackhide__ = True
    rng = random.Random(case.order_seed)
    tol = _TOL[case.dtype]
    items = [(tuple(keys), tuple(t.to(case.dtype) for t in _partial(case, keys)[:3])) for keys in case.parts]
    calls = len(items) - 1
    for call in range(1, calls + 1):
        if case.order in ("left", "tree") or (case.order == "empties first" and call == 1):
            i, j = 0, 1
        else:
            i, j = rng.sample(range(len(items)), 2)  # any two parts, in either argument order
        (keys_a, a), (keys_b, b) = items[i], items[j]
        for gone in sorted((i, j), reverse=True):
            items.pop(gone)
        args = a + b
        before = [t.clone() for t in args]
        at = f"{where}\n  in call {call} of {calls}: merge({_describe_part(keys_a)}, {_describe_part(keys_b)})"
        try:
            got = merge(*args)
        except NotImplementedError:
            raise not_written("merge", "merge") from None
        except Exception as err:
            hint = case.hint or "Read the error and the line of your code it points to."
            raise LabCheckError(f"{at}\n  `merge` raised {type(err).__name__}: {err}\n  Hint: {hint}\n  {rerun}") from err
        keys = keys_a + keys_b
        problem = _merge_problem(args, before, got, _partial(case, keys), tol)
        if problem is not None:
            what, hint = problem
            raise LabCheckError(f"{at}\n  {what}.\n  Hint: {' '.join(filter(None, (hint, case.hint)))}\n  {rerun}")
        put = {"left": 0, "tree": len(items)}.get(case.order, rng.randrange(len(items) + 1))
        items.insert(put, (keys, tuple(got)))
    return items[0][1]


def check_softmax_merge(merge: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade ``merge(m1, l1, o1, m2, l2, o2) -> (m, l, o)``, the merge of two partial
    softmax-attention results over disjoint key sets (plain PyTorch).

    For one key set and each query row: ``m`` is the largest score, ``l`` the sum of
    ``exp(score - m)`` and ``o`` the unnormalised sum of ``exp(score - m) * value``; m and l
    are (..., rows), o is (..., rows, D). An empty part is ``(-inf, 0, 0)``. 14 cases split
    random score and value matrices into 2 to 5 parts (empty parts, one-key parts, rows whose
    keys are all masked in a part, scores around +-1e4) and merge them in random orders and
    groupings, in float32 and float64; every call is compared with the exact result for the
    keys merged so far, and the last ``o / l`` with ``softmax(scores) @ values``. Raises
    :class:`LabCheckError`."""
    __tracebackhide__ = True
    from triton.runtime.jit import KernelInterface

    if isinstance(merge, KernelInterface) or not callable(merge):
        raise TypeError(
            f"check_softmax_merge takes your plain PyTorch function `merge(m1, l1, o1, m2, l2, o2)`, got {type(merge).__name__}"
        )
    seed = new_seed(seed)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtypes = [torch.float32, torch.float64]
    turn = rng.randrange(len(dtypes))
    empty_hint = "An empty part (m=-inf, l=0, o=0) must act as nothing: merge(empty, x) = x, merge(empty, empty) = empty."
    cases: list[_Case] = []

    def add(label: str, rows: int, keys: int, d: int, sizes: Sequence[int], hint: str = "", *, batch=(), scale=3.0,
            shift=0.0, masked=0.0, order="random"):  # fmt: skip
        nonlocal turn
        turn += 1
        dtype = dtypes[turn % len(dtypes)]
        scores = torch.randn((*batch, rows, keys), generator=gen, dtype=torch.float64) * scale + shift
        if masked:  # mask a fraction of the scores with -inf, but keep one key per row
            drop = torch.rand(scores.shape, generator=gen) < masked
            drop.scatter_(-1, torch.randint(keys, (*batch, rows, 1), generator=gen), False)
            scores = scores.masked_fill(drop, -math.inf)
        values = torch.randn((*batch, keys, d), generator=gen, dtype=torch.float64)
        perm = torch.randperm(keys, generator=gen).tolist()
        bounds = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        parts = tuple(tuple(perm[lo:hi]) for lo, hi in zip(bounds, bounds[1:]))
        shape = f"scores {tuple(scores.shape)}, D={d}, parts of {', '.join(map(str, sizes))} keys"
        case = _Case(f"{shape}, {label}", scores.to(dtype), values.to(dtype), parts, order, rng.randrange(1 << 30), hint)
        cases.append(case)

    def random_sizes(keys: int, parts: int) -> list[int]:
        cuts = sorted(rng.randint(0, keys) for _ in range(parts - 1))  # equal cuts make empty parts
        return [hi - lo for lo, hi in zip([0, *cuts], [*cuts, keys])]

    add("two halves", 4, 10, 8, [5, 5])
    add("three parts, one of them empty", 5, 12, 8, [6, 0, 6], empty_hint)
    add("two empty parts merged first", 3, 7, 4, [0, 0, 7], empty_hint, order="empties first")
    add("masked scores: some rows have no unmasked key in a part", 8, 16, 4, [4, 3, 3, 3, 3], empty_hint, masked=0.7)
    big_hint = "exp(score) and exp(max) overflow (or underflow to 0) here; only differences from the larger max are safe."
    add("huge logits (scores of order 1e4)", 6, 30, 8, [7, 5, 9, 4, 5], big_hint, scale=1e4)
    add("very negative logits (around -1e4)", 5, 20, 8, [8, 6, 6], big_hint, shift=-1e4)
    add("one key per part", 3, 5, 8, [1, 1, 1, 1, 1])
    add("unequal parts", 4, 41, 8, [1, 40])
    batch_hint = "Here m and l are (2, 3, rows): index the per-row factors with [..., None], not [:, None]."
    add("batch and head dimensions in front", 4, 20, 8, [7, 6, 7], batch_hint, batch=(2, 3))
    add("merged left to right, as a kernel's loop does", 6, 25, 16, [5, 5, 5, 5, 5], order="left")
    add("merged in pairs, then pairs of pairs, as split-KV decoding does", 6, 24, 16, [6, 6, 6, 6], order="tree")
    for _ in range(3):
        keys, parts = rng.randint(2, 50), rng.randint(2, 5)
        batch = rng.choice([(), (2,)])
        masked = rng.choice([0.0, 0.5])
        add("random", rng.randint(1, 8), keys, rng.randint(1, 16), random_sizes(keys, parts), batch=batch, masked=masked)

    rerun = f"Rerun this draw with check_softmax_merge(merge, seed={seed})."
    for number, case in enumerate(cases, 1):
        where = f"merge failed on case {number} of {len(cases)}: {case.label}, {dtype_name(case.dtype)}"
        _, lsum, o = (t.double() for t in _merge_all(merge, case, where, rerun))
        probs, values = torch.softmax(case.scores.double(), dim=-1), case.values.double()
        allowed = 10 * _TOL[case.dtype] * (probs @ values.abs())
        if not ((o / lsum[..., None] - probs @ values).abs() <= allowed).all():  # cannot happen when every call passed
            raise LabCheckError(f"{where}\n  the merged o / l differs from softmax(scores) @ values.\n  {rerun}")
    return report("merge", [f"{c.label}, {dtype_name(c.dtype)}" for c in cases], [c.dtype for c in cases], seed, verbose)
