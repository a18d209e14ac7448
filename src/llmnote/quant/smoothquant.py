"""SmoothQuant (Xiao et al. 2022, "SmoothQuant: Accurate and Efficient Post-Training
Quantization for Large Language Models"): make activations easy to quantize to INT8 by
moving their outliers into the weights.

W8A8 quantizes both operands of every Linear to INT8, so that the product runs on integer
tensor cores. Weights are easy (smooth, per output channel). Activations are not: a few input
channels of a transformer's Linears carry values 10-100x larger than the rest, in every token,
and a per-token scale sized for them rounds all other channels to a handful of levels. Those
channels are the same in every token, so a per-*channel* scale ``s`` removes them:

    y = x W^T = (x / s) (W diag(s))^T,

with ``s`` folded into the RMSNorm before the Linear (its weight divided by ``s``) and into
the weight's columns, once, offline. SmoothQuant picks

    s_j = max|X_j|^alpha / max|W_j|^(1 - alpha),

which, at ``alpha = 0.5``, gives channel ``j`` of the smoothed activations and of the scaled
weights the same maximum ``sqrt(max|X_j| max|W_j|)``: the difficulty is split between the two.

:class:`FakeQuantW8A8` then simulates the INT8 product in floating point, for measuring the
accuracy of W8A8 on any device: per-output-channel INT8 weights, per-token dynamic INT8
activations, an exact integer-valued product, and the two scales applied to the result.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ..layers import Dense, Linear, LinearMethod
from .calibrate import activation_absmax, linear_names
from .formats import quantize_scaled

__all__ = ["smoothing_scales", "smooth_model", "FakeQuantW8A8", "apply_fake_w8a8", "quantize_tokens_int8"]

MIN_SCALE = 1e-5


def smoothing_scales(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """``s_j = max|X_j|^alpha / max|W_j|^(1 - alpha)`` (K,) float32 for activations' per-channel
    ``act_absmax`` (K,) and ``weight`` (N, K), both terms clamped away from 0."""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D (N, K) tensor, got {getattr(weight, 'shape', type(weight).__name__)}")
    if not isinstance(act_absmax, torch.Tensor) or tuple(act_absmax.shape) != (weight.shape[1],):
        raise ValueError(f"act_absmax must have shape ({weight.shape[1]},), got {getattr(act_absmax, 'shape', act_absmax)}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    x = act_absmax.float().clamp(min=MIN_SCALE)
    w = weight.detach().float().abs().amax(dim=0).clamp(min=MIN_SCALE)
    return (x**alpha / w ** (1.0 - alpha)).clamp(min=MIN_SCALE)


@torch.no_grad()
def smooth_model(
    model: nn.Module, ids: torch.Tensor, alpha: float = 0.5, progress: bool = True, batch_size: int = 8
) -> dict[str, torch.Tensor]:
    """Smooth the inputs of every ``qkv_proj`` and ``gate_up_proj`` of ``model`` in place, the
    scales folded into ``input_layernorm`` and ``post_attention_layernorm``; the float model's
    output is unchanged. Calibrates on the windows ``ids`` ``(n, seq_len)`` (one forward pass:
    smoothing one layer does not change what any other layer sees). Returns
    ``{linear name: s (in_features,)}``."""
    targets = {}
    for i, layer in enumerate(model.model.layers):
        prefix = f"model.layers.{i}."
        targets[prefix + "self_attn.qkv_proj"] = (layer.input_layernorm, layer.self_attn.qkv_proj)
        targets[prefix + "mlp.gate_up_proj"] = (layer.post_attention_layernorm, layer.mlp.gate_up_proj)
    for _, linear in targets.values():
        if not isinstance(linear.method, Dense):
            raise TypeError(f"smoothing needs dense Linears, got {linear.extra_repr()}")
    absmax = activation_absmax(model, ids, list(targets), batch_size, progress)
    scales = {}
    for name, (norm, linear) in targets.items():
        s = smoothing_scales(absmax[name].to(linear.weight.device), linear.weight, alpha)
        norm.weight.copy_(norm.weight.float() / s)
        linear.weight.copy_(linear.weight.float() * s[None, :])
        scales[name] = s
    return scales


def quantize_tokens_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token (per-row) dynamic symmetric INT8 of ``x`` (..., K): integer-valued float32 codes
    in [-127, 127] and the scales (..., 1), with ``x ~ codes * scales``."""
    x = x.float()
    scale = x.abs().amax(dim=-1, keepdim=True) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / scale).clamp(-127, 127), scale


class FakeQuantW8A8(LinearMethod):
    """W8A8 simulated in floating point: the weight as INT8 with one float32 scale per output
    row (``layer.weight`` int8 (N, K), ``layer.weight_scale`` (N,)); each token's activations
    quantized to INT8 on the fly. ``apply`` multiplies the integer codes (exactly, in float32,
    while ``K * 127^2 < 2^24``), then applies both scales."""

    def create_weights(self, layer, out_features, in_features, dtype):
        layer.weight = nn.Parameter(torch.zeros(out_features, in_features, dtype=torch.int8), requires_grad=False)
        layer.weight_scale = nn.Parameter(torch.ones(out_features, dtype=torch.float32), requires_grad=False)
        layer.weight_dtype = dtype or torch.get_default_dtype()

    def load_rows(self, layer, weight, rows):
        q = quantize_scaled(weight.detach(), "int8", "row")  # per-row scales: rows quantize on their own
        with torch.no_grad():
            layer.weight[rows] = q.data.to(layer.weight.device)
            layer.weight_scale[rows] = q.scale.to(layer.weight_scale.device)

    def apply(self, layer, x, bias):
        codes, x_scale = quantize_tokens_int8(x)
        y = (codes @ layer.weight.float().t()) * x_scale * layer.weight_scale
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype)

    def dense_weight(self, layer):
        return (layer.weight.float() * layer.weight_scale[:, None]).to(layer.weight_dtype)


@torch.no_grad()
def apply_fake_w8a8(model: nn.Module) -> list[str]:
    """Swap every dense Linear of ``model`` to :class:`FakeQuantW8A8`, in place (the weights
    quantized per output row). Returns the names of the swapped layers."""
    names = []
    for name in linear_names(model):
        layer: Linear = model.get_submodule(name)
        if not isinstance(layer.method, Dense):
            raise TypeError(f"{name} must be a dense Linear, got {layer.extra_repr()}")
        weight = layer.weight.detach()
        del layer.weight
        method = FakeQuantW8A8()
        with torch.device(weight.device):
            method.create_weights(layer, weight.shape[0], weight.shape[1], weight.dtype)
        method.load_rows(layer, weight, slice(0, weight.shape[0]))
        layer.method = method
        names.append(name)
    return names
