"""Writing keys and values into a paged KV cache (the reference of ``kernels.store_kv``),
optionally quantized to 8 bits as they are written."""

from __future__ import annotations

import torch

from .._checks import KV_QUANT_MAX, check_store_kv

__all__ = ["store_kv", "quantize_kv", "dequantize_kv"]


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (T, H, D) -> ``(data (T, H, D) in dtype, scale (T, H) float32)``: one absmax scale
    per token and head, so that ``x ~ data * scale``. INT8 rounds half away from zero (the
    kernel's rounding); FP8 E4M3 rounds to nearest even."""
    top = KV_QUANT_MAX[dtype]
    scale = x.float().abs().amax(dim=-1) / top
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    y = x.float() / scale[..., None]
    if dtype == torch.int8:
        return (torch.sign(y) * torch.floor(y.abs() + 0.5)).clamp(-top, top).to(torch.int8), scale
    return y.clamp(-top, top).to(dtype), scale


def dequantize_kv(data: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """The inverse of :func:`quantize_kv` (``scale`` None: ``data`` is not quantized)."""
    return data if scale is None else (data.float() * scale[..., None]).to(dtype)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Copy token ``t``'s keys and values ``k[t]``, ``v[t]`` (Hkv, D) into slot
    ``slot_mapping[t]`` of the caches (num_blocks, block_size, Hkv, D), where slot
    ``s`` is offset ``s % block_size`` of block ``s // block_size``; a slot of -1 skips the
    token (a padding row). An INT8 or FP8 cache stores the values quantized per token and
    head, their scales in ``k_scale``/``v_scale`` (num_blocks, block_size, Hkv) float32.
    In place; returns nothing."""
    check_store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    if slots.numel() and int(slots.max()) >= k_cache.shape[0] * k_cache.shape[1]:
        raise ValueError(f"slot {int(slots.max())} is outside a cache of {k_cache.shape[0] * k_cache.shape[1]} slots")
    for x, cache, scales in ((k, k_cache, k_scale), (v, v_cache, v_scale)):
        if scales is None:
            cache.view(-1, *cache.shape[2:])[slots] = x[keep]
        else:
            data, scale = quantize_kv(x[keep], cache.dtype)
            cache.view(-1, *cache.shape[2:])[slots] = data
            scales.view(-1, scales.shape[2])[slots] = scale
