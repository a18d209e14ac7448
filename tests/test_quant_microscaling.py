"""Fake quantization of every format (llmnote.quant.microscaling): grids, rounding, block scales,
agreement with the packed formats of llmnote.quant.formats, and input checks."""

from __future__ import annotations

import math

import pytest
import torch

from llmnote.quant import quantize_scaled, quantize_weight
from llmnote.quant.microscaling import (
    FORMATS,
    bits_per_element,
    fake_mxfp4,
    fake_nvfp4,
    fake_quant,
    format_grid,
    mx_scales,
    nvfp4_scales,
    round_e2m1,
)

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def gaussian(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def rel_err(q: torch.Tensor, x: torch.Tensor) -> float:
    return ((q.float() - x.float()).norm() / x.float().norm()).item()


def on_grid(values: torch.Tensor, grid: torch.Tensor, atol: float = 0.0) -> bool:
    """Every value within ``atol`` of a grid value (exactly on it by default)."""
    return bool(((values.flatten()[:, None] - grid[None]).abs().min(dim=1).values <= atol).all())


def test_grids() -> None:
    fp4 = format_grid("fp4_e2m1")
    assert fp4.tolist() == [-v for v in reversed(E2M1[1:])] + E2M1
    assert torch.equal(format_grid("mxfp4"), fp4) and torch.equal(format_grid("nvfp4"), fp4)
    e4m3, e5m2 = format_grid("fp8_e4m3"), format_grid("fp8_e5m2")
    assert len(e4m3) == 253 and len(e5m2) == 247  # 256 codes less NaNs (and E5M2's infinities), +0 = -0
    assert e4m3.max() == 448 and e4m3[e4m3 > 0].min() == 2.0**-9
    assert e5m2.max() == 57344 and e5m2[e5m2 > 0].min() == 2.0**-16
    assert torch.equal(format_grid("int4"), torch.arange(-7.0, 8.0))
    assert torch.equal(format_grid("int8"), torch.arange(-127.0, 128.0))
    assert all(torch.equal(g, g.sort().values) for g in (fp4, e4m3, e5m2))
    with pytest.raises(ValueError, match="fmt"):
        format_grid("fp16")


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.25, 0.0), (0.75, 1.0), (1.25, 1.0), (1.75, 2.0), (2.5, 2.0), (3.5, 4.0), (5.0, 4.0),  # ties: even mantissa
        (0.3, 0.5), (0.7, 0.5), (1.3, 1.5), (2.6, 3.0), (4.9, 4.0), (5.1, 6.0), (6.0, 6.0),  # nearest
        (6.9, 6.0), (1e6, 6.0), (0.0, 0.0), (0.2, 0.0),  # saturation and underflow
    ],
)
def test_round_e2m1_known_values(value: float, expected: float) -> None:
    x = torch.tensor([value, -value])
    assert round_e2m1(x).tolist() == [expected, -expected]


def test_round_e2m1_is_nearest_grid_value() -> None:
    x = torch.empty(20000).uniform_(-7, 7, generator=torch.Generator().manual_seed(1))
    grid = format_grid("fp4_e2m1")
    q = round_e2m1(x)
    assert on_grid(q, grid)
    best = (x.clamp(-6, 6)[:, None] - grid[None]).abs().min(dim=1).values
    assert torch.allclose((q - x.clamp(-6, 6)).abs(), best)
    assert round_e2m1(x.half()).dtype == torch.float16


def test_mx_scales_are_powers_of_two_and_map_amax_into_4_to_8() -> None:
    x = gaussian(8, 256) * torch.logspace(-3, 3, 8)[:, None]  # blocks of very different magnitudes
    scale = mx_scales(x)
    assert scale.shape == (8, 8)
    assert torch.equal(torch.exp2(torch.log2(scale).round()), scale)
    ratio = x.view(8, 8, 32).abs().amax(-1) / scale
    assert (ratio >= 4).all() and (ratio < 8).all()
    q = fake_mxfp4(x)
    assert on_grid((q.view(8, 8, 32) / scale[..., None]), format_grid("fp4_e2m1"))


