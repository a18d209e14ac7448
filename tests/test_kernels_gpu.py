"""The kernels on a real GPU, in 16-bit floats and at large sizes, against torch's own operators.
Skipped without CUDA; run on the H200 with ``pytest tests/test_kernels_gpu.py``. The 16-bit
type is the runtime's (bfloat16, or float16 where the GPU, or ``LLMNOTE_CAPABILITY``, says the
tensor cores lack bfloat16), and the Hopper-only kernels are tested only where the runtime
takes them."""

import pytest
import torch
import torch.nn.functional as F

from llmnote import kernels, ref, runtime

HALF = runtime.half_dtype()
HALF_DTYPES = sorted({HALF, torch.float16}, key=str)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def rel_err(out, expected):
    return ((out.float() - expected.float()).norm() / expected.float().norm()).item()


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize("mnk", [(4096, 4096, 4096), (1, 28672, 4096), (16, 4096, 14336), (4095, 4097, 1023), (8192, 8192, 8192)])
def test_matmul_large(dtype, mnk):
    m, n, k = mnk
    a, b = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)
    c = torch.full((m, n), float("nan"), device="cuda", dtype=dtype)
    c.copy_(kernels.matmul(a, b))
    assert torch.isfinite(c).all()
    assert rel_err(c, a.float() @ b.float()) < 5e-3
    assert rel_err(c, torch.matmul(a, b)) < 5e-3


def test_matmul_fp32_is_full_precision():
    a, b = torch.randn(1000, 900, device="cuda"), torch.randn(900, 1100, device="cuda")
    assert rel_err(kernels.matmul(a, b), a.double() @ b.double()) < 1e-5  # TF32 would give ~1e-3


def test_matmul_transposed_operands():
    a = torch.randn(3000, 2000, device="cuda", dtype=HALF).t()
    b = torch.randn(5000, 3000, device="cuda", dtype=HALF).t()
    assert rel_err(kernels.matmul(a, b), a.float() @ b.float()) < 5e-3


@pytest.mark.parametrize("shape", [(8192, 8192), (65536, 1024), (64, 131072), (3, 5, 4099)])
def test_softmax_large(shape):
    x = torch.randn(*shape, device="cuda", dtype=HALF) * 20
    out = kernels.softmax(x)
    assert rel_err(out, torch.softmax(x.float(), -1)) < 1e-2
    torch.testing.assert_close(out.float().sum(-1), torch.ones(shape[:-1], device="cuda"), atol=2e-2, rtol=0)


@pytest.mark.parametrize("shape", [(16384, 4096), (7, 8192), (3, 65536)])
def test_rms_norm_large(shape):
    x, w = torch.randn(*shape, device="cuda", dtype=HALF), torch.randn(shape[-1], device="cuda", dtype=HALF)
    assert rel_err(kernels.rms_norm(x, w), F.rms_norm(x.float(), (shape[-1],), w.float(), 1e-6)) < 1e-2


def test_rope_and_silu_mul_large():
    x = torch.randn(8, 32, 2048, 128, device="cuda", dtype=HALF)
    cos, sin = ref.rope_cos_sin(2048, 128, device="cuda")
    assert rel_err(kernels.apply_rope(x, cos, sin), ref.apply_rope(x.float(), cos, sin)) < 1e-2
    g, u = (torch.randn(4096, 14336, device="cuda", dtype=HALF) for _ in range(2))
    assert rel_err(kernels.silu_mul(g, u), F.silu(g.float()) * u.float()) < 1e-2


