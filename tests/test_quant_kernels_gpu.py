"""W4A16 on a real GPU, at the shapes of Llama-3-8B's largest projections, in 16-bit floats,
against the reference. Skipped without CUDA; run on the H200 with
``pytest tests/test_quant_kernels_gpu.py``. The 16-bit types are float16 and the runtime's
(bfloat16, unless the GPU, or ``LLMNOTE_CAPABILITY``, says the tensor cores lack it)."""

import pytest
import torch

from llmnote import kernels, ref, runtime
from llmnote.kernels.gemm import w4a16, w4a16_swap_ab
from llmnote.quant import quantize_weight

HALF_DTYPES = sorted({runtime.half_dtype(), torch.float16}, key=str)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def rel_err(out, expected):
    return ((out.float() - expected.float()).norm() / expected.float().norm()).item()


def make(m, n, k, dtype, group=128, bits=4, symmetric=False):
    w = torch.randn(n, k, device="cuda", dtype=dtype)
    qw = quantize_weight(w, bits=bits, group_size=group, symmetric=symmetric)
    return torch.randn(m, k, device="cuda", dtype=dtype), qw


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("nk", [(28672, 4096), (4096, 14336)], ids=["N=28672,K=4096", "N=4096,K=14336"])
@pytest.mark.parametrize("m", [1, 16, 64, 256, 4096])
def test_w4a16_llama_shapes(m, nk, dtype):
    x, qw = make(m, *nk, dtype)
    out = torch.full((m, nk[0]), float("nan"), device="cuda", dtype=dtype)
    out.copy_(kernels.w4a16_linear(x, qw))
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert rel_err(out, ref.w4a16_linear(x, qw)) < 1e-2


@pytest.mark.parametrize("m", [3, 17, 100])
@pytest.mark.parametrize("fmt", [(64, 3, True), (32, 2, False), (256, 4, True)], ids=lambda f: "g={},b={},sym={}".format(*f))
def test_w4a16_odd_shapes_and_formats(m, fmt):
    group, bits, symmetric = fmt
    x, qw = make(m, 1000, 2048, runtime.half_dtype(), group, bits, symmetric)
    assert rel_err(kernels.w4a16_linear(x, qw), ref.w4a16_linear(x, qw)) < 1e-2


@pytest.mark.parametrize("fmt", [(64, 3, True), (32, 2, False), (256, 4, True)], ids=lambda f: "g={},b={},sym={}".format(*f))
@pytest.mark.parametrize("n", [1000, 1024], ids=["N=1000 (FMA or tl.dot kernel)", "N=1024 (tensor-core decode kernel)"])
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
def test_w4a16_decode(m, n, fmt):
    """Up to 16 rows of x take the tensor-core decode kernel when N is a multiple of 32 (one row, one
    8-row block, two), else the decode kernel (FMAs for one row, tl.dot beyond)."""
    group, bits, symmetric = fmt
    x, qw = make(m, n, 2048, runtime.half_dtype(), group, bits, symmetric)
    assert w4a16._swap_ab_fits(x, qw.qweight, group) == (n % 32 == 0)
    assert rel_err(kernels.w4a16_linear(x, qw), ref.w4a16_linear(x, qw)) < 1e-2


@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("deq", [False, True])
def test_tensor_core_decode_kernel_one_tile(m, prefetch, deq):
    """One tile launched directly, whatever the autotuner would choose: loading one group ahead or
    not, one row or two 8-row blocks, K split four ways, the inline-PTX loads, the codes scaled
    before the MMAs (``DEQ``) or after."""
    if tuple(runtime.capability()) < (8, 0):
        pytest.skip("the tensor-core decode kernel needs the m16n8k16 MMA (sm_80 on)")
    n, k, split, warps = 4096, 14336, 4, 4
    x, qw = make(m, n, k, runtime.half_dtype())
    q, s, z = w4a16._parts(qw)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=x.dtype)
    ws, locks = torch.empty(split, m, n, device="cuda"), w4a16._locks(x.device, n // 32)
    meta = {"GROUP": qw.group_size, "ROWS": w4a16_swap_ab._rows(m), "V": 1, "WARPS": warps, "SPLIT_K": split,
            "PREFETCH": prefetch, "DEQ": deq, "HALF": "bf16" if x.dtype == torch.bfloat16 else "f16", "ASM": True}  # fmt: skip
    args = (x, q, s, z, out, ws, locks, m, n, k, x.stride(0), q.stride(0), s.stride(0), out.stride(0))
    w4a16_swap_ab.w4a16_swap_ab_kernel[(n // 32, split)](*args, **meta, num_warps=warps)
    assert rel_err(out, ref.w4a16_linear(x, qw)) < 1e-2
    assert not locks.any()


def test_w4a16_batch_dims_and_strided_x():
    x, qw = make(2 * 9, 4096, 4096, runtime.half_dtype())
    x3 = x.view(2, 9, 4096)
    assert rel_err(kernels.w4a16_linear(x3, qw), ref.w4a16_linear(x3, qw)) < 1e-2
    wide = torch.randn(40, 8192, device="cuda", dtype=x.dtype)[:, ::2]
    assert rel_err(kernels.w4a16_linear(wide, qw), ref.w4a16_linear(wide.contiguous(), qw)) < 1e-2


def test_w4a16_split_k_in_a_cuda_graph():
    """The split-K counters reset themselves: graph replays with new inputs stay right."""
    x, qw = make(1, 4096, 14336, runtime.half_dtype())
    kernels.w4a16_linear(x, qw)  # autotune outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = kernels.w4a16_linear(x, qw)
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out, ref.w4a16_linear(x, qw)) < 1e-2
    assert not w4a16._LOCKS[x.device].any()


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_w4a16_dequantize_is_exact(dtype):
    _, qw = make(1, 4096, 14336, dtype)
    assert torch.equal(w4a16.w4a16_dequantize(qw), qw.dequantize().t())
