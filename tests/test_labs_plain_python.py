"""The graders of the plain-Python labs: Lab 1 (FLOPs, bytes and roofline placement) and Lab 5
(a decode step with a KV cache).

- each checker passes on the reference answer in llmnote.labs.solutions;
- each checker fails on the notebook's unfinished stub, and on typical mistakes with a message
  that names the mistake.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re

import pytest
import torch
from conftest import ROOT

import llmnote  # noqa: F401  (picks the device first)
from llmnote import hw
from llmnote.labs import (
    DecodeLayer,
    LabCheckError,
    LabReport,
    LayerCache,
    check_decode_step,
    check_roofline_placement,
    placement_figure,
)
from llmnote.labs import solutions as S

pytestmark = pytest.mark.device

COSTS = ("vector_add_cost", "softmax_cost", "matmul_cost", "attention_cost", "place")


def stub(notebook: str, tmp_path):
    """The notebook's exercise cell, imported as a module."""
    cells = json.loads((ROOT / notebook).read_text())["cells"]
    (source,) = [
        "".join(c["source"]) for c in cells if c["cell_type"] == "code" and "".join(c["source"]).startswith("# EXERCISE")
    ]
    path = tmp_path / "stub.py"
    path.write_text("import torch\nfrom llmnote import hw\nfrom llmnote.labs import DecodeLayer, LayerCache\n\n" + source)
    spec = importlib.util.spec_from_file_location("stub", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------- lab 5: the roofline


def grade(**replaced):
    functions = {name: replaced.get(name, getattr(S, name)) for name in COSTS}
    return check_roofline_placement(*functions.values(), seed=0, verbose=False)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roofline_checker_passes_the_solution(seed, capsys):
    report = check_roofline_placement(*(getattr(S, name) for name in COSTS), seed=seed)
    assert isinstance(report, LabReport) and report.lab == "roofline" and len(report.cases) == 17
    assert re.fullmatch(rf"roofline: 17 cases passed \(.+; seed {seed}\)", capsys.readouterr().out.strip())


def test_roofline_checker_fails_the_stub(tmp_path):
    module = stub("labs/01_roofline_placement.ipynb", tmp_path)
    with pytest.raises(LabCheckError, match="vector_add_cost: not written yet") as failure:
        check_roofline_placement(*(getattr(module, name) for name in COSTS))
    assert len(failure.value._render_traceback_()) == 1


def _place_without_min(flops, moved, gpu, dtype):
    intensity, bound, _ = S.place(flops, moved, gpu, dtype)
    return intensity, bound, intensity * hw.get_gpu(gpu).memory_tbps


def _place_flipped(flops, moved, gpu, dtype):
    intensity, bound, tflops = S.place(flops, moved, gpu, dtype)
    return intensity, {"memory": "compute", "compute": "memory"}[bound], tflops


def _place_in_flops(flops, moved, gpu, dtype):
    intensity, bound, tflops = S.place(flops, moved, gpu, dtype)
    return intensity, bound, tflops * 1e12


def _place_inverted(flops, moved, gpu, dtype):
    _, bound, tflops = S.place(flops, moved, gpu, dtype)
    return moved / flops, bound, tflops


def _attention_full(b, h, hkv, s, d, e):
    flops, moved = S.attention_cost(b, h, hkv, s, d, e)
    return 2 * flops, moved


def _attention_mha_bytes(b, h, hkv, s, d, e):
    return S.attention_cost(b, h, h, s, d, e)[0], S.attention_cost(b, h, h, s, d, e)[1]


def _attention_with_scores(b, h, hkv, s, d, e):
    flops, moved = S.attention_cost(b, h, hkv, s, d, e)
    return flops, moved + 2 * b * h * s * s * e  # S written and read back


WRONG_ROOFLINE = {
    "vector add without the output": (
        {"vector_add_cost": lambda n, e: (n, 2 * n * e)},
        r"(?s)vector_add_cost failed on case 1.*bytes are off \(1.5x too few.*Did you count the output\?",
    ),
    "vector add in elements": ({"vector_add_cost": lambda n, e: (n, 3 * n)}, "elements, not bytes"),
    "softmax without the output": (
        {"softmax_cost": lambda r, c, e: (5 * r * c, r * c * e)},
        r"softmax_cost failed.*\n  bytes are off \(2x too few.*Did you count the output\?",
    ),
    "softmax unfused": ({"softmax_cost": lambda r, c, e: (5 * r * c, 8 * r * c * e)}, "unfused chain"),
    "softmax 4 FLOPs": ({"softmax_cost": lambda r, c, e: (4 * r * c, 2 * r * c * e)}, "Count 5 FLOPs per element"),
    "matmul: a multiply-add is one FLOP": (
        {"matmul_cost": lambda m, n, k, e: (m * n * k, S.matmul_cost(m, n, k, e)[1])},
        r"FLOPs are off \(2x too few.*multiply-add is two FLOPs",
    ),
    "matmul without C": ({"matmul_cost": lambda m, n, k, e: (2 * m * n * k, (m * k + k * n) * e)}, "Did you count the output"),
    "matmul traffic per use": (
        {"matmul_cost": lambda m, n, k, e: (2 * m * n * k, 2 * m * n * k * e)},
        "once for each time it is used",
    ),
    "attention without the causal half": ({"attention_cost": _attention_full}, "only the lower triangle"),
    "attention: K and V with every head": ({"attention_cost": _attention_mha_bytes}, "K and V have kv_heads heads"),
    "attention: the scores through DRAM": ({"attention_cost": _attention_with_scores}, "keeps the scores on chip"),
    "some other count": (
        {"matmul_cost": lambda m, n, k, e: (2 * m * n * k + 1e6, S.matmul_cost(m, n, k, e)[1])},
        "FLOPs are off",
    ),
    "returns one number": ({"vector_add_cost": lambda n, e: 3 * n * e}, r"must return two numbers, \(FLOPs, bytes\)"),
    "place without min": ({"place": _place_without_min}, r"(?s)the 4096\^3 GEMM on the H200.*never exceeds the compute roof"),
    "place: constant peak": (
        {"place": lambda f, q, g, d: (f / q, *S.place(f, q, g, d)[1:2], hw.get_gpu(g).peak_tflops(d))},
        "memory roof",
    ),
    "place: the bound flipped": ({"place": _place_flipped}, r"the bound is off: got 'compute', expected 'memory'.*ridge point"),
    "place: FLOP/s, not TFLOP/s": ({"place": _place_in_flops}, "already in TFLOP/s"),
    "place: bytes per FLOP": ({"place": _place_inverted}, "FLOPs per byte"),
    "place: a word for the bound": ({"place": lambda f, q, g, d: (f / q, "slow", 1.0)}, "'memory' or 'compute'"),
}


@pytest.mark.parametrize("wrong", WRONG_ROOFLINE)
def test_roofline_checker_names_the_mistake(wrong):
    replaced, message = WRONG_ROOFLINE[wrong]
    with pytest.raises(LabCheckError, match=message) as failure:
        grade(**replaced)
    assert "seed=0" in str(failure.value)


def test_roofline_checker_accepts_bound_spelled_with_bound():
    def place(flops, moved, gpu, dtype):
        intensity, bound, tflops = S.place(flops, moved, gpu, dtype)
        return intensity, f"{bound.capitalize()}-bound", tflops

    assert grade(place=place).lab == "roofline"


def test_placement_figure_shows_the_readers_points():
    pytest.importorskip("plotly")
    kernels = {"GEMM": lambda: S.matmul_cost(4096, 4096, 4096, 2), "vector add": lambda: S.vector_add_cost(1 << 20, 2)}
    fig = placement_figure(kernels, S.place)
    points = {t.name.split(":")[0]: (t.x[0], t.y[0]) for t in fig.data if t.name.split(":")[0] in kernels}
    assert math.isclose(points["GEMM"][1], hw.get_gpu("H200").peak_tflops("bf16"))
    assert math.isclose(points["vector add"][0], 1 / 6)

    def unwritten():
        raise NotImplementedError

    empty = placement_figure({"GEMM": unwritten}, S.place)
    assert [t.name for t in empty.data if t.name.startswith("GEMM")] == []
    assert "once the exercise cell is written" in empty.layout.annotations[0].text


# ------------------------------------------------------------ lab 6: the KV cache


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_decode_checker_passes_the_solution(seed, capsys):
    report = check_decode_step(S.decode_step, seed=seed)
    assert report.lab == "decode_step" and len(report.cases) == 9
    assert re.fullmatch(rf"decode_step: 9 cases passed \(.+; seed {seed}\)", capsys.readouterr().out.strip())


def test_decode_checker_fails_the_stub(tmp_path):
    module = stub("labs/05_kv_cache_decode.ipynb", tmp_path)
    with pytest.raises(LabCheckError, match="decode_step: not written yet") as failure:
        check_decode_step(module.decode_step)
    assert len(failure.value._render_traceback_()) == 1


def _heads(x, layer):
    B, H, Hkv, D = x.shape[0], layer.heads, layer.kv_heads, layer.head_dim
    return layer.q_proj(x).view(B, H, D), layer.k_proj(x).view(B, Hkv, D), layer.v_proj(x).view(B, Hkv, D)


def _attend(q, keys, values, scale=None, repeat=torch.repeat_interleave):
    group = q.shape[1] // keys.shape[1]
    keys = repeat(keys.float(), group, dim=1) if repeat is torch.repeat_interleave else keys.float().repeat(1, group, 1, 1)
    values = repeat(values.float(), group, dim=1) if repeat is torch.repeat_interleave else values.float().repeat(1, group, 1, 1)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    probs = torch.softmax(q.float()[:, :, None] @ keys.transpose(-1, -2) * scale, dim=-1)
    return (probs @ values)[:, :, 0]


def decode_variant(x, cache, layer, *, advance=1, append_first=True, whole_buffer=False, scale=None, at=None, repeat=None):
    """The reference step with one thing changed."""
    q, k, v = _heads(x, layer)
    t = cache.length
    if not append_first:
        out = _attend(q, cache.k[:, :, :t], cache.v[:, :, :t], scale)
    pos = t if at is None else at
    cache.k[:, :, pos], cache.v[:, :, pos] = k, v
    cache.length = t + advance
    end = cache.capacity if whole_buffer else t + 1
    if append_first:
        out = _attend(q, cache.k[:, :, :end], cache.v[:, :, :end], scale, *([repeat] if repeat else []))
    return out.to(x.dtype)


def decode_with_cat(x, cache, layer):
    q, k, v = _heads(x, layer)
    t = cache.length
    cache.k = torch.cat([cache.k[:, :, :t], k[:, :, None], cache.k[:, :, t + 1 :]], dim=2)
    cache.v = torch.cat([cache.v[:, :, :t], v[:, :, None], cache.v[:, :, t + 1 :]], dim=2)
    cache.length = t + 1
    return _attend(q, cache.k[:, :, : t + 1], cache.v[:, :, : t + 1]).to(x.dtype)


def decode_projecting_twice(x, cache, layer):
    layer.k_proj(x)  # a wasted projection, e.g. to look at the shape
    return S.decode_step(x, cache, layer)


def decode_with_sdpa_is_causal(x, cache, layer):
    q, k, v = _heads(x, layer)
    t = cache.length
    cache.k[:, :, t], cache.v[:, :, t] = k, v
    cache.length = t + 1
    keys, values = cache.k[:, :, : t + 1], cache.v[:, :, : t + 1]
    out = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], keys, values, is_causal=True, enable_gqa=True)
    return out[:, :, 0]


