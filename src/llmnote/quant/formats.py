"""Number formats for quantized weights: integer codes with group scales, FP8 and INT8.

Three containers, one per kind of kernel that consumes them:

- :class:`QuantizedWeight`: ``bits``-bit integer codes (2 to 8) of an ``(N, K)`` weight, one
  scale and one zero point per group of ``group_size`` consecutive input features of a row.
  Codes are packed into int32 words along K (8 codes of 4 bits, or 4 of 8 bits, per word),
  stored ``(K // per_word, N)`` (a row of words per ``per_word`` consecutive k, contiguous along
  N): a GEMM kernel that walks K reads one word and unpacks the codes of ``per_word`` consecutive
  k for a row of N. Scales and zero points are
  ``(K // group_size, N)`` in the weight's dtype (16 bits each, as W4A16 kernels read them).
  Weight ``w[n, k]`` is stored as ``q = clamp(round(w / s) + z, 0, 2**bits - 1)`` and read back
  as ``(q - z) * s``, with ``s`` and ``z`` those of its group.
- :class:`ScaledWeight`: an FP8 (E4M3) or INT8 ``(N, K)`` matrix with a float32 scale per tensor,
  per output row, or per 128 x 128 block.

All functions here are plain PyTorch: they run wherever the weights are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

__all__ = [
    "QuantizedWeight",
    "ScaledWeight",
    "quantize_weight",
    "quantize_scaled",
    "pack_codes",
    "unpack_codes",
    "container_bits",
    "FP8_E4M3_MAX",
    "BLOCK",
]

FP8_E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
BLOCK = 128  # the side of a block scale's tile (DeepSeek-V3's 128 x 128 weight blocks)


def container_bits(bits: int) -> int:
    """Bits each code occupies in its int32 word: 4 for 2- to 4-bit codes, 8 above."""
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be in [2, 8], got {bits}")
    return 4 if bits <= 4 else 8


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``(N, K)`` integer codes in ``[0, 2**bits)`` -> ``(K // per_word, N)`` int32, packed along K:
    code ``k`` of row ``n`` sits in word ``k // per_word`` of column ``n``, at bit
    ``(k % per_word) * width``."""
    width = container_bits(bits)
    per_word = 32 // width
    n, k = codes.shape
    if k % per_word:
        raise ValueError(f"K = {k} must be a multiple of {per_word} to pack {bits}-bit codes")
    c = codes.t().to(torch.int64).reshape(k // per_word, per_word, n)
    shifts = torch.arange(per_word, device=codes.device, dtype=torch.int64)[None, :, None] * width
    words = (c << shifts).sum(dim=1)  # < 2**32: fits int64, then wraps into int32
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The inverse of :func:`pack_codes`: ``(K // per_word, N)`` int32 -> ``(N, K)`` uint8 codes."""
    width = container_bits(bits)
    per_word = 32 // width
    shifts = torch.arange(per_word, device=packed.device, dtype=torch.int32)[None, :, None] * width
    codes = (packed[:, None, :] >> shifts) & ((1 << width) - 1)  # arithmetic shift, then mask
    return codes.reshape(-1, packed.shape[1]).t().to(torch.uint8)


@dataclass
class QuantizedWeight:
    """An ``(N, K)`` weight as packed integer codes with a scale and zero point per group."""

    qweight: torch.Tensor  # (K // per_word, N) int32
    scales: torch.Tensor  # (K // group_size, N), the weight's dtype
    zeros: torch.Tensor  # (K // group_size, N), the weight's dtype (integer values)
    bits: int
    group_size: int
    shape: tuple[int, int]  # (N, K)
    dtype: torch.dtype

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    def codes(self) -> torch.Tensor:
        """The ``(N, K)`` integer codes, unpacked."""
        return unpack_codes(self.qweight, self.bits)

    def dequantize(self) -> torch.Tensor:
        """The ``(N, K)`` weight the codes stand for, in the original dtype."""
        n, k = self.shape
        q = self.codes().float().view(n, k // self.group_size, self.group_size)
        s = self.scales.float().t()[:, :, None]
        z = self.zeros.float().t()[:, :, None]
        return ((q - z) * s).view(n, k).to(self.dtype)

    def to(self, device) -> QuantizedWeight:
        return QuantizedWeight(
            self.qweight.to(device), self.scales.to(device), self.zeros.to(device),
            self.bits, self.group_size, self.shape, self.dtype,
        )

    @property
    def nbytes(self) -> int:
        """Bytes a kernel reads: the packed codes plus scales and zero points."""
        return sum(t.numel() * t.element_size() for t in (self.qweight, self.scales, self.zeros))

    def __repr__(self) -> str:
        n, k = self.shape
        return f"QuantizedWeight(N={n}, K={k}, bits={self.bits}, group_size={self.group_size}, dtype={self.dtype})"


def _round_up_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` (float32, > 0) stored in ``dtype``, rounded up rather than to the nearest: a scale
    never shrinks on storage, so the codes still span the group's range."""
    stored = x.to(dtype)
    too_small = stored.float() < x
    if too_small.any():
        bumped = torch.nextafter(stored, torch.full_like(stored, float("inf")))
        stored = torch.where(too_small, bumped, stored)
    return stored


def group_params(
    w: torch.Tensor, bits: int, group_size: int, symmetric: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Round-to-nearest scales and zero points of an ``(N, K)`` weight, ``(N, K // group_size)``
    each, in float32 with the scales already rounded (up) to ``w``'s dtype."""
    n, k = w.shape
    g = w.float().view(n, k // group_size, group_size)
    levels = 2**bits - 1
    if symmetric:  # a grid centred on zero: codes z - m .. z + m with z = 2**(bits-1), m = z - 1
        half = 2 ** (bits - 1) - 1
        scale = g.abs().amax(dim=-1) / half
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        scale = _round_up_to(scale, w.dtype).float()
        zero = torch.full_like(scale, 2 ** (bits - 1))
    else:  # the group's [min, max], with 0 inside it so that zeros stay exact
        lo, hi = g.amin(dim=-1).clamp(max=0), g.amax(dim=-1).clamp(min=0)
        scale = (hi - lo) / levels
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        scale = _round_up_to(scale, w.dtype).float()
        zero = torch.round(-lo / scale).clamp(0, levels)
    return scale, zero


def codes_for(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int, group_size: int) -> torch.Tensor:
    """The codes of ``w`` (N, K) under group ``scale`` and ``zero`` (N, K // group_size)."""
    n, k = w.shape
    g = w.float().view(n, k // group_size, group_size)
    q = torch.round(g / scale[..., None]) + zero[..., None]
    return q.clamp(0, 2**bits - 1).view(n, k).to(torch.uint8)


def check_group(shape: tuple[int, ...], bits: int, group_size: int) -> None:
    """Clear errors for a weight that cannot take this format."""
    if len(shape) != 2:
        raise ValueError(f"a weight must be 2-D (N, K), got shape {tuple(shape)}")
    per_word = 32 // container_bits(bits)
    n, k = shape
    if group_size < 1 or k % group_size:
        raise ValueError(f"K = {k} must be a multiple of group_size, got group_size {group_size}")
    if group_size % per_word:
        raise ValueError(f"group_size must be a multiple of {per_word} for {bits}-bit codes, got {group_size}")


def make_quantized(
    w: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int, group_size: int
) -> QuantizedWeight:
    """Pack codes and ``(N, K // group_size)`` float32 scales and zeros into a :class:`QuantizedWeight`."""
    return QuantizedWeight(
        qweight=pack_codes(codes, bits),
        scales=scale.t().contiguous().to(w.dtype),
        zeros=zero.t().contiguous().to(w.dtype),
        bits=bits,
        group_size=group_size,
        shape=tuple(w.shape),
        dtype=w.dtype,
    )


def quantize_weight(w: torch.Tensor, bits: int = 4, group_size: int = 128, symmetric: bool = False) -> QuantizedWeight:
    """Round-to-nearest (RTN) of an ``(N, K)`` weight in groups of ``group_size`` along K.

    Asymmetric (default): each group's ``[min, max]`` (widened to contain 0) is cut into
    ``2**bits - 1`` steps; the zero point is the code of 0. Symmetric: the grid is centred on 0
    with step ``max|w| / (2**(bits-1) - 1)``. Scales are rounded *up* to the weight's dtype,
    so every element lies within half a step of a code: the error is at most ``scale / 2``.
    """
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError(f"w must be a floating-point tensor, got {type(w).__name__}")
    check_group(tuple(w.shape), bits, group_size)
    scale, zero = group_params(w, bits, group_size, symmetric)
    return make_quantized(w, codes_for(w, scale, zero, bits, group_size), scale, zero, bits, group_size)


@dataclass
class ScaledWeight:
    """An ``(N, K)`` FP8 (E4M3) or INT8 matrix and its float32 scales: ``w ~ data * scale``,
    the scale per tensor ``()``, per row ``(N,)``, or per block ``(ceil(N/128), ceil(K/128))``."""

    data: torch.Tensor  # (N, K) float8_e4m3fn or int8
    scale: torch.Tensor  # float32
    granularity: Literal["tensor", "row", "block"]
    dtype: torch.dtype  # the original weight's dtype

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.data.shape)

    def expanded_scale(self) -> torch.Tensor:
        """The scale of every element, ``(N, K)`` float32."""
        n, k = self.shape
        if self.granularity == "tensor":
            return self.scale.expand(n, k)
        if self.granularity == "row":
            return self.scale[:, None].expand(n, k)
        return self.scale.repeat_interleave(BLOCK, 0)[:n].repeat_interleave(BLOCK, 1)[:, :k]

    def dequantize(self) -> torch.Tensor:
        return (self.data.float() * self.expanded_scale()).to(self.dtype)

    def to(self, device) -> ScaledWeight:
        return ScaledWeight(self.data.to(device), self.scale.to(device), self.granularity, self.dtype)


def _absmax(w: torch.Tensor, granularity: str) -> torch.Tensor:
    a = w.float().abs()
    if granularity == "tensor":
        return a.amax()
    if granularity == "row":
        return a.amax(dim=1)
    n, k = w.shape
    pad = torch.nn.functional.pad(a, (0, -k % BLOCK, 0, -n % BLOCK))
    return pad.view(pad.shape[0] // BLOCK, BLOCK, pad.shape[1] // BLOCK, BLOCK).amax(dim=(1, 3))


def quantize_scaled(
    w: torch.Tensor, kind: Literal["fp8", "int8"] = "fp8", granularity: Literal["tensor", "row", "block"] = "row"
) -> ScaledWeight:
    """Absmax quantization of an ``(N, K)`` matrix (weights, or activations with one row per
    token) to FP8 E4M3 or INT8, with one scale per tensor, row or 128 x 128 block."""
    if not isinstance(w, torch.Tensor) or w.ndim != 2 or not w.is_floating_point():
        raise ValueError(f"w must be a 2-D floating-point tensor, got {getattr(w, 'shape', type(w).__name__)}")
    if kind not in ("fp8", "int8"):
        raise ValueError(f"kind must be 'fp8' or 'int8', got {kind!r}")
    if granularity not in ("tensor", "row", "block"):
        raise ValueError(f"granularity must be 'tensor', 'row' or 'block', got {granularity!r}")
    top = FP8_E4M3_MAX if kind == "fp8" else 127.0
    scale = _absmax(w, granularity) / top
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    sw = ScaledWeight(w, scale, granularity, w.dtype)  # data replaced below
    scaled = w.float() / sw.expanded_scale()
    if kind == "fp8":
        data = scaled.clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    else:
        data = torch.round(scaled).clamp(-127, 127).to(torch.int8)
    return ScaledWeight(data, scale, granularity, w.dtype)
