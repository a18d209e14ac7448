"""Quantization (Chapter 5): number formats, calibration, RTN, SmoothQuant, AWQ, GPTQ and FP8,
and the swap of a model's :class:`~llmnote.layers.Linear` layers to quantized ones."""

from .apply import Scaled, WeightOnly, quantizable_linears, set_quantized, swap_methods
from .awq import awq_model
from .calibrate import activation_absmax, calibration_ids, input_stats
from .eval import perplexity, quantize
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
from .gptq import gptq_model, gptq_quantize
from .llm_int8 import int8_mixed_matmul
from .microscaling import (
    E2M1_MAX,
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
from .smoothquant import smooth_model, smoothing_scales

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
    "E2M1_MAX",
    "FORMATS",
    "bits_per_element",
    "fake_mxfp4",
    "fake_nvfp4",
    "fake_quant",
    "format_grid",
    "mx_scales",
    "nvfp4_scales",
    "round_e2m1",
    "Scaled",
    "WeightOnly",
    "quantizable_linears",
    "set_quantized",
    "swap_methods",
    "awq_model",
    "activation_absmax",
    "calibration_ids",
    "input_stats",
    "perplexity",
    "quantize",
    "gptq_model",
    "gptq_quantize",
    "smooth_model",
    "smoothing_scales",
    "int8_mixed_matmul",
]
