"""What ``LLMNOTE_CAPABILITY`` does on a real GPU: the package takes the paths of an older
GPU (no Gluon, no TMA, float16 instead of bfloat16) and says so when asked for more. Each
case runs in a fresh interpreter with the variable set as it needs, so these tests mean the
same whatever the variable is in the outer environment."""

import os
import subprocess
import sys

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

# Which attention kernel runs: record the Gluon call and the Triton kernel family.
PROBE = """
import llmnote, torch
from llmnote import kernels, ref
from llmnote.kernels.attention import flash as A
rt = llmnote.runtime
used = []
if A.flash_ws is not None:
    real_ws = A.flash_ws.flash_attention_ws
    A.flash_ws.flash_attention_ws = lambda *a, **k: (used.append("gluon"), real_ws(*a, **k))[1]
real_launch = A.flash_launch
def launch(q, k, v, out, causal, scale, kind, *rest):
    used.append(kind)
    return real_launch(q, k, v, out, causal, scale, kind, *rest)
A.flash_launch = launch
dt = rt.half_dtype()
q, k, v = (torch.randn(2, 4, 300, 128, device="cuda", dtype=dt) for _ in range(3))
out = kernels.flash_attention(q, k, v, causal=True)
torch.testing.assert_close(out.float(), ref.flash_attention(q.float(), k.float(), v.float(), causal=True), atol=2e-2, rtol=2e-2)
kinds = list(used)
try:
    kernels.flash_attention(*(t.bfloat16() for t in (q, k, v)))
    bf16 = "ran"
except TypeError as e:
    bf16 = "refused: " + str(e)
print(rt.capability(), rt.is_hopper(), str(dt), kinds, bf16, sep="|")
"""


def probe(capability: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "LLMNOTE_CAPABILITY"}
    if capability is not None:
        env["LLMNOTE_CAPABILITY"] = capability
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()[-1].split("|")


def test_as_a_t4_the_package_computes_in_float16_on_portable_kernels():
    cap, hopper, dtype, used, bf16 = probe("7.5")
    assert (cap, hopper, dtype) == ("(7, 5)", "False", "torch.float16")
    assert used == "['pointers']", "no TMA, no Gluon below sm_90"
    assert bf16.startswith("refused: ") and "float16" in bf16 and "7.5" in bf16


def test_as_an_a100_the_package_computes_in_bfloat16_without_tma():
    cap, hopper, dtype, used, bf16 = probe("8.0")
    assert (cap, hopper, dtype) == ("(8, 0)", "False", "torch.bfloat16")
    assert used == "['pointers']" and bf16 == "ran"


def test_natively_a_hopper_gpu_runs_the_gluon_kernel():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the Gluon kernel is for sm_90")
    cap, hopper, dtype, used, bf16 = probe(None)
    assert (cap, hopper, dtype) == ("(9, 0)", "True", "torch.bfloat16")
    assert used == "['gluon']" and bf16 == "ran"


def test_the_variable_never_raises_the_capability_and_rejects_nonsense():
    env = {**os.environ, "LLMNOTE_CAPABILITY": "12.0"}
    code = "import llmnote, torch; print(llmnote.runtime.capability() == torch.cuda.get_device_capability())"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout.strip() == "True"
    env["LLMNOTE_CAPABILITY"] = "sm80"
    result = subprocess.run(
        [sys.executable, "-c", "import llmnote; llmnote.runtime.capability()"], capture_output=True, text=True, env=env
    )
    assert result.returncode != 0 and "must look like '8.0'" in result.stderr