WRONG_DECODE = {
    "length not advanced": (
        lambda x, c, la: decode_variant(x, c, la, advance=0),
        r"cache.length is \d+ after the step, expected \d+ \(it was not advanced\)",
    ),
    "length advanced twice": (
        lambda x, c, la: decode_variant(x, c, la, advance=2),
        "grows by exactly one|exactly one new position",
    ),
    "attends before appending": (
        lambda x, c, la: decode_variant(x, c, la, append_first=False),
        "(?s)outputs are off.*attends to itself too",
    ),
    "the whole buffer": (lambda x, c, la: decode_variant(x, c, la, whole_buffer=True), "(?s)NaN.*unused part of the cache"),
    "no scale": (lambda x, c, la: decode_variant(x, c, la, scale=1.0), r"(?s)outputs are off.*1 / sqrt\(head_dim\)"),
    "always position 0": (lambda x, c, la: decode_variant(x, c, la, at=0), "changed at a past position"),
    "k.repeat": (lambda x, c, la: decode_variant(x, c, la, repeat="repeat"), r"(?s)grouped-query.*outputs are off.*h % kv_heads"),
    "SDPA is_causal with one query": (decode_with_sdpa_is_causal, "(?s)outputs are off.*top-left aligned"),
    "a new cache tensor each step": (decode_with_cat, "is a new tensor"),
    "a projection too many": (decode_projecting_twice, r"layer.k_proj was applied to \d+ token rows"),
    "heads not split": (lambda x, c, la: decode_variant(x, c, la).flatten(1), r"the output has shape \(\d+, \d+\)"),
    "returns nothing": (lambda x, c, la: None, "returned NoneType"),
}


