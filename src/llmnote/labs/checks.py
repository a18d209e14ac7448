"""Graders for the labs: run the reader's launcher on random, odd-sized inputs and compare
with a PyTorch reference.

Every checker takes the reader's **launcher**, the plain Python function that allocates
the output, launches the ``@triton.jit`` kernel and returns the output:

- ``check_vector_add(vector_add)``, ``vector_add(x, y) -> x + y`` for two contiguous
  tensors of one shape and dtype;
- ``check_softmax(softmax)``, ``softmax(x)`` for a 2-D ``x`` whose rows are contiguous
  but may lie ``x.stride(0) >= n_cols`` elements apart; softmax over each row;
- ``check_matmul(matmul)``, ``matmul(a, b) -> a @ b`` for ``a`` (M, K) and ``b`` (K, N) of
  one dtype, with any strides;
- ``check_attention(attention)``, ``attention(q, k, v) -> softmax(q k^T / sqrt(D)) v`` for one
  head: ``q`` (Sq, D), ``k`` and ``v`` (Skv, D), contiguous, D a power of two from 16 to 64.

``check_softmax_merge(merge)`` grades a plain PyTorch function instead, the merge of two
partial softmax-attention results ``(m, l, o)`` (the online softmax behind FlashAttention):
it splits random problems into parts, merges them in random orders and groupings with the
reader's ``merge``, and checks every call against the exact partial result of the keys
merged so far.

Inputs are drawn from a seeded generator: fixed edge cases (a single element, primes,
one past a block, rows longer than 1024, huge or very negative logits, transposed and
sliced operands) plus a few random shapes, in each dtype Triton can run here (float32 and
float16 in the CPU interpreter, bfloat16 too on a GPU). While the launcher runs,
``torch.empty``, ``torch.empty_like``, ``torch.zeros`` and ``torch.zeros_like`` hand out
tensors that are filled with NaN (``empty``) and fenced by guard zones, so an element the
kernel never writes shows up as NaN, and a store past the end of the output is caught
instead of corrupting memory. Inputs are fenced too (by NaN), so a load past their end
poisons the result.

A wrong or unfinished answer raises :class:`LabCheckError` naming the case, the dtype,
the error and a hint; a right one prints ``"<lab>: N cases passed (...)"`` and returns a
:class:`LabReport`. ``seed`` makes a run repeatable; every failure message says which
seed to pass.
"""

from __future__ import annotations

import math
import operator
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .. import runtime

__all__ = [
    "LabCheckError",
    "LabReport",
    "check_vector_add",
    "check_softmax",
    "check_matmul",
    "check_softmax_merge",
    "check_attention",
]

GUARD = 1 << 16  # elements of guard zone on each side of every tensor the checker fences
OUT_SENTINEL = 1234.0  # fills the guard zones around outputs: a store past the end changes it

_REAL = {name: getattr(torch, name) for name in ("empty", "empty_like", "zeros", "zeros_like")}


class LabCheckError(AssertionError):
    """A lab answer is wrong or unfinished. The message names the case and gives a hint."""


@dataclass(frozen=True)
class LabReport:
    """What a passing check ran: the lab, its cases (shape and dtype of each) and the seed."""

    lab: str
    cases: tuple[str, ...]
    dtypes: tuple[str, ...]
    seed: int

    def __str__(self) -> str:
        return f"{self.lab}: {len(self.cases)} cases passed ({', '.join(self.dtypes)}; seed {self.seed})"


@dataclass(frozen=True)
class _Case:
    label: str  # what the case tests, e.g. "n=1025, one past a multiple of 1024"
    inputs: tuple[torch.Tensor, ...]
    hint: str  # what to look at when this case fails
    atol: float
    rtol: float

    @property
    def dtype(self) -> torch.dtype:
        return self.inputs[0].dtype


# --------------------------------------------------------------------------- inputs


