"""Device choice and Triton's interpreter mode. Each case runs in a fresh interpreter,
because Triton reads TRITON_INTERPRET once, at import."""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="these cases describe a machine without a GPU")


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "LLMNOTE_DEVICE", "LLMNOTE_CAPABILITY")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**clean, **env}, timeout=120)


def test_cpu_switches_triton_to_the_interpreter_and_a_kernel_runs():
    code = """
import os, llmnote, torch
assert os.environ["TRITON_INTERPRET"] == "1"
assert llmnote.runtime.device() == torch.device("cpu") and llmnote.runtime.interpreting()
import triton, triton.language as tl

@triton.jit
def add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

x, y = torch.randn(1000), torch.randn(1000)
out = torch.full_like(x, float("nan"))
add[(triton.cdiv(1000, 256),)](x, y, out, 1000, BLOCK=256)
torch.testing.assert_close(out, x + y)
print(llmnote.runtime.describe())
"""
    result = run_python(code)
    assert result.returncode == 0, result.stderr
    assert "interpreter" in result.stdout


def test_importing_triton_first_is_an_error_with_advice():
    result = run_python("import triton\nimport llmnote")
    assert result.returncode != 0
    assert "import llmnote first" in result.stderr


def test_forcing_the_cpu():
    result = run_python("import llmnote; print(llmnote.runtime.device())", LLMNOTE_DEVICE="cpu")
    assert result.stdout.strip() == "cpu"


def test_without_a_gpu_there_is_no_capability_and_half_precision_is_float16():
    code = """
import llmnote, torch
rt = llmnote.runtime
assert rt.capability() is None and rt.gpu_memory_gb() is None and not rt.is_hopper()
assert rt.half_dtype() == torch.float16  # the interpreter has no bfloat16 arithmetic
try:
    rt.require_capability((9, 0), "the Gluon kernel")
except RuntimeError as e:
    print(e)
"""
    result = run_python(code, LLMNOTE_CAPABILITY="7.5")  # the variable caps a GPU; without one it changes nothing
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "the Gluon kernel needs an NVIDIA GPU; this run has none"


def test_colab_detection():
    assert run_python("import llmnote; print(llmnote.runtime.in_colab())").stdout.strip() == "False"
    assert run_python("import llmnote; print(llmnote.runtime.in_colab())", COLAB_RELEASE_TAG="x").stdout.strip() == "True"


def test_show_prints_the_real_source():
    import llmnote
    from llmnote.roofline import ridge_point

    view = llmnote.show(ridge_point)
    assert "def ridge_point" in view.code and "llmnote.roofline.ridge_point" in view.title
    assert "<div" in view._repr_html_() and "ridge_point" in repr(view)
    with pytest.raises(TypeError, match="cannot show"):
        llmnote.show(42)