def test_mxfp4_worked_block() -> None:
    block = torch.full((32,), 0.01)
    block[0], block[1], block[2] = 0.9, -0.3, 0.1  # amax 0.9: scale 2^(floor(log2 0.9) - 2) = 1/8
    assert mx_scales(block).item() == 0.125
    q = fake_mxfp4(block)
    assert q[:3].tolist() == [0.75, -0.25, 0.125]  # 7.2 saturates to 6; -2.4 -> -2; 0.8 -> 1
    assert (q[3:] == 0).all()  # 0.08 of a step rounds to 0


def test_nvfp4_scales_and_values() -> None:
    x = gaussian(64, 512, seed=2)
    block_scale, tensor_scale = nvfp4_scales(x)
    assert block_scale.shape == (64, 32) and tensor_scale.ndim == 0
    assert math.isclose(tensor_scale.item(), x.abs().max().item() / (6 * 448), rel_tol=1e-6)
    assert torch.equal(block_scale.to(torch.float8_e4m3fn).float(), block_scale)  # E4M3 values
    assert block_scale.max() == 448  # the tensor's largest block uses E4M3's top
    ratio = x.view(64, 32, 16).abs().amax(-1) / (block_scale * tensor_scale)
    assert (ratio > 6 / 1.07).all() and (ratio < 6 / 0.93).all()  # amax lands near 6, within E4M3 rounding
    q = fake_nvfp4(x)
    scaled = q.view(64, 32, 16) / (block_scale * tensor_scale)[..., None]  # scales are not powers of two: float rounding
    assert on_grid(scaled, format_grid("fp4_e2m1"), atol=1e-5)


def test_nvfp4_beats_mxfp4_on_gaussian_data() -> None:
    mx, nv = [], []
    for seed in range(4):
        x = gaussian(128, 1024, seed=seed)
        mx.append(rel_err(fake_quant(x, "mxfp4"), x))
        nv.append(rel_err(fake_quant(x, "nvfp4"), x))
    assert all(n < m for n, m in zip(nv, mx))
    assert sum(nv) / len(nv) < 0.9 * sum(mx) / len(mx)


@pytest.mark.parametrize("bits, fmt", [(4, "int4"), (8, "int8")])
@pytest.mark.parametrize("group", [32, 128, 256])
@pytest.mark.parametrize("symmetric", [True, False])
def test_integers_match_quantize_weight(bits: int, fmt: str, group: int, symmetric: bool) -> None:
    w = gaussian(48, 256, seed=3) * 0.05
    q = fake_quant(w, fmt, group, symmetric)
    assert torch.equal(q, quantize_weight(w, bits, group, symmetric).dequantize())
    # each element within half its group's step
    g = w.view(48, -1, group)
    step = g.abs().amax(-1) / (2 ** (bits - 1) - 1) if symmetric else (g.amax(-1).clamp(min=0) - g.amin(-1).clamp(max=0)) / (
        2**bits - 1
    )
    assert ((q - w).view(48, -1, group).abs() <= step[..., None] / 2 * (1 + 1e-5)).all()


@pytest.mark.parametrize("granularity, block", [("tensor", None), ("row", 384), ("block", (128, 128))])
@pytest.mark.parametrize("kind, fmt", [("fp8", "fp8_e4m3"), ("int8", "int8")])
def test_scaled_formats_match_quantize_scaled(granularity: str, block, kind: str, fmt: str) -> None:
    w = gaussian(256, 384, seed=4)
    assert torch.equal(fake_quant(w, fmt, block), quantize_scaled(w, kind, granularity).dequantize())


