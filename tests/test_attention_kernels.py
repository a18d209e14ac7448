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
    attention._flash_launch(q, k, v, out, causal, 32**-0.5, "tma", config)
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
