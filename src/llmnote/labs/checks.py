"""Graders for the labs: run the reader's launcher on random, odd-sized inputs and compare
with a PyTorch reference.

Every checker takes the reader's **launcher**, the plain Python function that allocates
the output, launches the ``@triton.jit`` kernel and returns the output:

- ``check_vector_add(vector_add)``, ``vector_add(x, y) -> x + y`` for two contiguous
  tensors of one shape and dtype;
- ``check_softmax(softmax)``, ``softmax(x)`` for a 2-D ``x`` whose rows are contiguous
  but may lie ``x.stride(0) >= n_cols`` elements apart; softmax over each row;
- ``check_matmul(matmul)``, ``matmul(a, b) -> a @ b`` for ``a`` (M, K) and ``b`` (K, N) of
  one dtype, with any strides.

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

__all__ = ["LabCheckError", "LabReport", "check_vector_add", "check_softmax", "check_matmul"]

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
        values = torch.randn(tuple(shape), generator=self.gen) * scale + shift
        view, _ = _fenced(shape, dtype, self.device, float("nan"))
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
