"""GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
Pre-trained Transformers"): round one column at a time and let the columns not yet rounded
absorb the error.

For a Linear with weight ``W`` (N, K) and calibration inputs ``X`` (tokens, K), the output error
of a quantized ``Ŵ`` is ``trace((W - Ŵ) H (W - Ŵ)^T)`` with ``H = X^T X``: each row is an
independent least-squares problem sharing one ``H``. Optimal Brain Quantization answers it
greedily: quantize input column ``j`` (every row at once), then move the remaining columns to
cancel the error that rounding made,

    e = (w_j - q_j) / [H^-1]_jj,        w_k -= e [H^-1]_jk   for the columns k after j,

and remove ``j`` from ``H^-1``. GPTQ makes this practical:

1. **One fixed order** of columns for every row, so every row shares the same sequence of
   inverses. Those inverses are the rows of the upper Cholesky factor ``U`` of ``H^-1``
   (``H^-1 = U^T U``): the update for column ``j`` is ``e = (w_j - q_j) / U_jj`` and
   ``w_k -= e U_jk``. No matrix is inverted inside the loop.
2. **Lazy blocks.** The updates of a block of ``block_size`` columns go to the columns of the
   block at once (a rank-1 update each), and to the rest of the matrix once per block
   (``W[:, after] -= E U[block, after]``, one matrix product), which reads ``W`` once per
   block instead of once per column.
3. **Dampening.** ``H`` gets ``damp * mean(diag H)`` added to its diagonal so that the
   Cholesky factorisation is stable; an input channel that is always zero (``H_jj = 0``)
   gets ``H_jj = 1`` and a zero weight, since nothing it multiplies reaches the output.

Group scales and zero points (the format of :class:`~.formats.QuantizedWeight`) are chosen
when the loop reaches a group's first column, from the group's weights *as updated so far*:
the errors already pushed into them are part of what the grid must cover.

``act_order=True`` visits the columns in decreasing ``diag(H)`` (the inputs with the most
energy first, while many columns remain to absorb their error). The groups of the format are
still consecutive input channels, visited out of order; here every group's scale and zero
point are then fixed up front from the original weights, the simplest choice that keeps the
stored format unchanged.

:func:`gptq_model` quantizes a whole model layer by layer: the Hessians of decoder layer ``i``
come from inputs that went through the already quantized layers before it, so each layer
also corrects the errors of the ones before.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from .calibrate import HiddenStates, check_quantizable, layer_linears, linear_names, recording
from .formats import QuantizedWeight, check_group, group_params, make_quantized

__all__ = ["gptq_quantize", "gptq_model"]


def _inverse_cholesky(h: torch.Tensor, damp: float) -> torch.Tensor:
    """The upper Cholesky factor ``U`` of ``(H + damp * mean(diag H) * I)^-1``, float32."""
    h = h.double().clone()
    h.diagonal().add_(damp * h.diagonal().mean())
    lower, info = torch.linalg.cholesky_ex(h)
    if info != 0:
        raise ValueError(f"the Hessian is not positive definite even with damp={damp}: raise damp")
    return torch.linalg.cholesky(torch.cholesky_inverse(lower), upper=True).float()


@torch.no_grad()
def gptq_quantize(
    w: torch.Tensor,
    hessian: torch.Tensor,
    bits: int = 4,
    group_size: int = 128,
    symmetric: bool = False,
    block_size: int = 128,
    damp: float = 0.01,
    act_order: bool = False,
) -> QuantizedWeight:
    """GPTQ of an ``(N, K)`` weight given the ``(K, K)`` Hessian proxy ``X^T X`` of its inputs
    (or any positive multiple of it, such as the mean over tokens: the damping is relative).
    Returns a :class:`QuantizedWeight`
    in ``w``'s dtype whose ``dequantize()`` is the GPTQ result."""
    if not isinstance(w, torch.Tensor) or not w.is_floating_point():
        raise TypeError(f"w must be a floating-point tensor, got {type(w).__name__}")
    check_group(tuple(w.shape), bits, group_size)
    n, k = w.shape
    if not isinstance(hessian, torch.Tensor) or tuple(hessian.shape) != (k, k) or not hessian.is_floating_point():
        raise ValueError(f"hessian must be a floating-point ({k}, {k}) tensor, got {getattr(hessian, 'shape', hessian)}")
    if not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    if damp < 0:
        raise ValueError(f"damp must be >= 0, got {damp}")

    weight = w.detach().float().clone()
    h = hessian.detach().to(weight.device, torch.float64).clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1.0
    weight[:, dead] = 0.0

    groups, top = k // group_size, 2**bits - 1
    if act_order:  # every group's grid fixed now, from the original weights
        scale, zero = (p.t().contiguous() for p in group_params(weight.to(w.dtype), bits, group_size, symmetric))
        order = torch.argsort(h.diagonal(), descending=True)
        weight, h = weight[:, order], h[order][:, order]
    else:
        scale = torch.empty(groups, n, device=w.device)
        zero = torch.empty(groups, n, device=w.device)
        order = torch.arange(k, device=w.device)
    group_of = (order // group_size).tolist()  # the group of the column at each position
    u = _inverse_cholesky(h, damp)
    u_diag = u.diagonal().tolist()
    # Work on W^T (K, N): input column j of W is the contiguous row wt[j].
    wt = weight.t().contiguous()
    codes = torch.empty(k, n, device=w.device)

    for b0 in range(0, k, block_size):
        b1 = min(b0 + block_size, k)
        errors = torch.zeros(b1 - b0, n, device=w.device)  # the scaled errors of this block's columns
        for j in range(b0, b1):
            g = group_of[j]
            if not act_order and j % group_size == 0:  # a group starts: its grid from the updated weights
                end = j + group_size
                cols = wt[j:end].clone()
                if end > b1:  # columns past the block have not yet received this block's updates
                    cols[b1 - j :] -= u[b0:j, b1:end].t() @ errors[: j - b0]
                s, z = group_params(cols.t().to(w.dtype), bits, group_size, symmetric)
                scale[g], zero[g] = s[:, 0], z[:, 0]
            q = torch.clamp(torch.round(wt[j] / scale[g]) + zero[g], 0, top)  # the rounding of codes_for
            codes[j] = q
            e = (wt[j] - (q - zero[g]) * scale[g]) / u_diag[j]
            wt[j + 1 : b1].addr_(u[j, j + 1 : b1], e, alpha=-1.0)  # within the block: at once
            errors[j - b0] = e
        wt[b1:].addmm_(u[b0:b1, b1:].t(), errors, alpha=-1.0)  # after the block: once per block

    natural = torch.empty(n, k, dtype=torch.uint8, device=w.device)
    natural[:, order] = codes.t().to(torch.uint8)
    scale, zero = scale.t(), zero.t()
    return make_quantized(w, natural, scale, zero, bits, group_size)


@torch.no_grad()
def gptq_model(
    model: nn.Module,
    ids: torch.Tensor,
    bits: int = 4,
    group_size: int = 128,
    symmetric: bool = False,
    progress: bool = True,
    *,
    block_size: int = 128,
    damp: float = 0.01,
    act_order: bool = False,
    true_sequential: bool = False,
    batch_size: int = 8,
) -> dict[str, QuantizedWeight]:
    """GPTQ of every Linear of ``model`` on the calibration windows ``ids`` ``(n, seq_len)``.

    Decoder layers are quantized in order. The inputs of layer ``i`` are the outputs of layers
    ``0 .. i-1`` *with their quantized weights*, so later layers see, and compensate, the errors
    of earlier ones. The four Hessians of a layer come from one pass over its inputs; with
    ``true_sequential`` the Linears inside a layer are quantized one after the other instead
    (``qkv_proj``, ``o_proj``, ``gate_up_proj``, ``down_proj``), each Hessian gathered after
    the ones before it were quantized, at the cost of a pass per Linear.

    Returns ``{linear name: QuantizedWeight}``. The model's weights are left as they were (the
    dequantized weights stand in for the float ones only while the function runs).
    """
    check_quantizable(model, bits, group_size)
    originals = {name: model.get_submodule(name).weight.detach().clone() for name in linear_names(model)}
    result: dict[str, QuantizedWeight] = {}
    states = HiddenStates.embed(model, ids, batch_size)
    layers = model.model.layers
    try:
        for i in tqdm(range(len(layers)), desc="GPTQ", disable=not progress):
            linears = layer_linears(model, i)
            stages = [[name] for name in linears] if true_sequential else [list(linears)]
            for stage in stages:
                with recording({name: linears[name] for name in stage}) as stats:
                    states.through(layers[i])
                for name in stage:
                    weight = linears[name].weight
                    q = gptq_quantize(weight, stats[name].hessian(), bits, group_size, symmetric, block_size, damp, act_order)
                    weight.copy_(q.dequantize())
                    result[name] = q
            states = states.through(layers[i])
    finally:
        for name, value in originals.items():
            model.get_submodule(name).weight.copy_(value)
    return result
