"""Writing a step's keys and values into a paged KV cache, optionally quantized.

Each new token owns a *slot*: offset ``slot % block_size`` of physical block
``slot // block_size``. The engine (or the model's cache) computes the slots from the
sequences' block tables; the kernel only copies, one program per token, so the same
launch serves a prefill of thousands of tokens and a decode step of one token per sequence.

An INT8 or FP8 (E4M3) cache halves the bytes every later decode step reads. The kernel then
quantizes as it writes: one absmax scale per token and head (``D`` values share it), stored
beside the cache in float32, so a token's scale is fixed when it is written and never
revisited (a per-tensor scale would have to be known in advance).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from .._checks import KV_QUANT_MAX, check_store_kv
from .common import check_device

__all__ = ["store_kv"]


@triton.jit
def _store_one(x_ptr, cache_ptr, scale_ptr, t, slot, stride_t, stride_h, heads, D,
               QUANT: tl.constexpr, QMAX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < heads) & (d < D)
    x = tl.load(x_ptr + t * stride_t + h * stride_h + d, mask=mask, other=0.0)
    dst = slot * heads * D + h * D + d  # caches are contiguous (num_blocks, block_size, heads, D)
    if QUANT == 0:
        tl.store(cache_ptr + dst, x, mask=mask)
    else:
        xf = x.to(tl.float32)
        scale = tl.max(tl.abs(xf), axis=1) / QMAX  # one scale per head
        scale = tl.where(scale > 0.0, scale, 1.0)
        y = xf / scale[:, None]
        if QUANT == 1:  # INT8: round half away from zero
            y = tl.where(y >= 0.0, tl.floor(y + 0.5), -tl.floor(0.5 - y))
        y = tl.minimum(tl.maximum(y, -QMAX), QMAX)
        tl.store(cache_ptr + dst, y.to(cache_ptr.dtype.element_ty), mask=mask)
        hs = tl.arange(0, BLOCK_H)
        tl.store(scale_ptr + slot * heads + hs, scale, mask=hs < heads)


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, ks_ptr, vs_ptr, slot_ptr, stride_kt, stride_kh, stride_vt, stride_vh, heads, D,
    QUANT: tl.constexpr, QMAX: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    if slot >= 0:  # -1 marks a padding token
        _store_one(k_ptr, kc_ptr, ks_ptr, t, slot, stride_kt, stride_kh, heads, D, QUANT, QMAX, BLOCK_H, BLOCK_D)
        _store_one(v_ptr, vc_ptr, vs_ptr, t, slot, stride_vt, stride_vh, heads, D, QUANT, QMAX, BLOCK_H, BLOCK_D)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Copy ``k``, ``v`` (T, Hkv, D) into their slots of contiguous caches (num_blocks,
    block_size, Hkv, D); ``slot_mapping`` (T,) int64, -1 to skip a token. An INT8 or FP8
    cache is written quantized, with per-token, per-head scales into ``k_scale``/``v_scale``
    (num_blocks, block_size, Hkv) float32. In place. The slots are not validated (reading
    them back would stall a GPU decode step): pass slots inside the cache."""
    check_store_kv(k, v, k_cache, v_cache, slot_mapping, k_scale, v_scale)
    check_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("store_kv needs contiguous caches and k, v with a contiguous last dimension")
    quant = {torch.int8: 1, torch.float8_e4m3fn: 2}.get(k_cache.dtype, 0)
    if k_cache.dtype == torch.float8_e4m3fn and not runtime.interpreting():
        runtime.require_capability((8, 9), "an FP8 KV cache")
    T, H, D = k.shape
    if T:
        _store_kv_kernel[(T,)](
            k, v, k_cache, v_cache, k_scale if quant else k_cache, v_scale if quant else v_cache, slot_mapping,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), H, D,
            QUANT=quant, QMAX=KV_QUANT_MAX.get(k_cache.dtype, 0.0),
            BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(D), num_warps=1 if H * D <= 1024 else 4,
        )
