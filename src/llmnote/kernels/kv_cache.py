"""Writing a step's keys and values into a paged KV cache.

Each new token owns a *slot*: offset ``slot % block_size`` of physical block
``slot // block_size``. The engine (or the model's cache) computes the slots from the
sequences' block tables; the kernel only copies, one program per token, so the same
launch serves a prefill of thousands of tokens and a decode step of one token per sequence.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._checks import check_store_kv
from .common import check_device

__all__ = ["store_kv"]


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_kt, stride_kh, stride_vt, stride_vh, heads, D,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t)
    if slot >= 0:  # -1 marks a padding token
        h = tl.arange(0, BLOCK_H)[:, None]
        d = tl.arange(0, BLOCK_D)[None, :]
        mask = (h < heads) & (d < D)
        dst = slot * heads * D + h * D + d  # caches are contiguous (num_blocks, block_size, heads, D)
        tl.store(kc_ptr + dst, tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask), mask=mask)
        tl.store(vc_ptr + dst, tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask), mask=mask)


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Copy ``k``, ``v`` (T, Hkv, D) into their slots of contiguous caches (num_blocks,
    block_size, Hkv, D); ``slot_mapping`` (T,) int64, -1 to skip a token. In place. The
    slots are not validated (reading them back would stall a GPU decode step): pass slots
    inside the cache."""
    check_store_kv(k, v, k_cache, v_cache, slot_mapping)
    check_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("store_kv needs contiguous caches and k, v with a contiguous last dimension")
    T, H, D = k.shape
    if T:
        _store_kv_kernel[(T,)](
            k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1), H, D,
            BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(D), num_warps=1 if H * D <= 1024 else 4,
        )
