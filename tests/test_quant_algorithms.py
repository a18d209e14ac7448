"""Calibration, GPTQ, AWQ and SmoothQuant (Chapter 5), on synthetic layers and on llmnote-tiny (CPU)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from llmnote import corpus, train
from llmnote.layers import Linear
from llmnote.models import ModelConfig, load_model, load_tokenizer, random_model
from llmnote.quant.awq import awq_model, fake_quantize, search_scale
from llmnote.quant.calibrate import (
    HiddenStates,
    activation_absmax,
    calibration_ids,
    capture_inputs,
    input_stats,
    linear_names,
)
from llmnote.quant.formats import quantize_weight
from llmnote.quant.gptq import gptq_model, gptq_quantize
from llmnote.quant.smoothquant import (
    FakeQuantW8A8,
    apply_fake_w8a8,
    quantize_tokens_int8,
    smooth_model,
    smoothing_scales,
)

TINY = "assets/models/llmnote-tiny"


# -- fixtures ---------------------------------------------------------------------------------


MHA = ModelConfig(  # every query head its own KV head, with q/k/v biases (Qwen2-style)
    model_type="qwen2", vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2,
    num_heads=4, num_kv_heads=4, head_dim=32, qkv_bias=True, max_position_embeddings=128,
)


def _random_mha():
    model = random_model(MHA, device="cpu", dtype=torch.float32, seed=0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # channels of different energy, as trained models have
        for layer in model.model.layers:
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.mul_(torch.exp(torch.randn(128, generator=g)))
            layer.self_attn.qkv_proj.bias.normal_(0, 0.1, generator=g)
    ids = torch.randint(0, 256, (4, 64), generator=g)
    return model, ids


@pytest.fixture(scope="module")
def tiny():
    return load_model(TINY, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def calib():
    return calibration_ids(load_tokenizer(TINY), num_tokens=4096, seq_len=256)


@pytest.fixture(scope="module")
def heldout():
    return corpus.encode_documents(load_tokenizer(TINY), corpus.load_split("heldout"))[: 8192 + 1]


@pytest.fixture(scope="module")
def probe():
    """A small batch of real text for checks of function (logits before and after)."""
    return calibration_ids(load_tokenizer(TINY), num_tokens=256, seq_len=128, split="valid", seed=1)


def _dequantized(model, qweights):
    """A copy of ``model`` with each Linear's weight replaced by its dequantized quantization."""
    model = copy.deepcopy(model)
    with torch.no_grad():
        for name, q in qweights.items():
            model.get_submodule(name).weight.copy_(q.dequantize())
    return model


def _perplexity(model, ids):
    return math.exp(train.evaluate(model, ids, seq_len=256))


@pytest.fixture(scope="module")
def awq3(tiny, calib):
    model = copy.deepcopy(tiny)
    return model, awq_model(model, calib, bits=3, group_size=128, progress=False)


@pytest.fixture(scope="module")
def gptq3(tiny, calib):
    model = copy.deepcopy(tiny)
    return model, gptq_model(model, calib, bits=3, group_size=128, progress=False)