@pytest.mark.parametrize("wrong", WRONG_DECODE)
def test_decode_checker_names_the_mistake(wrong):
    fn, message = WRONG_DECODE[wrong]
    with pytest.raises(LabCheckError, match=message) as failure:
        check_decode_step(fn, seed=0, verbose=False)
    assert "check_decode_step(decode_step, seed=0)" in str(failure.value) and "Hint: " in str(failure.value)


def test_decode_objects():
    layer = DecodeLayer.random(hidden=16, heads=4, kv_heads=2, head_dim=8, generator=torch.Generator().manual_seed(0))
    cache = LayerCache.empty(batch=3, kv_heads=2, capacity=5, head_dim=8)
    assert cache.capacity == 5 and cache.length == 0 and cache.k.shape == (3, 2, 5, 8)
    x = torch.randn(3, 16)
    assert layer.q_proj(x).shape == (3, 32) and layer.k_proj(x).shape == (3, 16)
    out = S.decode_step(x, cache, layer)
    assert out.shape == (3, 4, 8) and cache.length == 1
    # One token that sees only itself: the output is its own value, per key/value head.
    torch.testing.assert_close(out, layer.v_proj(x).view(3, 2, 1, 8).expand(3, 2, 2, 8).reshape(3, 4, 8))
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        DecodeLayer.random(hidden=16, heads=3, kv_heads=2, head_dim=8)
