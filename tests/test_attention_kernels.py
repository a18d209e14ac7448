"""The Triton attention kernels under the interpreter (CPU) against the references, on
odd shapes: Sq != Skv, GQA and MQA, one query over a long prefix, lengths that are not
multiples of the block, head dims that are not powers of two, paged tables with shuffled
blocks and partial last blocks, split-KV decoding, and bad input."""

import pytest
import torch

from llmnote import kernels, ref
from llmnote.kernels import attention
from llmnote.kernels.attention import decode_splits


def qkv(b, hq, hkv, sq, skv, d, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, sq, d, generator=g).to(dtype)
    k, v = (torch.randn(b, hkv, skv, d, generator=g).to(dtype) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "b, hq, hkv, sq, skv, d",
    [
        (1, 2, 1, 33, 47, 64),  # GQA, lengths not multiples of the 16-wide blocks
        (2, 4, 2, 50, 20, 32),  # more queries than keys: with causal, early rows see no key
        (1, 3, 3, 1, 70, 16),  # one query over a long prefix
        (1, 4, 1, 17, 17, 24),  # MQA, a head dim that is not a power of two
        (2, 2, 2, 64, 64, 64),  # exact multiples: the unmasked path only (non-causal)
    ],
)
def test_flash_attention_matches_reference(b, hq, hkv, sq, skv, d, causal):
    q, k, v = qkv(b, hq, hkv, sq, skv, d)
    out = kernels.flash_attention(q, k, v, causal=causal)
    torch.testing.assert_close(out, ref.flash_attention(q, k, v, causal=causal), atol=2e-5, rtol=1e-4)


def test_flash_attention_low_precision_scale_and_strides():
    q, k, v = qkv(1, 4, 2, 40, 40, 64, dtype=torch.float16)
    out = kernels.flash_attention(q, k, v, causal=True, sm_scale=0.3)
    expected = ref.flash_attention(q.float(), k.float(), v.float(), causal=True, sm_scale=0.3)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=1e-2)
    # bf16 inputs are computed in fp32 in the interpreter; still bf16 out
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    assert kernels.flash_attention(qb, kb, vb).dtype == torch.bfloat16
    # a (B, S, H, D) layout seen through transpose: non-contiguous strides
    qt = torch.randn(1, 30, 4, 32).transpose(1, 2)
    kt, vt = (torch.randn(1, 30, 2, 32).transpose(1, 2) for _ in range(2))
    torch.testing.assert_close(kernels.flash_attention(qt, kt, vt, causal=True), ref.flash_attention(qt, kt, vt, causal=True))


@pytest.mark.parametrize("sm_scale", [-0.4, 0.0])
def test_flash_attention_negative_and_zero_scale(sm_scale):
    """The kernels scale each row's maximum, which needs a positive scale: the wrapper rewrites others.
    Large scores make a wrong maximum overflow exp2; a zero scale times a masked -inf is NaN."""
    q, k, v = qkv(1, 2, 1, 20, 36, 32)
    q = q * 20
    for causal in (False, True):
        out = kernels.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale)
        torch.testing.assert_close(out, ref.flash_attention(q, k, v, causal=causal, sm_scale=sm_scale), atol=2e-5, rtol=1e-4)
    decode = ref.flash_attention(q[:, :, -1:], k, v, sm_scale=sm_scale)[:, :, 0]
    kc = k[0].transpose(0, 1).reshape(9, 4, 1, 32)  # 36 keys in 9 pages of 4
    vc = v[0].transpose(0, 1).reshape(9, 4, 1, 32)
    tables, lens = torch.arange(9, dtype=torch.int32)[None], torch.tensor([36], dtype=torch.int32)
    out = kernels.paged_attention_decode(q[:, :, -1], kc, vc, tables, lens, sm_scale=sm_scale)
    torch.testing.assert_close(out, decode, atol=2e-5, rtol=1e-4)
    with pytest.raises(ValueError, match="finite"):
        kernels.flash_attention(q, k, v, sm_scale=float("inf"))


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "b, hq, hkv, sq, skv",
    [
        (1, 2, 1, 40, 70),  # GQA, Sq < Skv, partial last blocks
        (2, 2, 2, 50, 20),  # Sq > Skv: with causal, the first blocks see no key (no unmasked step)
        (1, 3, 1, 1, 45),  # one query over a prefix
        (1, 2, 2, 64, 64),  # whole blocks only
    ],
)
def test_tma_kernel_in_the_interpreter(b, hq, hkv, sq, skv, causal, rotate):
    """The Hopper kernel (tensor descriptors), with and without the rotated loop, run by the
    interpreter with 16 x 16 tiles: same results as the reference."""
    import triton  # here, after llmnote has chosen the interpreter

    q, k, v = qkv(b, hq, hkv, sq, skv, 32)
    out = torch.empty_like(q)
    config = triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "WARP_SPECIALIZE": False, "ROTATE": rotate, "PREFETCH": False})
    attention.flash_launch(q, k, v, out, causal, 32**-0.5, "tma", config)
    torch.testing.assert_close(out, ref.flash_attention(q, k, v, causal=causal), atol=2e-5, rtol=1e-4)


