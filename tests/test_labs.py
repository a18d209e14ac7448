"""The graders of the kernel labs (llmnote.labs, labs 1 to 4) and the Triton-ran detector.

- each checker passes on the reference answer in llmnote.labs.solutions;
- each checker fails on the notebook's unfinished stub and on typical wrong answers,
  written here the way a reader gets them wrong;
- a kernel checker fails, saying that no Triton kernel computed the result, when the answer
  comes from torch: computed without a kernel, or a kernel's output overwritten by torch math,
  or the book's own kernel launched instead of the reader's.

A "lab" below is one exercise and its checker, named after the function the reader writes;
lab 4's notebook holds two: ``merge`` (plain PyTorch) and ``attention`` (a Triton kernel).
The notebooks themselves are tested in test_labs_notebooks.py, labs 5 and 6 in
test_labs_plain_python.py.

On a CPU the kernels run in Triton's interpreter; nothing here is skipped there.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import ROOT

import llmnote  # before triton: on a CPU it sets TRITON_INTERPRET=1
import llmnote.kernels

# isort: split
import triton
import triton.language as tl
from triton.runtime.jit import KernelInterface

from llmnote.labs import (
    LabCheckError,
    LabReport,
    check_attention,
    check_matmul,
    check_softmax,
    check_softmax_merge,
    check_vector_add,
    check_w4a16_gemv,
    solutions,
)
from llmnote.labs.sandbox import TritonWatch

LABS = {
    "vector_add": ("labs/02_vector_add.ipynb", check_vector_add),
    "softmax": ("labs/03_fused_softmax.ipynb", check_softmax),
    "matmul": ("labs/04_tiled_matmul.ipynb", check_matmul),
    "merge": ("labs/06_flash_attention.ipynb", check_softmax_merge),
    "attention": ("labs/06_flash_attention.ipynb", check_attention),
    "w4a16_gemv": ("labs/07_quantization.ipynb", check_w4a16_gemv),
}
KERNEL_LABS = [lab for lab in LABS if lab != "merge"]  # the labs whose answer is a Triton kernel and launcher
# The interpreter itself trips a NumPy deprecation on every scalar index; not ours to fix.
pytestmark = [pytest.mark.device, pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]


def exercise_source(lab: str) -> str:
    """The source of the notebook's exercise cell (first line ``# EXERCISE``) that defines ``lab``."""
    cells = json.loads((ROOT / LABS[lab][0]).read_text())["cells"]
    sources = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    found = [s for s in sources if s.startswith(solutions.EXERCISE_MARK) and re.search(rf"^def {lab}\(", s, re.MULTILINE)]
    assert len(found) == 1, f"expected one exercise cell defining {lab}, found {len(found)}"
    return found[0]


