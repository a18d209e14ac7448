"""Where code runs: pick the device, and put Triton in interpreter mode without a GPU.

Triton reads ``TRITON_INTERPRET`` once, when it is first imported, so this module must
run before anything imports ``triton``. ``import llmnote`` calls :func:`configure` for
you; import ``llmnote`` first in every notebook.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch

__all__ = [
    "Runtime",
    "configure",
    "device",
    "has_gpu",
    "interpreting",
    "in_colab",
    "describe",
    "capability",
    "is_hopper",
    "half_dtype",
    "gpu_memory_gb",
    "require_capability",
]

CAPABILITY_ENV = "LLMNOTE_CAPABILITY"


@dataclass(frozen=True)
class Runtime:
    """What :func:`configure` decided."""

    device: str  # "cuda" or "cpu"
    gpu_name: str | None  # e.g. "NVIDIA H200", None on CPU
    triton_interpret: bool  # True when Triton kernels run in the interpreter


_RUNTIME: Runtime | None = None


def has_gpu() -> bool:
    """True when PyTorch sees a CUDA device."""
    return torch.cuda.is_available()


def configure(force_cpu: bool = False) -> Runtime:
    """Choose the device once and set ``TRITON_INTERPRET=1`` when it is the CPU.

    ``force_cpu=True`` (or the environment variable ``LLMNOTE_DEVICE=cpu``) runs
    everything on the CPU even when a GPU is present. Calling again after Triton has
    been imported with a different choice raises ``RuntimeError``: Triton cannot switch
    modes in a running process.
    """
    global _RUNTIME
    want_cpu = force_cpu or os.environ.get("LLMNOTE_DEVICE", "").lower() == "cpu"
    use_gpu = has_gpu() and not want_cpu
    interpret = not use_gpu
    if "triton" in sys.modules:
        already = os.environ.get("TRITON_INTERPRET") == "1"
        if already != interpret:
            raise RuntimeError(
                "triton was imported before llmnote chose the device "
                f"(TRITON_INTERPRET={'1' if already else 'unset'}, wanted "
                f"{'1' if interpret else 'unset'}); restart the kernel and import llmnote first"
            )
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    elif os.environ.get("TRITON_INTERPRET") == "1":
        del os.environ["TRITON_INTERPRET"]
    gpu_name = torch.cuda.get_device_name(0) if use_gpu else None
    _RUNTIME = Runtime(device="cuda" if use_gpu else "cpu", gpu_name=gpu_name, triton_interpret=interpret)
    return _RUNTIME


def _current() -> Runtime:
    return _RUNTIME if _RUNTIME is not None else configure()


def device() -> torch.device:
    """The ``torch.device`` every notebook should allocate on."""
    return torch.device(_current().device)


def interpreting() -> bool:
    """True when Triton kernels run in the (slow, CPU) interpreter."""
    return _current().triton_interpret


def capability() -> tuple[int, int] | None:
    """The compute capability the package plans for, ``(major, minor)``; ``None`` without a GPU.

    It is the GPU's own, unless the environment variable ``LLMNOTE_CAPABILITY`` (e.g. ``7.5``
    for a T4, ``8.0`` for an A100) asks for a lower one: then every kernel takes the path it
    would take on that GPU and :func:`half_dtype` the dtype it would pick there. This runs a
    laptop's or Colab's code paths on a Hopper GPU. The variable never raises the capability.
    """
    if _current().device != "cuda":
        return None
    real = torch.cuda.get_device_capability(0)
    wanted = os.environ.get(CAPABILITY_ENV, "").strip()
    if not wanted:
        return real
    try:
        major, minor = (int(part) for part in wanted.split("."))
    except ValueError:
        raise ValueError(f"{CAPABILITY_ENV} must look like '8.0' or '7.5', got {wanted!r}") from None
    return min(real, (major, minor))


def is_hopper() -> bool:
    """True on a Hopper GPU (sm_90: TMA, wgmma, thread-block clusters) that the package may use as one."""
    cap = capability()
    return cap is not None and cap[0] == 9


def half_dtype() -> torch.dtype:
    """The 16-bit float type to compute in: bfloat16 where the tensor cores multiply it
    (compute capability 8.0 and newer), float16 on older GPUs (a T4 is 7.5) and in the CPU
    interpreter, which has no bfloat16 arithmetic."""
    cap = capability()
    return torch.bfloat16 if cap is not None and cap >= (8, 0) else torch.float16


def gpu_memory_gb() -> float | None:
    """Total memory of the GPU in GB (1e9 bytes); ``None`` without a GPU. Notebooks size
    their live runs from it (a T4 has 16 GB, an H200 141 GB)."""
    if _current().device != "cuda":
        return None
    return torch.cuda.get_device_properties(0).total_memory / 1e9


def require_capability(minimum: tuple[int, int], what: str) -> None:
    """Raise a ``RuntimeError`` naming ``what`` unless the GPU has at least ``minimum``."""
    cap = capability()
    if cap is None:
        raise RuntimeError(f"{what} needs an NVIDIA GPU; this run has none")
    if cap < minimum:
        name = _current().gpu_name
        forced = f" ({CAPABILITY_ENV}={os.environ[CAPABILITY_ENV]})" if os.environ.get(CAPABILITY_ENV) else ""
        raise RuntimeError(
            f"{what} needs compute capability {minimum[0]}.{minimum[1]} or newer; "
            f"this {name} is used as {cap[0]}.{cap[1]}{forced}"
        )


def in_colab() -> bool:
    """True inside Google Colab."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def describe() -> str:
    """One line for the top of a notebook: where this run executes."""
    rt = _current()
    if rt.device == "cuda":
        cap = capability()
        as_older = (
            f", used as compute capability {cap[0]}.{cap[1]} ({CAPABILITY_ENV})"
            if cap != torch.cuda.get_device_capability(0)
            else ""
        )
        return f"Running on {rt.gpu_name}{as_older} (torch {torch.__version__}); Triton kernels compile for the GPU."
    return (
        f"Running on the CPU (torch {torch.__version__}); Triton kernels run in the interpreter, "
        "so sizes are small and timings are not performance. Benchmarks show recorded H200 numbers."
    )
