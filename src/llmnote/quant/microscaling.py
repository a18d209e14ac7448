"""Fake quantization for every number format of the chapter: INT8 and INT4, FP8 (E4M3 and E5M2),
and the block-scaled 4-bit floats MXFP4 and NVFP4.

*Fake* quantization rounds a tensor to the values a format can hold and hands it back as floats:
``fake_quant(x, fmt, block) - x`` is exactly the error a kernel reading that format would see,
without packing a single bit. That is all a page needs to compare formats on the same tensor.

**Integer and FP8 formats** carry one float32 scale per group of elements. ``block`` chooses the
group: ``None`` for one scale per tensor, an integer ``g`` for runs of ``g`` consecutive elements
along the last dimension (``g`` equal to that dimension gives one scale per row, i.e. per output
channel of an ``(N, K)`` weight), or a pair ``(bn, bk)`` for tiles of a 2-D tensor (DeepSeek-V3's
128 x 128 weight blocks). Integers are symmetric (``round(x / s)`` in ``[-(2^(b-1) - 1), 2^(b-1) - 1]``
with ``s = amax / (2^(b-1) - 1)``) or asymmetric (``2^b - 1`` steps over the group's ``[min, max]``
widened to hold 0, and an integer zero point), with the same arithmetic as
:func:`llmnote.quant.quantize_weight`. FP8 scales map the group's largest magnitude to the format's
largest finite value (448 for E4M3, 57344 for E5M2; Micikevicius et al. 2022, *FP8 Formats for Deep
Learning*), and PyTorch's casts round to nearest, ties to even.

**FP4 E2M1** (1 sign, 2 exponent and 1 mantissa bit, exponent bias 1) holds 0, 0.5, 1, 1.5, 2, 3,
4, 6 and their negatives. Alone it is useless; with a scale per small block it is the element type
of two formats that Blackwell's tensor cores read directly:

- **MXFP4** (OCP *Microscaling Formats (MX) v1.0*, Rouhani et al. 2023): blocks of 32 consecutive
  elements share an E8M0 scale, a bare power of two ``2^e`` with ``e`` in [-127, 127]. The scale
  is ``2^(floor(log2 amax) - 2)``, 2 being E2M1's largest exponent, so the block's largest
  magnitude lands in [4, 8) and anything above 6 saturates to 6.
- **NVFP4** (NVIDIA, Blackwell): blocks of 16 share an FP8 E4M3 scale, ``amax / 6`` rounded to
  E4M3, so the block's largest element lands close to 6; a second, float32 scale per tensor,
  ``amax_tensor / (6 * 448)``, moves the block scales into E4M3's range.

Elements round to the nearest E2M1 value, ties to the even mantissa, and saturate at 6.
Everything is plain PyTorch in float32, on whatever device ``x`` lives; results come back in
``x``'s dtype and shape.
"""

from __future__ import annotations

import torch

__all__ = [
    "FORMATS",
    "E2M1_MAX",
    "round_e2m1",
    "mx_scales",
    "fake_mxfp4",
    "nvfp4_scales",
    "fake_nvfp4",
    "fake_quant",
    "format_grid",
    "bits_per_element",
]

FORMATS = ("int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp4", "nvfp4")
E2M1_MAX = 6.0  # the largest FP4 E2M1 magnitude
_FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}
_INT_BITS = {"int8": 8, "int4": 4}
_FP4_BLOCK = {"mxfp4": 32, "nvfp4": 16}


