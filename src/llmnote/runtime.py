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

__all__ = ["Runtime", "configure", "device", "has_gpu", "interpreting", "in_colab", "describe"]


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


def in_colab() -> bool:
    """True inside Google Colab."""
    return "google.colab" in sys.modules or "COLAB_RELEASE_TAG" in os.environ


def describe() -> str:
    """One line for the top of a notebook: where this run executes."""
    rt = _current()
    if rt.device == "cuda":
        return f"Running on {rt.gpu_name} (torch {torch.__version__}); Triton kernels compile for the GPU."
    return (
        f"Running on the CPU (torch {torch.__version__}); Triton kernels run in the interpreter, "
        "so sizes are small and timings are not performance. Benchmarks show recorded H200 numbers."
    )