@pytest.mark.parametrize("fmt, mantissa", [("fp8_e4m3", 3), ("fp8_e5m2", 2)])
def test_fp8_relative_error_is_half_an_ulp(fmt: str, mantissa: int) -> None:
    x = torch.exp(torch.empty(4096).uniform_(-4, 4, generator=torch.Generator().manual_seed(5)))
    q = fake_quant(x, fmt, None)
    assert ((q - x).abs() / x <= 2.0 ** -(mantissa + 1) * (1 + 1e-6)).all()
    assert ((q - x).abs() / x).max() > 0.7 * 2.0 ** -(mantissa + 1)  # and the bound is reached


def test_shapes_dtypes_and_zero_blocks() -> None:
    x = gaussian(2, 3, 64, seed=6).to(torch.bfloat16)
    x[0, 0] = 0  # an all-zero row: every block of it is zero
    for fmt in FORMATS:
        q = fake_quant(x, fmt, 32 if fmt not in ("mxfp4", "nvfp4") else None)
        assert q.shape == x.shape and q.dtype == torch.bfloat16, fmt
        assert torch.isfinite(q).all() and (q[0, 0] == 0).all(), fmt
        assert rel_err(q, x) < (0.15 if fmt in ("int4", "mxfp4", "nvfp4") else 0.06), fmt
    assert torch.equal(fake_quant(torch.zeros(4, 32), "nvfp4"), torch.zeros(4, 32))


def test_granularity_and_bits_order_the_errors() -> None:
    w = gaussian(64, 1024, seed=7)
    w[3, 5] = 40.0  # one outlier: it spoils the scale of its whole tensor, row or group
    errs = [rel_err(fake_quant(w, "int4", b), w) for b in (None, 1024, 128, 32)]
    assert errs == sorted(errs, reverse=True)
    assert rel_err(fake_quant(w, "int8", 32), w) < rel_err(fake_quant(w, "int4", 32), w) / 8


def test_bits_per_element() -> None:
    assert bits_per_element("mxfp4") == 4.25 and bits_per_element("nvfp4") == 4.5
    assert bits_per_element("int4", 128, symmetric=False) == 4.25
    assert bits_per_element("int4", 128) == 4.125 and bits_per_element("int8") == 8
    assert bits_per_element("fp8_e4m3", (128, 128), scale_bits=32) == 8 + 32 / 128**2
    with pytest.raises(ValueError, match="fmt"):
        bits_per_element("int3")


def test_bad_inputs() -> None:
    x = gaussian(4, 64)
    with pytest.raises(TypeError, match="floating-point"):
        fake_quant(torch.ones(4, 64, dtype=torch.int32), "int8")
    with pytest.raises(TypeError, match="floating-point"):
        fake_quant([1.0, 2.0], "int8")
    with pytest.raises(TypeError, match="floating-point"):
        round_e2m1(torch.arange(4))
    with pytest.raises(ValueError, match="fmt"):
        fake_quant(x, "int2")
    with pytest.raises(ValueError, match="multiple of block"):
        fake_quant(x, "int4", 48)
    with pytest.raises(ValueError, match="multiple of block"):
        fake_quant(gaussian(4, 40), "mxfp4")
    with pytest.raises(ValueError, match="block"):
        fake_quant(x, "int8", 0)
    with pytest.raises(ValueError, match="tile"):
        fake_quant(gaussian(2, 4, 64), "int8", (2, 32))
    with pytest.raises(ValueError, match="multiple of the tile"):
        fake_quant(x, "fp8_e4m3", (3, 32))
    with pytest.raises(ValueError, match="last dimension"):
        fake_quant(x, "nvfp4", (4, 16))
    with pytest.raises(ValueError, match="integer formats only"):
        fake_quant(x, "fp8_e4m3", 32, symmetric=False)
    with pytest.raises(ValueError, match="finite"):
        fake_quant(torch.tensor([1.0, float("nan")]), "int8")
    with pytest.raises(ValueError, match="empty"):
        fake_quant(torch.empty(0), "int8")
