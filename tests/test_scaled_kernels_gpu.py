"""FP8 and INT8 scaled GEMMs on a real GPU, at the shapes of an 8B Llama MLP (N=28672, K=4096 and
N=4096, K=14336; prefill M=4096 and decode M=1 or 16) and odd ones, against the references and
torch's own 8-bit products (``torch._scaled_mm`` with row-wise scales, ``torch._int_mm``).
Skipped without CUDA; fp8 needs compute capability 8.9 or newer."""

import pytest
import torch

from llmnote import kernels, ref, runtime
from llmnote.kernels.gemm import scaled as scaled_kernels
from llmnote.quant import quantize_scaled

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CAP = runtime.capability() or (0, 0)
needs_fp8 = pytest.mark.skipif(CAP < (8, 9), reason="float8 tensor cores need compute capability 8.9 or newer")
LARGE = [(4096, 28672, 4096), (4096, 4096, 14336)]
SHAPES = LARGE + [(1, 28672, 4096), (16, 4096, 14336), (300, 4097, 1040), (4095, 1000, 1000)]  # last: no TMA (K % 16)


def rel_err(out, expected):
    return ((out.float() - expected.float()).norm() / expected.float().norm()).item()


def operands(m, n, k, kind, granularity, seed=0):
    """Activations (bf16, quantized by the kernel) and a weight quantized by llmnote.quant."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
    w = quantize_scaled(torch.randn(n, k, device="cuda", generator=g) * 0.02, kind, granularity)
    a, a_scale = kernels.quantize_rows(x, kind, block=128 if granularity == "block" else None)
    return a, a_scale, w.data, w.scale


@needs_fp8
@pytest.mark.parametrize("mnk", SHAPES)
@pytest.mark.parametrize("granularity", ["row", "tensor", "block"])
def test_fp8_gemm_matches_ref(mnk, granularity):
    a, a_scale, b, b_scale = operands(*mnk, "fp8", granularity)
    expected = ref.fp8_gemm(a, a_scale, b, b_scale, out_dtype=torch.float32)
    out = kernels.fp8_gemm(a, a_scale, b, b_scale)
    assert out.dtype == torch.bfloat16 and out.shape == expected.shape and torch.isfinite(out).all()
    assert rel_err(out, expected) < 1e-2
    assert rel_err(kernels.fp8_gemm(a, a_scale, b, b_scale, out_dtype=torch.float32), expected) < 1e-2


@needs_fp8
@pytest.mark.parametrize("mnk", LARGE)
def test_fp8_gemm_promoted_accumulation_is_float32_accurate(mnk):
    a, a_scale, b, b_scale = operands(*mnk, "fp8", "row")
    expected = ref.fp8_gemm(a, a_scale, b, b_scale, out_dtype=torch.float32)
    out = kernels.fp8_gemm(a, a_scale, b, b_scale, out_dtype=torch.float32, fast_accum=False)
    assert rel_err(out, expected) < 1e-3


@pytest.mark.skipif(CAP < (9, 0), reason="torch._scaled_mm row-wise scales need Hopper")
@pytest.mark.parametrize("mnk", [s for s in SHAPES if all(d % 16 == 0 for d in s)])
def test_fp8_gemm_matches_torch_scaled_mm(mnk):
    a, a_scale, b, b_scale = operands(*mnk, "fp8", "row")
    theirs = torch._scaled_mm(a, b.t(), scale_a=a_scale[:, None], scale_b=b_scale[None, :], out_dtype=torch.bfloat16)
    assert rel_err(kernels.fp8_gemm(a, a_scale, b, b_scale), theirs) < 1e-2


@pytest.mark.parametrize("mnk", SHAPES)
@pytest.mark.parametrize("granularity", ["row", "tensor"])
def test_int8_gemm_matches_ref(mnk, granularity):
    a, a_scale, b, b_scale = operands(*mnk, "int8", granularity)
    expected = ref.int8_gemm(a, a_scale, b, b_scale, out_dtype=torch.float32)
    assert rel_err(kernels.int8_gemm(a, a_scale, b, b_scale, out_dtype=torch.float32), expected) < 1e-6  # exact int32 sums
    assert rel_err(kernels.int8_gemm(a, a_scale, b, b_scale), expected) < 1e-2


@pytest.mark.parametrize("mnk", [s for s in SHAPES if s[0] > 16 and s[1] % 8 == 0 and s[2] % 8 == 0])
def test_int8_gemm_sums_equal_torch_int_mm(mnk):
    a, _, b, _ = operands(*mnk, "int8", "row")
    one = torch.ones((), device="cuda")
    ours = kernels.int8_gemm(a, one, b, one, out_dtype=torch.float32)
    assert torch.equal(ours, torch._int_mm(a, b.t()).float())  # sums stay below 2**24: exact in float32


@pytest.mark.parametrize("kind,block", [("int8", None), ("fp8", None), ("fp8", 128)])
@pytest.mark.parametrize("shape", [(4096, 4096), (7, 14336), (33, 1000)])
def test_quantize_rows_matches_ref_exactly(kind, block, shape):
    if kind == "fp8" and CAP < (8, 9):
        pytest.skip("float8 needs compute capability 8.9 or newer")
    x = torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * torch.logspace(-3, 3, shape[0], device="cuda")[:, None]
    data, scale = kernels.quantize_rows(x, kind, block)
    want_data, want_scale = ref.quantize_rows(x, kind, block)
    assert torch.equal(scale, want_scale)
    assert torch.equal(data.view(torch.int8), want_data.view(torch.int8))


@pytest.mark.parametrize("kind,granularity", [("fp8", "row"), ("fp8", "tensor"), ("fp8", "block"), ("int8", "row")])
@pytest.mark.parametrize("tokens", [1, 4096])
def test_linear_matches_ref(kind, granularity, tokens):
    if kind == "fp8" and CAP < (8, 9):
        pytest.skip("float8 needs compute capability 8.9 or newer")
    x = torch.randn(tokens, 4096, device="cuda", dtype=torch.bfloat16)
    w = quantize_scaled(torch.randn(14336, 4096, device="cuda") * 0.02, kind, granularity)
    linear, ref_linear = (kernels.fp8_linear, ref.fp8_linear) if kind == "fp8" else (kernels.int8_linear, ref.int8_linear)
    out = linear(x[None], w)
    assert out.shape == (1, tokens, 14336) and out.dtype == torch.bfloat16
    assert rel_err(out, ref_linear(x[None], w)) < 1e-2
    assert rel_err(out[0], x.float() @ w.dequantize().float().T) < 0.1  # and near the unquantized product


@pytest.mark.skipif(CAP < (9, 0), reason="TMA needs Hopper or newer")
@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_pointer_and_tma_paths_agree(kind):
    a, a_scale, b, b_scale = operands(2048, 4096, 4096, kind, "row")
    outs = []
    for tma in (False, True):
        out = torch.full((2048, 4096), float("nan"), device="cuda", dtype=torch.bfloat16)
        scaled_kernels.scaled_gemm_launch(a, a_scale, b, b_scale, out, block_scales=False, tma=tma)
        outs.append(out)
    expected = (ref.fp8_gemm if kind == "fp8" else ref.int8_gemm)(a, a_scale, b, b_scale, out_dtype=torch.float32)
    assert all(rel_err(out, expected) < 1e-2 for out in outs)


def test_fp8_refuses_a_gpu_without_fp8(monkeypatch):
    monkeypatch.setattr(runtime, "capability", lambda: (8, 0))
    a = torch.zeros(4, 128, device="cuda").to(torch.float8_e4m3fn)
    with pytest.raises(RuntimeError, match="8.9"):
        kernels.fp8_gemm(a, torch.ones((), device="cuda"), a, torch.ones((), device="cuda"))
    with pytest.raises(RuntimeError, match="8.9"):
        kernels.quantize_rows(torch.zeros(4, 128, device="cuda"), "fp8")