def _correlated(k: int, tokens: int = 2048, seed: int = 0, spread: bool = False) -> torch.Tensor:
    """Inputs ``(tokens, k)`` whose channels are mixed (correlated), with channel energies
    spread over orders of magnitude if ``spread``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, k, generator=g) @ (torch.randn(k, k, generator=g) / k**0.5)
    return x * torch.exp(torch.randn(k, generator=g)) if spread else x


# -- calibration ------------------------------------------------------------------------------


def test_calibration_ids_are_seeded_windows():
    tok = load_tokenizer(TINY)
    a = calibration_ids(tok, num_tokens=1000, seq_len=128)
    assert a.shape == (8, 128) and a.dtype == torch.int64
    assert int(a.max()) < 4096 and int(a.min()) >= 0
    assert torch.equal(a, calibration_ids(tok, num_tokens=1000, seq_len=128))
    assert not torch.equal(a, calibration_ids(tok, num_tokens=1000, seq_len=128, seed=1))
    assert len({tuple(r.tolist()) for r in a}) == 8  # distinct windows
    with pytest.raises(ValueError, match="num_tokens"):
        calibration_ids(tok, num_tokens=0)
    with pytest.raises(ValueError, match="split"):
        calibration_ids(tok, split="test")


def test_linear_names_in_forward_order(tiny):
    names = linear_names(tiny)
    assert len(names) == 4 * 6
    assert names[:4] == [
        "model.layers.0.self_attn.qkv_proj",
        "model.layers.0.self_attn.o_proj",
        "model.layers.0.mlp.gate_up_proj",
        "model.layers.0.mlp.down_proj",
    ]
    assert "lm_head" not in names


def test_input_stats_match_the_captured_inputs(tiny, probe):
    names = ["model.layers.1.self_attn.o_proj", "model.layers.2.mlp.down_proj"]
    stats = input_stats(tiny, probe, names, batch_size=1, progress=False)
    xs = capture_inputs(tiny, probe, names)
    for name in names:
        x = xs[name]
        assert stats[name].tokens == x.shape[0] == probe.numel()
        torch.testing.assert_close(stats[name].absmax, x.abs().amax(0))
        torch.testing.assert_close(stats[name].mean_abs, x.abs().mean(0), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(stats[name].hessian(), x.t() @ x / x.shape[0], rtol=1e-4, atol=1e-5)
        s = torch.rand(x.shape[1]) + 0.5  # the statistics of x / s follow from those of x
        torch.testing.assert_close(stats[name].divided(s).hessian(), (x / s).t() @ (x / s) / x.shape[0], rtol=1e-4, atol=1e-5)
    absmax = activation_absmax(tiny, probe, progress=False)
    assert set(absmax) == set(linear_names(tiny))
    torch.testing.assert_close(absmax[names[1]], stats[names[1]].absmax)


def test_hidden_states_run_the_model_layer_by_layer(tiny, probe):
    with torch.no_grad():
        states = HiddenStates.embed(tiny, probe, batch_size=1)
        for layer in tiny.model.layers:
            states = states.through(layer)
        hidden = [tiny.model.norm(h, r)[0] for h, r in zip(states.hidden, states.residual)]
        logits = tiny.compute_logits(torch.cat(hidden)).view(*probe.shape, -1)
        torch.testing.assert_close(logits, tiny(probe), rtol=1e-4, atol=1e-4)


# -- GPTQ -------------------------------------------------------------------------------------


@pytest.mark.parametrize("bits", [3, 4])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_beats_rtn_on_correlated_inputs(bits, act_order):
    x = _correlated(256)
    w = torch.randn(96, 256, generator=torch.Generator().manual_seed(1))
    hessian = x.t() @ x

    def error(q):
        return float((x @ w.t() - x @ q.dequantize().t()).norm())

    rtn = error(quantize_weight(w, bits, 64))
    gptq = error(gptq_quantize(w, hessian, bits, 64, block_size=32, act_order=act_order))
    assert gptq < 0.85 * rtn


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("damp", [0.0, 0.01])
def test_gptq_with_identity_hessian_is_rtn(symmetric, damp):
    """With H = I no column sees another's error: GPTQ rounds each weight to nearest."""
    w = torch.randn(48, 256, generator=torch.Generator().manual_seed(2))
    q = gptq_quantize(w, torch.eye(256), 4, 64, symmetric, damp=damp)
    r = quantize_weight(w, 4, 64, symmetric)
    assert torch.equal(q.qweight, r.qweight) and torch.equal(q.scales, r.scales) and torch.equal(q.zeros, r.zeros)


def test_gptq_lazy_blocks_do_not_change_the_result():
    x = _correlated(192, seed=3)
    w = torch.randn(40, 192, generator=torch.Generator().manual_seed(4))
    ref = gptq_quantize(w, x.t() @ x, 4, 64, block_size=192).dequantize()
    for block_size in (1, 50, 64):  # a block that ends inside a group, too
        torch.testing.assert_close(gptq_quantize(w, x.t() @ x, 4, 64, block_size=block_size).dequantize(), ref)


def test_gptq_values_lie_on_their_group_grids():
    x = _correlated(256, seed=5)
    x[:, 7] = 0  # a dead input channel
    w = torch.randn(32, 256, generator=torch.Generator().manual_seed(6)).half()
    for bits, act_order in ((3, False), (4, True)):
        q = gptq_quantize(w, x.t() @ x, bits, 64, act_order=act_order)
        deq = q.dequantize()
        assert deq.shape == w.shape and deq.dtype == torch.float16
        s = q.scales.float().t().repeat_interleave(64, dim=1)
        z = q.zeros.float().t().repeat_interleave(64, dim=1)
        steps = deq.float() / s + z
        torch.testing.assert_close(steps, steps.round(), rtol=0, atol=1e-2)
        assert float(steps.min()) >= -1e-2 and float(steps.max()) <= 2**bits - 1 + 1e-2
        assert torch.all(deq[:, 7] == 0)  # nothing reaches the output through it