@pytest.mark.parametrize("dtype", HALF_DTYPES)
@pytest.mark.parametrize(
    "b, hq, hkv, sq, skv, d, causal",
    [
        (2, 8, 2, 1000, 1000, 128, True),
        (2, 4, 4, 300, 700, 64, False),
        (1, 4, 1, 1, 4097, 64, True),  # one query over a long prefix (MQA)
        (1, 8, 2, 700, 300, 128, True),  # more queries than keys: the first rows see nothing
        (1, 2, 1, 513, 129, 256, True),
        (1, 4, 2, 77, 95, 96, False),  # a head dim that is not a power of two
        (4, 32, 32, 4096, 4096, 128, False),
    ],
)
def test_flash_attention_gpu(dtype, b, hq, hkv, sq, skv, d, causal):
    q = torch.randn(b, hq, sq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=dtype) for _ in range(2))
    out = kernels.flash_attention(q, k, v, causal=causal)
    expected = ref.flash_attention(q, k, v, causal=causal).float()
    assert out.dtype == dtype and out.shape == q.shape and torch.isfinite(out).all()
    assert rel_err(out, expected) < 1e-2
    if sq == skv:  # torch's own operator agrees too
        sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hq != hkv)
        assert rel_err(out, sdpa) < 1e-2


def packed_gpu(lens_q, lens_k, hq, hkv, d, dtype):
    """Sequences packed along the token dimension on the GPU, with their int32 offsets."""
    q = torch.randn(sum(lens_q), hq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(sum(lens_k), hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    offsets = ([0, *torch.tensor(lens).cumsum(0).tolist()] for lens in (lens_q, lens_k))
    cu_q, cu_k = (torch.tensor(o, device="cuda", dtype=torch.int32) for o in offsets)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize(
    "lens_q, lens_k, hq, hkv",
    [
        ([1, 2000, 17, 640, 129, 1024, 3, 1999], [1, 2000, 17, 640, 129, 1024, 3, 1999], 32, 8),  # a prefill batch, GQA
        ([100, 0, 513, 1], [1900, 64, 513, 700], 8, 1),  # chunks after cached keys (MQA), a sequence without queries
    ],
)
def test_flash_attention_varlen_gpu(lens_q, lens_k, hq, hkv, d, causal):
    torch.manual_seed(0)
    q, k, v, cu_q, cu_k = packed_gpu(lens_q, lens_k, hq, hkv, d, HALF)
    out = kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal)
    expected = ref.flash_attention_varlen(q.float(), k.float(), v.float(), cu_q, cu_k, causal=causal)
    assert out.dtype == HALF and out.shape == q.shape and torch.isfinite(out).all()
    assert rel_err(out, expected) < 1e-2
    for b in range(len(lens_q)):  # each sequence on its own, as the dense kernel computes it
        rows, keys = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if lens_q[b]:
            parts = [t[s].transpose(0, 1)[None] for t, s in ((q, rows), (k, keys), (v, keys))]
            seq = kernels.flash_attention(*parts, causal=causal)
            assert rel_err(out[rows], seq[0].transpose(0, 1)) < 1e-2, b


def test_flash_attention_varlen_in_a_cuda_graph():
    """With max_seqlen_q given, nothing is read back from the GPU: the call is captured once and
    replayed on new lengths written into the same offset tensors."""
    torch.manual_seed(0)
    q, k, v, cu_q, cu_k = packed_gpu([300, 5, 700], [300, 5, 700], 16, 4, 128, HALF)

    def run():
        return kernels.flash_attention_varlen(q, k, v, cu_q, cu_k, 1000, causal=True)

    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()  # compile before the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    for offsets in ([0, 300, 305, 1005], [0, 1000, 1003, 1005], [0, 0, 5, 1005]):
        cu_q.copy_(torch.tensor(offsets, dtype=torch.int32))
        cu_k.copy_(cu_q)
        graph.replay()
        assert rel_err(out, ref.flash_attention_varlen(q.float(), k.float(), v.float(), cu_q, cu_k, causal=True)) < 1e-2, offsets


@pytest.mark.skipif(not torch.cuda.is_available() or runtime.capability() < (9, 0), reason="TMA needs sm_90+")
@pytest.mark.parametrize("d", [64, 128, 256])
def test_every_tma_candidate_gpu(d):
    """Each configuration the autotuner may pick (the L2 prefetch of a later program's Q, the
    rotated loop) gives the right answer on its own, on shapes with partial tiles and GQA."""
    from llmnote.kernels import attention

    torch.manual_seed(0)
    for b, hq, hkv, sq, skv, causal in ((2, 8, 2, 1000, 1000, True), (1, 4, 1, 777, 300, True), (3, 4, 4, 300, 777, False)):
        q = torch.randn(b, hq, sq, d, device="cuda", dtype=HALF)
        k, v = (torch.randn(b, hkv, skv, d, device="cuda", dtype=HALF) for _ in range(2))
        expected = ref.flash_attention(q, k, v, causal=causal).float()
        for config in attention.tma_attention_configs(d):
            out = torch.empty_like(q)
            attention.flash_launch(q, k, v, out, causal, d**-0.5, "tma", config)
            assert rel_err(out, expected) < 1e-2, (config, b, hq, hkv, sq, skv, causal)


@pytest.mark.skipif(not torch.cuda.is_available() or not runtime.is_hopper(), reason="the Gluon kernel is for sm_90")
@pytest.mark.parametrize("persistent", [True, False])
@pytest.mark.parametrize("overlap, pingpong", [(True, False), (False, False), (True, True), (False, True)])
def test_warp_specialized_variants_gpu(persistent, overlap, pingpong):
    """The Gluon kernel, persistent or one CTA per tile, with and without the intra-warpgroup
    overlap and the ping-pong, on partial tiles, GQA/MQA, more queries than keys, one query,
    fp16 and bf16."""
    from llmnote.kernels import attention
    from llmnote.kernels.attention import flash_ws

    torch.manual_seed(0)
    cases = ((2, 8, 2, 1000, 1000, True), (1, 4, 1, 777, 300, True), (3, 4, 4, 300, 777, False), (1, 4, 1, 1, 4097, True),
             (2, 4, 2, 4096, 4096, False), (1, 2, 2, 64, 130, False))  # fmt: skip
    for (b, hq, hkv, sq, skv, causal), dtype in zip(cases, [torch.bfloat16, torch.float16] * 3):
        q = torch.randn(b, hq, sq, 128, device="cuda", dtype=dtype)
        k, v = (torch.randn(b, hkv, skv, 128, device="cuda", dtype=dtype) for _ in range(2))
        assert flash_ws.use_warp_specialized(q, k, v)
        expected = ref.flash_attention(q, k, v, causal=causal).float()
        scale = 128**-0.5 * attention.LOG2E
        out = flash_ws.flash_attention_ws(q, k, v, torch.empty_like(q), causal, scale, persistent, overlap, pingpong)
        assert rel_err(out, expected) < 1e-2, (b, hq, hkv, sq, skv, causal, dtype)
        assert rel_err(attention.flash_attention_triton(q, k, v, causal), expected) < 1e-2


@pytest.mark.parametrize("splits", [None, 1, 7])
@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_paged_decode_gpu(splits, block_size):
    torch.manual_seed(0)
    lens = torch.tensor([1, 15, 16, 17, 1000, 4099, 8192, 33], dtype=torch.int32, device="cuda")
    b, hq, hkv, d = len(lens), 32, 8, 128
    per_seq = -(-int(lens.max()) // block_size)
    blocks = b * per_seq + 5
    k_cache, v_cache = (torch.randn(blocks, block_size, hkv, d, device="cuda", dtype=HALF) for _ in range(2))
    tables = torch.randperm(blocks, device="cuda")[: b * per_seq].view(b, per_seq).to(torch.int32)  # shuffled pages
    q = torch.randn(b, hq, d, device="cuda", dtype=HALF)
    out = kernels.paged_attention_decode(q, k_cache, v_cache, tables, lens, num_splits=splits)
    expected = ref.paged_attention_decode(q.float(), k_cache.float(), v_cache.float(), tables, lens)
    assert rel_err(out, expected) < 1e-2


@pytest.mark.parametrize("shape", [(1, 128256), (256, 151936), (7, 32000)])
def test_argmax_rows_large(shape):
    from llmnote.kernels.argmax import argmax_rows

    x = torch.randn(*shape, device="cuda", dtype=HALF)
    assert torch.equal(argmax_rows(x), x.argmax(-1))
    x[:, ::1000] = x.max()  # many tied maxima: the first wins
    assert torch.equal(argmax_rows(x), x.argmax(-1))
