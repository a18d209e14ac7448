"""Attention references: the contract's ``flash_attention`` and ``paged_attention_decode``
semantics in plain PyTorch (float32 math), ``flash_attention_varlen`` over sequences packed
along the token dimension, and DeepSeek's multi-head latent attention (MLA) in its naive and
its weight-absorbed form."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import FLOAT_DTYPES, check_cu_seqlens, check_paged, check_qkv, check_tensor, check_varlen
from .cache import dequantize_kv
from .ops import apply_rope

__all__ = [
    "flash_attention",
    "flash_attention_varlen",
    "paged_attention_decode",
    "MLAWeights",
    "mla_random_weights",
    "mla_naive",
    "mla_absorbed",
]


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """``softmax(q k^T * sm_scale) v`` for q ``(B, Hq, Sq, D)``, k/v ``(B, Hkv, Skv, D)``.

    Grouped-query heads: query head ``h`` uses key/value head ``h // (Hq // Hkv)``.
    ``causal`` masks bottom-right aligned: query ``i`` sees key ``j`` iff
    ``j <= i + (Skv - Sq)``. ``sm_scale`` defaults to ``D ** -0.5``. Returns q's dtype.
    """
    check_qkv(q, k, v)
    group = q.shape[1] // k.shape[1]
    scale = q.shape[-1] ** -0.5 if sm_scale is None else sm_scale
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    scores = q.float() @ kf.transpose(-1, -2) * scale
    if causal:
        sq, skv = q.shape[2], k.shape[2]
        allowed = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril(diagonal=skv - sq)
        scores = scores.masked_fill(~allowed, float("-inf"))
    # A query row that sees no key (possible when Sq > Skv) gives zeros rather than NaN.
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return (probs @ vf).to(q.dtype)


def _gather(cache: torch.Tensor, scale: torch.Tensor | None, blocks: torch.Tensor, n: int, dtype: torch.dtype) -> torch.Tensor:
    """The first ``n`` tokens held in ``blocks`` of a paged cache, ``(n, Hkv, D)`` in ``dtype``."""
    data = cache[blocks].reshape(-1, *cache.shape[2:])[:n]
    return dequantize_kv(data, None if scale is None else scale[blocks].reshape(-1, scale.shape[2])[:n], dtype)


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence against a paged KV cache.

    q ``(B, Hq, D)``; caches ``(num_blocks, block_size, Hkv, D)``; ``block_tables[b, i]`` is
    the physical block holding tokens ``[i * block_size, (i + 1) * block_size)`` of
    sequence ``b``; ``seq_lens[b]`` its length. An INT8 or FP8 cache comes with its scales
    ``k_scale``/``v_scale`` (num_blocks, block_size, Hkv) and is dequantized as it is read.
    Returns ``(B, Hq, D)``.
    """
    check_paged(q, k_cache, v_cache, block_tables, seq_lens, k_scale=k_scale, v_scale=v_scale)
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        blocks = block_tables[b, : -(-n // block_size)].long()
        k, v = (_gather(cache, scale, blocks, n, q.dtype) for cache, scale in ((k_cache, k_scale), (v_cache, v_scale)))
        out[b] = flash_attention(
            q[b, :, None, None].transpose(0, 1), k.permute(1, 0, 2)[None], v.permute(1, 0, 2)[None], sm_scale=sm_scale
        )[0, :, 0]
    return out


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    causal: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """``flash_attention`` over ``B`` sequences packed along the token dimension, with no padding
    (FlashAttention-2's variable-length layout, as a serving engine prefills several prompts).

    q ``(total_q, Hq, D)``, k and v ``(total_k, Hkv, D)`` with ``Hq % Hkv == 0``;
    ``cu_seqlens_q`` and ``cu_seqlens_k`` int32 ``(B + 1,)`` cumulative offsets from 0:
    sequence ``b`` owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]`` and key rows
    ``cu_seqlens_k[b]:cu_seqlens_k[b + 1]``, and attends to its own keys only. ``causal`` is
    bottom-right aligned per sequence: its query ``i`` sees its key ``j`` iff
    ``j <= i + (len_k - len_q)`` (queries that continue cached keys, as in chunked prefill).
    A sequence may have no queries; one that has queries needs keys, and with ``causal`` at
    least as many keys as queries, so that every query sees a key (``ValueError`` otherwise).
    ``sm_scale`` defaults to ``D ** -0.5``. Returns ``(total_q, Hq, D)`` in q's dtype.
    """
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k)
    cu_q, cu_k = check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, q.shape[0], k.shape[0], causal)
    out = torch.empty_like(q)
    for b in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if rows.stop > rows.start:  # each sequence on its own: (1, H, S, D) views of its rows
            seq = [t[s].transpose(0, 1)[None] for t, s in ((q, rows), (k, keys), (v, keys))]
            out[rows] = flash_attention(*seq, causal=causal, sm_scale=sm_scale)[0].transpose(0, 1)
    return out


