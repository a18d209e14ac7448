"""W4A16 (Chapter 5) on the CPU: the reference, the Triton kernels in the interpreter against it
(float16 and float32: the interpreter cannot multiply bfloat16), the planning of their tiles,
and the registration of the ``quant`` benchmark suite."""

import math
import re

import pytest
import torch

from llmnote import kernels, ref
from llmnote.kernels.gemm import w4a16, w4a16_plan, w4a16_swap_ab
from llmnote.quant import quantize_weight


def rel_err(out, expected):
    return ((out.float() - expected.float()).norm() / expected.float().norm()).item()


def make(m, n, k, group=32, bits=4, symmetric=False, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen).to(dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    return x, w, quantize_weight(w, bits=bits, group_size=group, symmetric=symmetric)


# (M, N, K, group_size, bits, symmetric). M <= 16 takes the tensor-core decode kernel when x is
# 16-bit, N a multiple of 32 and the group size too, else the decode kernel (float32 FMAs on
# subnormal codes at M = 1, tl.dot beyond) with 128-deep K tiles; larger M the tiled kernel with
# 32-deep ones. In the interpreter K is split in two whenever it spans two tiles.
CASES = [
    (1, 96, 256, 64, 4, False),  # GEMV, split-K, two groups per K tile
    (1, 64, 128, 128, 4, True),  # GEMV, one K tile in one group (scale applied once), no split
    (1, 40, 96, 32, 3, True),  # GEMV, K shorter than one tile: masked
    (5, 80, 256, 32, 3, False),  # decode tl.dot, 3-bit codes, split-K
    (16, 48, 384, 128, 2, True),  # decode tl.dot, 2-bit, three K tiles split unevenly
    (3, 40, 96, 32, 4, False),  # K shorter than one tile: masked
    (12, 64, 256, 64, 3, False),  # fp16: the tensor-core decode kernel, two 8-row blocks; fp32: decode tl.dot
    (33, 72, 256, 64, 4, False),  # tiled kernel, M and N not multiples of the tile
    (70, 40, 192, 16, 4, True),  # tiled kernel, groups smaller than the K tile
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "M={},N={},K={},g={},b={},sym={}".format(*c))
def test_kernel_matches_reference(case, dtype):
    m, n, k, group, bits, symmetric = case
    x, _, qw = make(m, n, k, group, bits, symmetric, dtype)
    out = kernels.w4a16_linear(x, qw)
    expected = ref.w4a16_linear(x, qw)
    assert out.shape == (m, n) and out.dtype == dtype
    assert torch.isfinite(out).all()
    assert rel_err(out, expected) < (1e-5 if dtype == torch.float32 else 2e-3)


def test_leading_batch_dimensions():
    for lead in ((2, 3), (2, 20)):  # 6 rows: decode kernel; 40 rows: tiled kernel
        x, _, qw = make(lead[0] * lead[1], 40, 128, group=64)
        x = x.view(*lead, 128)
        out = kernels.w4a16_linear(x, qw)
        assert out.shape == (*lead, 40)
        assert rel_err(out, ref.w4a16_linear(x, qw)) < 2e-3
        assert rel_err(out.reshape(-1, 40), kernels.w4a16_linear(x.reshape(-1, 128), qw)) == 0


@pytest.mark.parametrize("m", [1, 5, 24])
def test_non_contiguous_x(m):
    _, _, qw = make(1, 48, 128)
    strided = torch.randn(m, 256).half()[:, ::2]
    transposed = torch.randn(128, m).half().t()
    for x in (strided, transposed) if m > 1 else (strided,):  # (a 1-row transpose is contiguous)
        assert not x.is_contiguous()
        assert rel_err(kernels.w4a16_linear(x, qw), ref.w4a16_linear(x.contiguous(), qw)) < 2e-3


def test_empty_batch():
    _, _, qw = make(1, 40, 64)
    assert kernels.w4a16_linear(torch.empty(0, 64).half(), qw).shape == (0, 40)
    assert kernels.w4a16_linear(torch.empty(2, 0, 64).half(), qw).shape == (2, 0, 40)


def test_split_k_counters_are_reset():
    """The last split of a tile resets its counter: a second call (new x) is right too."""
    x, _, qw = make(1, 64, 512, group=128)
    for seed in (1, 2):
        x = torch.randn(1, 512, generator=torch.Generator().manual_seed(seed)).half()
        assert rel_err(kernels.w4a16_linear(x, qw), ref.w4a16_linear(x, qw)) < 2e-3
        assert not w4a16._LOCKS[torch.device("cpu")].any()


def test_prefill_dequantizes_then_multiplies():
    x, _, qw = make(w4a16.DEQUANT_M, 40, 96, dtype=torch.float32)
    assert rel_err(kernels.w4a16_linear(x, qw), ref.w4a16_linear(x, qw)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("nkg", [(40, 96, 32), (64, 256, 32), (24, 112, 16)])  # (the last: a partial K tile)
def test_dequantize_is_exact(nkg, dtype):
    n, k, group = nkg
    _, _, qw = make(1, n, k, group=group, dtype=dtype)
    w_t = w4a16.w4a16_dequantize(qw)
    assert w_t.shape == (k, n) and w_t.dtype == dtype
    assert w_t.t().is_contiguous()  # an (N, K) buffer: x @ w_t is the product x @ W.T of 16-bit weights
    assert torch.equal(w_t, qw.dequantize().t())  # both round (q - z) * s, exact in fp32, once


def test_bad_inputs():
    x, w, qw = make(2, 40, 64)
    with pytest.raises(ValueError, match="last dimension must be K = 64"):
        kernels.w4a16_linear(torch.randn(2, 72).half(), qw)
    for bits in (5, 8):
        with pytest.raises(ValueError, match="8-bit containers"):
            kernels.w4a16_linear(x, quantize_weight(w, bits=bits, group_size=32))
    with pytest.raises(TypeError, match="x must have dtype"):
        kernels.w4a16_linear(x.to(torch.int32), qw)
    with pytest.raises(TypeError, match="x must have dtype"):
        kernels.w4a16_linear(x.double(), qw)
    with pytest.raises(TypeError, match="QuantizedWeight"):
        kernels.w4a16_linear(x, w)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        kernels.w4a16_linear(x.tolist(), qw)
    broken = quantize_weight(w, group_size=32)
    broken.qweight = broken.qweight.to(torch.int64)
    with pytest.raises(TypeError, match="qweight.qweight must have dtype int32"):
        kernels.w4a16_linear(x, broken)
    with pytest.raises(ValueError, match="8-bit containers"):
        w4a16.w4a16_dequantize(quantize_weight(w, bits=8, group_size=32))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_reference_is_x_times_the_dequantized_weight(dtype):
    x, w, qw = make(7, 48, 128, group=32, dtype=dtype)
    out = ref.w4a16_linear(x, qw)
    assert out.dtype == dtype and out.shape == (7, 48)
    assert torch.equal(out, (x.float() @ qw.dequantize().float().t()).to(dtype))
    # and it approximates the unquantized product within the rounding of 4-bit codes; 8 bits
    # (which the reference accepts, the kernel not) come far closer
    exact = x.float() @ w.float().t()
    err4 = rel_err(out, exact)
    err8 = rel_err(ref.w4a16_linear(x, quantize_weight(w, bits=8, group_size=32)), exact)
    assert 1e-3 < err4 < 0.15 and err8 < err4 / 8
    assert ref.w4a16_linear(x.view(7, 1, 128), qw).shape == (7, 1, 48)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["fp16", "fp32"])
@pytest.mark.parametrize(
    "case",  # (N, K, group_size, BLOCK_N, BLOCK_K, SPLIT_K, warps)
    [(256, 512, 128, 256, 64, 2, 1),  # every word row of a tile in each thread, K split
     (200, 1152, 128, 128, 64, 3, 1),  # N not a multiple of the tile, 18 K tiles split unevenly
     (200, 1152, 128, 128, 128, 4, 2),  # two warps side by side over the columns
     (300, 640, 32, 128, 32, 4, 1),  # groups of 32: tiles of 32 rows of K
     (96, 384, 64, 128, 64, 1, 1)],  # no split
    ids=lambda c: "N={},K={},g={},tile={}x{},split={},warps={}".format(*c),
)  # fmt: skip
def test_wide_one_row_tiles_match_reference(case, dtype):
    """The wide one-row tiles (``WIDE``: scale and zero point once per column and tile), launched
    directly since the interpreter's plan uses fixed narrow tiles."""
    import triton

    n, k, group, bn, bk, split, warps = case
    x, _, qw = make(1, n, k, group, dtype=dtype)
    q, s, z = w4a16._parts(qw)
    out = torch.empty(1, n, dtype=dtype)
    ws = torch.empty((split, 1, n), dtype=torch.float32)
    locks = torch.zeros(64, dtype=torch.int32)
    args = (x, q, s, z, out, ws, locks, 1, n, k, group, 1, n, x.stride(0), x.stride(1), q.stride(0), s.stride(0), out.stride(0))
    meta = {"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "WIDE": True, "num_warps": warps}
    w4a16._gemv[(triton.cdiv(n, bn), split)](*args, **meta, UPCAST=False, PRECISION="ieee")
    assert rel_err(out, ref.w4a16_linear(x, qw)) < (1e-5 if dtype == torch.float32 else 2e-3)
    assert not locks.any()


def test_tile_plans_fill_the_h200():
    from llmnote.kernels.gemm.matmul import _smem_per_block

    sms = 132
    for n, k in ((28672, 4096), (4096, 14336)):
        for small, bucket in ((True, 1), (True, 16), (False, 32), (False, 128)):
            plan = w4a16.plan_configs(small, bucket, n, k, 2, sms, (9, 0))
            assert plan
            for c in plan:
                programs = -(-bucket // c.kwargs["BLOCK_M"]) * -(-n // c.kwargs["BLOCK_N"]) * c.kwargs["SPLIT_K"]
                assert programs >= 0.75 * sms, (n, k, bucket, c)
                assert c.kwargs["SPLIT_K"] <= -(-k // c.kwargs["BLOCK_K"])
                assert c.kwargs["BLOCK_M"] == (1 if bucket == 1 else 16) or not small  # FMAs (one row) for M = 1 only
    # N = 4096 in 64- to 256-wide tiles is at most 64 programs: those tiles always split K
    down = w4a16.plan_configs(True, 1, 4096, 14336, 2, sms, (9, 0))
    assert all(c.kwargs["SPLIT_K"] > 1 for c in down if c.kwargs["BLOCK_N"] >= 64)
    plan = w4a16.plan_configs(True, 1, 28672, 4096, 2, sms, (9, 0))
    assert {c.kwargs["BLOCK_M"] for c in plan} == {1}
    # the narrow one-row tiles carry a register target (ptxas then hoists their loads); no other tile does
    assert {c.maxnreg for c in plan if c.kwargs["BLOCK_N"] == 32} == {56}
    assert {c.maxnreg for c in plan if c.kwargs["BLOCK_N"] > 32} == {None}
    # splits of K stay candidates where 64-wide tiles alone fill the GPU (448 programs): more in flight
    assert {c.kwargs["SPLIT_K"] for c in plan if c.kwargs["BLOCK_N"] == 64} == {1, 2, 4}
    # the fused GEMM's pipeline buffers fit a T4's 64 KiB as well as an H200's; from DEQUANT_M on, no fused plan is used
    for cap in ((9, 0), (7, 5)):
        plan = w4a16.plan_configs(False, w4a16.DEQUANT_M, 28672, 4096, 2, 40, cap)
        limit = _smem_per_block(cap)
        assert plan and all(c.num_stages * (c.kwargs["BLOCK_M"] * 128 * 2 + 128 * c.kwargs["BLOCK_N"] // 2)
                            + 128 * c.kwargs["BLOCK_N"] * 2 <= limit for c in plan)  # fmt: skip


def test_quant_suite_is_registered_and_its_cases_parse():
    from llmnote.bench import quant
    from llmnote.bench.__main__ import SUITES

    suite = SUITES["quant"]
    assert (suite.module, suite.runner) == ("quant", "run_quant")
    assert suite.description == "W4A16, FP8 and INT8 linears vs cuBLAS bf16, torch int4, torch._scaled_mm, torch._int_mm"
    assert callable(getattr(quant, suite.runner))
    cases = quant.quant_cases()
    assert len(cases) == 10
    for case, m, n, k in cases:
        assert re.fullmatch(r"M=\d+,N=\d+,K=\d+", case)
        assert quant.parse_case(case) == (m, n, k)
    assert {(n, k) for _, _, n, k in cases} == {(28672, 4096), (4096, 14336)}
    assert {m for _, m, _, _ in cases} == {1, 16, 64, 256, 4096}
    # recorded in parts (each part's rows are one kernel's, which --merge keeps or replaces)
    assert quant.PARTS == ("w4a16", "fp8", "int8", "decode")
    for bad in (("bogus",), ()):
        with pytest.raises(ValueError, match="the parts are w4a16, fp8, int8, decode"):
            quant.run_quant(parts=bad)
    with pytest.raises(ValueError, match="M=<m>,N=<n>,K=<k>"):
        quant.parse_case("M=1,N=2")


def _run_ptx(asm: str, regs: dict[str, int], dtype: torch.dtype) -> dict[str, int]:
    """Execute the few PTX instructions of the pair-unpacking code on 32-bit integers."""

    def half_lanes(v: int) -> torch.Tensor:
        return torch.tensor([v & 0xFFFF, v >> 16], dtype=torch.int32).to(torch.int16).view(dtype).double()

    def val(tok: str) -> int:
        return int(tok, 0) if tok[0].isdigit() else regs[tok]

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        dst, *src = [a.strip() for a in args.split(",")]
        if op == "mov.b32":
            regs[dst] = val(src[0])
        elif op == "prmt.b32":  # byte i of the result: byte (selector nibble i) of b:a
            pool, sel = val(src[1]) << 32 | val(src[0]), val(src[2])
            regs[dst] = sum(((pool >> (8 * ((sel >> (4 * i)) & 7))) & 0xFF) << (8 * i) for i in range(4))
        elif op == "shr.u32":
            regs[dst] = val(src[0]) >> int(src[1])
        elif op == "lop3.b32":
            assert src[3] == "0xEA"  # (a & b) | c
            regs[dst] = (val(src[0]) & val(src[1])) | val(src[2])
        elif op.startswith("fma.rn."):  # a * b + c in each 16-bit lane, rounded once
            exact = half_lanes(val(src[0])) * half_lanes(val(src[1])) + half_lanes(val(src[2]))
            lanes = exact.to(dtype).view(torch.int16).to(torch.int32) & 0xFFFF
            regs[dst] = int(lanes[0]) | int(lanes[1]) << 16
        else:
            raise AssertionError(f"unexpected instruction {op}")
    return regs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("scaled", [False, True], ids=["one-group", "scaled"])
def test_the_pair_unpacking_ptx_gives_each_code_minus_its_zero(dtype, scaled):
    """The inline PTX of the 16-row path, replayed instruction by instruction: two words in,
    output j holds code j of both, minus each one's zero point (times its scale)."""
    from llmnote.kernels.gemm.w4a16_codes import _pairs_asm

    magic = 128.0 if dtype == torch.bfloat16 else 1024.0
    asm = _pairs_asm("bf16" if dtype == torch.bfloat16 else "f16", scaled)

    def pack(lo: float, hi: float) -> int:
        bits = torch.tensor([lo, hi], dtype=dtype).view(torch.int16).to(torch.int32) & 0xFFFF
        return int(bits[0]) | int(bits[1]) << 16

    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        qa, qb = (torch.randint(0, 16, (8,), generator=gen) for _ in range(2))
        za, zb = (int(v) for v in torch.randint(0, 16, (2,), generator=gen))
        sa, sb = (torch.tensor([0.0123, -0.5]).to(dtype)).tolist()  # scales are stored in 16 bits
        word = lambda q: sum(int(v) << (4 * j) for j, v in enumerate(q))  # noqa: E731
        regs = {"$8": word(qa), "$9": word(qb), "$10": pack(-(magic + za), -(magic + zb)), "$11": pack(sa, sb)}
        regs = _run_ptx(asm, regs, dtype)
        for j in range(8):
            lo, hi = (torch.tensor([regs[f"${j}"] & 0xFFFF, regs[f"${j}"] >> 16]).to(torch.int16).view(dtype)).tolist()
            want_lo, want_hi = float(qa[j] - za), float(qb[j] - zb)
            if scaled:
                want_lo, want_hi = (torch.tensor([want_lo * sa, want_hi * sb], dtype=torch.float64).to(dtype)).tolist()
            assert (lo, hi) == (want_lo, want_hi), (j, lo, hi, want_lo, want_hi)


def _script(name: str):
    """A module of ``scripts/`` (run on a GPU), loaded by path."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).parents[1] / "scripts" / f"{name}.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_decode_profile_script_names_tiles_and_needs_a_gpu(capsys):
    """``scripts/w4a16_decode_profile.py`` (run on a GPU): its tile names, and a clear refusal here,
    timing or profiling."""
    script = _script("w4a16_decode_profile")
    config = w4a16.gemv_configs()[0]
    kw = config.kwargs
    assert script.tile_name(config) == f"m1n{kw['BLOCK_N']}k{kw['BLOCK_K']}s{kw['SPLIT_K']}w{config.num_warps}p3"
    assert script.tile_name(next(c for c in w4a16.gemv_configs() if c.maxnreg)).startswith("m1n32k256s1w4p3r56")
    # --wide: wide one-row tiles, which lie in one group of 128 and make 448 to 3584 programs
    for n, k in ((28672, 4096), (4096, 14336)):
        wide = script.wide_tiles(n, k)
        assert wide and all(c.kwargs["WIDE"] and 128 % c.kwargs["BLOCK_K"] == 0 for c in wide)
        assert all(448 <= -(-n // c.kwargs["BLOCK_N"]) * c.kwargs["SPLIT_K"] <= 3584 for c in wide)
        assert all(script.tile_name(c).endswith("-wide") for c in wide)
    with pytest.raises(SystemExit):
        script.main(["out.json", "--wide"])  # --wide belongs to a sweep
    assert "--sweep" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["out.json", "--tile", "1", "2", "1", "1", "128"])  # so does --tile
    assert "--sweep" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["out.json", "--sweep", "--tile", "1", "2", "1", "2", "128"])  # PRE is 0 or 1
    assert "PRE 0 or 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["out.json", "--deq"])  # so does --deq
    assert "--sweep" in capsys.readouterr().err
    tile = script.triton.Config({"V": 1, "WARPS": 2, "SPLIT_K": 1, "PREFETCH": True}, num_warps=2, num_stages=1, maxnreg=128)
    assert script.tile_name(tile) == "swap-v1w2s1-prer128"
    deq = script.triton.Config({"V": 2, "WARPS": 4, "SPLIT_K": 7, "PREFETCH": False, "DEQ": True}, num_warps=4, num_stages=1)
    assert script.tile_name(deq) == "swap-v2w4s7-deq"
    if not torch.cuda.is_available():
        assert script.main(["out.json"]) == 2 and "needs an NVIDIA GPU" in capsys.readouterr().err
        assert script.main(["-", "--profile", "--batches", "1", "16"]) == 2 and "needs an NVIDIA GPU" in capsys.readouterr().err


def _run_warp_ptx(asm: str, lanes: list[dict], dtype: torch.dtype) -> list[dict]:
    """Execute PTX on a whole warp: ``lanes[l]`` holds lane l's registers (ints for .b32, floats for
    .f32). ``mma.sync.m16n8k16`` gathers its A, B and C fragments from all 32 lanes as the PTX ISA
    lays them out (lane l: g = l // 4, t = l % 4; A rows g and g + 8, B column g, k pairs 2t and 2t + 8)."""

    def halves(v: int) -> list[float]:
        return torch.tensor([v & 0xFFFF, v >> 16], dtype=torch.int32).to(torch.int16).view(dtype).double().tolist()

    for line in asm.splitlines():
        line = line.strip().rstrip(";")
        if not line or line in "{}" or line.startswith(".reg"):
            continue
        op, args = line.split(None, 1)
        if op.startswith("mma.sync.aligned.m16n8k16"):
            d, a, b, c = ([r.strip() for r in group.split(",")] for group in re.findall(r"\{([^}]*)\}", args))
            A, B, C = (torch.zeros(16, cols, dtype=torch.float64) for cols in (16, 8, 8))
            for lane, regs in enumerate(lanes):
                g, t = divmod(lane, 4)
                for r, (row, col) in zip(a, [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
                    A[row, col : col + 2] = torch.tensor(halves(regs[r]), dtype=torch.float64)
                for r, row in zip(b, [2 * t, 2 * t + 8]):
                    B[row : row + 2, g] = torch.tensor(halves(regs[r]), dtype=torch.float64)
                for r, (row, col) in zip(c, [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
                    C[row, col] = regs[r]
            D = A @ B + C
            for lane, regs in enumerate(lanes):
                g, t = divmod(lane, 4)
                for r, (row, col) in zip(d, [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]):
                    regs[r] = float(D[row, col])
        else:
            for regs in lanes:
                _run_ptx(line + ";", regs, dtype)
    return lanes


def _warp_step_inputs(dtype: torch.dtype, rows: int):
    """What one step of the tensor-core decode kernel's PTX meets on a warp: four word rows of 32
    columns of random codes (``codes``: word row, code j, column; ``words`` packed), ``max(rows, 1)``
    rows of 32 entries of x (and their 16-bit patterns), and random accumulators in, one row per lane."""
    half = "bf16" if dtype == torch.bfloat16 else "f16"
    magic = 128.0 if dtype == torch.bfloat16 else 1024.0
    blocks, per = max(rows // 8, 1), (2 if rows == 1 else 4)
    n_out = 2 * blocks * per
    gen = torch.Generator().manual_seed(rows)
    codes = torch.randint(0, 16, (4, 8, 32), generator=gen)
    words = (codes << (4 * torch.arange(8))[None, :, None]).sum(1)  # (4, 32): eight codes a word
    x = torch.randn(max(rows, 1), 32, generator=gen).to(dtype)  # (row of x, k)
    xbits = (x.view(torch.int16).to(torch.int32) & 0xFFFF).tolist()
    c_in = torch.randn(32, n_out, generator=gen, dtype=torch.float64)
    return half, magic, blocks, per, n_out, gen, codes, words, x, xbits, c_in


def _each_accumulator(units: list[dict], blocks: int, per: int, rows: int):
    """Every accumulator of a warp's step: the lane, its registers, the output index, and the
    weight column and x row it sums (see ``_swap_ab_unit_asm``)."""
    for lane, regs in enumerate(units):
        g, t = divmod(lane, 4)
        for o in range(2 * blocks * per):
            s, b, r = o // (blocks * per), o // per % blocks, o % per
            word, row = (2 * s + r, 0) if rows == 1 else (2 * s + r // 2, 8 * b + 2 * t + r % 2)
            yield lane, regs, o, 4 * g + word, row


@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_tensor_core_decode_ptx_sums_each_column_over_its_quad(dtype, rows):
    """The PTX of ``w4a16_swap_ab_kernel``'s step, replayed on a warp: lane (g, t) brings the words
    of columns 4g .. 4g + 3 of word row t and 8 entries of x from that word row's K slice (one row:
    x's; 8 or 16 rows: x row 8b + g of block b). Afterwards each accumulator holds, for its column
    and row of x, ``sum (m + q) x`` over all four word rows (m = 128 in bf16, 1024 in fp16), and
    each sum of x the sum of its row's 32 entries."""
    from llmnote.kernels.gemm.w4a16_swap_ab_codes import _swap_ab_unit_asm, _swap_ab_x_asm

    half, magic, blocks, per, n_out, gen, codes, words, x, xbits, c_in = _warp_step_inputs(dtype, rows)
    units = [{f"${n_out + i}": int(words[lane % 4, 4 * (lane // 4) + i]) for i in range(4)} for lane in range(32)]
    for lane, u in enumerate(units):  # the accumulators in
        u.update({f"${n_out + 4 + 4 * blocks + i}": float(c_in[lane, i]) for i in range(n_out)})
    for b in range(blocks):  # the x step of each block: its outputs are the unit's B pairs for that block
        xw = 5 if rows == 1 else 6
        lanes = []
        for lane in range(32):
            g, t = divmod(lane, 4)
            row = 0 if rows == 1 else 8 * b + g
            regs = {f"${xw + i}": xbits[row][8 * t + 2 * i] | xbits[row][8 * t + 2 * i + 1] << 16 for i in range(4)}
            regs.update({"$9": 0.5} if rows == 1 else {"$10": 0.5, "$11": -0.25})
            lanes.append(regs)
        _run_warp_ptx(_swap_ab_x_asm(half, rows), lanes, dtype)
        for lane, regs in enumerate(lanes):
            t = lane % 4
            sums = x.double().sum(1)
            if rows == 1:
                assert regs["$4"] == pytest.approx(0.5 + sums[0].item(), rel=1e-12)
            else:
                assert regs["$4"] == pytest.approx(0.5 + sums[8 * b + 2 * t].item(), rel=1e-12)
                assert regs["$5"] == pytest.approx(-0.25 + sums[8 * b + 2 * t + 1].item(), rel=1e-12)
            units[lane].update({f"${n_out + 4 + 4 * b + i}": regs[f"${i}"] for i in range(4)})
    _run_warp_ptx(_swap_ab_unit_asm(half, rows), units, dtype)
    xr = x.double().view(-1, 4, 8)  # (row of x, word row, code j)
    for lane, regs, o, col, row in _each_accumulator(units, blocks, per, rows):
        want = c_in[lane, o] + ((magic + codes[:, :, col].double()) * xr[row]).sum()
        assert regs[f"${o}"] == pytest.approx(float(want), rel=1e-12), (lane, o)


@pytest.mark.parametrize("rows", [1, 8, 16])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_the_dequantizing_decode_ptx_scales_each_code_before_the_mma(dtype, rows):
    """The PTX of the kernel's ``DEQ`` step, replayed on a warp: each code becomes ``(q - z) s``
    rounded once to 16 bits (``(m + q) + (-(m + z))``, exact, then times s) before the MMAs, so each
    accumulator gains, for its column and row of x, the sum of those weights times x over the four
    word rows; the x step only pairs x's entries (no sums of x)."""
    from llmnote.kernels.gemm.w4a16_swap_ab_codes import _SAB_XB, _swap_ab_unit_asm

    half, magic, blocks, per, n_out, gen, codes, words, x, xbits, c_in = _warp_step_inputs(dtype, rows)
    zeros = torch.randint(0, 16, (32,), generator=gen)  # a zero point and a scale per column
    scales = (torch.rand(32, generator=gen) * 0.02 + 0.001).to(dtype)

    def pair(value: float) -> int:  # a 16-bit value in both halves
        bits = int(torch.tensor([value], dtype=dtype).view(torch.int16)[0]) & 0xFFFF
        return bits | bits << 16

    units = []
    for lane in range(32):
        cols = [4 * (lane // 4) + i for i in range(4)]
        unit = {f"${n_out + i}": int(words[lane % 4, col]) for i, col in enumerate(cols)}
        unit.update({f"${n_out + 4 + i}": pair(float(scales[col])) for i, col in enumerate(cols)})
        unit.update({f"${n_out + 8 + i}": pair(-(magic + int(zeros[col]))) for i, col in enumerate(cols)})
        unit.update({f"${n_out + 12 + 4 * blocks + i}": float(c_in[lane, i]) for i in range(n_out)})
        units.append(unit)
    for b in range(blocks):  # the B pairs of each block
        lanes = []
        for lane in range(32):
            g, t = divmod(lane, 4)
            row = 0 if rows == 1 else 8 * b + g
            lanes.append({f"${4 + i}": xbits[row][8 * t + 2 * i] | xbits[row][8 * t + 2 * i + 1] << 16 for i in range(4)})
        _run_warp_ptx(_SAB_XB.value, lanes, dtype)
        for lane, regs in enumerate(lanes):
            units[lane].update({f"${n_out + 12 + 4 * b + i}": regs[f"${i}"] for i in range(4)})
    _run_warp_ptx(_swap_ab_unit_asm(half, rows, deq=True), units, dtype)
    xr = x.double().view(-1, 4, 8)  # (row of x, word row, code j)
    for lane, regs, o, col, row in _each_accumulator(units, blocks, per, rows):
        weight = ((codes[:, :, col].double() - int(zeros[col])) * float(scales[col])).to(dtype).double()
        want = c_in[lane, o] + (weight * xr[row]).sum()
        assert regs[f"${o}"] == pytest.approx(float(want), rel=1e-9, abs=1e-12), (lane, o)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize(
    "case",  # (M, N, K, group_size, V, WARPS, SPLIT_K, PREFETCH, DEQ)
    [(1, 64, 512, 128, 1, 2, 2, True, False),  # two programs a column block, two warps each, one group a warp, loads ahead
     (1, 96, 640, 32, 1, 4, 3, False, False),  # 20 groups in 3 splits of 7 (the last short), 4 warps of 2
     (1, 128, 512, 64, 2, 1, 1, True, False),  # 64-column blocks, one warp runs all 8 groups
     (1, 64, 768, 256, 2, 2, 2, False, False),  # groups of 256 (eight steps), one warp in each split idle
     (1, 32, 256, 32, 1, 4, 5, True, False),  # 8 groups in 5 splits of 2, most warps past their run
     (3, 64, 512, 128, 1, 2, 2, True, False),  # one 8-row block, five of its rows repeats of row 2
     (8, 128, 512, 64, 2, 1, 1, True, False),  # a full block, 64-column blocks
     (11, 96, 640, 32, 1, 4, 3, False, False),  # two blocks, the second short
     (16, 64, 768, 256, 2, 2, 2, False, False),  # two full blocks, groups of 256
     # the codes scaled before the MMAs (DEQ)
     (1, 32, 256, 32, 1, 4, 5, True, True),  # most warps past their run: their scales must be zero
     (1, 128, 512, 64, 2, 1, 1, True, True),
     (11, 96, 640, 32, 1, 4, 3, False, True),
     (16, 64, 768, 256, 2, 2, 2, False, True)],
    ids=lambda c: "M={},N={},K={},g={},V={},warps={},split={},prefetch={},deq={}".format(*c),
)  # fmt: skip
def test_tensor_core_decode_kernel_matches_reference(case, dtype):
    """``w4a16_swap_ab_kernel`` in the interpreter (the MMA's gather over the warp written out),
    launched directly over its tiles: one row, and one or two 8-row blocks of x with rows past M,
    splits of K that leave warps or a split short, prefetching or not, and with ``DEQ`` the codes
    scaled before the MMAs. Scales and zero points come as ``(lanes, 4)`` tiles split into their
    four columns (any mix-up of their order, with random scales, changes the product)."""
    m, n, k, group, v, warps, split, prefetch, deq = case
    x, _, qw = make(m, n, k, group, dtype=dtype)
    q, s, z = w4a16._parts(qw)
    out = torch.empty(m, n, dtype=dtype)
    ws, locks = torch.empty(split, m, n), torch.zeros(64, dtype=torch.int32)
    meta = {"GROUP": group, "ROWS": w4a16_swap_ab._rows(m), "V": v, "WARPS": warps, "SPLIT_K": split, "PREFETCH": prefetch,
            "DEQ": deq}  # fmt: skip
    half = "bf16" if dtype == torch.bfloat16 else "f16"
    args = (x, q, s, z, out, ws, locks, m, n, k, x.stride(0), q.stride(0), s.stride(0), out.stride(0))
    w4a16.w4a16_swap_ab_kernel[(n // (32 * v), split)](*args, **meta, HALF=half, ASM=False, num_warps=warps)
    s32, z32 = (t.float().repeat_interleave(group, 0).t() for t in (qw.scales, qw.zeros))
    expected = x.float() @ ((qw.codes().float() - z32) * s32).t()  # exact weights: the kernel rounds once, at the end
    assert rel_err(out, expected) < (4e-3 if dtype == torch.bfloat16 else 1e-3)
    assert not locks.any()


def test_decode_takes_the_tensor_core_kernel_where_it_fits(monkeypatch):
    x, _, qw = make(1, 64, 256, 64)
    q = qw.qweight
    assert w4a16_swap_ab._swap_ab_fits(x, q, 64)
    assert w4a16_swap_ab._swap_ab_fits(x.expand(16, -1).contiguous(), q, 64)
    assert not w4a16_swap_ab._swap_ab_fits(x.expand(17, -1).contiguous(), q, 64)  # more than 16 rows: the GEMM
    assert not w4a16_swap_ab._swap_ab_fits(x.float(), q, 64)  # float32 x: the FMA kernel
    assert not w4a16_swap_ab._swap_ab_fits(x, q[:, :40], 64)  # N not a multiple of 32
    assert not w4a16_swap_ab._swap_ab_fits(x, q, 16)  # a group shorter than one 32-deep step
    assert not w4a16_swap_ab._swap_ab_fits(torch.randn(1, 257, dtype=x.dtype)[:, 1:], q, 64)  # x not 16-byte aligned
    assert not w4a16_swap_ab._swap_ab_fits(torch.randn(2, 260, dtype=x.dtype)[:, :256], q, 64)  # rows 520 bytes apart
    assert [w4a16_swap_ab._rows(m) for m in (1, 2, 8, 9, 16)] == [1, 8, 8, 16, 16]
    calls = []
    monkeypatch.setattr(w4a16, "_swap_ab", lambda *a: calls.append(a[0].shape[0]))
    for m in (1, 2, 16, 17):
        w4a16.w4a16_linear(x.expand(m, -1).contiguous(), qw)
    assert calls == [1, 2, 16]  # 17 rows: the tiled GEMM


@pytest.mark.parametrize("rows", [1, 8, 16])
def test_tensor_core_decode_plans_fill_the_h200(rows):
    sms = 132
    for n, k in ((28672, 4096), (4096, 14336)):
        plan = w4a16.plan_swap_ab(n, k, 128, sms, rows=rows)
        every = w4a16.plan_swap_ab(n, k, 128, sms, every=True, rows=rows)
        assert 1 <= len(plan) <= (6 if rows == 1 else 12) and set(plan) <= set(every)
        for c in every:
            v, warps, split = c.kwargs["V"], c.kwargs["WARPS"], c.kwargs["SPLIT_K"]
            assert n % (32 * v) == 0 and c.num_warps == warps
            assert 12 * sms <= n // (32 * v) * split * warps <= 48 * sms
            assert math.ceil(math.ceil(k // 128 / split) / warps) >= 2  # two groups or more a warp
        # one candidate per tile, each with its longest run
        tiles = {(c.kwargs["V"], c.kwargs["WARPS"], c.kwargs["PREFETCH"], c.maxnreg, c.kwargs["DEQ"]) for c in plan}
        assert len(tiles) == len(plan)
        # from 8 rows each tile also with its codes scaled before the MMAs (DEQ), at one row never
        deq = {t[:4] for t in tiles if t[4]}
        assert deq == ({t[:4] for t in tiles if not t[4]} if rows > 1 else set())
        # the prefetching tiles carry a register target, but for one at one row
        assert sum(c.kwargs["PREFETCH"] and not c.maxnreg for c in plan) == (rows == 1)
        assert all(any(c is d for d in w4a16_plan._SWAP_AB_BY_ROWS[rows]) for c in plan)  # this row count's tiles
    assert w4a16.plan_swap_ab(256, 512, 128, sms, rows=rows)  # too small for the band: still candidates


def test_nine_to_sixteen_rows_take_the_decode_kernel_measured_faster(monkeypatch):
    """At 9 to 16 rows the dispatcher times both decode kernels once per shape and keeps the faster;
    inside a CUDA graph capture it cannot time and takes the tensor-core one, remembering nothing."""
    times = iter([2.0, 1.0])  # the tensor-core kernel 2 ms, the tl.dot one 1 ms
    calls = []
    monkeypatch.setattr(w4a16, "_replay_ms", lambda fn, device: next(times))
    monkeypatch.setattr(w4a16, "_SWAP_AB_CHOICE", {})
    swap, dot = (lambda: calls.append("swap")), (lambda: calls.append("dot"))
    monkeypatch.setattr(w4a16.torch.cuda, "is_current_stream_capturing", lambda: True)
    assert w4a16._swap_ab_wins("shape", swap, dot, "cuda") and not w4a16._SWAP_AB_CHOICE and not calls
    monkeypatch.setattr(w4a16.torch.cuda, "is_current_stream_capturing", lambda: False)
    assert not w4a16._swap_ab_wins("shape", swap, dot, "cuda")  # measured: the tl.dot kernel
    assert calls == ["swap", "dot"] and w4a16._SWAP_AB_CHOICE == {"shape": False}
    assert not w4a16._swap_ab_wins("shape", swap, dot, "cuda") and calls == ["swap", "dot"]  # remembered, not timed again