def load_cell(source: str, tmp_path: Path, name: str):
    """Import a notebook cell's source as a module (Triton reads a kernel's source from its file)."""
    path = tmp_path / f"{name}.py"
    path.write_text("import torch\nimport triton\nimport triton.language as tl\n\n" + source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------ right answers


@pytest.mark.parametrize("lab", LABS)
@pytest.mark.parametrize("seed", [0, 1])
def test_checker_passes_the_solution(lab, seed, capsys):
    check = LABS[lab][1]
    report = check(getattr(solutions, lab), seed=seed)
    assert isinstance(report, LabReport) and report.lab == lab and report.seed == seed
    assert len(report.cases) >= 12
    if lab == "merge":  # plain PyTorch: the dtypes the merge state is kept in
        expected_dtypes = {"float32", "float64"}
    else:
        half = llmnote.runtime.half_dtype()
        expected_dtypes = {"float32", "float16"} | ({"bfloat16"} if half == torch.bfloat16 else set())
    assert set(report.dtypes) == expected_dtypes
    assert capsys.readouterr().out.strip() == str(report)
    assert re.fullmatch(rf"{lab}: \d+ cases passed \(.+; seed {seed}\)", str(report))


def test_checker_draws_new_shapes_for_each_seed():
    one, two = (check_vector_add(solutions.vector_add, seed=s, verbose=False) for s in (3, 4))
    assert one.cases != two.cases
    assert check_vector_add(solutions.vector_add, seed=3, verbose=False).cases == one.cases


def test_attention_checker_covers_heads_and_causal_masks():
    cases = check_attention(solutions.attention, seed=2, verbose=False).cases
    assert any("Hq=4, Hkv=2" in c for c in cases) and any("Hq=6, Hkv=1" in c for c in cases)
    assert sum(", causal, " in c for c in cases) >= 5
    assert any("Sq=50, Skv=20" in c and "see no key" in c for c in cases)


# ------------------------------------------------------------------ unfinished stubs


@pytest.mark.parametrize("lab", LABS)
def test_checker_fails_the_notebook_stub(lab, tmp_path):
    stub = load_cell(exercise_source(lab), tmp_path, f"stub_{lab}")
    with pytest.raises(LabCheckError, match=f"{lab}: not written yet") as failure:
        LABS[lab][1](getattr(stub, lab), seed=0)
    # One short line in Jupyter, no traceback: IPython prints what _render_traceback_ returns.
    rendered = failure.value._render_traceback_()
    assert len(rendered) == 1 and rendered[0].startswith(f"LabCheckError: {lab}: not written yet") and "/" not in rendered[0]


@pytest.mark.parametrize("lab", KERNEL_LABS)
def test_checker_fails_a_launcher_around_an_empty_kernel(lab, tmp_path):
    # the launcher is written, the kernel body is still `pass`: nothing is stored, outputs stay NaN
    source = exercise_source(lab)
    kernel_only = source[: source.rindex("\ndef ")]
    launcher = solutions.source(lab)
    launcher = launcher[launcher.rindex("\ndef ") :]
    module = load_cell(kernel_only + launcher, tmp_path, f"empty_{lab}")
    with pytest.raises(LabCheckError, match="NaN"):
        LABS[lab][1](getattr(module, lab), seed=0)


def test_checker_wants_the_launcher_not_the_kernel():
    with pytest.raises(TypeError, match="not the @triton.jit kernel"):
        check_vector_add(solutions.add_kernel)
    with pytest.raises(TypeError, match="launcher"):
        check_matmul("matmul")
    with pytest.raises(TypeError, match="not the @triton.jit kernel"):
        check_attention(solutions.attention_kernel)
    with pytest.raises(TypeError, match="plain PyTorch function"):
        check_softmax_merge(solutions.attention_kernel)


def test_an_error_in_the_readers_code_shows_where_it_happened(tmp_path):
    module = load_cell(
        "def vector_add(x, y):\n    out = torch.empty_like(x)\n    return out[10**9]  # out of range\n", tmp_path, "raising"
    )
    with pytest.raises(LabCheckError, match="raised IndexError") as failure:
        check_vector_add(module.vector_add, seed=0)
    rendered = failure.value._render_traceback_()
    assert rendered[0].startswith("LabCheckError: vector_add failed on case 1 of 12")
    where = rendered[rendered.index("Where, in your code:") + 1 :]
    assert where and "raising.py, line 7, in vector_add" in where[-1] and "out[10**9]" in where[-1]
    assert not any("llmnote" in line or "site-packages" in line for line in where)


# ------------------------------------------------------------ the Triton-ran detector

NO_KERNEL = "no Triton kernel (of yours )?computed the result"


@triton.jit
def empty_add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    pass


def launch_then_overwrite(x, y):
    """Launches a kernel that computes nothing, then fills the output with torch math."""
    out = torch.empty_like(x)
    empty_add_kernel[(triton.cdiv(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
    out.copy_(x + y)
    return out


def launch_into_another_tensor(x, y):
    scratch, out = torch.empty_like(x), torch.empty_like(x)
    solutions.add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, scratch, x.numel(), BLOCK=1024)
    return out


def ref_attention(q, k, v, causal=False):
    return llmnote.ref.flash_attention(q[None], k[None], v[None], causal=causal)[0]


def scaled_in_torch(q, k, v, causal=False):
    """Does part of the work (the scaling) in torch before a correct kernel."""
    return solutions.attention(q * 1.0, k, v, causal=causal)


TORCH_ANSWERS = {
    "vector_add: x + y": (check_vector_add, lambda x, y: x + y, "launched no Triton kernel and computed with torch: Tensor.add"),
    "softmax: torch.softmax": (
        check_softmax,
        lambda x: torch.softmax(x.float(), -1).to(x.dtype),
        "launched no Triton kernel and computed with torch: torch.softmax",
    ),
    "matmul: a @ b": (check_matmul, lambda a, b: a @ b, r"computed with torch: Tensor.matmul \(@\)"),
    "attention: llmnote.ref": (check_attention, ref_attention, "launched no Triton kernel and computed with torch"),
    "attention: SDPA": (
        check_attention,
        lambda q, k, v, causal=False: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal),
        "computed with torch: F.scaled_dot_product_attention",
    ),
    "vector_add: a kernel, then torch overwrites its output": (
        check_vector_add,
        launch_then_overwrite,
        "outside its Triton kernel, `vector_add` computed with torch: Tensor.add",
    ),
    "attention: a kernel after torch did part of the work": (check_attention, scaled_in_torch, "computed with torch: Tensor.mul"),
    "vector_add: the book's own kernel": (
        check_vector_add,
        lambda x, y: llmnote.kernels.vector_add(x, y),
        "no Triton kernel of yours computed the result: `vector_add` launched only the book's own kernels",
    ),
    "vector_add: a kernel wrote another tensor": (
        check_vector_add,
        launch_into_another_tensor,
        "never passed to a Triton kernel",
    ),
    "vector_add: no launch, no math": (check_vector_add, lambda x, y: torch.empty_like(x), "launched no Triton kernel"),
}


@pytest.mark.parametrize("answer", TORCH_ANSWERS)
def test_kernel_checkers_fail_answers_that_torch_computed(answer):
    check, fn, message = TORCH_ANSWERS[answer]
    with pytest.raises(LabCheckError, match=message) as failure:
        check(fn, seed=0, verbose=False)
    text = str(failure.value)
    assert re.search(NO_KERNEL, text) and "case 1 of" in text and "Hint: " in text


def test_a_launcher_may_allocate_view_and_read_metadata():
    def roundabout(x, y):  # every torch call here is allocation, metadata, a view or a copy
        flat_x, flat_y = x.reshape(-1).contiguous(), y.view(-1)
        n = flat_x.numel()
        assert x.is_contiguous() and x.dim() >= 1 and x.stride(-1) == 1 and x.data_ptr()
        out = torch.zeros(n, dtype=x.dtype, device=x.device)
        solutions.add_kernel[(triton.cdiv(n, 256),)](flat_x, flat_y, out, n, BLOCK=256)
        print(f"{tuple(x.shape)} {x.dtype}", end="")
        return out.view(x.shape)

    assert check_vector_add(roundabout, seed=0, verbose=False).lab == "vector_add"


def _add(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


# One kernel body behind the two wrappers a reader may use: heuristics, and autotune over heuristics.
add_kernel_with_heuristics = triton.heuristics({"BLOCK": lambda args: 256})(triton.jit(_add))
add_kernel_autotuned = triton.autotune(configs=[triton.Config({}, num_warps=4)], key=["n_elements"])(
    triton.heuristics({"BLOCK": lambda args: 512})(triton.jit(_add))
)


@pytest.mark.parametrize("kernel", [add_kernel_with_heuristics, add_kernel_autotuned], ids=["heuristics", "autotune"])
def test_launches_through_triton_wrappers_count(kernel):
    def vector_add(x, y):
        out = torch.empty_like(x)
        kernel[lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)](x, y, out, x.numel())
        return out

    assert check_vector_add(vector_add, seed=1, verbose=False).lab == "vector_add"


def test_the_watch_restores_what_it_patched():
    classes = [cls for cls in (KernelInterface, *KernelInterface.__subclasses__()) if "run" in vars(cls)]
    runs = {cls: vars(cls)["run"] for cls in classes}
    factories = {name: getattr(torch, name) for name in ("empty", "empty_like", "zeros", "zeros_like")}
    with pytest.raises(LabCheckError):
        check_vector_add(launch_then_overwrite, seed=0, verbose=False)
    with pytest.raises(LabCheckError):
        check_vector_add(lambda x, y: 1 / 0, seed=0, verbose=False)
    assert {cls: vars(cls)["run"] for cls in classes} == runs
    assert {name: getattr(torch, name) for name in factories} == factories
    assert (torch.ones(2) + 1).tolist() == [2.0, 2.0]  # no torch-function mode left behind
    with TritonWatch() as watch:
        torch.ones(3).sum()
    assert watch.torch_calls == ["Tensor.sum"] and watch.launches == []


# --------------------------------------------------------------- wrong: vector add


@triton.jit
def add_no_mask_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets) + tl.load(y_ptr + offsets))


