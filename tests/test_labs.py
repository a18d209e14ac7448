"""The lab checkers (llmnote.labs) and the lab notebooks (labs/*.ipynb).

- each checker passes on the reference answer in llmnote.labs.solutions;
- each checker fails on the notebook's unfinished stub and on typical wrong answers,
  written here the way a reader gets them wrong;
- each lab notebook runs clean, top to bottom, with the reference answer in place of its
  exercise cell (the cell whose first line is ``# EXERCISE``).

On a CPU the kernels run in Triton's interpreter; nothing here is skipped there.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest
import torch
from conftest import ROOT
from nbclient import NotebookClient

import llmnote  # before triton: on a CPU it sets TRITON_INTERPRET=1

# isort: split
import triton
import triton.language as tl

from llmnote.labs import LabCheckError, LabReport, check_matmul, check_softmax, check_vector_add, solutions

LABS = {
    "vector_add": ("labs/01_vector_add.ipynb", check_vector_add),
    "softmax": ("labs/02_fused_softmax.ipynb", check_softmax),
    "matmul": ("labs/03_tiled_matmul.ipynb", check_matmul),
}
RAISES_MARK = "# NBVAL_RAISES_EXCEPTION"
# The interpreter itself trips a NumPy deprecation on every scalar index; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


def lab_notebook(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / LABS[lab][0], as_version=4)


def exercise_cell(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    cells = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(solutions.EXERCISE_MARK)]
    assert len(cells) == 1, f"expected one exercise cell (first line {solutions.EXERCISE_MARK!r}), found {len(cells)}"
    return cells[0]


def check_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(RAISES_MARK)]


# ------------------------------------------------------------------ right answers


@pytest.mark.parametrize("lab", LABS)
@pytest.mark.parametrize("seed", [0, 1])
def test_checker_passes_the_solution(lab, seed, capsys):
    check = LABS[lab][1]
    report = check(getattr(solutions, lab), seed=seed)
    assert isinstance(report, LabReport) and report.lab == lab and report.seed == seed
    assert len(report.cases) >= 12
    expected_dtypes = {"float32", "float16"} | (set() if llmnote.runtime.interpreting() else {"bfloat16"})
    assert set(report.dtypes) == expected_dtypes
    assert capsys.readouterr().out.strip() == str(report)
    assert re.fullmatch(rf"{lab}: \d+ cases passed \(.+; seed {seed}\)", str(report))


def test_checker_draws_new_shapes_for_each_seed():
    one, two = (check_vector_add(solutions.vector_add, seed=s, verbose=False) for s in (3, 4))
    assert one.cases != two.cases
    assert check_vector_add(solutions.vector_add, seed=3, verbose=False).cases == one.cases


def test_solution_source_defines_the_stub_names():
    for lab in LABS:
        stub = exercise_cell(lab_notebook(lab)).source
        answer = solutions.source(lab)
        assert answer.startswith(solutions.EXERCISE_MARK)
        names = re.findall(r"^def (\w+)\(", stub, re.MULTILINE)
        assert names and names == re.findall(r"^def (\w+)\(", answer, re.MULTILINE), lab
    with pytest.raises(ValueError, match="vector_add"):
        solutions.source("attention")


# ------------------------------------------------------------------ unfinished stubs


def load_cell(source: str, tmp_path: Path, name: str):
    """Import a notebook cell's source as a module (Triton reads a kernel's source from its file)."""
    path = tmp_path / f"{name}.py"
    path.write_text("import torch\nimport triton\nimport triton.language as tl\n\n" + source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("lab", LABS)
def test_checker_fails_the_notebook_stub(lab, tmp_path):
    stub = load_cell(exercise_cell(lab_notebook(lab)).source, tmp_path, f"stub_{lab}")
    with pytest.raises(LabCheckError, match=f"{lab}: not written yet"):
        LABS[lab][1](getattr(stub, lab), seed=0)


@pytest.mark.parametrize("lab", LABS)
def test_checker_fails_a_launcher_around_an_empty_kernel(lab, tmp_path):
    # the launcher is written, the kernel body is still `pass`: nothing is stored, outputs stay NaN
    source = exercise_cell(lab_notebook(lab)).source
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
    "over the wrong axis": (lambda x: torch.softmax(x.float(), dim=0).to(x.dtype), "outputs are off"),
    "float32 output": (lambda x: launch_softmax(x, dtype=torch.float32), "dtype float32"),
    "not normalised": (lambda x: torch.exp(x.float() - x.float().amax(-1, keepdim=True)).to(x.dtype), "outputs are off"),
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
    "flattened output": (lambda a, b: (a.float() @ b.float()).to(a.dtype).flatten(), r"shape \(1,\), expected \(1, 1\)"),
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
    assert re.search(r"matmul failed on case \d+ of 12: M=\d+, N=\d+, K=\d+, .*, float(32|16)", message), message
    assert "Mask the loads along K" in message and "check_matmul(matmul, seed=0)" in message


# ------------------------------------------------------------------ the notebooks


@pytest.mark.parametrize("lab", LABS)
def test_committed_lab_expects_its_check_to_fail(lab):
    nb = lab_notebook(lab)
    assert "raise NotImplementedError" in exercise_cell(nb).source
    checks = check_cells(nb)
    assert len(checks) == 1 and f"check_{lab}({lab})" in checks[0].source
    assert "raises-exception" in checks[0].metadata.get("tags", [])


@pytest.mark.parametrize("lab", LABS)
def test_lab_runs_clean_with_the_solution_filled_in(lab):
    nb = lab_notebook(lab)
    exercise_cell(nb).source = solutions.source(lab)
    (check,) = check_cells(nb)
    check.source = check.source.removeprefix(RAISES_MARK).lstrip("\n")
    check.metadata["tags"] = [t for t in check.metadata.get("tags", []) if t != "raises-exception"]
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "labs")}}).execute()
    printed = "".join(out.get("text", "") for out in check.outputs if out.output_type == "stream")
    assert re.search(rf"{lab}: \d+ cases passed", printed), printed
