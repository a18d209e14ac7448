"""Paged decode attention in Triton.

``paged_attention_decode`` computes one query token per sequence against a KV cache stored
in fixed-size pages (vLLM's PagedAttention, Kwon et al., 2023). One program serves all the
query heads of one key/value head (so each cached key is read once per group, not once
per query head) and gathers its pages through the block table. With few sequences and
long contexts the keys are also split across programs (flash-decoding, Dao et al., 2023):
each split writes its partial ``(m, l, output)`` and a second kernel merges them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..._checks import check_paged
from ..common import check_device
from .common import LOG2E, online_step, positive_scale

__all__ = ["paged_attention_decode", "paged_decode_kernel", "merge_splits_kernel", "decode_splits"]


@triton.jit
def paged_decode_kernel(
    Q,
    KC,
    VC,
    KS,
    VS,
    TABLES,
    LENS,
    OUT,
    M_PART,
    L_PART,
    sqb,
    sqh,
    skb,
    sks,
    skh,
    svb,
    svs,
    svh,
    ssb,
    sss,
    stb,
    sob,
    soh,
    sos,
    smb,
    smh,
    HQ,
    GROUP,
    BLOCK_SIZE,
    SPLIT_TOKENS,
    qk_scale,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    UPCAST: tl.constexpr,
    QUANT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    hk = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(LENS + b).to(tl.int32)
    start_tok = split * SPLIT_TOKENS
    end_tok = tl.minimum(start_tok + SPLIT_TOKENS, seq_len)

    heads = hk * GROUP + tl.arange(0, BLOCK_G)  # the query heads that share this KV head
    g_ok = tl.arange(0, BLOCK_G) < GROUP
    dims = tl.arange(0, BLOCK_D)
    d_ok = dims < D
    q = tl.load(Q + b * sqb + heads[:, None] * sqh + dims[None, :], mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
    cols = tl.arange(0, BLOCK_N)
    for start in range(start_tok, end_tok, BLOCK_N):
        toks = start + cols
        t_ok = toks < end_tok
        page = tl.load(TABLES + b * stb + toks // BLOCK_SIZE, mask=t_ok, other=0).to(tl.int64)
        slot = toks % BLOCK_SIZE
        k_off = page * skb + slot * sks + hk * skh
        v_off = page * svb + slot * svs + hk * svh
        kt = tl.load(KC + k_off[None, :] + dims[:, None], mask=t_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(VC + v_off[:, None] + dims[None, :], mask=t_ok[:, None] & d_ok[None, :], other=0.0)
        if QUANT:  # an 8-bit cache: one scale per token (and KV head), applied as the tile is read
            s_off = page * ssb + slot * sss + hk
            ks = tl.load(KS + s_off, mask=t_ok, other=0.0)
            vs = tl.load(VS + s_off, mask=t_ok, other=0.0)
            kt = (kt.to(tl.float32) * ks[None, :]).to(Q.dtype.element_ty)
            v = (v.to(tl.float32) * vs[:, None]).to(Q.dtype.element_ty)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.where(t_ok[None, :], tl.dot(q, kt), float("-inf"))
        acc, l_i, m_i = online_step(acc, l_i, m_i, s, v, qk_scale, True)

    o_ptrs = OUT + b * sob + heads[:, None] * soh + split * sos + dims[None, :]
    if SPLIT:  # partial results: unnormalised output, running max and sum
        tl.store(o_ptrs, acc, mask=g_ok[:, None] & d_ok[None, :])
        tl.store(M_PART + b * smb + heads * smh + split, m_i, mask=g_ok)
        tl.store(L_PART + b * smb + heads * smh + split, l_i, mask=g_ok)
    else:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=g_ok[:, None] & d_ok[None, :])


@triton.jit
def merge_splits_kernel(
    ACC,
    M_PART,
    L_PART,
    OUT,
    sab,
    sah,
    sas,
    smb,
    smh,
    sob,
    soh,
    NUM_SPLITS,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    """Merge per-split (m, l, acc) of one (sequence, head): rescale each split by
    exp2(m_split - m_max), sum, divide by the rescaled sum of l."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    splits = tl.arange(0, BLOCK_S)
    s_ok = splits < NUM_SPLITS
    dims = tl.arange(0, BLOCK_D)
    m = tl.load(M_PART + b * smb + h * smh + splits, mask=s_ok, other=float("-inf"))
    l_part = tl.load(L_PART + b * smb + h * smh + splits, mask=s_ok, other=0.0)
    m_max = tl.max(m, 0)
    w = tl.where(m == float("-inf"), 0.0, tl.math.exp2(m - m_max))  # empty splits weigh nothing
    acc_ptrs = ACC + b * sab + h * sah + splits[:, None] * sas + dims[None, :]
    acc = tl.load(acc_ptrs, mask=s_ok[:, None] & (dims[None, :] < D), other=0.0)
    total = tl.sum(l_part * w, 0)
    out = tl.sum(acc * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(OUT + b * sob + h * soh + dims, out.to(OUT.dtype.element_ty), mask=dims < D)


def decode_splits(batch: int, kv_heads: int, max_len: int, sms: int, min_tokens: int = 512) -> int:
    """How many programs share one sequence's keys: enough (sequence, KV head) programs to
    fill the GPU about twice over, but no split shorter than ``min_tokens``."""
    programs = batch * kv_heads
    if programs >= 2 * sms or max_len <= 2 * min_tokens:
        return 1
    return max(1, min(-(-2 * sms // programs), max_len // min_tokens, 64))


_DECODE_CONFIG = {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3}


def paged_attention_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float | None = None,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per sequence against a paged KV cache (see the module doc).

    q ``(B, Hq, D)``; caches ``(num_blocks, block_size, Hkv, D)``; ``block_tables`` ``(B,
    max_blocks)`` int32; ``seq_lens`` ``(B,)`` int32. ``num_splits`` (default: chosen from the
    batch, the KV heads and the longest sequence) splits each sequence's keys across that
    many programs (flash-decoding). ``max_seq_len``, if the caller knows it (a serving
    engine does), spares reading ``seq_lens`` back to the host, a synchronisation that
    would otherwise stall every decode step; the lengths are then not validated. An INT8 or
    FP8 cache comes with its per-token, per-head scales ``k_scale``/``v_scale`` (num_blocks,
    block_size, Hkv) float32 (see ``store_kv``) and is dequantized as each tile is read.
    Returns ``(B, Hq, D)`` in q's dtype.
    """
    check_paged(q, k_cache, v_cache, block_tables, seq_lens, check_values=max_seq_len is None, k_scale=k_scale, v_scale=v_scale)
    quant = k_scale is not None
    if k_cache.dtype == torch.float8_e4m3fn and not runtime.interpreting():
        runtime.require_capability((8, 9), "an FP8 KV cache")
    check_device(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=block_tables, seq_lens=seq_lens)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("q, k_cache and v_cache need a contiguous last (head) dimension")
    B, HQ, D = q.shape
    block_size, HKV = k_cache.shape[1], k_cache.shape[2]
    group = HQ // HKV
    max_len = int(seq_lens.max()) if max_seq_len is None else max_seq_len
    if max_len < 1:
        raise ValueError(f"max_seq_len must be >= 1, got {max_len}")
    if num_splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
        num_splits = decode_splits(B, HKV, max_len, sms)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    interp = runtime.interpreting()
    block_n = 16 if interp else _DECODE_CONFIG["BLOCK_N"]
    split_tokens = -(-max_len // num_splits)
    split_tokens = -(-split_tokens // block_n) * block_n
    num_splits = -(-max_len // split_tokens)
    block_d = max(16, triton.next_power_of_2(D))
    out = torch.empty_like(q)
    q, scale = positive_scale(q, D**-0.5 if sm_scale is None else sm_scale)
    scale *= LOG2E
    split = num_splits > 1
    if split:
        acc = torch.empty((B, HQ, num_splits, D), device=q.device, dtype=torch.float32)
        m_part = torch.empty((B, HQ, num_splits), device=q.device, dtype=torch.float32)
        l_part = torch.empty_like(m_part)
        target, o_strides, ml_strides = acc, acc.stride()[:3], m_part.stride()[:2]
    else:
        m_part = l_part = out  # unused
        target, o_strides, ml_strides = out, (*out.stride()[:2], 0), (0, 0)
    launch = {} if interp else {k: _DECODE_CONFIG[k] for k in ("num_warps", "num_stages")}
    paged_decode_kernel[(B, HKV, num_splits)](
        q,
        k_cache,
        v_cache,
        k_scale if quant else k_cache,
        v_scale if quant else v_cache,
        block_tables,
        seq_lens,
        target,
        m_part,
        l_part,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        *(k_scale.stride()[:2] if quant else (0, 0)),
        block_tables.stride(0),
        *o_strides,
        *ml_strides,
        HQ,
        group,
        block_size,
        split_tokens,
        scale,
        D=D,
        BLOCK_D=block_d,
        BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n,
        SPLIT=split,
        UPCAST=q.dtype == torch.bfloat16 and interp,
        QUANT=quant,
        **launch,
    )
    if split:
        merge_splits_kernel[(B, HQ)](
            acc,
            m_part,
            l_part,
            out,
            *acc.stride()[:3],
            *m_part.stride()[:2],
            *out.stride()[:2],
            num_splits,
            D=D,
            BLOCK_D=block_d,
            BLOCK_S=max(2, triton.next_power_of_2(num_splits)),
        )
    return out