def test_gptq_rejects_bad_arguments():
    w = torch.randn(16, 128)
    with pytest.raises(ValueError, match="bits"):
        gptq_quantize(w, torch.eye(128), bits=9)
    with pytest.raises(ValueError, match="group_size"):
        gptq_quantize(w, torch.eye(128), group_size=96)
    with pytest.raises(ValueError, match="hessian"):
        gptq_quantize(w, torch.eye(64))
    with pytest.raises(TypeError):
        gptq_quantize(torch.ones(16, 128, dtype=torch.int32), torch.eye(128))


def test_gptq_model_leaves_the_model_as_it_was(tiny, gptq3):
    model, qweights = gptq3
    assert list(qweights) == linear_names(tiny)
    for name, q in qweights.items():
        original = tiny.get_submodule(name).weight
        assert q.shape == tuple(original.shape) and q.bits == 3
        assert torch.equal(model.get_submodule(name).weight, original)


def test_gptq_true_sequential():
    model, ids = _random_mha()
    state = copy.deepcopy(model.state_dict())
    one_pass = gptq_model(model, ids, bits=4, group_size=64, progress=False)
    staged = gptq_model(model, ids, bits=4, group_size=64, progress=False, true_sequential=True)
    first, second = "model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj"
    assert torch.equal(staged[first].qweight, one_pass[first].qweight)  # the first Linear sees the same inputs
    assert not torch.equal(staged[second].qweight, one_pass[second].qweight)  # o_proj now sees the quantized qkv
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in state.items())


def test_model_level_functions_reject_bad_formats(tiny, calib):
    with pytest.raises(ValueError, match="group_size"):
        gptq_model(tiny, calib, bits=4, group_size=100, progress=False)
    with pytest.raises(ValueError, match="bits"):
        awq_model(copy.deepcopy(tiny), calib, bits=1, group_size=128, progress=False)


# -- AWQ --------------------------------------------------------------------------------------


def test_awq_scale_search_includes_rtn():
    x = _correlated(128, seed=7, spread=True)
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(8))
    from llmnote.quant.calibrate import InputStats

    stats = InputStats.empty(128, "cpu")
    stats.add(x)
    s, alpha = search_scale(w, stats, 3, 64, grid=20)
    h = stats.hessian()

    def err(deq):
        return float(((w - deq) @ h * (w - deq)).sum())

    assert err(fake_quantize(w * s, 3, 64) / s) <= err(quantize_weight(w, 3, 64).dequantize()) + 1e-6
    assert 0.0 <= alpha < 1.0


def test_awq_folding_keeps_the_float_model(tiny, awq3, probe):
    model, _ = awq3
    with torch.no_grad():
        torch.testing.assert_close(model(probe), tiny(probe), rtol=1e-4, atol=1e-4)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, tiny.get_parameter(n))]
    assert any("layernorm" in n for n in changed) and any("gate_up_proj" in n for n in changed)


def test_awq_output_error_on_calibration_data_is_at_most_rtn(tiny, awq3, calib):
    model, qweights = awq3
    names = linear_names(tiny)
    before, after = capture_inputs(tiny, calib[:8], names), capture_inputs(model, calib[:8], names)
    total_awq = total_rtn = 0.0
    for name in names:
        w0, w1 = tiny.get_submodule(name).weight.detach(), model.get_submodule(name).weight.detach()
        exact = before[name] @ w0.t()
        rtn = float((exact - before[name] @ quantize_weight(w0, 3, 128).dequantize().t()).square().sum())
        awq = float((after[name] @ w1.t() - after[name] @ qweights[name].dequantize().t()).square().sum())
        total_awq, total_rtn = total_awq + awq, total_rtn + rtn
        assert awq <= 1.02 * rtn, name
    assert total_awq < 0.9 * total_rtn


def test_awq_folds_o_proj_scales_into_the_v_rows_without_gqa():
    model, ids = _random_mha()
    original = copy.deepcopy(model)
    qweights = awq_model(model, ids, bits=4, group_size=64, grid=10, progress=False)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), original(ids), rtol=1e-4, atol=1e-4)
    attn, attn0 = model.model.layers[0].self_attn, original.model.layers[0].self_attn
    v = slice(256, 384)
    assert not torch.equal(attn.qkv_proj.weight[v], attn0.qkv_proj.weight[v])
    assert not torch.equal(attn.qkv_proj.bias[v], attn0.qkv_proj.bias[v])
    assert torch.equal(attn.qkv_proj.bias[:256], attn0.qkv_proj.bias[:256])  # q and k biases untouched
    assert not torch.equal(attn.o_proj.weight, attn0.o_proj.weight)
    assert set(qweights) == set(linear_names(model))


