"""The Triton kernels against the PyTorch references and torch's own operators.

On a CPU these run in Triton's interpreter (fp32 and fp16: the interpreter cannot do
bf16 arithmetic); test_kernels_gpu.py repeats the checks in bf16 at large sizes on a GPU.
"""

import pytest
import torch
import torch.nn.functional as F

import llmnote
from llmnote import kernels, ref

pytestmark = pytest.mark.device

DEVICE = llmnote.runtime.device()
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if llmnote.runtime.half_dtype() == torch.bfloat16 else [])
TOL = {
    torch.float32: dict(atol=1e-5, rtol=1e-5),
    torch.float16: dict(atol=2e-3, rtol=2e-3),
    torch.bfloat16: dict(atol=2e-2, rtol=2e-2),
}


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(dtype)


def poisoned(fn):
    """Run ``fn`` with torch.empty returning NaN-filled memory, so an unwritten output shows."""

    def run(*args, **kwargs):
        real_empty = torch.empty

        def nan_empty(*a, **kw):
            t = real_empty(*a, **kw)
            return t.fill_(float("nan")) if t.is_floating_point() else t

        torch.empty = nan_empty
        try:
            return fn(*args, **kwargs)
        finally:
            torch.empty = real_empty

    return run


def close(actual, expected, dtype):
    torch.testing.assert_close(actual.float(), expected.float(), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 1000, 4097])
def test_vector_add(dtype, n):
    x, y = randn(n, dtype=dtype), randn(n, dtype=dtype)
    close(poisoned(kernels.vector_add)(x, y), x.float() + y.float(), dtype)
    # strided (every other element) inputs give the same answer
    xs, ys = randn(2 * n, dtype=dtype)[::2], randn(2 * n, dtype=dtype)[::2]
    close(kernels.vector_add(xs, ys), ref.vector_add(xs, ys), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 3, 129), (2, 1000), (2, 20000), (2, 40000)])
def test_softmax_matches_torch(dtype, shape):
    x = randn(*shape, dtype=dtype, scale=3)
    out = poisoned(kernels.softmax)(x)
    assert out.shape == x.shape and out.dtype == dtype
    close(out, torch.softmax(x.float(), dim=-1), dtype)
    close(ref.softmax(x), torch.softmax(x.float(), dim=-1), dtype)


@pytest.mark.parametrize("n", [300, 40000])
def test_softmax_survives_large_magnitudes(n):
    x = randn(4, n, scale=1e4)  # exp(x) overflows float32 without the max subtraction
    x[0, 0] = 3e4
    out = kernels.softmax(x)
    assert torch.isfinite(out).all()
    close(out, torch.softmax(x, dim=-1), torch.float32)
    torch.testing.assert_close(out.sum(-1), torch.ones(4, device=DEVICE))


def test_softmax_of_column_slice_and_transposed_input():
    base = randn(6, 50)
    close(kernels.softmax(base[:, 3:40]), torch.softmax(base[:, 3:40], -1), torch.float32)
    t = randn(50, 6).t()  # last dim not contiguous
    close(kernels.softmax(t), torch.softmax(t, -1), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 8), (3, 5, 100), (7, 4096), (2, 20000)])
def test_rms_norm_matches_torch(dtype, shape):
    x, w = randn(*shape, dtype=dtype), randn(shape[-1], dtype=dtype)
    out = poisoned(kernels.rms_norm)(x, w, eps=1e-5)
    expected = F.rms_norm(x.float(), (shape[-1],), w.float(), eps=1e-5)
    close(out, expected, dtype)
    close(ref.rms_norm(x, w, eps=1e-5), expected, dtype)


def test_rms_norm_strided_rows():
    x, w = randn(9, 64), randn(40)
    close(kernels.rms_norm(x[::2, :40], w), ref.rms_norm(x[::2, :40].contiguous(), w), torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 3, 11, 64), (1, 4, 17, 128), (5, 3, 6)])
def test_rope_matches_reference_and_rotation(dtype, shape):
    seq, dim = shape[-2:]
    x = randn(*shape, dtype=dtype)
    cos, sin = ref.rope_cos_sin(seq, dim, device=DEVICE)
    out = poisoned(kernels.apply_rope)(x, cos, sin)
    close(out, ref.apply_rope(x, cos, sin), dtype)
    # RoPE is a rotation: it keeps every head vector's norm...
    torch.testing.assert_close(out.float().norm(dim=-1), x.float().norm(dim=-1), **TOL[dtype])