def test_rows_that_see_no_key_are_zero_and_causal_is_bottom_right():
    q, k, v = qkv(1, 1, 1, 8, 3, 16)
    out = kernels.flash_attention(q, k, v, causal=True)
    assert torch.equal(out[0, 0, :5], torch.zeros(5, 16))  # query i sees keys j <= i - 5
    torch.testing.assert_close(out[0, 0, 5], v[0, 0, 0])  # the first visible row sees exactly key 0
    assert torch.isfinite(out).all()


def test_flash_attention_bad_input():
    q, k, v = qkv(1, 3, 2, 8, 8, 16)
    with pytest.raises(ValueError, match="multiple"):
        kernels.flash_attention(q, k, v)
    q, k, v = qkv(1, 2, 1, 8, 8, 16)
    with pytest.raises(ValueError, match="same shape"):
        kernels.flash_attention(q, k, v[:, :, :4])
    with pytest.raises(TypeError, match="dtype"):
        kernels.flash_attention(q, k.half(), v)
    with pytest.raises(ValueError, match="share B and D"):
        kernels.flash_attention(q, k[..., :8], v[..., :8])
    q, k, v = qkv(1, 1, 1, 4, 4, 512)
    with pytest.raises(ValueError, match="256"):
        kernels.flash_attention(q, k, v)


