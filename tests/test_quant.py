"""Quantized number formats, the quantized Linear methods and the ``python -m llmnote.quant`` CLI."""

import json

import pytest
import torch

from llmnote import ref
from llmnote.layers import Linear
from llmnote.paths import models_dir
from llmnote.quant import QuantizedWeight, pack_codes, quantize_scaled, quantize_weight, unpack_codes
from llmnote.quant.__main__ import main as quant_main
from llmnote.quant.apply import Scaled, WeightOnly, set_quantized, swap_methods

TINY = models_dir() / "llmnote-tiny"


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("group_size", [32, 128])
def test_rtn_error_is_at_most_half_a_step(bits, symmetric, group_size):
    torch.manual_seed(bits)
    w = torch.randn(40, 256) * torch.rand(40, 1) * 3 + torch.randn(40, 1)  # rows of different scale and offset
    q = quantize_weight(w, bits, group_size, symmetric)
    assert isinstance(q, QuantizedWeight) and q.shape == (40, 256) and q.scales.shape == (256 // group_size, 40)
    d = q.dequantize()
    assert d.shape == w.shape and d.dtype == w.dtype
    step = q.scales.t().repeat_interleave(group_size, dim=1)
    assert ((d - w).abs() <= step / 2 * (1 + 1e-5)).all()
    codes = q.codes()
    assert codes.max() <= 2**bits - 1
    assert codes.max() == 2**bits - 1 or symmetric  # the asymmetric grid is used to its top code
    assert len(codes.unique()) > 2 ** (bits - 1)  # and not collapsed onto a few codes


def test_rtn_keeps_zero_exact_and_16bit_scales():
    w = torch.randn(8, 128, dtype=torch.bfloat16)
    w[:, :5] = 0
    q = quantize_weight(w, 4, 64)
    assert q.scales.dtype == torch.bfloat16 and q.zeros.dtype == torch.bfloat16
    assert (q.dequantize()[:, :5] == 0).all()  # asymmetric grids contain 0 exactly


def test_pack_unpack_round_trip():
    for bits, hi in ((4, 16), (3, 8), (8, 256)):
        c = torch.randint(0, hi, (7, 64))
        packed = pack_codes(c, bits)
        assert packed.dtype == torch.int32 and packed.shape == (64 // (8 if bits <= 4 else 4), 7)
        assert torch.equal(unpack_codes(packed, bits).long(), c)


@pytest.mark.parametrize(
    "shape, bits, group, message",
    [((8, 100), 4, 64, "multiple of group_size"), ((8, 120), 4, 12, "multiple of 8"), ((8, 128), 9, 64, "bits"),
     ((8, 128), 1, 64, "bits"), ((128,), 4, 64, "2-D")],
)
def test_quantize_weight_rejects_bad_shapes(shape, bits, group, message):
    with pytest.raises(ValueError, match=message):
        quantize_weight(torch.randn(shape), bits, group)
    with pytest.raises(TypeError):
        quantize_weight(torch.ones(8, 128, dtype=torch.int32))


@pytest.mark.parametrize("granularity", ["tensor", "row", "block"])
def test_scaled_weights(granularity):
    torch.manual_seed(0)
    w = torch.randn(300, 260) * torch.linspace(0.01, 10, 300)[:, None]  # rows of very different size
    i8 = quantize_scaled(w, "int8", granularity)
    assert i8.data.dtype == torch.int8
    assert ((i8.dequantize() - w).abs() <= i8.expanded_scale() / 2 * (1 + 1e-5)).all()
    f8 = quantize_scaled(w, "fp8", granularity)
    assert f8.data.dtype == torch.float8_e4m3fn
    rel = ((f8.dequantize() - w).abs() / w.abs().clamp_min(1e-30))
    normal = w.abs() / f8.expanded_scale() >= 2**-6  # E4M3's normal range: 3 mantissa bits, error <= 2^-4 relative
    assert (rel[normal] <= 2**-4 * (1 + 1e-5)).all()
    if granularity == "row":  # finer scales: the small rows keep their precision
        coarse = quantize_scaled(w, "int8", "tensor")
        assert (i8.dequantize() - w)[:30].abs().max() < (coarse.dequantize() - w)[:30].abs().max() / 10


def _layer(out_sizes, k=256, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    layer = Linear(k, out_sizes, dtype=dtype)
    with torch.no_grad():
        layer.weight.normal_()
    return layer


@pytest.mark.parametrize("method", [WeightOnly(4, 64), WeightOnly(3, 128, symmetric=True), Scaled("int8"), Scaled("fp8")])
def test_swapped_layer_multiplies_by_its_dequantized_weight(method):
    layer = _layer([64, 32, 32])
    dense = layer.weight.detach().clone()
    swap_methods(layer_holder := torch.nn.Sequential(layer), lambda name, m: method)
    assert "weight" not in dict(layer.named_parameters()) and type(layer.method) is type(method)
    x = torch.randn(5, 3, 256)
    w = layer.method.dense_weight(layer)
    assert w.shape == dense.shape and 0 < (w - dense).abs().max() < 1.0
    y = layer_holder(x)
    assert y.shape == (5, 3, 128)
    if isinstance(method, WeightOnly):
        torch.testing.assert_close(y, x @ w.t(), rtol=1e-4, atol=1e-4)
    else:  # W8A8: the activations are quantized too, per token
        exact = x @ dense.t()
        assert ((y - exact).norm() / exact.norm()) < (0.01 if method.kind == "int8" else 0.06)


def test_loading_merged_parts_quantizes_each_like_the_whole():
    layer = _layer([64, 32, 32])
    whole = quantize_weight(layer.weight.detach(), 4, 64)
    q = Linear(256, [64, 32, 32], method=WeightOnly(4, 64))
    for shard, part in enumerate(layer.weight.detach().split([64, 32, 32])):  # as a checkpoint streams them
        q.load("weight", part, shard)
    assert torch.equal(q.qweight, whole.qweight) and torch.equal(q.scales, whole.scales)


def test_set_quantized_checks_the_format():
    layer = Linear(256, 64, method=WeightOnly(4, 128))
    w = torch.randn(64, 256)
    set_quantized(layer, quantize_weight(w, 4, 128))
    torch.testing.assert_close(layer.method.dense_weight(layer), quantize_weight(w, 4, 128).dequantize())
    with pytest.raises(ValueError, match="group_size"):
        set_quantized(layer, quantize_weight(w, 4, 64))
    with pytest.raises(TypeError):
        set_quantized(Linear(256, 64), quantize_weight(w, 4, 128))


def test_reference_w4a16_equals_dequantized_product():
    q = quantize_weight(torch.randn(48, 256), 4, 128)
    x = torch.randn(2, 7, 256, dtype=torch.float16)
    y = ref.w4a16_linear(x, q)
    assert y.dtype == torch.float16 and y.shape == (2, 7, 48)
    torch.testing.assert_close(y.float(), x.float() @ q.dequantize().t(), rtol=2e-3, atol=2e-3)


def test_cli_rejects_a_group_size_the_model_cannot_take(capsys):
    assert quant_main(["eval", str(TINY), "--method", "rtn", "--group-size", "100", "--json"]) == 2
    assert "multiple of group_size" in capsys.readouterr().err


def test_cli_prints_one_json_line(capsys):
    assert quant_main(["eval", str(TINY), "--method", "rtn", "--bits", "4", "--group-size", "64",
                       "--max-eval-tokens", "2048", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip())
    assert set(result) == {"method", "bits", "group_size", "perplexity"}
    assert result["method"] == "rtn" and result["bits"] == 4 and result["group_size"] == 64
    assert 5 < result["perplexity"] < 200


def test_load_model_quantizes_each_tensor_as_it_streams_in():
    from llmnote.models import load_model

    streamed = load_model(TINY, device="cpu", dtype=torch.float32, linear_method=lambda name, layer: WeightOnly(4, 64))
    after = swap_methods(load_model(TINY, device="cpu", dtype=torch.float32), lambda name, layer: WeightOnly(4, 64))
    layers = dict(streamed.named_modules())
    for name, layer in dict(after.named_modules()).items():
        if isinstance(layer, Linear):
            assert torch.equal(layers[name].qweight, layer.qweight) and torch.equal(layers[name].scales, layer.scales)
    assert not any(isinstance(m, Linear) and "weight" in m._parameters for m in streamed.modules())
    ids = torch.randint(0, 4096, (1, 16))
    torch.testing.assert_close(streamed(ids), after(ids))
