"""Causal self-attention over packed tokens, on a paged KV cache or on none.

The layer receives the projected, rotated queries, keys and values of all new tokens of a
batch, packed along one token dimension, and an :class:`~llmnote.layers.kv_cache.AttentionContext`.
It stores the new keys and values in their cache slots, then attends:

- **decode** (one new token per sequence): ``paged_attention_decode`` reads each sequence's
  keys and values through its block table;
- **prefill** (new sequences): ``flash_attention_varlen`` over the packed tokens, each
  sequence causal within itself, no padding;
- **a chunk after cached tokens**: the sequences' cached and new keys are gathered from
  their slots, then ``flash_attention_varlen`` with the causal mask aligned bottom-right;
- **a mixed step** (a serving engine's): the first ``num_decodes`` sequences have one new token
  each and go to the paged kernel, the others to one of the two paths above.

On a GPU these are the book's Triton kernels; on a CPU, the PyTorch references. Without a
cache, sequences of one length on a CPU, or wherever gradients flow, go to PyTorch's fused
``scaled_dot_product_attention`` as one ``(batch, heads, seq, head_dim)`` batch.
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

from .. import kernels, ref
from ..kernels.attention import decode_splits
from .kv_cache import AttentionContext
from .ops import ops_for

__all__ = ["Attention"]


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


class Attention(nn.Module):
    """Attention of layer ``layer`` (its index in the cache) with grouped-query heads."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, layer: int, scale: float | None = None):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.num_heads, self.num_kv_heads, self.head_dim, self.layer = num_heads, num_kv_heads, head_dim, layer
        self.scale = head_dim**-0.5 if scale is None else scale

    def extra_repr(self) -> str:
        return f"heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, layer={self.layer}"

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        """``q`` (T, Hq, D), ``k`` and ``v`` (T, Hkv, D) -> (T, Hq, D)."""
        ops = ops_for(q)
        on_gpu = ops is kernels
        if ctx.cache is None and ctx.batch_shape is not None and not on_gpu:
            return self._batched_sdpa(q, k, v, *ctx.batch_shape)
        if ctx.cache is None:
            return self._varlen(ops, q, k, v, ctx.cu_seqlens_q, ctx.cu_seqlens_q, ctx.max_seqlen_q, ctx.max_seqlen_q, on_gpu)
        k_cache, v_cache = ctx.cache.k[self.layer], ctx.cache.v[self.layer]
        k_scale, v_scale = ctx.cache.scales(self.layer)
        ops.store_kv(k, v, k_cache, v_cache, ctx.slot_mapping, k_scale, v_scale)
        caches = (k_cache, v_cache, k_scale, v_scale)
        if ctx.decode:
            return self._paged(ops, q, caches, ctx.block_tables, ctx.seq_lens, ctx.max_seqlen_k, on_gpu)
        nd, cu_q = ctx.num_decodes, ctx.cu_seqlens_q
        if nd:  # a mixed step: the leading one-token sequences go to the paged kernel
            decoded = self._paged(ops, q[:nd], caches, ctx.block_tables[:nd], ctx.seq_lens[:nd], ctx.max_seqlen_k, on_gpu)
            q, k, v, cu_q = q[nd:], k[nd:], v[nd:], cu_q[nd:] - nd
        if ctx.key_slots is None:  # only new sequences: their keys are the ones just computed
            out = self._varlen(ops, q, k, v, cu_q, cu_q, ctx.max_seqlen_q, ctx.max_seqlen_q, on_gpu)
        else:
            keys, values = (
                ref.dequantize_kv(
                    cache.view(-1, self.num_kv_heads, self.head_dim)[ctx.key_slots],
                    None if scale is None else scale.view(-1, self.num_kv_heads)[ctx.key_slots],
                    q.dtype,
                )
                for cache, scale in ((k_cache, k_scale), (v_cache, v_scale))
            )
            out = self._varlen(ops, q, keys, values, cu_q, ctx.cu_seqlens_k, ctx.max_seqlen_q, ctx.max_seqlen_k, on_gpu)
        return torch.cat([decoded, out]) if nd else out

    def _paged(self, ops, q, caches, block_tables, seq_lens, max_seqlen_k: int, on_gpu: bool) -> torch.Tensor:
        k_cache, v_cache, k_scale, v_scale = caches
        if not on_gpu:
            return ops.paged_attention_decode(
                q, k_cache, v_cache, block_tables, seq_lens, self.scale, k_scale=k_scale, v_scale=v_scale
            )
        # Told the longest possible sequence, the kernel never reads the lengths back; split
        # each sequence's keys finely enough that a small batch still fills the GPU.
        sms = _sm_count(q.device) if q.is_cuda else 1
        splits = decode_splits(q.shape[0], self.num_kv_heads, max_seqlen_k, sms, min_tokens=64)
        return ops.paged_attention_decode(
            q, k_cache, v_cache, block_tables, seq_lens, self.scale, num_splits=splits, max_seq_len=max_seqlen_k,
            k_scale=k_scale, v_scale=v_scale,
        )

    def _batched_sdpa(self, q, k, v, batch: int, seq: int) -> torch.Tensor:
        """Sequences of one length, as a ``(batch, heads, seq, head_dim)`` batch for PyTorch's
        fused attention: the path that training (which needs gradients) takes."""
        q, k, v = (t.view(batch, seq, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        gqa = self.num_kv_heads != self.num_heads
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale, enable_gqa=gqa)
        return out.transpose(1, 2).reshape(batch * seq, self.num_heads, self.head_dim)

    def _varlen(self, ops, q, k, v, cu_q, cu_k, max_q, max_k, on_gpu: bool) -> torch.Tensor:
        if on_gpu:
            return ops.flash_attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True, sm_scale=self.scale)
        return ops.flash_attention_varlen(q, k, v, cu_q, cu_k, causal=True, sm_scale=self.scale)
