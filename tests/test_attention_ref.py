"""Attention references: the contract's semantics against torch SDPA, paged decode against
contiguous attention, and MLA's absorbed form against the naive one."""

import pytest
import torch
import torch.nn.functional as F

from llmnote import ref


def sdpa(q, k, v, **kw):
    group = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), **kw)


@pytest.mark.parametrize("hq,hkv", [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_reference_matches_sdpa(hq, hkv, causal):
    q, k, v = torch.randn(2, hq, 33, 16), torch.randn(2, hkv, 33, 16), torch.randn(2, hkv, 33, 16)
    torch.testing.assert_close(ref.flash_attention(q, k, v, causal=causal), sdpa(q, k, v, is_causal=causal), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ref.flash_attention(q, k, v, sm_scale=0.3), sdpa(q, k, v, scale=0.3), atol=1e-5, rtol=1e-5)


def test_causal_mask_is_bottom_right_aligned():
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)
    out = ref.flash_attention(q, k, v, causal=True)
    # the last query sees every key; the first sees keys 0..7 (12 - 5 = 7 keys of offset)
    torch.testing.assert_close(out[:, :, -1:], ref.flash_attention(q[:, :, -1:], k, v), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(out[:, :, :1], ref.flash_attention(q[:, :, :1], k[:, :, :8], v[:, :, :8]), atol=1e-6, rtol=1e-6)
    # one query over a long prefix equals SDPA with no mask
    torch.testing.assert_close(ref.flash_attention(q[:, :, :1], k, v, causal=True), sdpa(q[:, :, :1], k, v), atol=1e-6, rtol=1e-6)


def test_flash_attention_reference_rejects_bad_input():
    q = torch.randn(1, 6, 4, 8)
    with pytest.raises(ValueError, match="multiple of"):
        ref.flash_attention(q, torch.randn(1, 4, 4, 8), torch.randn(1, 4, 4, 8))
    with pytest.raises(ValueError, match="share B and D"):
        ref.flash_attention(q, torch.randn(1, 2, 4, 16), torch.randn(1, 2, 4, 16))
    with pytest.raises(TypeError):
        ref.flash_attention(q, torch.randn(1, 2, 4, 8).half(), torch.randn(1, 2, 4, 8).half())


def test_paged_decode_reference_equals_contiguous_attention():
    torch.manual_seed(0)
    batch, hq, hkv, d, block = 3, 8, 2, 16, 4
    lens = torch.tensor([1, 9, 13], dtype=torch.int32)
    num_blocks = 12
    k_cache, v_cache = torch.randn(num_blocks, block, hkv, d), torch.randn(num_blocks, block, hkv, d)
    tables = torch.randperm(num_blocks)[: batch * 4].view(batch, 4).to(torch.int32)  # shuffled physical blocks
    q = torch.randn(batch, hq, d)
    out = ref.paged_attention_decode(q, k_cache, v_cache, tables, lens)
    for b in range(batch):
        n = int(lens[b])
        k = k_cache[tables[b].long()].reshape(-1, hkv, d)[:n].permute(1, 0, 2)[None]
        v = v_cache[tables[b].long()].reshape(-1, hkv, d)[:n].permute(1, 0, 2)[None]
        torch.testing.assert_close(out[b], sdpa(q[b][None, :, None], k, v)[0, :, 0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="fit in its row"):
        ref.paged_attention_decode(q, k_cache, v_cache, tables, torch.tensor([1, 9, 17], dtype=torch.int32))


def test_mla_absorbed_equals_naive():
    g = torch.Generator().manual_seed(0)
    w = ref.mla_random_weights(generator=g)
    x = torch.randn(2, 11, 64, generator=g)
    cos, sin = ref.rope_cos_sin(11, w.rope_dim)
    naive, absorbed = ref.mla_naive(x, w, cos, sin), ref.mla_absorbed(x, w, cos, sin)
    assert naive.shape == (2, 11, 64)
    torch.testing.assert_close(absorbed, naive, atol=1e-5, rtol=1e-5)
    # causal: the first token's output does not depend on later tokens
    x2 = x.clone()
    x2[:, 5:] = torch.randn(2, 6, 64, generator=g)
    torch.testing.assert_close(ref.mla_absorbed(x2, w, cos, sin)[:, :5], absorbed[:, :5], atol=1e-5, rtol=1e-5)


def test_mla_cache_is_small():
    w = ref.mla_random_weights(hidden=64, heads=4, head_dim=16, rope_dim=8, kv_rank=12)
    per_token_mla = w.w_dkv.shape[0] + w.rope_dim  # latent + shared rope key
    per_token_mha = 2 * w.heads * w.head_dim
    assert per_token_mla * 6 < per_token_mha


def packed(lens_q, lens_k, hq, hkv, d, dtype=torch.float32, seed=0):
    """Sequences of lens_q queries and lens_k keys packed along the token dimension, with their offsets."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(dtype)
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g).to(dtype) for _ in range(2))
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) for lens in (lens_q, lens_k))
    return q, k, v, cu_q, cu_k


def packed_sdpa(q, k, v, lens_q, lens_k, causal, scale=None):
    """SDPA over the whole packed batch at once: a block-diagonal mask keeps each query to its own
    sequence's keys (and, causal, bottom-right aligned within it)."""
    seq_q, seq_k = (torch.repeat_interleave(torch.arange(len(lens)), torch.tensor(lens)) for lens in (lens_q, lens_k))
    start_q, start_k = (torch.tensor([0, *lens]).cumsum(0) for lens in (lens_q, lens_k))
    pos_q, pos_k = torch.arange(len(seq_q)) - start_q[seq_q], torch.arange(len(seq_k)) - start_k[seq_k]
    mask = seq_q[:, None] == seq_k[None, :]
    if causal:
        offset = torch.tensor(lens_k)[seq_q] - torch.tensor(lens_q)[seq_q]
        mask &= pos_k[None, :] <= pos_q[:, None] + offset[:, None]
    out = sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "lens_q, lens_k, hq, hkv",
    [
        ([1, 17, 64, 5, 130], [1, 17, 64, 5, 130], 4, 2),  # GQA, prefill of five prompts
        ([1, 17, 64, 5, 130], [1, 17, 64, 5, 130], 4, 1),  # MQA
        ([3, 0, 20, 9, 0], [40, 7, 20, 30, 0], 2, 2),  # chunks after cached keys, no queries, an empty sequence
    ],
)
def test_flash_attention_varlen_reference(lens_q, lens_k, hq, hkv, causal):
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, hq, hkv, 16)
    out = ref.flash_attention_varlen(q, k, v, cu_q, cu_k, causal=causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out, packed_sdpa(q, k, v, lens_q, lens_k, causal), atol=1e-5, rtol=1e-5)
    for b in range(len(lens_q)):  # each sequence alone through the dense reference
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if lens_q[b]:
            seq = ref.flash_attention(*(t[s].transpose(0, 1)[None] for t, s in ((q, rows), (k, keys), (v, keys))), causal=causal)
            torch.testing.assert_close(out[rows], seq[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
    scaled = ref.flash_attention_varlen(q, k, v, cu_q, cu_k, causal=causal, sm_scale=0.3)
    torch.testing.assert_close(scaled, packed_sdpa(q, k, v, lens_q, lens_k, causal, scale=0.3), atol=1e-5, rtol=1e-5)


def test_flash_attention_varlen_reference_keeps_the_dtype():
    q, k, v, cu_q, cu_k = packed([5, 9], [5, 9], 2, 1, 8, dtype=torch.bfloat16)
    out = ref.flash_attention_varlen(q, k, v, cu_q, cu_k, causal=True)
    assert out.dtype == torch.bfloat16
    expected = ref.flash_attention_varlen(q.float(), k.float(), v.float(), cu_q, cu_k, causal=True)
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


def test_flash_attention_varlen_reference_rejects_bad_input():
    q, k, v, cu_q, cu_k = packed([3, 5], [3, 5], 4, 2, 8)
    with pytest.raises(TypeError, match="int32"):
        ref.flash_attention_varlen(q, k, v, cu_q.long(), cu_k)
    with pytest.raises(ValueError, match="B \\+ 1"):
        ref.flash_attention_varlen(q, k, v, cu_q, cu_k[:2])
    with pytest.raises(ValueError, match="never decrease"):
        ref.flash_attention_varlen(q, k, v, torch.tensor([0, 6, 5, 8], dtype=torch.int32), cu_k[[0, 1, 1, 2]])
    with pytest.raises(ValueError, match="end at the number of tokens"):
        ref.flash_attention_varlen(q, k, v, torch.tensor([0, 3, 7], dtype=torch.int32), cu_k)
    with pytest.raises(ValueError, match="start at 0"):
        ref.flash_attention_varlen(q, k, v, torch.tensor([1, 3, 8], dtype=torch.int32), cu_k)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        ref.flash_attention_varlen(q[:, :3], k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match="same shape"):
        ref.flash_attention_varlen(q, k, v[:, :1], cu_q, cu_k)
    with pytest.raises(ValueError, match="share D"):
        ref.flash_attention_varlen(q, k[..., :4], v[..., :4], cu_q, cu_k)
    with pytest.raises(TypeError, match="dtype"):
        ref.flash_attention_varlen(q, k.half(), v.half(), cu_q, cu_k)
    with pytest.raises(ValueError, match="3 dimensions"):
        ref.flash_attention_varlen(q[None], k, v, cu_q, cu_k)
    # causal with fewer keys than queries: the first queries would see no key
    short_k = torch.tensor([0, 2, 8], dtype=torch.int32)
    assert ref.flash_attention_varlen(q, k, v, cu_q, short_k).shape == q.shape  # fine without the mask
    with pytest.raises(ValueError, match="at least 3 keys"):
        ref.flash_attention_varlen(q, k, v, cu_q, short_k, causal=True)
    with pytest.raises(ValueError, match="at least one key"):
        ref.flash_attention_varlen(q, k, v, cu_q, torch.tensor([0, 0, 8], dtype=torch.int32))