# -- SmoothQuant ------------------------------------------------------------------------------


def test_smoothing_scales_balance_the_maxima():
    act = torch.tensor([1.0, 100.0, 4.0, 0.0])
    w = torch.tensor([[1.0, -0.5, 2.0, 1.0], [-4.0, 0.1, 0.5, 0.0]])
    s = smoothing_scales(act, w, alpha=0.5)
    torch.testing.assert_close((act / s)[:3], (w.abs().amax(0) * s)[:3])  # equal maxima
    assert float(s[3]) > 0  # a silent channel still gets a usable scale
    torch.testing.assert_close(smoothing_scales(act, w, alpha=1.0)[:3], act[:3])
    with pytest.raises(ValueError, match="act_absmax"):
        smoothing_scales(act[:3], w)
    with pytest.raises(ValueError, match="alpha"):
        smoothing_scales(act, w, alpha=1.5)


def test_smoothing_keeps_the_float_model_and_flattens_the_activations(tiny, calib, probe):
    model, ids = copy.deepcopy(tiny), calib[:8]
    targets = [n for n in linear_names(tiny) if n.endswith(("qkv_proj", "gate_up_proj"))]
    before = activation_absmax(tiny, ids, targets, progress=False)
    scales = smooth_model(model, ids, alpha=0.5, progress=False)
    assert sorted(scales) == sorted(targets)
    with torch.no_grad():
        torch.testing.assert_close(model(probe), tiny(probe), rtol=1e-4, atol=1e-4)
    after = activation_absmax(model, ids, targets, progress=False)
    for name in targets:
        torch.testing.assert_close(after[name], before[name] / scales[name], rtol=1e-4, atol=1e-6)
        # the channels' maxima move closer together: less range wasted on a few channels
        assert float(after[name].max() / after[name].min()) < float(before[name].max() / before[name].min()), name


def test_fake_w8a8_linear_simulates_the_int8_product():
    g = torch.Generator().manual_seed(9)
    w0, w1 = torch.randn(24, 64, generator=g), torch.randn(8, 64, generator=g)
    layer = Linear(64, [24, 8], method=FakeQuantW8A8())
    layer.load("weight", w0, 0)
    layer.load("weight", w1, 1)
    w = torch.cat([w0, w1])
    assert layer.weight.dtype == torch.int8
    step = w.abs().amax(1, keepdim=True) / 127
    assert float(((layer.method.dense_weight(layer) - w).abs() / step).max()) <= 0.5 + 1e-4
    x = torch.randn(5, 64, generator=g) * torch.linspace(0.1, 10, 64)
    codes, x_scale = quantize_tokens_int8(x)
    expected = (codes * x_scale) @ layer.method.dense_weight(layer).t()
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(layer(x), x @ w.t(), rtol=1e-4, atol=1e-4)  # it does quantize


def test_apply_fake_w8a8_swaps_every_linear(tiny, probe):
    model = copy.deepcopy(tiny)
    names = apply_fake_w8a8(model)
    assert names == linear_names(tiny)
    assert all(isinstance(model.get_submodule(n).method, FakeQuantW8A8) for n in names)
    with torch.no_grad():
        ref, out = tiny(probe), model(probe)
    assert not torch.equal(out, ref)
    assert float((out - ref).norm() / ref.norm()) < 0.05


# -- perplexity on llmnote-tiny ---------------------------------------------------------------


def test_gptq_and_awq_beat_rtn_at_3_bits(tiny, heldout, gptq3, awq3):
    rtn = {n: quantize_weight(tiny.get_submodule(n).weight, 3, 128) for n in linear_names(tiny)}
    ppl_rtn = _perplexity(_dequantized(tiny, rtn), heldout)
    ppl_gptq = _perplexity(_dequantized(*gptq3), heldout)
    ppl_awq = _perplexity(_dequantized(*awq3), heldout)
    assert ppl_gptq < ppl_rtn and ppl_awq < ppl_rtn, (ppl_rtn, ppl_gptq, ppl_awq)
