"""Quantized :class:`~llmnote.layers.Linear` methods, and the swap of a model's projections.

A quantized layer is the same :class:`~llmnote.layers.Linear` with another
:class:`~llmnote.layers.LinearMethod`: the model's code does not change. Two methods:

- :class:`WeightOnly` (W4A16 and friends): packed integer codes with group scales and zero
  points (:class:`~llmnote.quant.QuantizedWeight`); the product dequantizes inside
  ``w4a16_linear`` (the Triton kernel on a GPU, the reference on a CPU).
- :class:`Scaled` (W8A8): FP8 E4M3 or INT8 weights with per-row (or per-tensor, per-block)
  scales; activations are quantized per token on the fly and the product runs in 8 bits
  (``fp8_linear`` / ``int8_linear``).

Both quantize a checkpoint tensor as it is loaded (:meth:`LinearMethod.load_rows`), so a model
can be built on the meta device and streamed in without ever holding its dense weights, and
both accept weights quantized elsewhere (GPTQ, AWQ) through :func:`set_quantized`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn

from ..layers.linear import Dense, Linear, LinearMethod
from ..layers.ops import ops_for
from .formats import (
    BLOCK,
    QuantizedWeight,
    ScaledWeight,
    check_group,
    codes_for,
    container_bits,
    group_params,
    pack_codes,
    quantize_scaled,
)

__all__ = ["WeightOnly", "Scaled", "quantizable_linears", "swap_methods", "set_quantized"]


class WeightOnly(LinearMethod):
    """Integer codes of ``bits`` bits in groups of ``group_size`` along the input features,
    16-bit activations (W4A16 for ``bits=4``). Loading a dense weight quantizes it by
    round-to-nearest; :func:`set_quantized` installs codes found by GPTQ or AWQ instead."""

    def __init__(self, bits: int = 4, group_size: int = 128, symmetric: bool = False):
        container_bits(bits)  # validates bits
        self.bits, self.group_size, self.symmetric = bits, group_size, symmetric

    def create_weights(self, layer, out_features, in_features, dtype):
        check_group((out_features, in_features), self.bits, self.group_size)
        per_word = 32 // container_bits(self.bits)
        groups = in_features // self.group_size
        layer.register_buffer("qweight", torch.zeros(in_features // per_word, out_features, dtype=torch.int32))
        layer.register_buffer("scales", torch.ones(groups, out_features, dtype=dtype))
        layer.register_buffer("zeros", torch.zeros(groups, out_features, dtype=dtype))

    def weight(self, layer) -> QuantizedWeight:
        n, k = layer.scales.shape[1], layer.qweight.shape[0] * (32 // container_bits(self.bits))
        return QuantizedWeight(layer.qweight, layer.scales, layer.zeros, self.bits, self.group_size, (n, k), layer.scales.dtype)

    def load_rows(self, layer, weight, rows):
        w = weight.to(layer.scales.device, layer.scales.dtype)
        scale, zero = group_params(w, self.bits, self.group_size, self.symmetric)
        codes = codes_for(w, scale, zero, self.bits, self.group_size)
        with torch.no_grad():
            layer.qweight[:, rows] = pack_codes(codes, self.bits)
            layer.scales[:, rows] = scale.t().to(layer.scales.dtype)
            layer.zeros[:, rows] = zero.t().to(layer.zeros.dtype)

    def apply(self, layer, x, bias):
        y = ops_for(x).w4a16_linear(x, self.weight(layer))
        return y if bias is None else y + bias

    def dense_weight(self, layer):
        return self.weight(layer).dequantize()


class Scaled(LinearMethod):
    """An FP8 (E4M3) or INT8 weight with float32 scales per row, tensor or 128 x 128 block;
    activations are quantized per token (per token and 128-channel block with block scales)
    as they arrive. The FP8 bits are kept as ``uint8`` so that ``model.to(dtype)`` leaves them
    alone; the scales must stay float32 (a cast of the model to 16 bits is undone on load)."""

    def __init__(self, kind: str = "fp8", granularity: str = "row"):
        if kind not in ("fp8", "int8"):
            raise ValueError(f"kind must be 'fp8' or 'int8', got {kind!r}")
        if granularity not in ("tensor", "row", "block") or (kind == "int8" and granularity == "block"):
            raise ValueError(f"granularity {granularity!r} is not available for {kind}")
        self.kind, self.granularity = kind, granularity

    def _scale_shape(self, n: int, k: int) -> tuple[int, ...]:
        return {"tensor": (), "row": (n,), "block": (-(-n // BLOCK), -(-k // BLOCK))}[self.granularity]

    def create_weights(self, layer, out_features, in_features, dtype):
        storage = torch.uint8 if self.kind == "fp8" else torch.int8
        layer.register_buffer("qdata", torch.zeros(out_features, in_features, dtype=storage))
        layer.register_buffer("wscale", torch.ones(self._scale_shape(out_features, in_features), dtype=torch.float32))
        layer.out_dtype = dtype

    def weight(self, layer) -> ScaledWeight:
        data = layer.qdata.view(torch.float8_e4m3fn) if self.kind == "fp8" else layer.qdata
        dtype = layer.out_dtype or torch.float32
        return ScaledWeight(data, layer.wscale, self.granularity, dtype)

    def load_rows(self, layer, weight, rows):
        if layer.wscale.dtype != torch.float32:  # cast along with the model: restore float32
            layer.wscale = layer.wscale.float()
        n, k = layer.qdata.shape
        if (rows.start, rows.stop) != (0, n) and self.granularity != "row":
            raise ValueError(f"{self.granularity} scales need the whole weight at once; load merged parts with row scales")
        q = quantize_scaled(weight.to(layer.qdata.device), self.kind, self.granularity)
        with torch.no_grad():
            layer.qdata[rows] = q.data.view(layer.qdata.dtype)
            layer.wscale[rows if self.granularity == "row" else ...] = q.scale
        layer.out_dtype = weight.dtype

    def apply(self, layer, x, bias):
        ops = ops_for(x)
        fn = ops.fp8_linear if self.kind == "fp8" else ops.int8_linear
        y = fn(x, self.weight(layer))
        return y if bias is None else y + bias

    def dense_weight(self, layer):
        return self.weight(layer).dequantize()


def quantizable_linears(model: nn.Module) -> dict[str, Linear]:
    """The model's projections, by module name, in forward order (the LM head is not one: it
    is usually kept in 16 bits, being small next to the layers and sensitive)."""
    return {name: m for name, m in model.named_modules() if isinstance(m, Linear)}


def swap_methods(model: nn.Module, method: Callable[[str, Linear], LinearMethod | None], load: bool = True) -> nn.Module:
    """Give each dense projection ``name`` the method ``method(name, layer)`` (None keeps it
    dense), in place. With ``load``, the dense weight is loaded through the new method, which
    quantizes it; without, the new storage is left empty for a checkpoint to be streamed into
    (a model built on the meta device never holds its dense weights)."""
    for name, layer in quantizable_linears(model).items():
        new = method(name, layer)
        if new is None:
            continue
        if not isinstance(layer.method, Dense):
            raise ValueError(f"{name} is already quantized ({type(layer.method).__name__})")
        dense = layer.weight.detach()
        del layer.weight
        layer.method = new
        with torch.device(dense.device):
            new.create_weights(layer, sum(layer.local_sizes), layer.local_in, dense.dtype)
        if load:
            new.load_rows(layer, dense, slice(0, dense.shape[0]))
    return model


def set_quantized(layer: Linear, weight: QuantizedWeight) -> None:
    """Install codes, scales and zero points found elsewhere (GPTQ, AWQ) in a layer whose
    method is :class:`WeightOnly` of the same bits and group size."""
    method = layer.method
    if not isinstance(method, WeightOnly):
        raise TypeError(f"the layer's method is {type(method).__name__}, not WeightOnly")
    if (weight.bits, weight.group_size) != (method.bits, method.group_size):
        raise ValueError(f"weight has bits={weight.bits}, group_size={weight.group_size}; the layer "
                         f"{method.bits} and {method.group_size}")
    if tuple(weight.qweight.shape) != tuple(layer.qweight.shape):
        raise ValueError(f"packed shape {tuple(weight.qweight.shape)} does not match the layer's {tuple(layer.qweight.shape)}")
    with torch.no_grad():
        layer.qweight.copy_(weight.qweight)
        layer.scales.copy_(weight.scales)
        layer.zeros.copy_(weight.zeros)
