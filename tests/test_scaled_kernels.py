"""FP8 and INT8 scaled GEMMs (Chapter 5): the references against the definition, dynamic row
quantization, and the Triton kernels against the references.

On a CPU the kernels run in Triton's interpreter, which handles float8 and int8 ``tl.dot``
(Triton 3.6); outputs are checked in float32 and float16 there (the interpreter rounds bfloat16
stores toward zero). test_scaled_kernels_gpu.py repeats the checks at real sizes on a GPU.
"""

import pytest
import torch

import llmnote
from llmnote import kernels, ref, runtime
from llmnote.kernels.gemm import scaled as scaled_kernels
from llmnote.quant import quantize_scaled

DEVICE = llmnote.runtime.device()
FP8 = torch.float8_e4m3fn
device = pytest.mark.device
ON_CPU = DEVICE.type == "cpu"
FP8_OK = ON_CPU or (runtime.capability() or (0, 0)) >= (8, 9)
# The interpreter sums in float32; Hopper's fp8 tensor cores (fast accumulation) keep fewer bits.
FP8_ACCUM_TOL = 1e-6 if ON_CPU else 3e-3


def require(kind):
    if kind == "fp8" and not FP8_OK:
        pytest.skip("float8 tensor cores need compute capability 8.9 or newer")


def tolerance(kind, out_dtype):
    """Relative error allowed against the float32 reference: float32 rounding (plus the tensor
    cores' fp8 accumulation on a GPU), or one float16 rounding of the output."""
    exact = 1e-6 if kind == "int8" else FP8_ACCUM_TOL
    return exact if out_dtype == torch.float32 else max(exact, 1e-3)


def rel_err(out, expected):
    return ((out.double() - expected.double()).norm() / expected.double().norm()).item()