def _dtypes() -> list[torch.dtype]:
    """The dtypes Triton can compute in here: the interpreter has no bfloat16 arithmetic."""
    return [torch.float32, torch.float16] + ([] if runtime.interpreting() else [torch.bfloat16])


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _fenced(shape: Sequence[int], dtype: torch.dtype, device, guard_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous ``shape`` tensor inside a buffer with ``GUARD`` elements of ``guard_value``
    on each side. Returns ``(view, buffer)``."""
    numel = math.prod(shape)
    buffer = _REAL["empty"](numel + 2 * GUARD, dtype=dtype, device=device).fill_(guard_value)
    return buffer[GUARD : GUARD + numel].view(tuple(shape)), buffer


class _Draw:
    """Random inputs for one check: shapes from ``random.Random(seed)``, values from a seeded
    torch generator, each tensor fenced by NaN so that loads past its end poison the result."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.device = runtime.device()
        self._turn = self.rng.randrange(len(_dtypes()))

    def dtype(self) -> torch.dtype:
        """The next dtype, round-robin from a random start: every dtype appears."""
        dtypes = _dtypes()
        self._turn += 1
        return dtypes[self._turn % len(dtypes)]

    def randn(self, shape: Sequence[int], dtype: torch.dtype, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return self.fence(torch.randn(tuple(shape), generator=self.gen) * scale + shift, dtype)

    def fence(self, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``values`` (made on the CPU) as a NaN-fenced tensor of ``dtype`` on the device."""
        view, _ = _fenced(values.shape, dtype, self.device, float("nan"))
        return view.copy_(values.to(dtype))


# --------------------------------------------------------------- poisoned allocation


def _shape(size: tuple) -> tuple[int, ...] | None:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    try:
        return tuple(operator.index(s) for s in size)
    except TypeError:
        return None


class _PoisonedAllocations:
    """While active, ``torch.empty``/``empty_like`` return NaN-filled tensors and
    ``torch.zeros``/``zeros_like`` zero-filled ones, each fenced by ``OUT_SENTINEL`` guard
    zones; :meth:`overrun` counts guard elements a kernel overwrote. Anything unusual
    (integer dtypes, ``out=``, pinned memory) goes to the real function."""

    _PLAIN = {"dtype", "device", "layout", "memory_format", "requires_grad", "pin_memory"}

    def __init__(self):
        self.buffers: list[tuple[torch.Tensor, int]] = []

    def _make(self, shape, kwargs, fill: float, like: torch.Tensor | None = None):
        if shape is None or set(kwargs) - self._PLAIN or kwargs.get("requires_grad") or kwargs.get("pin_memory"):
            return None
        if kwargs.get("layout", torch.strided) != torch.strided:
            return None
        dtype = kwargs.get("dtype") or (like.dtype if like is not None else torch.get_default_dtype())
        device = kwargs.get("device") or (like.device if like is not None else None)
        if not dtype.is_floating_point:
            return None
        view, buffer = _fenced(shape, dtype, device, OUT_SENTINEL)
        self.buffers.append((buffer, view.numel()))
        return view.fill_(fill)

    def __enter__(self) -> _PoisonedAllocations:
        nan = float("nan")

        def new(name: str, fill: float):
            def factory(*size, **kwargs):
                shape = _shape((kwargs["size"],) if "size" in kwargs and not size else size)
                made = self._make(shape, {k: v for k, v in kwargs.items() if k != "size"}, fill)
                return _REAL[name](*size, **kwargs) if made is None else made

            return factory

        def like(name: str, fill: float):
            def factory(t, **kwargs):
                made = self._make(tuple(t.shape), kwargs, fill, like=t) if isinstance(t, torch.Tensor) else None
                return _REAL[name](t, **kwargs) if made is None else made

            return factory

        torch.empty, torch.zeros = new("empty", nan), new("zeros", 0.0)
        torch.empty_like, torch.zeros_like = like("empty_like", nan), like("zeros_like", 0.0)
        return self

    def __exit__(self, *exc) -> None:
        for name, fn in _REAL.items():
            setattr(torch, name, fn)

    def overrun(self) -> int:
        """How many guard elements, around all tensors made while active, were written."""
        hits = 0
        for buffer, numel in self.buffers:
            sentinel = torch.full((), OUT_SENTINEL, dtype=buffer.dtype, device=buffer.device)
            hits += int((buffer[:GUARD] != sentinel).sum()) + int((buffer[GUARD + numel :] != sentinel).sum())
        return hits


# --------------------------------------------------------------------------- grading


def _check_launcher(lab: str, fn: object, signature: str) -> None:
    from triton.runtime.jit import KernelInterface

    if isinstance(fn, KernelInterface):
        raise TypeError(
            f"check_{lab} takes your launcher `{signature}`, not the @triton.jit kernel: the launcher allocates "
            "the output, launches the kernel on its grid and returns the output."
        )
    if not callable(fn):
        raise TypeError(f"check_{lab} takes your launcher function `{signature}`, got {type(fn).__name__}")


def _index(flat: int, shape: torch.Size) -> tuple[int, ...]:
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), shape))


def _problem(case: _Case, out: object, expected: torch.Tensor, before, poison: _PoisonedAllocations, lab: str, formula: str):
    """``(what is wrong, a hint)`` for this case's output, or ``None`` when it is right."""
    if out is None:
        return f"`{lab}` returned None", "End the launcher with `return out` (the tensor the kernel wrote)."
    if not isinstance(out, torch.Tensor):
        return f"`{lab}` returned a {type(out).__name__}, not a torch.Tensor", "Return the output tensor."
    for i, (now, then) in enumerate(zip(case.inputs, before)):
        if not torch.equal(now, then):
            return (
                f"input {i} changed during the call",
                "Write the result into a new tensor (torch.empty_like / torch.empty), never into an input.",
            )
    overrun = poison.overrun()
    if overrun:
        return (
            f"the kernel stored {overrun} element(s) outside the output tensor (past its end)",
            "The last block runs past the end of the data: pass mask=... to every tl.store (and tl.load). " + case.hint,
        )
    if out.shape != expected.shape:
        return f"the output has shape {tuple(out.shape)}, expected {tuple(expected.shape)}", f"{formula} {case.hint}"
    if out.dtype != expected.dtype:
        return (
            f"the output has dtype {_name(out.dtype)}, expected {_name(expected.dtype)} (the inputs' dtype)",
            "Allocate the output with the inputs' dtype, and cast the result on store: `.to(out_ptr.dtype.element_ty)`.",
        )
    if out.device != expected.device:
        return f"the output is on {out.device}, expected {expected.device}", "Allocate the output on the inputs' device."
    got, want = out.double(), expected.double()
    finite = torch.isfinite(want)
    nan = torch.isnan(got) & finite
    if nan.any():
        first = _index(int(nan.flatten().nonzero()[0]), out.shape)
        return (
            f"{int(nan.sum())} of {out.numel()} outputs are NaN, the first at index {first}. The checker fills new "
            "tensors with NaN, so these were never written, were computed from values read outside the input, or come "
            "from an overflow (inf / inf)",
            "Check that the grid covers every element (triton.cdiv) and the masks are not too strict. " + case.hint,
        )
    inf = torch.isinf(got) & finite
    if inf.any():
        first = _index(int(inf.flatten().nonzero()[0]), out.shape)
        return f"{int(inf.sum())} outputs are infinite (the first at {first}): something overflowed", case.hint
    error = torch.where(finite, (got - want).abs(), torch.where(got == want, 0.0, math.inf))
    allowed = case.atol + case.rtol * want.abs().nan_to_num(posinf=0.0)
    bad = error > allowed
    if bad.any():
        worst = int((error - allowed).flatten().argmax())
        at = _index(worst, out.shape)
        return (
            f"{int(bad.sum())} of {out.numel()} outputs are off; the worst at index {at}: got {got.flatten()[worst]:.6g}, "
            f"expected {want.flatten()[worst]:.6g} (max abs error {error.max():.3g}, "
            f"tolerance {case.atol:.2g} + {case.rtol:.2g}*|expected|)",
            f"{formula} {case.hint}",
        )
    return None


def _grade(lab: str, fn: Callable, cases: list[_Case], reference: Callable, formula: str, seed: int, verbose: bool):
    """Run the launcher ``fn`` (named like its lab) on every case; raise at the first failure."""
    __tracebackhide__ = True  # IPython and pytest show the reader's frames, not the grader's
    rerun = f"Rerun this draw with check_{lab}({lab}, seed={seed})."
    for number, case in enumerate(cases, 1):
        where = f"{lab} failed on case {number} of {len(cases)}: {case.label}, {_name(case.dtype)}"
        expected = reference(*case.inputs)
        before = [t.clone() for t in case.inputs]
        try:
            with _PoisonedAllocations() as poison:
                out = fn(*case.inputs)
        except NotImplementedError as err:
            raise LabCheckError(
                f"{lab}: not written yet: `{lab}` raised NotImplementedError({str(err)!r}). Write the kernel and "
                "the launcher in the exercise cell, run that cell, then run this check again."
            ) from None
        except Exception as err:
            raise LabCheckError(
                f"{where}\n  `{lab}` raised {type(err).__name__}: {err}\n"
                f"  Hint: the traceback above points into your code. {case.hint}\n  {rerun}"
            ) from err
        problem = _problem(case, out, expected, before, poison, lab, formula)
        if problem is not None:
            what, hint = problem
            raise LabCheckError(f"{where}\n  {what}.\n  Hint: {hint}\n  {rerun}")
    dtypes = tuple(dict.fromkeys(_name(c.dtype) for c in cases))
    report = LabReport(lab, tuple(f"{c.label}, {_name(c.dtype)}" for c in cases), dtypes, seed)
    if verbose:
        print(report)
    return report


def _seed(seed: int | None) -> int:
    return random.SystemRandom().randrange(1 << 31) if seed is None else int(seed)


# ------------------------------------------------------------------------ vector add

_ADD_TOL = {torch.float32: (1e-6, 1e-6), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1e-2)}


def check_vector_add(vector_add: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade ``vector_add(x, y) -> x + y`` on 12 random cases (1 element, primes, one past a
    block, a 2-D tensor, random lengths up to 20,000). Inputs are contiguous, of one shape
    and dtype; the output must have the same shape and dtype. Raises :class:`LabCheckError`."""
    __tracebackhide__ = True
    _check_launcher("vector_add", vector_add, "vector_add(x, y)")
    seed = _seed(seed)
    draw = _Draw(seed)
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
        cases.append(_Case(label, (x, y), hint, *_ADD_TOL[dtype]))

    def reference(x, y):
        return (x.double() + y.double()).to(x.dtype)

    formula = "The output is x + y, element by element."
    return _grade("vector_add", vector_add, cases, reference, formula, seed, verbose)


# --------------------------------------------------------------------------- softmax

_SOFTMAX_TOL = {torch.float32: (1e-6, 1e-4), torch.float16: (1e-4, 5e-3), torch.bfloat16: (1e-3, 3e-2)}


def check_softmax(softmax: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade ``softmax(x)`` (softmax over each row of a 2-D ``x``) on 13 random cases: rows of
    1 to ~4,000 columns (longer than 1,024 too), huge logits, very negative logits, rows with
    ``-inf`` entries, and rows spaced ``x.stride(0) > n_cols`` apart (a column slice). The
    output is ``(n_rows, n_cols)`` in ``x.dtype``. Raises :class:`LabCheckError`."""
    __tracebackhide__ = True
    _check_launcher("softmax", softmax, "softmax(x)")
    seed = _seed(seed)
    draw = _Draw(seed)
    block_hint = "Each program holds one whole row: BLOCK = triton.next_power_of_2(n_cols), mask = cols < n_cols."
    pad_hint = "Masked lanes must load other=-float('inf'), so they add exp(-inf) = 0 to the sum and never win the max."
    cases: list[_Case] = []

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
        cases.append(_Case(f"x of shape ({rows}, {cols}), {label}", (x,), hint, *_SOFTMAX_TOL[dtype]))

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
    return _grade("softmax", softmax, cases, reference, formula, seed, verbose)


# ---------------------------------------------------------------------------- matmul

# atol is per unit of sqrt(K): a dot product of K random terms grows like sqrt(K). float32
# allows TF32 (tl.dot's default for float32 on a GPU: 10-bit mantissas, float32 sums).
_MATMUL_TOL = {torch.float32: (5e-3, 1e-3), torch.float16: (1e-3, 2e-3), torch.bfloat16: (1e-2, 1e-2)}


def check_matmul(matmul: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade ``matmul(a, b) -> a @ b`` for ``a`` (M, K), ``b`` (K, N) on 12 random cases: odd and
    prime M, N, K from 1 to 130, K not a multiple of the block, one-row products, and
    transposed, sliced and strided operands. The output is (M, N) in ``a.dtype``, with
    float32 accumulation. Raises :class:`LabCheckError`."""
    __tracebackhide__ = True
    _check_launcher("matmul", matmul, "matmul(a, b)")
    seed = _seed(seed)
    draw = _Draw(seed)
    tail_hint = "Mask the loads along K in the last step (rk < K - k, other=0.0), and rows >= M, columns >= N everywhere."
    stride_hint = "Use the strides you are given (a.stride(0), a.stride(1), b.stride(0), b.stride(1)): do not assume contiguity."
    acc_hint = "Accumulate in a float32 tile (tl.zeros(..., dtype=tl.float32)) and cast once on the store."
    cases: list[_Case] = []

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
        atol, rtol = _MATMUL_TOL[dtype]
        cases.append(_Case(f"M={m}, N={n}, K={k}, {label}", (a, b), f"{hint} {acc_hint}", atol * math.sqrt(k), rtol))

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
    return _grade("matmul", matmul, cases, reference, formula, seed, verbose)


# --------------------------------------------------------------------- softmax merge

# Relative tolerance of l and o in each merge call: the merge is exact algebra, only the
# rounding of a few multiplications and additions differs from the float64 reference.
_MERGE_TOL = {torch.float32: 2e-5, torch.float64: 1e-12}
_MERGE_ARGS = ("m1", "l1", "o1", "m2", "l2", "o2")


@dataclass(frozen=True)
class _MergeCase:
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


def _partial(case: _MergeCase, keys: Sequence[int]) -> tuple[torch.Tensor, ...]:
    """The exact ``(m, l, o)`` of the keys ``keys`` in float64, and ``sum exp(s - m) |v|``
    (the size of o's terms, for its tolerance). No key, or only masked ones: (-inf, 0, 0)."""
    index = torch.tensor(list(keys), dtype=torch.long)
    s = case.scores.double()[..., index]
    v = case.values.double()[..., index, :]
    m = s.amax(-1) if len(keys) else torch.full(s.shape[:-1], -math.inf, dtype=torch.float64)
    p = torch.exp(s - torch.where(m == -math.inf, 0.0, m)[..., None])  # masked rows: exp(-inf) = 0
    return m, p.sum(-1), p @ v, p @ v.abs()


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    return _index(int(mask.flatten().nonzero()[0]), mask.shape)


def _merge_problem(args: tuple, before: list, got: object, want: tuple, tol: float):
    """``(what is wrong, a hint)`` for one call of the reader's merge, or ``None``."""
    if got is None:
        return "`merge` returned None", "End with `return m, l, o`."
    if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
        return f"`merge` returned a {type(got).__name__}, not three tensors (m, l, o)", "End with `return m, l, o`."
    for name, now, then in zip(_MERGE_ARGS, args, before):
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
            return f"{name} has dtype {_name(t.dtype)}, expected {_name(args[0].dtype)}", "Keep the inputs' dtype."
    m1, m2 = args[0].double(), args[3].double()
    m, lsum, o = (t.double() for t in got)
    want_m, want_l, want_o, size_o = want
    nan = torch.isnan(m) | torch.isnan(lsum) | torch.isnan(o).any(-1)
    if nan.any():
        count, first = int(nan.sum()), _first(nan)
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
        first = _first(inf)
        return (
            f"l or o is infinite in {int(inf.sum())} row(s), the first at {first} "
            f"(m1 = {m1[first]:.6g}, m2 = {m2[first]:.6g}): an exponential overflowed",
            "Rescale by exp(m1 - m) and exp(m2 - m) with m the larger max (both <= 1); never exponentiate a max "
            "on its own, nor a difference with the smaller max.",
        )
    wrong_m = m != want_m
    if wrong_m.any():
        at = _first(wrong_m)
        return (
            f"m is wrong in {int(wrong_m.sum())} row(s), the first at {at}: got {m[at]:.6g}, expected "
            f"{want_m[at]:.6g}, the larger of m1 = {m1[at]:.6g} and m2 = {m2[at]:.6g}",
            "m is the maximum score over both key sets: torch.maximum(m1, m2).",
        )
    wrong_l = (lsum - want_l).abs() > tol * want_l
    if wrong_l.any():
        at = _first(wrong_l)
        return (
            f"l is off in {int(wrong_l.sum())} row(s), the first at {at}: got {lsum[at]:.8g}, expected {want_l[at]:.8g}",
            "Each part's l is a sum of exp(s - its own max). Re-express both relative to the new max before "
            "adding: l = exp(m1 - m) * l1 + exp(m2 - m) * l2.",
        )
    wrong_o = (o - want_o).abs() > tol * size_o
    if wrong_o.any():
        at = _first(wrong_o)
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


def _merge_all(merge: Callable, case: _MergeCase, where: str, rerun: str) -> tuple[torch.Tensor, ...]:
    """Merge the case's parts with the reader's ``merge`` in the case's order, checking each
    call against the exact partial result of the keys merged so far; return the last one."""
    __tracebackhide__ = True
    rng = random.Random(case.order_seed)
    tol = _MERGE_TOL[case.dtype]
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
        except NotImplementedError as err:
            raise LabCheckError(
                f"merge: not written yet: `merge` raised NotImplementedError({str(err)!r}). Write it in the "
                "exercise cell, run that cell, then run this check again."
            ) from None
        except Exception as err:
            hint = " ".join(filter(None, ("The traceback above points into your code.", case.hint)))
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
    seed = _seed(seed)
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    dtypes = [torch.float32, torch.float64]
    turn = rng.randrange(len(dtypes))
    empty_hint = "An empty part (m=-inf, l=0, o=0) must act as nothing: merge(empty, x) = x, merge(empty, empty) = empty."
    cases: list[_MergeCase] = []

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
        case = _MergeCase(f"{shape}, {label}", scores.to(dtype), values.to(dtype), parts, order, rng.randrange(1 << 30), hint)
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
        where = f"merge failed on case {number} of {len(cases)}: {case.label}, {_name(case.dtype)}"
        _, lsum, o = (t.double() for t in _merge_all(merge, case, where, rerun))
        probs, values = torch.softmax(case.scores.double(), dim=-1), case.values.double()
        allowed = 10 * _MERGE_TOL[case.dtype] * (probs @ values.abs())
        if not ((o / lsum[..., None] - probs @ values).abs() <= allowed).all():  # cannot happen when every call passed
            raise LabCheckError(f"{where}\n  the merged o / l differs from softmax(scores) @ values.\n  {rerun}")
    report = LabReport(
        "merge", tuple(f"{c.label}, {_name(c.dtype)}" for c in cases), tuple(dict.fromkeys(_name(c.dtype) for c in cases)), seed
    )
    if verbose:
        print(report)
    return report


# ------------------------------------------------------------------------- attention

# Outputs are weighted averages of rows of v (|v| of order 1). float32 allows TF32 (tl.dot's
# default on a GPU); float16 and bfloat16 allow the rounding of p to the dtype of v before
# the second product, as tensor-core kernels do.
_ATTENTION_TOL = {torch.float32: (5e-3, 5e-3), torch.float16: (3e-3, 5e-3), torch.bfloat16: (2e-2, 2e-2)}


def check_attention(attention: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade ``attention(q, k, v) -> softmax(q k^T / sqrt(D)) v`` for one head, non-causal:
    ``q`` (Sq, D), ``k`` and ``v`` (Skv, D), contiguous, of one dtype, D in {16, 32, 64}. 13
    random cases: a single query and a single key, Sq and Skv that are not multiples of any
    block, fewer keys than a block, many key blocks, and integer-valued scores in the hundreds
    that grow along the keys (exact in every dtype). The output is (Sq, D) in ``q.dtype``;
    the reference computes in float32. Raises :class:`LabCheckError`."""
    __tracebackhide__ = True
    _check_launcher("attention", attention, "attention(q, k, v)")
    seed = _seed(seed)
    draw = _Draw(seed)
    key_hint = (
        "Keys past Skv: load k and v with mask=keys[:, None] < Skv, other=0.0, and set their scores to -inf "
        "(tl.where(keys[None, :] < Skv, s, float('-inf'))) so that exp gives them weight 0."
    )
    row_hint = (
        "Rows past Sq: load q with mask=rows[:, None] < Sq, other=0.0, and store with the same mask; the grid has "
        "triton.cdiv(Sq, BLOCK_M) programs."
    )
    online_hint = (
        "For each key block: m_new = max(m, row max of s); p = exp(s - m_new[:, None]); alpha = exp(m - m_new); "
        "l = alpha * l + row sum of p; acc = alpha[:, None] * acc + p @ v; m = m_new. Divide acc by l once, after the loop."
    )
    cases: list[_Case] = []

    def add(sq: int, skv: int, d: int, label: str, hint: str, growing: bool = False):
        dtype = draw.dtype()
        if growing:  # small integers, exact in every dtype and in TF32: scores climb by about 2 a key
            q = draw.fence(torch.randint(1, 4, (sq, d), generator=draw.gen).float(), dtype)
            steps = (torch.arange(skv) // 2)[:, None]
            k = draw.fence((torch.randint(-2, 3, (skv, d), generator=draw.gen) + steps).float(), dtype)
        else:
            q, k = draw.randn((sq, d), dtype), draw.randn((skv, d), dtype)
        v = draw.randn((skv, d), dtype)
        label = f"Sq={sq}, Skv={skv}, D={d}, {label}"
        cases.append(_Case(label, (q, k, v), hint, *_ATTENTION_TOL[dtype]))

    add(1, 1, 16, "one query and one key (the output is that key's value)", f"{row_hint} {key_hint}")
    add(16, 16, 16, "one small block each", f"{row_hint} {key_hint}")
    add(64, 64, 32, "multiples of the usual block sizes", "No edges here: look at the indexing. " + online_hint)
    add(1, 100, 64, "one query (a decode step)", f"{row_hint} {key_hint}")
    add(37, 13, 32, "fewer keys than any BLOCK_N", key_hint)
    add(45, 77, 16, "neither Sq nor Skv a multiple of a block", f"{row_hint} {key_hint}")
    add(20, 130, 32, "many key blocks: the running max changes", online_hint)
    growing_hint = (
        "Subtract the running max before tl.exp (exp(89) overflows float32, exp(12) float16), and rescale acc and l "
        "whenever the max grows. " + online_hint
    )
    add(24, 70, 16, "large scores (hundreds) that grow along the keys", growing_hint, growing=True)
    add(33, 65, 64, "Skv one past a multiple of 64", key_hint)
    add(50, 40, 64, "D=64", online_hint)
    for _ in range(3):
        sq, skv, d = draw.rng.randint(1, 70), draw.rng.randint(1, 140), draw.rng.choice([16, 32, 64])
        add(sq, skv, d, "random", f"{row_hint} {key_hint}")

    def reference(q, k, v):
        scores = q.float() @ k.float().T / math.sqrt(q.shape[-1])
        return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype)

    formula = "Output row i is softmax(q_i k^T / sqrt(D)) v, a weighted average of the rows of v."
    return _grade("attention", attention, cases, reference, formula, seed, verbose)
