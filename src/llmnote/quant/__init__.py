"""Quantization (Chapter 5): number formats, calibration, RTN, SmoothQuant, AWQ, GPTQ and FP8,
and the swap of a model's :class:`~llmnote.layers.Linear` layers to quantized ones."""

from .formats import (
    BLOCK,
    FP8_E4M3_MAX,
    QuantizedWeight,
    ScaledWeight,
    container_bits,
    pack_codes,
    quantize_scaled,
    quantize_weight,
    unpack_codes,
)

__all__ = [
    "BLOCK",
    "FP8_E4M3_MAX",
    "QuantizedWeight",
    "ScaledWeight",
    "container_bits",
    "pack_codes",
    "quantize_scaled",
    "quantize_weight",
    "unpack_codes",
]