@triton.jit
def add_off_by_one_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets <= n_elements
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + tl.load(y_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def sub_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) - tl.load(y_ptr + offsets, mask=mask), mask=mask)


def launch_add(kernel, x, y, out=None, programs=triton.cdiv):
    out = torch.empty_like(x) if out is None else out
    kernel[(programs(x.numel(), 128),)](x, y, out, x.numel(), BLOCK=128)
    return out


WRONG_ADD = {
    "no mask": (lambda x, y: launch_add(add_no_mask_kernel, x, y), "outside the output tensor"),
    "mask <= n": (lambda x, y: launch_add(add_off_by_one_kernel, x, y), "outside the output tensor"),
    "grid n // BLOCK": (lambda x, y: launch_add(solutions.add_kernel, x, y, programs=lambda n, b: n // b), "NaN"),
    "x - y": (lambda x, y: launch_add(sub_kernel, x, y), "outputs are off"),
    "float32 output": (
        lambda x, y: launch_add(solutions.add_kernel, x, y, out=torch.empty(x.shape, device=x.device)),
        "dtype float32",
    ),
    "writes into x": (lambda x, y: launch_add(solutions.add_kernel, x, y, out=x), "input 0 changed"),
    "returns None": (lambda x, y: None, "returned None"),
    "flattens": (lambda x, y: solutions.vector_add(x, y).flatten(), r"shape \(3000,\)"),
}


@pytest.mark.parametrize("wrong", WRONG_ADD)
def test_vector_add_checker_fails_wrong_answers(wrong):
    fn, message = WRONG_ADD[wrong]
    with pytest.raises(LabCheckError, match=message) as failure:
        check_vector_add(fn, seed=0, verbose=False)
    assert "seed=0" in str(failure.value) and "Hint:" in str(failure.value)


# ------------------------------------------------------------------ wrong: softmax


@triton.jit
def softmax_no_max_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    row, cols = tl.program_id(0), tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x)  # no max subtraction
    tl.store(out_ptr + row * out_row_stride + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_unnormalised_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    row, cols = tl.program_id(0), tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))  # no division by the sum
    tl.store(out_ptr + row * out_row_stride + cols, e.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def softmax_zero_padding_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    row, cols = tl.program_id(0), tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)  # should be -inf
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(out_ptr + row * out_row_stride + cols, (e / tl.sum(e, axis=0)).to(out_ptr.dtype.element_ty), mask=mask)


