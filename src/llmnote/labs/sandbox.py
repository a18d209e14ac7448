"""What a grader watches while the reader's launcher runs.

- :class:`PoisonedAllocations`: ``torch.empty``/``empty_like`` hand out NaN-filled tensors and
  ``torch.zeros``/``zeros_like`` zero-filled ones, each between guard zones, so an element a
  kernel never writes shows up as NaN and a store past the end of the output is caught.
- :class:`TritonWatch`: records every Triton kernel launch (``kernel[grid](...)``, also through
  ``triton.autotune`` and ``triton.heuristics``, compiled on a GPU or run by the CPU interpreter)
  and every torch computation made *outside* a launch. A launcher may allocate, read shapes and
  strides, take views and launch; arithmetic in torch (``x + y``, ``torch.softmax``, ``@``) means
  the result did not come from the reader's kernel.

:func:`watching` enters both, and :meth:`TritonWatch.problem` says what is wrong, if anything.
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode, resolve_name

__all__ = ["GUARD", "OUT_SENTINEL", "fenced", "PoisonedAllocations", "Launch", "TritonWatch", "watching"]

GUARD = 1 << 16  # elements of guard zone on each side of every tensor the checker fences
OUT_SENTINEL = 1234.0  # fills the guard zones around outputs: a store past the end changes it

_REAL = {name: getattr(torch, name) for name in ("empty", "empty_like", "zeros", "zeros_like")}

# Torch calls a launcher may make outside a kernel: allocation, metadata, views and copies.
ALLOWED_TORCH = frozenset(
    # allocation
    "empty empty_like empty_strided zeros zeros_like ones ones_like full full_like arange tensor as_tensor "
    "new_empty new_empty_strided new_zeros new_ones new_full new_tensor "
    # metadata
    "shape size stride dim ndim ndimension numel nelement dtype device layout is_cuda is_cpu is_floating_point "
    "is_contiguous element_size itemsize nbytes data_ptr storage_offset get_device requires_grad is_leaf data "
    "__len__ __repr__ __str__ __format__ "
    # views
    "view view_as reshape reshape_as contiguous t T mT transpose permute expand expand_as broadcast_to unsqueeze "
    "squeeze flatten unflatten narrow select __getitem__ split chunk unbind movedim moveaxis swapaxes swapdims "
    "as_strided detach "
    # copies and fills (a computed value would have been flagged where it was computed)
    "to cuda cpu float half bfloat16 clone copy_ fill_ zero_ __setitem__".split()
)

_OPERATORS = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "true_divide": "/", "matmul": "@", "pow": "**", "neg": "unary -",
    "__radd__": "+", "__rsub__": "-", "__rmul__": "*", "__rtruediv__": "/", "__rmatmul__": "@", "__rpow__": "**",
    "__iadd__": "+=", "__isub__": "-=", "__imul__": "*=", "__itruediv__": "/=",
}  # fmt: skip


def fenced(shape: Sequence[int], dtype: torch.dtype, device, guard_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous ``shape`` tensor inside a buffer with ``GUARD`` elements of ``guard_value``
    on each side. Returns ``(view, buffer)``."""
    numel = math.prod(shape)
    buffer = _REAL["empty"](numel + 2 * GUARD, dtype=dtype, device=device).fill_(guard_value)
    return buffer[GUARD : GUARD + numel].view(tuple(shape)), buffer


def _shape(size: tuple) -> tuple[int, ...] | None:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    try:
        return tuple(operator.index(s) for s in size)
    except TypeError:
        return None


class PoisonedAllocations:
    """While active, ``torch.empty``/``empty_like`` return NaN-filled tensors and
    ``torch.zeros``/``zeros_like`` zero-filled ones, each fenced by ``OUT_SENTINEL`` guard
    zones; :meth:`overrun` counts guard elements a kernel overwrote. Anything unusual
    (integer dtypes, ``out=``, pinned memory) goes to the real function."""

    _PLAIN = {"dtype", "device", "layout", "memory_format", "requires_grad", "pin_memory"}

    def __init__(self, watch: TritonWatch | None = None):
        self.buffers: list[tuple[torch.Tensor, int]] = []
        self.watch = watch

    def _make(self, shape, kwargs, fill: float, like: torch.Tensor | None = None):
        if shape is None or set(kwargs) - self._PLAIN or kwargs.get("requires_grad") or kwargs.get("pin_memory"):
            return None
        if kwargs.get("layout", torch.strided) != torch.strided:
            return None
        dtype = kwargs.get("dtype") or (like.dtype if like is not None else torch.get_default_dtype())
        device = kwargs.get("device") or (like.device if like is not None else None)
        if not dtype.is_floating_point:
            return None
        with self.watch.grader() if self.watch else contextlib.nullcontext():
            view, buffer = fenced(shape, dtype, device, OUT_SENTINEL)
            self.buffers.append((buffer, view.numel()))
            return view.fill_(fill)

    def __enter__(self) -> PoisonedAllocations:
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


# ------------------------------------------------------------------ the Triton watch


@dataclass(frozen=True)
class Launch:
    """One kernel launch: the kernel's name and module, and the storages of its tensor arguments."""

    kernel: str
    module: str
    storages: frozenset[int]

    @property
    def from_the_book(self) -> bool:
        """True for the book's own kernels (``llmnote.kernels``), which are not the reader's."""
        return self.module.startswith("llmnote.kernels")


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _tensors(values) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (tuple, list)):
            yield from _tensors(value)
        elif isinstance(getattr(value, "base", None), torch.Tensor):  # a TensorDescriptor (TMA)
            yield value.base


