"""Attention references: the contract's ``flash_attention`` and ``paged_attention_decode``
semantics in plain PyTorch (float32 math), and DeepSeek's multi-head latent attention
(MLA) in its naive and its weight-absorbed form."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._checks import FLOAT_DTYPES, check_tensor
from .ops import apply_rope

__all__ = [
    "flash_attention",
    "paged_attention_decode",
    "check_qkv",
    "check_paged",
    "MLAWeights",
    "mla_random_weights",
    "mla_naive",
    "mla_absorbed",
]


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The contract's shape, head-count, dtype and device rules for ``flash_attention``."""
    check_tensor("q", q, ndim=4)
    check_tensor("k", k, ndim=4)
    check_tensor("v", v, ndim=4)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q (B, Hq, Sq, D) and k (B, Hkv, Skv, D) must share B and D, got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise TypeError("q, k and v must share dtype and device")


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


def check_paged(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    check_values: bool = True,
) -> None:
    """The contract's rules for ``paged_attention_decode``. ``check_values`` also reads
    ``seq_lens`` back (a host synchronisation) to check every length fits its table row."""
    check_tensor("q", q, ndim=3)
    check_tensor("k_cache", k_cache, ndim=4)
    check_tensor("v_cache", v_cache, ndim=4)
    check_tensor("block_tables", block_tables, dtypes=(torch.int32, torch.int64), ndim=2)
    check_tensor("seq_lens", seq_lens, dtypes=(torch.int32, torch.int64), ndim=1)
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"caches must be (num_blocks, block_size, Hkv, D) alike with D={q.shape[2]}")
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k_cache.shape[2]})")
    if block_tables.shape[0] != q.shape[0] or seq_lens.shape[0] != q.shape[0]:
        raise ValueError("block_tables and seq_lens need one row per sequence of q")
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"q, k_cache and v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if check_values and q.shape[0]:
        if int(seq_lens.min()) < 1 or int(seq_lens.max()) > block_tables.shape[1] * k_cache.shape[1]:
            raise ValueError("every seq_len must be >= 1 and fit in its row of block_tables")


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """One query token per sequence against a paged KV cache.

    q ``(B, Hq, D)``; caches ``(num_blocks, block_size, Hkv, D)``; ``block_tables[b, i]`` is
    the physical block holding tokens ``[i * block_size, (i + 1) * block_size)`` of
    sequence ``b``; ``seq_lens[b]`` its length. Returns ``(B, Hq, D)``.
    """
    check_paged(q, k_cache, v_cache, block_tables, seq_lens)
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        n = int(seq_lens[b])
        blocks = block_tables[b, : -(-n // block_size)].long()
        k = k_cache[blocks].reshape(-1, *k_cache.shape[2:])[:n]  # (n, Hkv, D)
        v = v_cache[blocks].reshape(-1, *v_cache.shape[2:])[:n]
        out[b] = flash_attention(
            q[b, :, None, None].transpose(0, 1), k.permute(1, 0, 2)[None], v.permute(1, 0, 2)[None], sm_scale=sm_scale
        )[0, :, 0]
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