@dataclass
class MLAWeights:
    """Multi-head latent attention (DeepSeek-V2, 2024), without its latent RMSNorms.

    Queries and keys/values pass through low-rank latents: ``c_q = w_dq x`` and
    ``c_kv = w_dkv x``; per head, ``q_c = w_uq c_q``, ``k_c = w_uk c_kv``, ``v = w_uv c_kv``.
    Position enters through separate RoPE parts: ``q_r = rope(w_qr c_q)`` per head and one
    ``k_r = rope(w_kr x)`` shared by all heads. The cache holds only ``c_kv`` and ``k_r``.
    """

    heads: int
    head_dim: int  # d_h of the content part
    rope_dim: int  # d_r of the decoupled RoPE part
    w_dq: torch.Tensor  # (q_rank, hidden)
    w_uq: torch.Tensor  # (heads * head_dim, q_rank)
    w_qr: torch.Tensor  # (heads * rope_dim, q_rank)
    w_dkv: torch.Tensor  # (kv_rank, hidden)
    w_uk: torch.Tensor  # (heads * head_dim, kv_rank)
    w_uv: torch.Tensor  # (heads * head_dim, kv_rank)
    w_kr: torch.Tensor  # (rope_dim, hidden)
    w_o: torch.Tensor  # (hidden, heads * head_dim)


def mla_random_weights(
    hidden: int = 64,
    heads: int = 4,
    head_dim: int = 16,
    rope_dim: int = 8,
    q_rank: int = 24,
    kv_rank: int = 12,
    generator: torch.Generator | None = None,
) -> MLAWeights:
    def w(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=generator) / cols**0.5

    return MLAWeights(
        heads,
        head_dim,
        rope_dim,
        w(q_rank, hidden),
        w(heads * head_dim, q_rank),
        w(heads * rope_dim, q_rank),
        w(kv_rank, hidden),
        w(heads * head_dim, kv_rank),
        w(heads * head_dim, kv_rank),
        w(rope_dim, hidden),
        w(hidden, heads * head_dim),
    )


def _mla_parts(x: torch.Tensor, w: MLAWeights, cos: torch.Tensor, sin: torch.Tensor):
    b, s, _ = x.shape
    check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=3)
    c_q = x @ w.w_dq.T
    q_c = (c_q @ w.w_uq.T).view(b, s, w.heads, w.head_dim).transpose(1, 2)  # (b, h, s, d_h)
    q_r = apply_rope((c_q @ w.w_qr.T).view(b, s, w.heads, w.rope_dim).transpose(1, 2), cos, sin)
    c_kv = x @ w.w_dkv.T  # (b, s, kv_rank): what the cache stores
    k_r = apply_rope((x @ w.w_kr.T)[:, None], cos, sin)  # (b, 1, s, d_r), shared by the heads
    return q_c, q_r, c_kv, k_r


def _causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    s = scores.shape[-1]
    mask = torch.ones(s, s, dtype=torch.bool, device=scores.device).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def mla_naive(x: torch.Tensor, w: MLAWeights, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Causal MLA over ``x`` ``(B, S, hidden)``, materialising per-head keys and values."""
    b, s, _ = x.shape
    q_c, q_r, c_kv, k_r = _mla_parts(x, w, cos, sin)
    k_c = (c_kv @ w.w_uk.T).view(b, s, w.heads, w.head_dim).transpose(1, 2)
    v = (c_kv @ w.w_uv.T).view(b, s, w.heads, w.head_dim).transpose(1, 2)
    q = torch.cat([q_c, q_r], dim=-1)
    k = torch.cat([k_c, k_r.expand(b, w.heads, s, w.rope_dim)], dim=-1)
    probs = _causal_softmax(q @ k.transpose(-1, -2) / (w.head_dim + w.rope_dim) ** 0.5)
    out = (probs @ v).transpose(1, 2).reshape(b, s, w.heads * w.head_dim)
    return out @ w.w_o.T


def mla_absorbed(x: torch.Tensor, w: MLAWeights, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The same function computed against the latent cache only: ``w_uk`` is absorbed into
    the queries (``q_c . (w_uk c) = (w_uk^T q_c) . c``) and ``w_uv`` is applied after the
    attention-weighted sum of latents, so no per-head key or value is ever formed."""
    b, s, _ = x.shape
    q_c, q_r, c_kv, k_r = _mla_parts(x, w, cos, sin)
    w_uk = w.w_uk.view(w.heads, w.head_dim, -1)  # (h, d_h, kv_rank)
    w_uv = w.w_uv.view(w.heads, w.head_dim, -1)
    q_latent = torch.einsum("bhsd,hdr->bhsr", q_c, w_uk)  # queries in latent space
    scores = torch.einsum("bhsr,btr->bhst", q_latent, c_kv) + q_r @ k_r.transpose(-1, -2)
    probs = _causal_softmax(scores / (w.head_dim + w.rope_dim) ** 0.5)
    latent_out = torch.einsum("bhst,btr->bhsr", probs, c_kv)
    out = torch.einsum("bhsr,hdr->bshd", latent_out, w_uv).reshape(b, s, w.heads * w.head_dim)
    return out @ w.w_o.T