def _check_tensor(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    if x.numel() == 0:
        raise ValueError("x must not be empty")
    if not torch.isfinite(x).all():
        raise ValueError("x must be finite (no inf or nan)")


def _grouped(x: torch.Tensor, block) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``x`` in float32, viewed so that each scale group is a set of dims: ``(view, dims)``."""
    v = x.float()
    if block is None:
        return v.reshape(1, -1), (1,)
    if isinstance(block, tuple):
        if len(block) != 2 or x.ndim != 2 or not all(isinstance(b, int) and b > 0 for b in block):
            raise ValueError(f"a tile block (bn, bk) needs a 2-D x and two positive ints, got {block} for shape {tuple(x.shape)}")
        (n, k), (bn, bk) = x.shape, block
        if n % bn or k % bk:
            raise ValueError(f"x's shape {tuple(x.shape)} must be a multiple of the tile {block}")
        return v.reshape(n // bn, bn, k // bk, bk), (1, 3)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be None, a positive int or a pair of them, got {block!r}")
    if x.ndim == 0 or x.shape[-1] % block:
        raise ValueError(f"the last dimension of x {tuple(x.shape)} must be a multiple of block = {block}")
    return v.reshape(*x.shape[:-1], x.shape[-1] // block, block), (-1,)


def _check_fp4(x: torch.Tensor, block) -> None:
    _check_tensor(x)
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"FP4 blocks run along the last dimension: block must be a positive int, got {block!r}")


def _safe(scale: torch.Tensor) -> torch.Tensor:
    """A scale of 0 (an all-zero group) replaced by 1: its elements quantize to 0 either way."""
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Each element of ``x`` rounded to the nearest FP4 E2M1 value, ties to even mantissa,
    saturating at +-6. The grid's step is 0.5 below 2, 1 in [2, 4) and 2 in [4, 6], i.e.
    ``2^(max(floor(log2|x|), 0) - 1)``; ``torch.round`` (half to even) on ``|x| / step`` then
    picks the even mantissa at a tie."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {getattr(x, 'dtype', type(x).__name__)}")
    a = x.float().abs().clamp(max=E2M1_MAX)
    _, e = torch.frexp(a.clamp(min=1.0))  # a = m * 2^e with m in [0.5, 1): floor(log2 a) = e - 1
    step = torch.exp2((e - 2).float())
    return torch.copysign((torch.round(a / step) * step).clamp(max=E2M1_MAX), x.float()).to(x.dtype)


def mx_scales(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """MXFP4's E8M0 scales of ``x`` (..., K): ``(..., K // block)`` powers of two,
    ``2^(floor(log2 amax) - 2)`` per block of ``block`` consecutive elements (1 for an all-zero block)."""
    _check_fp4(x, block)
    amax = _grouped(x, block)[0].abs().amax(-1)
    _, e = torch.frexp(amax)  # floor(log2 amax) = e - 1
    return torch.where(amax > 0, torch.exp2((e - 3).clamp(-127, 127).float()), torch.ones_like(amax))


def fake_mxfp4(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """``x`` (..., K) through MXFP4: E2M1 elements times a power-of-two scale per ``block``."""
    scale = mx_scales(x, block)[..., None]
    v, _ = _grouped(x, block)
    return (round_e2m1(v / scale) * scale).reshape(x.shape).to(x.dtype)


def nvfp4_scales(x: torch.Tensor, block: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4's two levels of scale for ``x`` (..., K): the E4M3 block scales ``(..., K // block)``
    (as float32 values) and the float32 per-tensor scale ``amax / (6 * 448)``. A block's scale is
    ``block_scale * tensor_scale``."""
    _check_fp4(x, block)
    amax = _grouped(x, block)[0].abs().amax(-1)
    tensor_scale = _safe(amax.amax() / (E2M1_MAX * _FP8["fp8_e4m3"][1]))
    block_scale = (amax / (E2M1_MAX * tensor_scale)).clamp(max=448.0).to(torch.float8_e4m3fn).float()
    return block_scale, tensor_scale


def fake_nvfp4(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    """``x`` (..., K) through NVFP4: E2M1 elements times an E4M3 scale per ``block`` times a
    float32 scale per tensor. A block whose scale underflows E4M3 becomes zeros."""
    block_scale, tensor_scale = nvfp4_scales(x, block)
    scale = (block_scale * tensor_scale)[..., None]
    v, _ = _grouped(x, block)
    q = torch.where(scale > 0, round_e2m1(v / _safe(scale)) * scale, torch.zeros_like(v))
    return q.reshape(x.shape).to(x.dtype)


def _fake_int(v: torch.Tensor, dims: tuple[int, ...], bits: int, symmetric: bool) -> torch.Tensor:
    if symmetric:
        top = 2 ** (bits - 1) - 1
        scale = _safe(v.abs().amax(dims, keepdim=True) / top)
        return torch.round(v / scale).clamp(-top, top) * scale
    levels = 2**bits - 1
    lo = v.amin(dims, keepdim=True).clamp(max=0)
    hi = v.amax(dims, keepdim=True).clamp(min=0)
    scale = _safe((hi - lo) / levels)
    zero = torch.round(-lo / scale)  # the code of 0.0: zeros stay exact
    return ((torch.round(v / scale) + zero).clamp(0, levels) - zero) * scale


def fake_quant(x: torch.Tensor, fmt: str, block=None, symmetric: bool = True) -> torch.Tensor:
    """``x`` quantized to ``fmt`` (one of :data:`FORMATS`) and dequantized, in ``x``'s shape and dtype.

    ``block``: the scale group. ``None`` (one scale per tensor), ``g`` (runs of ``g`` along the
    last dim) or ``(bn, bk)`` (tiles of a 2-D ``x``) for the integer and FP8 formats; for
    ``"mxfp4"`` and ``"nvfp4"`` the block length along the last dim, default 32 and 16.
    ``symmetric=False`` (integer formats only) adds a zero point per group.
    """
    _check_tensor(x)
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    if not symmetric and fmt not in _INT_BITS:
        raise ValueError(f"symmetric=False applies to integer formats only, not {fmt!r}")
    if fmt in _FP4_BLOCK:
        block = _FP4_BLOCK[fmt] if block is None else block
        return fake_mxfp4(x, block) if fmt == "mxfp4" else fake_nvfp4(x, block)
    v, dims = _grouped(x, block)
    if fmt in _INT_BITS:
        q = _fake_int(v, dims, _INT_BITS[fmt], symmetric)
    else:
        dtype, top = _FP8[fmt]
        scale = _safe(v.abs().amax(dims, keepdim=True) / top)
        q = (v / scale).clamp(-top, top).to(dtype).float() * scale
    return q.reshape(x.shape).to(x.dtype)


def format_grid(fmt: str) -> torch.Tensor:
    """Every value the element type of ``fmt`` can hold before scaling, sorted, float32:
    the 15 E2M1 values for ``"fp4_e2m1"``, ``"mxfp4"`` and ``"nvfp4"``, the 253 finite E4M3
    and 247 finite E5M2 values, and the symmetric integer codes (-127..127, -7..7)."""
    if fmt in ("fp4_e2m1", *_FP4_BLOCK):
        half = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
        return torch.cat([-half.flip(0), half]).unique()
    if fmt in _FP8:
        values = torch.arange(256, dtype=torch.uint8).view(_FP8[fmt][0]).float()
        return values[torch.isfinite(values)].unique()
    if fmt in _INT_BITS:
        top = 2 ** (_INT_BITS[fmt] - 1) - 1
        return torch.arange(-top, top + 1, dtype=torch.float32)
    raise ValueError(f"fmt must be 'fp4_e2m1' or one of {FORMATS}, got {fmt!r}")


def bits_per_element(fmt: str, block=None, symmetric: bool = True, scale_bits: int = 16) -> float:
    """Storage cost per element: the element's bits plus its share of the scales. MXFP4 and NVFP4
    pay 8 bits per block (E8M0, E4M3); integer and FP8 groups pay ``scale_bits`` per scale, and
    twice that when a zero point is stored beside it (``symmetric=False``). A per-tensor scale
    (``block=None``, and NVFP4's second level) is counted as free."""
    if fmt in _FP4_BLOCK:
        return 4 + 8 / (_FP4_BLOCK[fmt] if block is None else block)
    if fmt not in FORMATS:
        raise ValueError(f"fmt must be one of {FORMATS}, got {fmt!r}")
    element = _INT_BITS.get(fmt, 8)
    if block is None:
        return float(element)
    size = block[0] * block[1] if isinstance(block, tuple) else block
    return element + scale_bits * (1 if symmetric else 2) / size
