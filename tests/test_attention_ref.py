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