def test_rope_dot_products_depend_only_on_relative_position():
    dim, q, k = 64, randn(1, 1, 1, 64), randn(1, 1, 1, 64)

    def at(pos, v):
        cos, sin = ref.rope_cos_sin(1, dim, device=DEVICE, positions=torch.tensor([pos]))
        return kernels.apply_rope(v, cos, sin)

    dots = [(at(p + 5, q) * at(p, k)).sum() for p in (0, 17, 1000)]
    torch.testing.assert_close(dots[1], dots[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dots[2], dots[0], atol=1e-4, rtol=1e-4)


def test_rope_tables_take_given_frequencies():
    freq = torch.rand(16, device=DEVICE)
    cos, sin = ref.rope_cos_sin(5, 32, device=DEVICE, inv_freq=freq)
    torch.testing.assert_close(cos[3], torch.cos(3 * torch.cat([freq, freq])))
    with pytest.raises(ValueError, match="inv_freq"):
        ref.rope_cos_sin(5, 32, inv_freq=freq[:8])


def test_rope_per_sequence_positions_and_strided_input():
    b, h, s, d = 2, 3, 5, 32
    x = randn(b, s, h, d).transpose(1, 2)  # (b, h, s, d) view of a (b, s, h, d) tensor
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    cos, sin = ref.rope_cos_sin(s, d, device=DEVICE, positions=positions)
    out = kernels.apply_rope(x, cos, sin)
    close(out, ref.apply_rope(x.contiguous(), cos, sin), torch.float32)
    # position 7 of sequence 1 rotates exactly as position 7 in a plain table would
    cos7, sin7 = ref.rope_cos_sin(12, d, device=DEVICE)
    close(out[1, :, 0], ref.apply_rope(x[1:2, :, 0:1].contiguous(), cos7[7:8], sin7[7:8])[0, :, 0], torch.float32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7, 333), (2, 3, 1025)])