def _kernel_classes() -> list[type]:
    """Every class of Triton's launch machinery that defines its own ``run``: JITFunction
    (GPU), InterpretedFunction (CPU interpreter), Autotuner and Heuristics (wrappers)."""
    import triton.runtime.autotuner  # noqa: F401  (registers Autotuner and Heuristics)
    import triton.runtime.interpreter  # noqa: F401
    from triton.runtime.jit import KernelInterface

    found, todo = [], [KernelInterface]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls is not KernelInterface and "run" in vars(cls) and cls not in found:
            found.append(cls)
    return found


def _op_name(func) -> str:
    """``torch.Tensor.add`` -> ``add``; ``torch.Tensor.shape.__get__`` -> ``shape``."""
    name = resolve_name(func) or getattr(func, "__name__", repr(func))
    name = name.removesuffix(".__get__").removesuffix(".__set__")
    return name.rsplit(".", 1)[-1]


def _display(func) -> str:
    full = (resolve_name(func) or getattr(func, "__name__", repr(func))).removesuffix(".__get__")
    full = full.replace("torch.Tensor.", "Tensor.").replace("torch.nn.functional.", "F.")
    symbol = _OPERATORS.get(_op_name(func))
    return f"{full} ({symbol})" if symbol else full


class _TorchMath(TorchFunctionMode):
    """Records torch calls the watch does not allow, made while no kernel is running."""

    def __init__(self, watch: TritonWatch):
        super().__init__()
        self.watch = watch

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if self.watch.depth == 0 and _op_name(func) not in ALLOWED_TORCH:
            name = _display(func)
            if name not in self.watch.torch_calls:
                self.watch.torch_calls.append(name)
        return func(*args, **(kwargs or {}))


class TritonWatch:
    """While active, records Triton kernel launches (:attr:`launches`) and the torch
    computations made outside any launch (:attr:`torch_calls`). Torch calls inside a launch
    (the interpreter's own, Triton's argument handling) and inside :meth:`grader` are not
    recorded. Restores everything it patched on exit."""

    def __init__(self):
        self.launches: list[Launch] = []
        self.torch_calls: list[str] = []
        self.depth = 0  # > 0 inside a launch or the grader's own code
        self._patched: list[tuple[type, object]] = []
        self._mode: _TorchMath | None = None

    @contextlib.contextmanager
    def grader(self) -> Iterator[None]:
        """Torch calls made in this block are the grader's, not the reader's."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def _wrap(self, run):
        from triton.runtime.jit import KernelInterface

        watch = self

        def run_and_record(kernel, *args, **kwargs):
            with watch.grader():
                fn = getattr(kernel, "fn", None)
                if not kwargs.get("warmup", False) and fn is not None and not isinstance(fn, KernelInterface):
                    storages = frozenset(_storage(t) for t in _tensors((*args, *kwargs.values())))
                    name = getattr(fn, "__qualname__", getattr(fn, "__name__", "kernel"))
                    watch.launches.append(Launch(name, getattr(fn, "__module__", "") or "", storages))
                return run(kernel, *args, **kwargs)

        return run_and_record

    def __enter__(self) -> TritonWatch:
        for cls in _kernel_classes():
            run = vars(cls)["run"]
            self._patched.append((cls, run))
            cls.run = self._wrap(run)
        self._mode = _TorchMath(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for cls, run in reversed(self._patched):
            cls.run = run
        self._patched.clear()

    def problem(self, lab: str, kernel: str, out: torch.Tensor) -> tuple[str, str] | None:
        """``(what is wrong, a hint)`` when the returned ``out`` was not computed by one of the
        reader's Triton kernels, else ``None``. ``kernel`` names the lab's kernel, for the hint."""
        none = "no Triton kernel computed the result"
        allowed = (
            "The launcher may only allocate the output (torch.empty, torch.empty_like), read shapes and strides, take "
            f"views, and launch {kernel}[grid](...); all the arithmetic belongs inside the kernel (tl.load, tl.store, ...)."
        )
        if self.torch_calls:
            more = len(self.torch_calls) - 4
            calls = ", ".join(self.torch_calls[:4]) + (f" and {more} more" if more > 0 else "")
            launched = f"`{lab}` launched no Triton kernel and" if not self.launches else f"outside its Triton kernel, `{lab}`"
            return f"{none}: {launched} computed with torch: {calls}", f"This lab grades your Triton kernel. {allowed}"
        if not self.launches:
            return f"{none}: `{lab}` launched no Triton kernel", f"Launch {kernel}[grid](...) and return the tensor it wrote."
        own = [launch for launch in self.launches if not launch.from_the_book]
        if not own:
            names = ", ".join(dict.fromkeys(f"{launch.module}.{launch.kernel}" for launch in self.launches))
            return (
                f"no Triton kernel of yours computed the result: `{lab}` launched only the book's own kernels ({names})",
                f"Write and launch your own kernel, {kernel}.",
            )
        if not any(_storage(out) in launch.storages for launch in own):
            return (
                f"{none}: the tensor `{lab}` returned was never passed to a Triton kernel",
                f"Pass the output tensor to {kernel} (as out_ptr), and return that same tensor.",
            )
        return None


@contextlib.contextmanager
def watching() -> Iterator[tuple[TritonWatch, PoisonedAllocations]]:
    """Watch Triton launches and torch math, and poison new allocations, for one call."""
    with TritonWatch() as watch, PoisonedAllocations(watch) as poison:
        yield watch, poison