def paged(b, hq, hkv, d, block_size, lens, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    per_seq = max(-(-n // block_size) for n in lens) + 1  # a spare column in every row
    blocks = b * per_seq + 3
    k_cache, v_cache = (torch.randn(blocks, block_size, hkv, d, generator=g).to(dtype) for _ in range(2))
    tables = torch.randperm(blocks, generator=g)[: b * per_seq].view(b, per_seq).to(torch.int32)  # shuffled pages
    q = torch.randn(b, hq, d, generator=g).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32)


@pytest.mark.parametrize("splits", [None, 1, 3, 7])
@pytest.mark.parametrize(
    "b, hq, hkv, d, block_size, lens",
    [
        (3, 4, 2, 64, 16, [1, 37, 100]),  # a one-token sequence, partial last blocks
        (2, 8, 1, 32, 8, [130, 64]),  # MQA: eight query heads on one KV head
        (2, 6, 3, 48, 32, [5, 70]),  # a head dim that is not a power of two
    ],
)
def test_paged_decode_matches_reference(b, hq, hkv, d, block_size, lens, splits):
    q, kc, vc, tables, seq_lens = paged(b, hq, hkv, d, block_size, lens)
    out = kernels.paged_attention_decode(q, kc, vc, tables, seq_lens, num_splits=splits)
    torch.testing.assert_close(out, ref.paged_attention_decode(q, kc, vc, tables, seq_lens), atol=2e-5, rtol=1e-4)
    # the caller may pass the longest length and skip the read-back
    out2 = kernels.paged_attention_decode(q, kc, vc, tables, seq_lens, num_splits=splits, max_seq_len=max(lens))
    torch.testing.assert_close(out2, out)


def test_paged_decode_low_precision():
    q, kc, vc, tables, lens = paged(2, 4, 1, 64, 16, [40, 200], dtype=torch.float16)
    out = kernels.paged_attention_decode(q, kc, vc, tables, lens, num_splits=4)
    expected = ref.paged_attention_decode(q.float(), kc.float(), vc.float(), tables, lens)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=1e-2)


def test_paged_decode_bad_input():
    q, kc, vc, tables, lens = paged(2, 4, 2, 16, 8, [5, 9])
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        kernels.paged_attention_decode(q[:, :3], kc, vc, tables, lens)
    with pytest.raises(ValueError, match="fit in its row"):
        kernels.paged_attention_decode(q, kc, vc, tables, torch.tensor([5, 1000], dtype=torch.int32))
    with pytest.raises(ValueError, match=">= 1"):
        kernels.paged_attention_decode(q, kc, vc, tables, torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="one row per sequence"):
        kernels.paged_attention_decode(q, kc, vc, tables[:1], lens)
    with pytest.raises(TypeError, match="dtype"):
        kernels.paged_attention_decode(q.half(), kc, vc, tables, lens)
    with pytest.raises(ValueError, match="num_splits"):
        kernels.paged_attention_decode(q, kc, vc, tables, lens, num_splits=0)


def test_decode_splits_fill_the_gpu_only_when_needed():
    assert decode_splits(64, 8, 4096, sms=132) == 1  # 512 programs already fill 132 SMs
    assert decode_splits(8, 8, 32768, sms=132) == 5  # 64 programs: split each sequence
    assert decode_splits(1, 1, 100, sms=132) == 1  # too short to be worth splitting
    assert decode_splits(1, 8, 1 << 20, sms=132) == 33


@pytest.mark.parametrize("causal", [False, True])
def test_persistent_experiment_kernel_in_the_interpreter(causal):
    """The persistent kernel of ``scripts/attention_experiments.py`` (tiles of every program
    in one flat loop, snake order over few programs): same results as the reference on odd
    shapes, GQA, more queries than keys, and more programs than tiles."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "scripts" / "attention_experiments.py"
    spec = importlib.util.spec_from_file_location("attention_experiments", path)
    experiments = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(experiments)
    for b, hq, hkv, sq, skv, programs in (
        (1, 2, 1, 40, 70, 3),
        (2, 4, 2, 33, 95, 5),
        (1, 2, 1, 100, 17, 4),
        (2, 2, 2, 48, 48, 100),
    ):
        q, k, v = qkv(b, hq, hkv, sq, skv, 32)
        out = experiments.persistent(q, k, v, causal, 16, 16, 4, 2, 1, False, sms=programs)
        torch.testing.assert_close(out, ref.flash_attention(q, k, v, causal=causal), atol=2e-5, rtol=1e-4)


def packed(lens_q, lens_k, hq, hkv, d, dtype=torch.float32, seed=0):
    """Sequences of lens_q queries and lens_k keys packed along the token dimension, with their offsets."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(dtype)
    k, v = (torch.randn(sum(lens_k), hkv, d, generator=g).to(dtype) for _ in range(2))
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32) for lens in (lens_q, lens_k))
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "lens_q, lens_k, hq, hkv, d",
    [
        ([1, 17, 64, 5, 130], [1, 17, 64, 5, 130], 2, 1, 32),  # MQA; tiles past a short sequence's end return at once
        ([1, 17, 40, 5, 33], [1, 17, 40, 5, 33], 4, 2, 24),  # GQA, a head dim that is not a power of two
        ([3, 0, 20, 9, 0], [40, 7, 20, 70, 0], 2, 2, 16),  # chunks after cached keys, no queries, an empty sequence
    ],
)
def test_flash_attention_varlen_matches_reference(lens_q, lens_k, hq, hkv, d, causal):
    q, k, v, cu_q, cu_k = packed(lens_q, lens_k, hq, hkv, d)
    out = kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), causal=causal)
    torch.testing.assert_close(out, ref.flash_attention_varlen(q, k, v, cu_q, cu_k, causal=causal), atol=2e-5, rtol=1e-4)


