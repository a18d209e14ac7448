"""The machinery every lab grader shares: the error a failed check raises, the report a passed
one returns, random inputs, the comparison of an output with its reference, and the loop that
runs a reader's Triton launcher under watch (:mod:`llmnote.labs.sandbox`).

Inputs are drawn from a seeded generator, in each dtype Triton computes in where the check
runs (float32 and float16 in the CPU interpreter; on a GPU also ``runtime.half_dtype()`` when
that is bfloat16). Every failure message says which seed reproduces it.
"""

from __future__ import annotations

import math
import random
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .. import runtime
from .sandbox import PoisonedAllocations, TritonWatch, fenced, watching

__all__ = [
    "LabCheckError",
    "LabReport",
    "Case",
    "Draw",
    "kernel_dtypes",
    "dtype_name",
    "new_seed",
    "first_index",
    "check_launcher",
    "not_written",
    "compare",
    "grade_launcher",
    "report",
]


class LabCheckError(AssertionError):
    """A lab answer is wrong or unfinished. The message names the case and gives a hint.

    In IPython and Jupyter the error shows as its message alone (plus, when the reader's code
    raised, the lines of the reader's code it went through): no grader source, no long traceback.
    """

    def _render_traceback_(self) -> list[str]:
        lines = str(self).splitlines() or [""]
        lines[0] = f"{type(self).__name__}: {lines[0]}"
        where = _reader_frames(self.__cause__)
        if where:
            lines += ["", "Where, in your code:", *where]
        return lines


_LIBRARY = tuple(
    str(Path(p).resolve()) for p in (Path(__file__).parents[1], Path(torch.__file__).parents[1], sys.prefix, sys.base_prefix)
)


def _reader_frames(error: BaseException | None, limit: int = 4) -> list[str]:
    """The frames of ``error`` (and the errors it was raised from) that lie in the reader's
    code, not in a library: ``Cell In[5], line 7, in vector_add`` and the line itself."""
    found: list[str] = []
    seen: set[int] = set()
    names = _cell_names()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        for frame in traceback.extract_tb(error.__traceback__):
            if (
                not frame.filename
                or frame.filename.startswith("<frozen")
                or str(Path(frame.filename).resolve()).startswith(_LIBRARY)
            ):
                continue
            where = names.get(frame.filename, Path(frame.filename).name)
            entry = f"  {where}, line {frame.lineno}, in {frame.name}" + (f"\n    {frame.line.strip()}" if frame.line else "")
            if entry not in found:
                found.append(entry)
        error = error.__cause__ or error.__context__
    return found[-limit:]


def _cell_names() -> dict[str, str]:
    """IPython's names for its cells' files ("Cell In[5]"), when running under IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return {}
    shell = get_ipython()
    numbers = getattr(getattr(shell, "compile", None), "_filename_map", {}) or {}
    return {filename: f"Cell In[{number}]" for filename, number in numbers.items()}


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
class Case:
    """One input of a check: what it tests, the inputs, a hint for when it fails, tolerances,
    and keyword arguments for the reader's function (e.g. ``causal=True``)."""

    label: str  # what the case tests, e.g. "n=1025, one past a multiple of 1024"
    inputs: tuple[torch.Tensor, ...]
    hint: str  # what to look at when this case fails
    atol: float
    rtol: float
    kwargs: tuple[tuple[str, object], ...] = ()

    @property
    def dtype(self) -> torch.dtype:
        return self.inputs[0].dtype


def kernel_dtypes() -> list[torch.dtype]:
    """The dtypes the kernel labs try: float32 and float16 everywhere (the CPU interpreter has
    no bfloat16 arithmetic), and bfloat16 too where ``runtime.half_dtype()`` picks it (sm_80+)."""
    half = runtime.half_dtype()
    return [torch.float32, torch.float16] + ([half] if half not in (torch.float32, torch.float16) else [])


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def new_seed(seed: int | None) -> int:
    """``seed``, or a fresh random one when it is ``None``."""
    return random.SystemRandom().randrange(1 << 31) if seed is None else int(seed)


def first_index(mask: torch.Tensor) -> tuple[int, ...]:
    """The index of the first true element of ``mask``."""
    flat = int(mask.flatten().nonzero()[0])
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), mask.shape))


