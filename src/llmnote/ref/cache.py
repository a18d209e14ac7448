"""Writing keys and values into a paged KV cache (the reference of ``kernels.store_kv``)."""

from __future__ import annotations

import torch

from .._checks import check_store_kv

__all__ = ["store_kv"]


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Copy token ``t``'s keys and values ``k[t]``, ``v[t]`` (Hkv, D) into slot
    ``slot_mapping[t]`` of the caches (num_blocks, block_size, Hkv, D), where slot
    ``s`` is offset ``s % block_size`` of block ``s // block_size``; a slot of -1 skips the
    token (a padding row). In place; returns nothing."""
    check_store_kv(k, v, k_cache, v_cache, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    if slots.numel() and int(slots.max()) >= k_cache.shape[0] * k_cache.shape[1]:
        raise ValueError(f"slot {int(slots.max())} is outside a cache of {k_cache.shape[0] * k_cache.shape[1]} slots")
    k_cache.view(-1, *k_cache.shape[2:])[slots] = k[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = v[keep]