def test_flash_attention_varlen_low_precision_strides_and_scales():
    q, k, v, cu_q, cu_k = packed([7, 30, 2], [7, 45, 2], 4, 2, 32, dtype=torch.float16)
    out = kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, 30, causal=True, sm_scale=0.3)
    expected = ref.flash_attention_varlen(q.float(), k.float(), v.float(), cu_q, cu_k, causal=True, sm_scale=0.3)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), expected, atol=2e-3, rtol=1e-2)
    # bf16 is computed in fp32 in the interpreter; still bf16 out
    qb, kb, vb = (t[:9].to(torch.bfloat16) for t in (q, k, v))
    assert kernels.flash_attention_varlen(qb, kb, vb, cu_q[:2], cu_k[:2], 7).dtype == torch.bfloat16
    # q, k and v as column slices of one fused QKV projection (T, Hq + 2 Hkv, D): strided, no copy
    qkv = torch.randn(39, 4 + 2 + 2, 32)
    q, k, v = qkv[:, :4], qkv[:, 4:6], qkv[:, 6:]
    cu = torch.tensor([0, 7, 37, 39], dtype=torch.int32)
    for sm_scale in (None, -0.4, 0.0):  # the kernel needs a positive scale: the wrapper rewrites the others
        out = kernels.flash_attention_varlen(q, k, v, cu, cu, None, causal=True, sm_scale=sm_scale)
        expected = ref.flash_attention_varlen(q, k, v, cu, cu, causal=True, sm_scale=sm_scale)
        torch.testing.assert_close(out, expected, atol=2e-5, rtol=1e-4)


def test_flash_attention_varlen_bad_input():
    q, k, v, cu_q, cu_k = packed([3, 5], [3, 5], 4, 2, 16)
    with pytest.raises(TypeError, match="int32"):
        kernels.flash_attention_varlen(q, k, v, cu_q.long(), cu_k, 5)
    with pytest.raises(ValueError, match="B \\+ 1"):
        kernels.flash_attention_varlen(q, k, v, cu_q[:2], cu_k, 5)
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        kernels.flash_attention_varlen(q[:, :3], k, v, cu_q, cu_k, 5)
    with pytest.raises(ValueError, match="share D"):
        kernels.flash_attention_varlen(q, k[..., :8], v[..., :8], cu_q, cu_k, 5)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, 0)
    qw = torch.randn(8, 1, 512)
    with pytest.raises(ValueError, match="256"):
        kernels.flash_attention_varlen(qw, qw, qw, cu_q, cu_k, 5)
    # without max_seqlen_q the offsets are read back and checked as the reference checks them
    with pytest.raises(ValueError, match="never decrease"):
        kernels.flash_attention_varlen(q, k, v, torch.tensor([0, 6, 5, 8], dtype=torch.int32), cu_k[[0, 1, 1, 2]], None)
    with pytest.raises(ValueError, match="end at the number of tokens"):
        kernels.flash_attention_varlen(q, k, v, cu_q, torch.tensor([0, 3, 9], dtype=torch.int32), None)
    with pytest.raises(ValueError, match="at least 5 keys"):
        kernels.flash_attention_varlen(q, k, v, cu_q, torch.tensor([0, 4, 8], dtype=torch.int32), None, causal=True)
    with pytest.raises(ValueError, match="max_seqlen_k"):
        kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, None, max_seqlen_k=4)