def launch_softmax(x, kernel=solutions.softmax_kernel, row_stride=None, block=None, dtype=None):
    n_rows, n_cols = x.shape
    out = torch.empty((n_rows, n_cols), dtype=dtype or x.dtype, device=x.device)
    stride = x.stride(0) if row_stride is None else row_stride
    block = block or triton.next_power_of_2(n_cols)
    kernel[(n_rows,)](x, out, n_cols, stride, out.stride(0), BLOCK=block)
    return out


WRONG_SOFTMAX = {
    "no max subtraction": (lambda x: launch_softmax(x, softmax_no_max_kernel), "huge logits"),
    "padding loads 0": (lambda x: launch_softmax(x, softmax_zero_padding_kernel), "other=-float"),
    "row stride n_cols": (lambda x: launch_softmax(x, row_stride=x.shape[1]), "column slice"),
    "BLOCK fixed at 1024": (lambda x: launch_softmax(x, block=1024), "NaN"),
    "float32 output": (lambda x: launch_softmax(x, dtype=torch.float32), "dtype float32"),
    "not normalised": (lambda x: launch_softmax(x, softmax_unnormalised_kernel), "outputs are off"),
}


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # the interpreter's exp overflows, as it should
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("wrong", WRONG_SOFTMAX)
def test_softmax_checker_fails_wrong_answers(wrong):
    fn, message = WRONG_SOFTMAX[wrong]
    with pytest.raises(LabCheckError, match=message):
        check_softmax(fn, seed=0, verbose=False)