def make_a(m, k, kind, layout, device="cpu", seed=0):
    """Activations quantized by the reference, with ``layout`` scales ('tensor', 'row', 'block')."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4
    if layout == "tensor":
        q = quantize_scaled(x, kind, "tensor")
        data, scale = q.data, q.scale
    else:
        data, scale = ref.quantize_rows(x, kind, block=128 if layout == "block" else None)
    return data.to(device), scale.to(device)


def make_b(n, k, kind, layout, device="cpu", seed=1):
    w = quantize_scaled(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05, kind, layout)
    return w.data.to(device), w.scale.to(device)


# (a's scales, b's scales): both per tensor, both per row, mixed, or both block (fp8 only)
LAYOUTS = [("tensor", "tensor"), ("row", "row"), ("row", "tensor"), ("tensor", "row"), ("block", "block")]


def definition(a, a_scale, b, b_scale):
    """``sum_k a[m,k] b[n,k] s_a s_b`` in float64, the scales applied per 128-wide K block
    (DeepSeek-V3's formulation) or once after the sum."""
    (M, K), N = a.shape, b.shape[0]
    if a_scale.dim() < 2:
        dots = a.double() @ b.double().T
        return dots * a_scale.double().reshape(-1, 1) * b_scale.double().reshape(1, -1)
    out = torch.zeros(M, N, dtype=torch.float64)
    for kb, k0 in enumerate(range(0, K, 128)):
        part = a[:, k0 : k0 + 128].double() @ b[:, k0 : k0 + 128].double().T
        out += part * a_scale[:, kb, None].double() * b_scale[torch.arange(N) // 128, kb][None, :].double()
    return out


# ---------------------------------------------------------------- references


@pytest.mark.parametrize("kind,layout", [("fp8", lay) for lay in LAYOUTS] + [("int8", lay) for lay in LAYOUTS[:4]])
def test_ref_gemm_is_the_definition(kind, layout):
    a, a_scale = make_a(5, 333, kind, layout[0])
    b, b_scale = make_b(300, 333, kind, layout[1])
    gemm = ref.fp8_gemm if kind == "fp8" else ref.int8_gemm
    out = gemm(a, a_scale, b, b_scale, out_dtype=torch.float32)
    assert out.shape == (5, 300) and out.dtype == torch.float32
    assert rel_err(out, definition(a, a_scale, b, b_scale)) < 1e-6
    assert gemm(a, a_scale, b, b_scale).dtype == torch.bfloat16  # the default out_dtype


@pytest.mark.parametrize("kind,granularity,bound", [("fp8", "tensor", 0.06), ("fp8", "row", 0.06), ("fp8", "block", 0.06),
                                                    ("int8", "tensor", 0.02), ("int8", "row", 0.02)])  # fmt: skip
def test_ref_linear_approximates_the_float_product(kind, granularity, bound):
    torch.manual_seed(0)
    x, w = torch.randn(2, 7, 384), torch.randn(200, 384) * 0.05
    linear = ref.fp8_linear if kind == "fp8" else ref.int8_linear
    out = linear(x, quantize_scaled(w, kind, granularity))
    assert out.shape == (2, 7, 200) and out.dtype == x.dtype
    err = rel_err(out, x @ w.T)
    assert 1e-4 < err < bound  # quantized (not exact), yet close


@pytest.mark.parametrize("kind,block", [("int8", None), ("fp8", None), ("fp8", 128)])
def test_ref_quantize_rows_round_trips(kind, block):
    torch.manual_seed(0)
    x = torch.randn(6, 300) * torch.logspace(-3, 2, 6)[:, None]
    x[2] = 0.0
    data, scale = ref.quantize_rows(x, kind, block)
    assert data.dtype == (FP8 if kind == "fp8" else torch.int8) and data.shape == x.shape
    assert scale.shape == ((6,) if block is None else (6, 3)) and scale.dtype == torch.float32
    s = ref.scaled.expand_scale(scale, 6, 300)
    q = data.float()
    top = 448.0 if kind == "fp8" else 127.0
    assert torch.equal(scale[2], torch.ones_like(scale[2])) and torch.equal(q[2], torch.zeros(300))  # a zero row
    err = (q * s - x).abs()
    if kind == "int8":  # within half a step
        assert (err <= s / 2 * (1 + 1e-5)).all()
    else:  # within E4M3's relative precision (3 mantissa bits), or half its smallest step
        assert (err <= torch.maximum(x.abs() * 2**-4, s * 2**-10) * (1 + 1e-5)).all()
    # the largest element of every group lands on the top code
    groups = q.abs() if block is None else torch.nn.functional.pad(q.abs(), (0, 84)).view(6, 3, 128)
    top_codes = groups.amax(dim=-1)
    assert torch.equal(top_codes[[0, 1, 3, 4, 5]], torch.full_like(top_codes[[0, 1, 3, 4, 5]], top))


# ---------------------------------------------------------------- kernels


@device
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind,block", [("int8", None), ("fp8", None), ("fp8", 128)])
def test_quantize_rows_kernel_matches_ref_exactly(kind, block, dtype):
    require(kind)
    torch.manual_seed(0)
    x = (torch.randn(9, 300) * torch.logspace(-4, 3, 9)[:, None]).to(dtype)
    x[4] = 0
    data, scale = kernels.quantize_rows(x.to(DEVICE), kind, block)
    want_data, want_scale = ref.quantize_rows(x, kind, block)
    assert torch.equal(scale.cpu(), want_scale)
    assert torch.equal(data.cpu().view(torch.int8), want_data.view(torch.int8))


@device
def test_quantize_rows_kernel_rounds_every_e4m3_tie_to_even():
    require("fp8")
    codes = torch.arange(256, dtype=torch.uint8).view(FP8).float()
    grid = torch.unique(codes[codes.isfinite()])  # every finite E4M3 number, sorted
    ties = (grid[1:] + grid[:-1]) / 2  # halfway between neighbours (exact in float32)
    near = torch.cat([ties * (1 + 2**-20), ties * (1 - 2**-20)])
    x = torch.cat([grid, ties, near, torch.tensor([448.0])])[None, :]  # absmax 448: scale exactly 1
    data, scale = kernels.quantize_rows(x.to(DEVICE), "fp8")
    assert scale.item() == 1.0
    assert torch.equal(data.cpu().view(torch.int8), x.to(FP8).view(torch.int8))


@device
def test_quantize_rows_kernel_rounds_int8_ties_to_even():
    x = torch.tensor([[127.0, -127.0, 0.5, 1.5, 2.5, -0.5, -1.5, 126.5, 3.49999, -3.50001, 0.0]])
    data, scale = kernels.quantize_rows(x.to(DEVICE), "int8")
    assert scale.item() == 1.0
    assert data.cpu().tolist() == [[127, -127, 0, 2, 2, 0, -2, 126, 3, -4, 0]]


@device
@pytest.mark.parametrize("k,out_dtype", [(300, torch.float32), (256, torch.float16)])  # a masked last K step, or none
@pytest.mark.parametrize("kind,layout", [("fp8", lay) for lay in LAYOUTS] + [("int8", lay) for lay in LAYOUTS[:4]])
def test_gemm_kernel_matches_ref(kind, layout, out_dtype, k):
    require(kind)
    a, a_scale = make_a(37, k, kind, layout[0])
    b, b_scale = make_b(150, k, kind, layout[1])
    gemm, ref_gemm = (kernels.fp8_gemm, ref.fp8_gemm) if kind == "fp8" else (kernels.int8_gemm, ref.int8_gemm)
    out = gemm(a.to(DEVICE), a_scale.to(DEVICE), b.to(DEVICE), b_scale.to(DEVICE), out_dtype=out_dtype)
    assert out.shape == (37, 150) and out.dtype == out_dtype
    expected = ref_gemm(a, a_scale, b, b_scale, out_dtype=torch.float32)
    assert rel_err(out.cpu(), expected) < tolerance(kind, out_dtype)


@device
def test_fp8_gemm_kernel_with_promoted_accumulation():
    require("fp8")
    a, a_scale = make_a(37, 300, "fp8", "row", DEVICE)
    b, b_scale = make_b(150, 300, "fp8", "row", DEVICE)
    out = kernels.fp8_gemm(a, a_scale, b, b_scale, out_dtype=torch.float32, fast_accum=False)
    expected = ref.fp8_gemm(a.cpu(), a_scale.cpu(), b.cpu(), b_scale.cpu(), out_dtype=torch.float32)
    assert rel_err(out.cpu(), expected) < 1e-5


@device
@pytest.mark.skipif(not ON_CPU and (runtime.capability() or (0, 0)) < (9, 0), reason="TMA needs Hopper or newer")
@pytest.mark.parametrize("kind,layout", [("fp8", ("block", "block")), ("fp8", ("row", "tensor")), ("int8", ("row", "row"))])
def test_gemm_kernel_through_tma_descriptors(kind, layout):
    require(kind)
    a, a_scale = make_a(37, 272, kind, layout[0], DEVICE)  # 272: rows 16-byte aligned, a partial K step
    b, b_scale = make_b(150, 272, kind, layout[1], DEVICE)
    out = torch.full((37, 150), float("nan"), device=DEVICE)
    scaled_kernels.scaled_gemm_launch(
        a, a_scale, b, b_scale, out, block_scales=layout[0] == "block", tma=True, config=scaled_kernels._INTERPRETER_CONFIG
    )
    ref_gemm = ref.fp8_gemm if kind == "fp8" else ref.int8_gemm
    expected = ref_gemm(a.cpu(), a_scale.cpu(), b.cpu(), b_scale.cpu(), out_dtype=torch.float32)
    assert rel_err(out.cpu(), expected) < tolerance(kind, torch.float32)


@device
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("kind,granularity", [("fp8", "tensor"), ("fp8", "row"), ("fp8", "block"), ("int8", "tensor"),
                                              ("int8", "row")])  # fmt: skip
def test_linear_kernel_matches_ref(kind, granularity, dtype):
    require(kind)
    torch.manual_seed(0)
    x, w = torch.randn(2, 5, 272).to(dtype), quantize_scaled(torch.randn(150, 272) * 0.05, kind, granularity)
    linear, ref_linear = (kernels.fp8_linear, ref.fp8_linear) if kind == "fp8" else (kernels.int8_linear, ref.int8_linear)
    out = linear(x.to(DEVICE), w.to(DEVICE))
    assert out.shape == (2, 5, 150) and out.dtype == dtype
    assert rel_err(out.cpu(), ref_linear(x, w)) < tolerance(kind, dtype)
    assert linear(x[:, :0].to(DEVICE), w.to(DEVICE)).shape == (2, 0, 150)  # no tokens


@device
def test_gemm_kernel_writes_every_element_and_handles_no_rows():
    a, a_scale = make_a(70, 130, "int8", "row", DEVICE)
    b, b_scale = make_b(65, 130, "int8", "row", DEVICE)
    out = torch.full((70, 65), float("nan"), device=DEVICE)
    scaled_kernels.scaled_gemm_launch(a, a_scale, b, b_scale, out, block_scales=False, config=scaled_kernels._INTERPRETER_CONFIG)
    assert torch.isfinite(out).all()
    empty = kernels.int8_gemm(a[:0], a_scale[:0], b, b_scale)
    assert empty.shape == (0, 65)


def test_autotuning_keeps_decode_tiles_for_decode_and_prefill_tiles_for_prefill(monkeypatch):
    monkeypatch.setattr(runtime, "capability", lambda: (9, 0))
    configs = scaled_kernels.scaled_gemm_configs()

    def tiles(m, **kwargs):
        kept = scaled_kernels._prune(configs, {"M_BUCKET": m, "N": 28672, "K": 4096}, **kwargs)
        return {(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps) for c in kept}

    decode, prefill = tiles(16, FAST_ACCUM=True), tiles(4096, FAST_ACCUM=True)
    assert (16, 64, 4) in decode and all(bm <= 64 for bm, _, _ in decode)
    assert (128, 256, 8) in prefill and all(bm >= 64 for bm, _, _ in prefill)
    two_sums = tiles(4096, BLOCK_SCALES=True, FAST_ACCUM=True)  # step and total sums: at most 64 floats a thread each
    assert two_sums and (128, 256, 8) not in two_sums and all(bm * bn <= 64 * 32 * w for bm, bn, w in two_sums)
    assert all(c.kwargs["BLOCK_K"] == 128 for c in configs)


# ---------------------------------------------------------------- bad inputs

IMPLS = [pytest.param(ref, id="ref"), pytest.param(kernels, id="kernels")]


@device
@pytest.mark.parametrize("impl", IMPLS)
def test_gemm_rejects_bad_inputs(impl):
    require("fp8")
    a, a_scale = make_a(4, 256, "fp8", "row", DEVICE)
    b, b_scale = make_b(8, 256, "fp8", "row", DEVICE)
    ab, ab_scale = make_a(4, 256, "fp8", "block", DEVICE)
    bb, bb_scale = make_b(8, 256, "fp8", "block", DEVICE)
    ai, ai_scale = make_a(4, 256, "int8", "row", DEVICE)
    bi, bi_scale = make_b(8, 256, "int8", "row", DEVICE)
    ones = lambda *shape: torch.ones(*shape, device=DEVICE)  # noqa: E731
    with pytest.raises(TypeError, match="a must have dtype float8_e4m3fn"):
        impl.fp8_gemm(a.float(), a_scale, b, b_scale)
    with pytest.raises(TypeError, match="b must have dtype int8"):
        impl.int8_gemm(ai, ai_scale, b, b_scale)
    with pytest.raises(ValueError, match="must share K"):
        impl.fp8_gemm(a, a_scale, b[:, :128], b_scale)
    with pytest.raises(TypeError, match="a_scale must have dtype float32"):
        impl.fp8_gemm(a, a_scale.half(), b, b_scale)
    with pytest.raises(ValueError, match=r"a_scale must be \(\) or \(1,\)"):
        impl.fp8_gemm(a, ones(5), b, b_scale)
    with pytest.raises(ValueError, match="block scales must be"):
        impl.fp8_gemm(ab, ab_scale, b, b_scale)  # block a with row b
    with pytest.raises(ValueError, match="block scales are for fp8_gemm"):
        impl.int8_gemm(ai, ones(4, 2), bi, ones(1, 2))
    with pytest.raises(TypeError, match="out_dtype"):
        impl.int8_gemm(ai, ai_scale, bi, bi_scale, out_dtype=torch.int32)
    assert impl.fp8_gemm(ab, ab_scale, bb, bb_scale, out_dtype=torch.float32).shape == (4, 8)  # the valid case runs


@device
@pytest.mark.parametrize("impl", IMPLS)
def test_quantize_and_linear_reject_bad_inputs(impl):
    x = torch.randn(4, 256, device=DEVICE)
    with pytest.raises(ValueError, match="kind must be"):
        impl.quantize_rows(x, "int4")
    with pytest.raises(ValueError, match="block scales are for fp8"):
        impl.quantize_rows(x, "int8", block=128)
    with pytest.raises(ValueError, match="block must be None"):
        impl.quantize_rows(x, "fp8", block=64)
    with pytest.raises(ValueError, match="2 dimensions"):
        impl.quantize_rows(x[None], "fp8")
    with pytest.raises(TypeError, match="x must have dtype"):
        impl.quantize_rows(x.to(torch.int32), "fp8")
    w8 = quantize_scaled(torch.randn(8, 256, device=DEVICE), "fp8", "row")
    wi = quantize_scaled(torch.randn(8, 256, device=DEVICE), "int8", "row")
    with pytest.raises(TypeError, match="w.data must have dtype float8_e4m3fn"):
        impl.fp8_linear(x, wi)
    with pytest.raises(TypeError, match="must be a ScaledWeight"):
        impl.int8_linear(x, torch.randn(8, 256, device=DEVICE))
    with pytest.raises(ValueError, match="last dimension must be K = 256"):
        impl.fp8_linear(x[:, :128], w8)
    with pytest.raises(ValueError, match="int8_linear takes per-tensor or per-row"):
        impl.int8_linear(x, quantize_scaled(torch.randn(8, 256, device=DEVICE), "int8", "block"))
    with pytest.raises(ValueError, match="must have shape"):
        impl.fp8_linear(x, type(w8)(w8.data, torch.ones(3, device=DEVICE), "row", torch.float32))
