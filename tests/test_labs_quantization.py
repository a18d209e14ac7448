"""The graders of Lab 7 (labs/07_quantization.ipynb): group-wise quantization, 4-bit packing and
the W4A16 GEMV kernel.

- each checker passes on the reference answer in llmnote.labs.solutions;
- each checker fails on the notebook's unfinished stub with one short line;
- each checker fails on typical wrong answers, written here the way a reader gets them wrong,
  with a message that names the failed check and, where it can tell, the mistake.

The GEMV's generic kernel-lab checks (the Triton-ran detector, an empty kernel) run with the
other kernel labs in test_labs.py. On a CPU the kernels run in Triton's interpreter.
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
import torch
from conftest import ROOT

import llmnote  # noqa: F401  (before triton: on a CPU it sets TRITON_INTERPRET=1)

# isort: split
import triton
import triton.language as tl

from llmnote.labs import LabCheckError, LabReport, check_pack_int4, check_quantize_groups, check_w4a16_gemv
from llmnote.labs import solutions as S
from llmnote.quant import pack_codes

pytestmark = [pytest.mark.device, pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]
NOTEBOOK = "labs/07_quantization.ipynb"


def stub(name: str, tmp_path):
    """The notebook's exercise cell that defines ``name``, imported as a module."""
    cells = json.loads((ROOT / NOTEBOOK).read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    (source,) = [s for s in sources if s.startswith("# EXERCISE") and re.search(rf"^def {name}\(", s, re.M)]
    path = tmp_path / f"stub_{name}.py"
    path.write_text("import torch\nimport triton\nimport triton.language as tl\n\n" + source)
    spec = importlib.util.spec_from_file_location(f"stub_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ right answers


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantize_checker_passes_the_solution(seed, capsys):
    report = check_quantize_groups(S.quantize_groups, S.dequantize_groups, seed=seed)
    assert isinstance(report, LabReport) and report.lab == "quantize_groups" and len(report.cases) == 17
    assert set(report.dtypes) == {"float32", "float16", "bfloat16"}
    assert {int(b) for b in re.findall(r"bits=(\d)", " ".join(report.cases))} == {2, 3, 4}
    assert sum(c.startswith("dequantize_groups: ") for c in report.cases) == 5
    assert re.fullmatch(rf"quantize_groups: 17 cases passed \(.+; seed {seed}\)", capsys.readouterr().out.strip())


@pytest.mark.parametrize("seed", [0, 1])
def test_pack_checker_passes_the_solution(seed, capsys):
    report = check_pack_int4(S.pack_int4, seed=seed)
    assert report.lab == "pack_int4" and len(report.cases) == 10
    assert re.fullmatch(rf"pack_int4: 10 cases passed \(uint8; seed {seed}\)", capsys.readouterr().out.strip())


def test_the_solutions_match_the_books_format():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(24, 256, generator=gen)
    qw = llmnote.quant.quantize_weight(w, bits=4, group_size=64)
    codes, scales, zeros = S.quantize_groups(w, 4, 64)
    assert torch.equal(codes, qw.codes()) and torch.equal(scales, qw.scales.t()) and torch.equal(zeros, qw.zeros.t())
    assert torch.equal(S.dequantize_groups(codes, scales, zeros, 64), qw.dequantize())
    assert torch.equal(S.pack_int4(codes), qw.qweight)
    x, qw = torch.randn(256, generator=gen).to(llmnote.runtime.device()), qw.to(llmnote.runtime.device())  # Triton's device
    torch.testing.assert_close(S.w4a16_gemv(x, qw.qweight, qw.scales, qw.zeros, 64), qw.dequantize() @ x)


def test_gemv_checker_covers_ragged_shapes():
    cases = check_w4a16_gemv(S.w4a16_gemv, seed=3, verbose=False).cases
    sizes = [tuple(int(v) for v in re.match(r"N=(\d+), K=(\d+), group_size=(\d+)", c).groups()) for c in cases]
    assert any(n % 32 for n, _, _ in sizes) and any(k % 64 for _, k, _ in sizes) and {16, 128} <= {g for *_, g in sizes}
    assert any("every zero point is 0" in c for c in cases) and any("every zero point is 15" in c for c in cases)


# ------------------------------------------------------------------ unfinished stubs


def test_checkers_fail_the_notebook_stubs(tmp_path):
    quantize, pack, gemv = (stub(name, tmp_path) for name in ("quantize_groups", "pack_int4", "w4a16_gemv"))
    for check, args, name in (
        (check_quantize_groups, (quantize.quantize_groups, quantize.dequantize_groups), "quantize_groups"),
        (check_pack_int4, (pack.pack_int4,), "pack_int4"),
        (check_w4a16_gemv, (gemv.w4a16_gemv,), "w4a16_gemv"),
    ):
        with pytest.raises(LabCheckError, match=f"^{name}: not written yet") as failure:
            check(*args, seed=0)
        rendered = failure.value._render_traceback_()
        assert len(rendered) == 1 and "/" not in rendered[0] and len(rendered[0]) < 250
    with pytest.raises(LabCheckError, match="^dequantize_groups: not written yet"):
        check_quantize_groups(S.quantize_groups, quantize.dequantize_groups, seed=0)


def test_checkers_want_plain_functions_and_the_launcher():
    with pytest.raises(TypeError, match="plain PyTorch function"):
        check_quantize_groups(S.w4a16_gemv_kernel, S.dequantize_groups)
    with pytest.raises(TypeError, match="plain PyTorch function"):
        check_pack_int4("pack_int4")
    with pytest.raises(TypeError, match="not the @triton.jit kernel"):
        check_w4a16_gemv(S.w4a16_gemv_kernel)


# ------------------------------------------------------------ wrong: quantize


def quantize_variant(w, bits, group_size, rounding=torch.round, widen=True, steps=None, dtype=torch.float32, guard=True):
    """The reference quantizer with one of its choices changed."""
    n, k = w.shape
    levels = 2**bits - 1
    groups = w.to(dtype).reshape(n, k // group_size, group_size)
    lo, hi = groups.amin(-1), groups.amax(-1)
    if widen:
        lo, hi = lo.clamp(max=0), hi.clamp(min=0)
    scales = (hi - lo) / (steps or levels)
    if guard:
        scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    zeros = torch.round(-lo / scales)
    q = rounding(groups / scales[..., None]) + zeros[..., None]
    return q.clamp(0, levels).to(torch.uint8).reshape(n, k), scales.float(), zeros.float()


def quantize_symmetric(w, bits, group_size):
    """A grid centred on 0: step max|w| / (2**(bits-1) - 1), zero point 2**(bits-1)."""
    n, k = w.shape
    groups = w.float().reshape(n, k // group_size, group_size)
    scales = groups.abs().amax(-1) / (2 ** (bits - 1) - 1)
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    zeros = torch.full_like(scales, 2 ** (bits - 1))
    q = torch.round(groups / scales[..., None]) + zeros[..., None]
    return q.clamp(0, 2**bits - 1).to(torch.uint8).reshape(n, k), scales, zeros


def quantize_unclamped(w, bits, group_size):
    codes, scales, zeros = S.quantize_groups(w, bits, group_size)
    return codes + 2**bits, scales, zeros  # as if .to(torch.uint8) had run on unclamped codes past the top


WRONG_QUANTIZE = {
    "rounds down": (lambda w, b, g: quantize_variant(w, b, g, rounding=torch.floor), r"(?s)the error bound: w\[.*rounded down"),
    "truncates": (lambda w, b, g: quantize_variant(w, b, g, rounding=torch.trunc), "(?s)the error bound.*torch.round"),
    "symmetric": (quantize_symmetric, "(?s)the scale: row 0, group 0 .*symmetric grid"),
    "range not widened to 0": (lambda w, b, g: quantize_variant(w, b, g, widen=False), "(?s)the scale.*Widen the range"),
    "2**bits steps": (lambda w, b, g: quantize_variant(w, b, g, steps=2**b), "(?s)the scale.*make 2\\*\\*bits - 1 = 15 steps"),
    "no guard for all-zero groups": (lambda w, b, g: quantize_variant(w, b, g, guard=False), "(?s)scale 0.*all 0"),
    "float16 arithmetic": (lambda w, b, g: quantize_variant(w, b, g, dtype=w.dtype), "(?s)the scale.*Compute in float32"),
    "codes not clamped": (quantize_unclamped, "above the largest 4-bit code 15"),
    "returns codes only": (lambda w, b, g: S.quantize_groups(w, b, g)[0], "not three tensors"),
    "scales (K // G, N)": (
        lambda w, b, g: (lambda c, s, z: (c, s.t(), z.t()))(*S.quantize_groups(w, b, g)),
        r"scales has shape \(1, 3\)",
    ),
}


@pytest.mark.parametrize("wrong", WRONG_QUANTIZE)
def test_quantize_checker_names_the_failed_check(wrong):
    fn, message = WRONG_QUANTIZE[wrong]
    with pytest.raises(LabCheckError, match=message) as failure:
        check_quantize_groups(fn, S.dequantize_groups, seed=0, verbose=False)
    assert str(failure.value).startswith("quantize_groups failed on case ") and "Hint:" in str(failure.value)
    assert "check_quantize_groups(quantize_groups, dequantize_groups, seed=0)" in str(failure.value)


def dequantize_without_zero(codes, scales, zeros, group_size):
    return (codes.float().reshape(*scales.shape, group_size) * scales[..., None]).reshape(codes.shape)


def dequantize_repeat(codes, scales, zeros, group_size):
    """Expands with .repeat (tiling the groups) where repeat_interleave is meant."""
    return (codes.float() - zeros.repeat(1, group_size)) * scales.repeat(1, group_size)


WRONG_DEQUANTIZE = {
    "no zero point": (dequantize_without_zero, "zero point is missing"),
    "q * s - z": (
        lambda q, s, z, g: (q.float().reshape(*s.shape, g) * s[..., None] - z[..., None]).reshape(q.shape),
        "zero point is a code",
    ),
    ".repeat": (dequantize_repeat, "repeat_interleave"),
    "float64 output": (lambda q, s, z, g: S.dequantize_groups(q, s, z, g).double(), "dtype float64"),
}


@pytest.mark.parametrize("wrong", WRONG_DEQUANTIZE)
def test_dequantize_checker_names_the_mistake(wrong):
    fn, message = WRONG_DEQUANTIZE[wrong]
    with pytest.raises(LabCheckError, match=f"(?s)^dequantize_groups failed on case 1[3-7] of 17.*{message}"):
        check_quantize_groups(S.quantize_groups, fn, seed=1, verbose=False)


# ------------------------------------------------------------------- wrong: pack


def pack_reversed(codes):
    """The first code of each word in the top nibble."""
    n, k = codes.shape
    nibbles = codes.to(torch.int32).t().reshape(k // 8, 8, n)
    shifts = 28 - 4 * torch.arange(8, dtype=torch.int32, device=codes.device)
    return (nibbles << shifts[None, :, None]).sum(dim=1, dtype=torch.int32)


def pack_in_uint8(codes):
    """Shifts the uint8 codes themselves: the high bits fall off."""
    n, k = codes.shape
    shifted = codes.t().reshape(k // 8, 8, n) << (4 * torch.arange(8, dtype=torch.uint8, device=codes.device))[None, :, None]
    return shifted.sum(dim=1, dtype=torch.int32)


WRONG_PACK = {
    "reversed nibble order": (pack_reversed, r"(?s)the bits: word \(0, 0\) is 0x12345678, expected 0x87654321.*reversed"),
    "N-major words": (lambda c: S.pack_int4(c).t(), r"(?s)shape \(3, 2\), expected .*transpose to \(K // 8, N\)"),
    "int64 words": (lambda c: S.pack_int4(c).long(), "dtype int64, expected int32"),
    "shifts in uint8": (pack_in_uint8, "(?s)the bits.*Shift in int32"),
    "writes into codes": (lambda c: pack_codes(c.clamp_(0, 7), 4), "changed its input"),
}


@pytest.mark.parametrize("wrong", WRONG_PACK)
def test_pack_checker_names_the_failed_check(wrong):
    fn, message = WRONG_PACK[wrong]
    with pytest.raises(LabCheckError, match=message) as failure:
        check_pack_int4(fn, seed=0, verbose=False)
    message = str(failure.value)
    assert message.startswith("pack_int4 failed on case ") and "check_pack_int4(pack_int4, seed=0)" in message


# -------------------------------------------------------------------- wrong: GEMV


@triton.jit
def gemv_variant_kernel(
    x_ptr, packed_ptr, scales_ptr, zeros_ptr, out_ptr, N, K, group_size,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    USE_ZERO: tl.constexpr, REVERSED: tl.constexpr, MASK_K: tl.constexpr, MASK_STORE: tl.constexpr,
):  # fmt: skip
    """The reference kernel with one of its parts changed."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        k_ok = k < K if MASK_K else k >= 0
        ok = k_ok[:, None] & (cols < N)[None, :]
        words = tl.load(packed_ptr + (k // 8)[:, None] * N + cols[None, :], mask=ok, other=0)
        shift = 28 - 4 * (k % 8) if REVERSED else 4 * (k % 8)
        q = ((words >> shift[:, None]) & 0xF).to(tl.float32)
        group = (k // group_size)[:, None] * N + cols[None, :]
        s = tl.load(scales_ptr + group, mask=ok, other=0.0).to(tl.float32)
        if USE_ZERO:
            q = q - tl.load(zeros_ptr + group, mask=ok, other=0.0).to(tl.float32)
        xk = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        acc += tl.sum(q * s * xk[:, None], axis=0)
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=cols < N if MASK_STORE else cols >= 0)


def gemv_variant(use_zero=True, reversed=False, mask_k=True, mask_store=True):
    def w4a16_gemv(x, packed, scales, zeros, group_size):
        K, N = x.shape[0], packed.shape[1]
        out = torch.empty((N,), dtype=x.dtype, device=x.device)
        gemv_variant_kernel[(triton.cdiv(N, 32),)](
            x, packed, scales, zeros, out, N, K, group_size, BLOCK_N=32, BLOCK_K=64,
            USE_ZERO=use_zero, REVERSED=reversed, MASK_K=mask_k, MASK_STORE=mask_store,
        )  # fmt: skip
        return out

    return w4a16_gemv


def gemv_in_torch(x, packed, scales, zeros, group_size):
    w = llmnote.quant.unpack_codes(packed, 4).float()
    return w @ x.float()


WRONG_GEMV = {
    "forgets the zero point": (gemv_variant(use_zero=False), r"(?s)outputs are off.*Hint: Your outputs equal x @ \(q \* s\)\.T"),
    "nibbles in reverse order": (gemv_variant(reversed=True), "(?s)outputs are off.*unpacked in reverse order"),
    "no mask on k": (gemv_variant(mask_k=False), "(?s)K=32.*NaN"),
    "no store mask": (gemv_variant(mask_store=False), "outside the output tensor"),
    "computed in torch": (gemv_in_torch, "launched no Triton kernel and computed with torch"),
}


@pytest.mark.parametrize("wrong", WRONG_GEMV)
def test_gemv_checker_names_the_failed_check(wrong):
    fn, message = WRONG_GEMV[wrong]
    with pytest.raises(LabCheckError, match=message) as failure:
        check_w4a16_gemv(fn, seed=0, verbose=False)
    message = str(failure.value)
    assert message.startswith("w4a16_gemv failed on case ") and "check_w4a16_gemv(w4a16_gemv, seed=0)" in message
