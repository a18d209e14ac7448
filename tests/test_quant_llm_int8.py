"""LLM.int8()'s mixed-precision decomposition (llmnote.quant.llm_int8)."""

import math

import pytest
import torch

from llmnote.quant import int8_mixed_matmul
from llmnote.quant.llm_int8 import vectorwise_int8_matmul
from llmnote.quant.smoothquant import quantize_tokens_int8


def _data(m=48, k=200, n=72, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g), torch.randn(n, k, generator=g) / k**0.5


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_all_outliers_is_the_float_product():
    x, w = _data()
    y, cols = int8_mixed_matmul(x, w, threshold=0.0)
    assert cols.tolist() == list(range(x.shape[1]))
    torch.testing.assert_close(y, x @ w.t(), rtol=1e-5, atol=1e-5)


def test_no_outliers_is_vectorwise_int8():
    x, w = _data(seed=1)
    y, cols = int8_mixed_matmul(x, w, threshold=math.inf)
    assert cols.numel() == 0
    torch.testing.assert_close(y, vectorwise_int8_matmul(x, w), rtol=0, atol=0)
    # and vector-wise INT8 is what its definition says: per-token and per-output-channel absmax codes
    qx, sx = quantize_tokens_int8(x)
    qw, sw = quantize_tokens_int8(w)
    torch.testing.assert_close(y, (qx.double() @ qw.double().t() * sx.double() * sw.double().t()).float())
    assert 1e-4 < _rel(y, x @ w.t()) < 0.03  # quantized, but close


def test_threshold_picks_exactly_the_large_columns():
    x, w = _data(seed=2)
    x[:, 5] *= 0.1
    x[3, 17] = 9.0
    x[7, 120] = -8.0
    y, cols = int8_mixed_matmul(x, w, threshold=6.0)
    assert set(cols.tolist()) == {k for k in range(x.shape[1]) if x[:, k].abs().max() > 6.0}
    assert {17, 120} <= set(cols.tolist())


def test_decomposition_rescues_injected_outlier_channels():
    x, w = _data(m=64, k=256, n=96, seed=3)
    x[:, [11, 99]] *= 100.0  # two outlier features in every token
    exact = x @ w.t()
    plain = _rel(vectorwise_int8_matmul(x, w), exact)
    mixed_y, cols = int8_mixed_matmul(x, w, threshold=6.0)
    mixed = _rel(mixed_y, exact)
    assert {11, 99} <= set(cols.tolist()) and cols.numel() < 0.1 * x.shape[1]
    assert mixed < plain / 10, (mixed, plain)
    assert mixed < 0.02


def test_leading_dims_and_dtypes():
    x, w = _data(m=24, k=64, n=16, seed=4)
    y3, cols3 = int8_mixed_matmul(x.reshape(2, 12, 64).half(), w.half(), threshold=1.0)
    y2, cols2 = int8_mixed_matmul(x.half(), w.half(), threshold=1.0)
    assert y3.shape == (2, 12, 16) and y3.dtype == torch.float32
    torch.testing.assert_close(y3.reshape(24, 16), y2)
    assert torch.equal(cols3, cols2)


def test_bad_inputs():
    x, w = _data(m=4, k=8, n=3)
    with pytest.raises(TypeError, match="x"):
        int8_mixed_matmul(x.numpy(), w)
    with pytest.raises(TypeError, match="w"):
        int8_mixed_matmul(x, w.to(torch.int32))
    with pytest.raises(ValueError, match="in_features"):
        int8_mixed_matmul(x, w[:, :7])
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        int8_mixed_matmul(x, w[0])
    for bad in (-1.0, float("nan"), "6", True):
        with pytest.raises(ValueError, match="threshold"):
            int8_mixed_matmul(x, w, threshold=bad)
