"""AWQ (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization for LLM Compression and
Acceleration"): protect the weights that meet large activations by scaling them up before
rounding.

A few input channels of a Linear carry much larger activations than the rest, and the
weights they multiply matter most to the output. Keeping them in high precision would break
the format, but a per-input-channel scale does the same job inside it: for ``s > 0``,

    y = x W^T = (x / s) (W diag(s))^T,

so quantizing ``W diag(s)`` instead of ``W`` gives a channel with ``s_k > 1`` a finer grid
relative to its weights (its rounding error, divided by ``s_k`` on the way out, shrinks),
while the group's scale barely moves as long as few channels are scaled. The division
``x / s`` costs nothing at run time: it is folded into the op that produced ``x``,

- the RMSNorm's weight before ``qkv_proj`` (``input_layernorm``) and before ``gate_up_proj``
  (``post_attention_layernorm``);
- the ``up`` rows of ``gate_up_proj`` before ``down_proj``: ``silu(gate) * up`` is linear in
  ``up``;
- the ``v`` rows of ``qkv_proj`` before ``o_proj``: attention mixes tokens, not channels, so
  its output is linear in ``v`` per channel. This holds channel for channel only when every
  query head has its own KV head (``num_heads == num_kv_heads``); with grouped-query
  attention one ``v`` row feeds several heads and ``o_proj`` keeps ``s = 1``.

The scale is searched, not learnt: ``s = mean|x|^alpha`` (normalised so that
``sqrt(max(s) * min(s)) = 1``), with ``alpha`` on a grid in ``[0, 1)``, and the ``alpha``
whose round-to-nearest quantization gives the smallest output error on the calibration
tokens wins (``alpha = 0`` is plain RTN, so the search never does worse on them). The output
error of a weight change ``D`` is ``trace(D H D^T)`` with ``H = X^T X / tokens``
(:meth:`~.calibrate.InputStats.hessian`), so each candidate costs one product with ``H``,
whatever the number of tokens.

Then a **clipping** search, per row and group: shrinking the grid's range to
``[shrink * min, shrink * max]`` clips a few large weights but rounds all the others more
finely; each (row, group) keeps the shrink with the smallest output error of its group
(the group's block of ``H``).

The model's float weights are rescaled in place (norms, Linears), computing the same
function as before; the quantized weights returned belong to that rescaled model.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from .calibrate import HiddenStates, InputStats, check_quantizable, layer_linears, recording
from .formats import QuantizedWeight, group_params, quantize_weight

__all__ = ["awq_model", "search_scale", "search_clip", "clip_groups", "output_error", "fake_quantize"]


def output_error(delta: torch.Tensor, hessian: torch.Tensor) -> torch.Tensor:
    """Mean squared output error per token, ``trace(D H D^T)``, of a weight change ``D`` (N, K)."""
    return ((delta @ hessian) * delta).sum()


def clip_groups(w: torch.Tensor, group_size: int, shrink: torch.Tensor) -> torch.Tensor:
    """``w`` (N, K) with each (row, group) clipped to ``[shrink * min, shrink * max]`` (the range
    widened to contain 0, as the grid's is), ``shrink`` (N, K // group_size) in (0, 1]; float32."""
    n, k = w.shape
    g = w.float().view(n, k // group_size, group_size)
    lo = g.amin(dim=-1, keepdim=True).clamp(max=0) * shrink[..., None]
    hi = g.amax(dim=-1, keepdim=True).clamp(min=0) * shrink[..., None]
    return torch.maximum(torch.minimum(g, hi), lo).view(n, k)


def fake_quantize(
    w: torch.Tensor, bits: int, group_size: int, symmetric: bool = False, shrink: torch.Tensor | None = None
) -> torch.Tensor:
    """What RTN makes of ``w`` (N, K), optionally clipped first (:func:`clip_groups`): the
    dequantized weight in float32, without packing (a search evaluates many candidates)."""
    n, k = w.shape
    if shrink is not None:
        w = clip_groups(w, group_size, shrink)
    scale, zero = group_params(w, bits, group_size, symmetric)
    g = w.float().view(n, k // group_size, group_size)
    q = torch.clamp(torch.round(g / scale[..., None]) + zero[..., None], 0, 2**bits - 1)  # as codes_for
    return ((q - zero[..., None]) * scale[..., None]).view(n, k)


def search_scale(
    weight: torch.Tensor, stats: InputStats, bits: int, group_size: int, grid: int = 20, symmetric: bool = False
) -> tuple[torch.Tensor, float]:
    """AWQ's per-input-channel scale ``s`` (K,) for ``weight`` (N, K) and the ``alpha`` chosen."""
    if not isinstance(grid, int) or grid < 1:
        raise ValueError(f"grid must be a positive int, got {grid!r}")
    w, h = weight.float(), stats.hessian()
    importance = stats.mean_abs.clamp(min=1e-8)
    best = (float("inf"), None, 0.0)
    for alpha in (i / grid for i in range(grid)):
        s = importance**alpha
        s = s / (s.max() * s.min()).sqrt()
        deq = fake_quantize(w * s, bits, group_size, symmetric) / s
        err = float(output_error(w - deq, h))
        if err < best[0]:
            best = (err, s, alpha)
    return best[1], best[2]


def search_clip(
    weight: torch.Tensor, stats: InputStats, bits: int, group_size: int, symmetric: bool = False, steps: int = 10
) -> torch.Tensor:
    """The shrink (N, K // group_size) of each (row, group) of ``weight`` among ``1, 0.95, ..``
    (``steps`` values down to 0.55) with the smallest output error of that group."""
    n, k = weight.shape
    w, h = weight.float(), stats.hessian()
    groups = k // group_size
    blocks = torch.stack([h[i * group_size : (i + 1) * group_size, i * group_size : (i + 1) * group_size] for i in range(groups)])
    best_err = torch.full((n, groups), float("inf"), device=w.device)
    best = torch.ones(n, groups, device=w.device)
    for i in range(steps):
        shrink = torch.full((n, groups), 1.0 - 0.05 * i, device=w.device)
        delta = (w - fake_quantize(w, bits, group_size, symmetric, shrink)).view(n, groups, group_size)
        err = torch.einsum("ngk,gkl,ngl->ng", delta, blocks, delta)
        better = err < best_err
        best_err, best = torch.where(better, err, best_err), torch.where(better, shrink, best)
    return best


def _scale_inputs(consumer: nn.Module, s: torch.Tensor, producer: nn.Module, rows: slice | None = None) -> None:
    """Multiply ``consumer``'s weight columns by ``s`` and divide what ``producer`` makes by ``s``:
    a norm's weight, or the output ``rows`` (and bias) of a Linear."""
    consumer.weight.copy_(consumer.weight.float() * s[None, :])
    if rows is None:
        producer.weight.copy_(producer.weight.float() / s)
        return
    producer.weight[rows] = producer.weight[rows].float() / s[:, None]
    if getattr(producer, "bias", None) is not None:
        producer.bias[rows] = producer.bias[rows].float() / s


def _part(linear: nn.Module, index: int) -> slice:
    start = sum(linear.local_sizes[:index])
    return slice(start, start + linear.local_sizes[index])


@torch.no_grad()
def awq_model(
    model: nn.Module,
    ids: torch.Tensor,
    bits: int = 4,
    group_size: int = 128,
    grid: int = 20,
    progress: bool = True,
    *,
    symmetric: bool = False,
    clip: bool = True,
    batch_size: int = 8,
) -> dict[str, QuantizedWeight]:
    """AWQ of every Linear of ``model`` on the calibration windows ``ids`` ``(n, seq_len)``.

    Layer by layer: gather the inputs' statistics, search and fold the scales (in place: the
    float model computes the same function afterwards), search the clipping (``clip``), and
    quantize. Each layer's inputs come from the float layers before it (AWQ changes no float
    function, so it has no errors to pass on). Returns ``{linear name: QuantizedWeight}`` of the
    *rescaled* weights, to be used with the rescaled norms and Linears the model now holds.
    """
    check_quantizable(model, bits, group_size)
    config = model.config
    result: dict[str, QuantizedWeight] = {}
    states = HiddenStates.embed(model, ids, batch_size)
    layers = model.model.layers
    for i in tqdm(range(len(layers)), desc="AWQ", disable=not progress):
        layer = layers[i]
        linears = layer_linears(model, i)
        with recording(linears) as stats:
            states.through(layer)
        attn, mlp = layer.self_attn, layer.mlp
        # (the Linear whose inputs are scaled, the op that makes those inputs, its output rows)
        pairs = [(attn.qkv_proj, layer.input_layernorm, None)]
        if config.num_heads == config.num_kv_heads:
            pairs.append((attn.o_proj, attn.qkv_proj, _part(attn.qkv_proj, 2)))  # the v rows
        pairs.append((mlp.gate_up_proj, layer.post_attention_layernorm, None))
        pairs.append((mlp.down_proj, mlp.gate_up_proj, _part(mlp.gate_up_proj, 1)))  # the up rows
        name_of = {module: name for name, module in linears.items()}
        for consumer, producer, rows in pairs:
            name = name_of[consumer]
            s, _ = search_scale(consumer.weight, stats[name], bits, group_size, grid, symmetric)
            _scale_inputs(consumer, s, producer, rows)
            stats[name] = stats[name].divided(s)
        for name, linear in linears.items():  # every scale is folded: quantize the final weights
            w = linear.weight
            if clip:
                w = clip_groups(w, group_size, search_clip(w, stats[name], bits, group_size, symmetric)).to(w.dtype)
            result[name] = quantize_weight(w, bits, group_size, symmetric)
        states = states.through(layer)
    return result