def test_silu_mul_matches_torch(dtype, shape):
    g, u = randn(*shape, dtype=dtype, scale=4), randn(*shape, dtype=dtype)
    close(poisoned(kernels.silu_mul)(g, u), F.silu(g.float()) * u.float(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mnk", [(1, 1, 1), (1, 37, 64), (17, 1, 33), (33, 65, 31), (64, 64, 64), (100, 70, 130)])
def test_matmul_matches_torch(dtype, mnk):
    m, n, k = mnk
    a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
    out = poisoned(kernels.matmul)(a, b)
    assert out.shape == (m, n) and out.dtype == dtype
    expected = a.double() @ b.double()
    tol = dict(atol=1e-4 * k**0.5, rtol=1e-4) if dtype == torch.float32 else TOL[dtype]
    torch.testing.assert_close(out.double(), expected, **tol)
    close(ref.matmul(a, b), expected, dtype)


def test_matmul_any_strides():
    a = randn(40, 30).t()  # (30, 40), column-major
    b = randn(80, 50)[::2, 5:25]  # (40, 20), strided rows, offset
    torch.testing.assert_close(kernels.matmul(a, b), a @ b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("op", ["softmax", "rms_norm", "silu_mul", "matmul", "vector_add", "apply_rope"])
def test_kernels_and_references_reject_bad_input(op):
    x = randn(4, 8)
    bad = {
        "softmax": [((x.long(),), TypeError, "dtype"), (("x",), TypeError, "torch.Tensor")],
        "rms_norm": [
            ((x, randn(7)), ValueError, "last dimension"),
            ((x, randn(8, dtype=torch.float16)), TypeError, "same dtype"),
            ((x, randn(8), -1.0), ValueError, "eps"),
        ],
        "silu_mul": [((x, randn(4, 9)), ValueError, "same shape")],
        "vector_add": [((x, randn(4, 8, dtype=torch.float16)), TypeError, "same dtype")],
        "matmul": [
            ((x, randn(9, 3)), ValueError, "inner dimensions"),
            ((x[0], randn(8, 3)), ValueError, "2 dimensions"),
            ((randn(0, 8), randn(8, 3)), ValueError, ">= 1"),
        ],
        "apply_rope": [
            ((randn(2, 3, 5, 7), *ref.rope_cos_sin(5, 8, device=DEVICE)), ValueError, "even"),
            ((randn(2, 3, 5, 8), *ref.rope_cos_sin(6, 8, device=DEVICE)), ValueError, "seq_len"),
        ],
    }[op]
    for args, error, message in bad:
        for impl in (kernels, ref):
            with pytest.raises(error, match=message):
                getattr(impl, op)(*args)


@pytest.mark.skipif(DEVICE.type == "cuda", reason="interpreter-mode check")
def test_kernels_refuse_a_device_they_cannot_run_on():
    with pytest.raises(ValueError, match="meta"):
        kernels.softmax(torch.empty(2, 2, device="meta"))


def _tiles(configs):
    return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_stages) for c in configs]


def test_matmul_autotuning_prunes_tiles_larger_than_the_problem():
    from llmnote.kernels.gemm.matmul import matmul_configs, prune_configs

    hopper = matmul_configs((9, 0))
    # A large bf16 product keeps every candidate; a tiny one keeps only the smallest tile.
    assert _tiles(prune_configs(hopper, 4096, 4096, 4096, 2, (9, 0))) == _tiles(hopper)
    assert _tiles(prune_configs(hopper, 7, 13, 5, 2, (9, 0))) == [(16, 64, 128, 4)]
    # A decode-shaped product (one row) keeps the 16-row tiles, and only those.
    decode = prune_configs(hopper, 1, 4096, 2048, 2, (9, 0))
    assert len(decode) >= 2 and {bm for bm, *_ in _tiles(decode)} == {16}
    # A 129-row product may use 128- and 256-row tiles (next power of two: 256) but no tile
    # wider than 32 columns exists, so the narrowest (64) is allowed.
    assert {bn for _, bn, _, _ in _tiles(prune_configs(hopper, 129, 31, 96, 2, (9, 0)))} == {64}


def test_matmul_autotuning_prunes_tiles_that_overflow_shared_memory():
    from llmnote.kernels.gemm.matmul import matmul_configs, prune_configs

    hopper, turing = matmul_configs((9, 0)), matmul_configs((7, 5))

    def smem(t, element_size):
        bm, bn, bk, stages = t
        return (bm * bk + bk * bn) * element_size * (stages - 1)

    fp32_hopper = _tiles(prune_configs(hopper, 4096, 4096, 4096, 4, (9, 0)))
    assert 0 < len(fp32_hopper) < len(hopper) and all(smem(t, 4) <= 227 * 1024 for t in fp32_hopper)
    fp16_turing = _tiles(prune_configs(turing, 4096, 4096, 4096, 2, (7, 5)))
    assert fp16_turing and all(smem(t, 2) <= 64 * 1024 for t in fp16_turing)
    # The same list on an sm_90 budget keeps more than on an sm_75 one.
    assert len(prune_configs(turing, 4096, 4096, 4096, 4, (9, 0))) > len(prune_configs(turing, 4096, 4096, 4096, 4, (7, 5)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("shape", [(1, 5), (3, 2048), (2, 2049), (4, 5000)])
def test_argmax_rows(dtype, shape):
    from llmnote.kernels.argmax import argmax_rows

    x = randn(*shape, dtype=dtype)
    assert torch.equal(argmax_rows(x), x.argmax(-1))
    # ties, within a chunk and across chunks, go to the first index; a row of -inf answers 0
    ties = torch.randint(0, 3, shape, device=DEVICE).to(dtype)
    ties[0] = float("-inf")
    assert torch.equal(argmax_rows(ties), ties.argmax(-1))
    assert argmax_rows(x[:, ::2]).equal(x[:, ::2].argmax(-1))  # a strided row


def test_argmax_rows_rejects_bad_input():
    from llmnote.kernels.argmax import argmax_rows

    with pytest.raises(ValueError, match="2-D floating-point"):
        argmax_rows(torch.zeros(3, device=DEVICE))
    with pytest.raises(ValueError, match="2-D floating-point"):
        argmax_rows(torch.zeros(2, 3, dtype=torch.int64, device=DEVICE))
    with pytest.raises(ValueError, match="no values"):
        argmax_rows(torch.zeros(2, 0, device=DEVICE))