class Draw:
    """Random inputs for one check: shapes from ``random.Random(seed)``, values from a seeded
    torch generator, each tensor fenced by NaN so that loads past its end poison the result."""

    def __init__(self, seed: int, dtypes: Sequence[torch.dtype] | None = None):
        self.rng = random.Random(seed)
        self.gen = torch.Generator().manual_seed(seed)
        self.device = runtime.device()
        self.dtypes = list(dtypes or kernel_dtypes())
        self._turn = self.rng.randrange(len(self.dtypes))

    def dtype(self) -> torch.dtype:
        """The next dtype, round-robin from a random start: every dtype appears."""
        self._turn += 1
        return self.dtypes[self._turn % len(self.dtypes)]

    def randn(self, shape: Sequence[int], dtype: torch.dtype, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return self.fence(torch.randn(tuple(shape), generator=self.gen) * scale + shift, dtype)

    def fence(self, values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``values`` (made on the CPU) as a NaN-fenced tensor of ``dtype`` on the device."""
        view, _ = fenced(values.shape, dtype, self.device, float("nan"))
        return view.copy_(values.to(dtype))


def check_launcher(lab: str, fn: object, signature: str) -> None:
    """Refuse a ``@triton.jit`` kernel or a non-callable where the launcher is expected."""
    from triton.runtime.jit import KernelInterface

    if isinstance(fn, KernelInterface):
        raise TypeError(
            f"check_{lab} takes your launcher `{signature}`, not the @triton.jit kernel: the launcher allocates "
            "the output, launches the kernel on its grid and returns the output."
        )
    if not callable(fn):
        raise TypeError(f"check_{lab} takes your launcher function `{signature}`, got {type(fn).__name__}")


def not_written(lab: str, what: str = "the kernel and the launcher") -> LabCheckError:
    """The error for an exercise cell that still holds its stub."""
    return LabCheckError(
        f"{lab}: not written yet. Write {what} in the exercise cell (the cell that starts with `# EXERCISE`), "
        "run that cell, then run this check again."
    )


def _output_problem(case: Case, out: object, expected: torch.Tensor, before, poison: PoisonedAllocations, lab: str, formula: str):
    """``(what is wrong, a hint)`` for this case's output, or ``None`` when it is right."""
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
            f"the output has dtype {dtype_name(out.dtype)}, expected {dtype_name(expected.dtype)} (the inputs' dtype)",
            "Allocate the output with the inputs' dtype, and cast the result on store: `.to(out_ptr.dtype.element_ty)`.",
        )
    if out.device != expected.device:
        return f"the output is on {out.device}, expected {expected.device}", "Allocate the output on the inputs' device."
    return compare(out, expected, case.atol, case.rtol, f"{formula} {case.hint}")


def compare(out: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float, hint: str) -> tuple[str, str] | None:
    """``(what is wrong, hint)`` when ``out`` differs from ``expected`` beyond ``atol + rtol |expected|``
    (NaN where ``expected`` is finite, infinities, or plain errors), else ``None``."""
    got, want = out.double(), expected.double()
    finite = torch.isfinite(want)
    nan = torch.isnan(got) & finite
    if nan.any():
        return (
            f"{int(nan.sum())} of {out.numel()} outputs are NaN, the first at index {first_index(nan)}. The checker fills "
            "new tensors with NaN, so these were never written, were computed from values read outside the input, or "
            "come from an overflow (inf / inf)",
            "Check that the grid covers every element (triton.cdiv) and the masks are not too strict. " + hint,
        )
    inf = torch.isinf(got) & finite
    if inf.any():
        return f"{int(inf.sum())} outputs are infinite (the first at {first_index(inf)}): something overflowed", hint
    error = torch.where(finite, (got - want).abs(), torch.where(got == want, 0.0, math.inf))
    allowed = atol + rtol * want.abs().nan_to_num(posinf=0.0)
    bad = error > allowed
    if bad.any():
        worst = int((error - allowed).flatten().argmax())
        at = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst), out.shape))
        return (
            f"{int(bad.sum())} of {out.numel()} outputs are off; the worst at index {at}: got {got.flatten()[worst]:.6g}, "
            f"expected {want.flatten()[worst]:.6g} (max abs error {error.max():.3g}, "
            f"tolerance {atol:.2g} + {rtol:.2g}*|expected|)",
            hint,
        )
    return None


def grade_launcher(
    lab: str, kernel: str, fn: Callable, cases: list[Case], reference: Callable, formula: str, seed: int, verbose: bool
) -> LabReport:
    """Run the reader's launcher ``fn`` (named like its lab; ``kernel`` names its Triton kernel)
    on every case, watching that one of the reader's Triton kernels computes the output, and
    compare with ``reference``; raise :class:`LabCheckError` at the first failure."""
    __tracebackhide__ = True  # pytest shows the reader's frames, not the grader's
    rerun = f"Rerun this draw with check_{lab}({lab}, seed={seed})."
    for number, case in enumerate(cases, 1):
        where = f"{lab} failed on case {number} of {len(cases)}: {case.label}, {dtype_name(case.dtype)}"
        kwargs = dict(case.kwargs)
        expected = reference(*case.inputs, **kwargs)
        before = [t.clone() for t in case.inputs]
        watch: TritonWatch
        try:
            with watching() as (watch, poison):
                out = fn(*case.inputs, **kwargs)
        except NotImplementedError:
            raise not_written(lab) from None
        except Exception as err:
            raise LabCheckError(f"{where}\n  `{lab}` raised {type(err).__name__}: {err}\n  Hint: {case.hint}\n  {rerun}") from err
        if out is None:
            problem = f"`{lab}` returned None", "End the launcher with `return out` (the tensor the kernel wrote)."
        elif not isinstance(out, torch.Tensor):
            problem = f"`{lab}` returned a {type(out).__name__}, not a torch.Tensor", "Return the output tensor."
        else:
            problem = watch.problem(lab, kernel, out) or _output_problem(case, out, expected, before, poison, lab, formula)
        if problem is not None:
            what, hint = problem
            raise LabCheckError(f"{where}\n  {what}.\n  Hint: {hint}\n  {rerun}")
    return report(lab, [f"{c.label}, {dtype_name(c.dtype)}" for c in cases], [c.dtype for c in cases], seed, verbose)


def report(lab: str, cases: Sequence[str], dtypes: Sequence[torch.dtype | str], seed: int, verbose: bool) -> LabReport:
    """The :class:`LabReport` of a passed check, printed when ``verbose``."""
    names = tuple(dict.fromkeys(d if isinstance(d, str) else dtype_name(d) for d in dtypes))
    result = LabReport(lab, tuple(cases), names, seed)
    if verbose:
        print(result)
    return result