# ------------------------------------------------------------------- wrong: matmul


@triton.jit
def matmul_variant_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MASK_K: tl.constexpr,
    MASK_STORE: tl.constexpr,
):
    """The reference kernel with one of its safeguards switched off."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_ok = rk < K - k if MASK_K else rk < BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    store_ok = (rm[:, None] < M) & (rn[None, :] < N) if MASK_STORE else rm[:, None] >= 0
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=store_ok)


def launch_matmul(a, b, strides=None, mask_k=True, mask_store=True, dtype=None):
    (M, K), N = a.shape, b.shape[1]
    c = torch.empty((M, N), dtype=dtype or a.dtype, device=a.device)
    strides = strides or (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    grid = (triton.cdiv(M, 32), triton.cdiv(N, 32))
    matmul_variant_kernel[grid](
        a, b, c, M, N, K, *strides, c.stride(0), c.stride(1),
        BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, MASK_K=mask_k, MASK_STORE=mask_store,
    )  # fmt: skip
    return c


WRONG_MATMUL = {
    "no K-tail mask": (lambda a, b: launch_matmul(a, b, mask_k=False), "NaN|outputs are off"),
    "B transposed (strides swapped)": (
        lambda a, b: launch_matmul(a, b, strides=(a.stride(0), a.stride(1), b.stride(1), b.stride(0))),
        "outputs are off|NaN",
    ),
    "assumes contiguous inputs": (lambda a, b: launch_matmul(a, b, strides=(a.shape[1], 1, b.shape[1], 1)), "transposed"),
    "no store mask": (lambda a, b: launch_matmul(a, b, mask_store=False), "outside the output tensor"),
    "float32 output": (lambda a, b: launch_matmul(a, b, dtype=torch.float32), "dtype float32"),
    "flattened output": (lambda a, b: solutions.matmul(a, b).flatten(), r"shape \(1,\), expected \(1, 1\)"),
}


@pytest.mark.parametrize("wrong", WRONG_MATMUL)
def test_matmul_checker_fails_wrong_answers(wrong):
    fn, message = WRONG_MATMUL[wrong]
    with pytest.raises(LabCheckError, match=message):
        check_matmul(fn, seed=0, verbose=False)


def test_a_failure_names_the_case_and_the_error():
    with pytest.raises(LabCheckError) as failure:
        check_matmul(lambda a, b: launch_matmul(a, b, mask_k=False), seed=0, verbose=False)
    message = str(failure.value)
    assert re.search(r"matmul failed on case \d+ of 12: M=\d+, N=\d+, K=\d+, .*, (float32|float16|bfloat16)", message), message
    assert "Mask the loads along K" in message and "check_matmul(matmul, seed=0)" in message


# ------------------------------------------------------------------- wrong: merge


def merge_variant(m1, l1, o1, m2, l2, o2, pick=torch.maximum, guard=True, rescale_o=True, normalise=False):
    """The reference merge with one of its safeguards changed."""
    m = pick(m1, m2)
    base = torch.where(m == -torch.inf, torch.zeros_like(m), m) if guard else m
    a1, a2 = torch.exp(m1 - base), torch.exp(m2 - base)
    lsum = a1 * l1 + a2 * l2
    o = a1[..., None] * o1 + a2[..., None] * o2 if rescale_o else o1 + o2
    if normalise:
        o = o / torch.where(lsum == 0, 1.0, lsum)[..., None]
    return m, lsum, o


def merge_by_mass(m1, l1, o1, m2, l2, o2):
    """Mixes the parts by their total mass l * exp(m): right on paper, overflows in floating point."""
    m = torch.maximum(m1, m2)
    e1, e2 = torch.exp(m1), torch.exp(m2)
    scale = torch.where(m == -torch.inf, 1.0, torch.exp(m))  # empty rows stay empty
    return m, (e1 * l1 + e2 * l2) / scale, (e1[..., None] * o1 + e2[..., None] * o2) / scale[..., None]


def merge_rows_2d(m1, l1, o1, m2, l2, o2):
    """Broadcasts with [:, None]: right for (rows,) states, wrong with batch or head dimensions."""
    m = torch.maximum(m1, m2)
    base = torch.where(m == -torch.inf, torch.zeros_like(m), m)
    a1, a2 = torch.exp(m1 - base), torch.exp(m2 - base)
    return m, a1 * l1 + a2 * l2, a1[:, None] * o1 + a2[:, None] * o2


def merge_into_o1(m1, l1, o1, m2, l2, o2):
    m, lsum, o = solutions.merge(m1, l1, o1, m2, l2, o2)
    return m, lsum, o1.copy_(o)


WRONG_MERGE = {
    "forgets to rescale o": (lambda *a: merge_variant(*a, rescale_o=False), "o is off"),
    "min instead of max": (lambda *a: merge_variant(*a, pick=torch.minimum), "m is wrong"),
    "no -inf guard": (lambda *a: merge_variant(*a, guard=False), "NaN: an empty part has m=-inf"),
    "normalises o": (lambda *a: merge_variant(*a, normalise=True), "looks divided by l"),
    "exp(m) on its own": (merge_by_mass, "(?s)huge logits.*overflowed"),
    "[:, None] with leading dims": (merge_rows_2d, "(?s)batch and head dimensions.*raised RuntimeError"),
    "writes into o1": (merge_into_o1, "changed its input o1"),
    "returns o only": (lambda *a: solutions.merge(*a)[2], "not three tensors"),
}


@pytest.mark.parametrize("wrong", WRONG_MERGE)
def test_merge_checker_fails_wrong_answers(wrong):
    fn, message = WRONG_MERGE[wrong]
    with pytest.raises(LabCheckError, match=message) as failure:
        check_softmax_merge(fn, seed=0, verbose=False)
    assert "check_softmax_merge(merge, seed=0)" in str(failure.value) and "Hint:" in str(failure.value)


def test_merge_checker_checks_every_call():
    calls = []

    def counting(*args):
        calls.append([t.shape for t in args])
        return solutions.merge(*args)

    report = check_softmax_merge(counting, seed=5, verbose=False)
    parts = [int(n) for case in report.cases for n in re.search(r"parts of ([\d, ]+) keys", case).group(1).split(",")]
    assert len(calls) == len(parts) - len(report.cases)  # k parts take k - 1 merges
    assert any(len(shapes[0]) == 3 for shapes in calls)  # m with a batch and a head dimension in front


def test_merge_failure_names_the_call():
    with pytest.raises(LabCheckError) as failure:
        check_softmax_merge(lambda *a: merge_variant(*a, guard=False), seed=0, verbose=False)
    message = str(failure.value)
    call = r"\n  in call 1 of \d+: merge\(an empty part"
    assert re.search(r"merge failed on case \d+ of 14: scores \(.*, float(32|64)" + call, message), message


# --------------------------------------------------------------- wrong: attention


@triton.jit
def attention_variant_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    out_ptr,
    Sq,
    Skv,
    GROUP,
    HKV,
    sm_scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_LOADS: tl.constexpr,
    MASK_SCORES: tl.constexpr,
    SUBTRACT_MAX: tl.constexpr,
    RESCALE: tl.constexpr,
    NORMALISE: tl.constexpr,
    MASK_STORE: tl.constexpr,
    HEAD_MODULO: tl.constexpr,
    TOP_LEFT: tl.constexpr,
    GUARD: tl.constexpr,
):
    """The reference kernel with one of its safeguards switched off."""
    head = tl.program_id(1)
    kv_head = head % HKV if HEAD_MODULO else head // GROUP
    q_ptr += head * Sq * D
    out_ptr += head * Sq * D
    k_ptr += kv_head * Skv * D
    v_ptr += kv_head * Skv * D
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D)
    q = tl.load(q_ptr + rows[:, None] * D + dims[None, :], mask=rows[:, None] < Sq, other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)
    for start in range(0, Skv, BLOCK_N):
        keys = start + cols
        load_ok = keys < Skv if MASK_LOADS else keys >= 0
        k = tl.load(k_ptr + keys[:, None] * D + dims[None, :], mask=load_ok[:, None], other=0.0)
        v = tl.load(v_ptr + keys[:, None] * D + dims[None, :], mask=load_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale
        visible = keys[None, :] < Skv if MASK_SCORES else keys[None, :] >= 0
        if CAUSAL:
            shift = 0 if TOP_LEFT else Skv - Sq
            visible = visible & (keys[None, :] <= rows[:, None] + shift)
        s = tl.where(visible, s, float("-inf"))
        if SUBTRACT_MAX:
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
        else:
            m_new = tl.zeros((BLOCK_M,), dtype=tl.float32)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new) if GUARD else m_new
        if RESCALE:
            alpha = tl.exp(m_i - m_safe)
        else:
            alpha = tl.where(m_i == float("-inf"), 0.0, 1.0)
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    if NORMALISE:
        out = acc / (tl.where(l_i == 0.0, 1.0, l_i) if GUARD else l_i)[:, None]
    else:
        out = acc
    store_ok = rows[:, None] < Sq if MASK_STORE else rows[:, None] >= 0
    tl.store(out_ptr + rows[:, None] * D + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=store_ok)


def launch_attention(q, k, v, causal=False, programs=triton.cdiv, dtype=None, scale=None, **switches):
    (hq, sq, d), (hkv, skv, _) = q.shape, k.shape
    out = torch.empty((hq, sq, d), dtype=dtype or q.dtype, device=q.device)
    flags = {"mask_loads": True, "mask_scores": True, "subtract_max": True, "rescale": True, "normalise": True}
    flags |= {"mask_store": True, "head_modulo": False, "top_left": False, "guard": True} | switches
    attention_variant_kernel[(programs(sq, 32), hq)](
        q, k, v, out, sq, skv, hq // hkv, hkv, d**-0.5 if scale is None else scale, D=d, BLOCK_M=32, BLOCK_N=32,
        CAUSAL=causal, **{name.upper(): value for name, value in flags.items()},
    )  # fmt: skip
    return out


def wrong(**switches):
    return lambda q, k, v, causal=False: launch_attention(q, k, v, causal, **switches)


WRONG_ATTENTION = {
    "no key mask": (wrong(mask_loads=False, mask_scores=False), "NaN"),
    "padding keys score 0": (wrong(mask_scores=False), "outputs are off"),
    "no max subtraction": (wrong(subtract_max=False), "(?s)large scores.*(NaN|infinite)"),
    "no running-max rescale": (wrong(rescale=False), "outputs are off"),
    "no normalisation": (wrong(normalise=False), "outputs are off"),
    "no store mask": (wrong(mask_store=False), "outside the output tensor"),
    "grid Sq // BLOCK_M": (wrong(programs=lambda n, b: max(n // b, 1)), "NaN"),
    "no 1/sqrt(D) scale": (wrong(scale=1.0), "outputs are off"),
    "float32 output": (wrong(dtype=torch.float32), "dtype float32"),
    "kv head h % Hkv": (wrong(head_modulo=True), "(?s)Hq=4, Hkv=2.*outputs are off.*h // GROUP"),
    "causal mask ignored": (lambda q, k, v, causal=False: launch_attention(q, k, v, False), "(?s)causal with Sq = Skv.*are off"),
    "top-left causal mask": (wrong(top_left=True), "(?s)causal with one query.*are off.*bottom-right aligned"),
    "no -inf guard": (wrong(guard=False), "(?s)more queries than keys.*NaN.*see no key at all"),
}


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # the interpreter's exp overflows, as it should
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("wrong_answer", WRONG_ATTENTION)
def test_attention_checker_fails_wrong_answers(wrong_answer):
    fn, message = WRONG_ATTENTION[wrong_answer]
    with pytest.raises(LabCheckError, match=message) as failure:
        check_attention(fn, seed=0, verbose=False)
    assert "check_attention(attention, seed=0)" in str(failure.value) and "Hint:" in str(failure.value)
