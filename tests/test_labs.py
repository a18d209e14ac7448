"""The lab checkers (llmnote.labs) and the lab notebooks (labs/*.ipynb).

- each checker passes on the reference answer in llmnote.labs.solutions;
- each checker fails on the notebook's unfinished stub and on typical wrong answers,
  written here the way a reader gets them wrong;
- each lab notebook runs clean, top to bottom, with the reference answers in place of its
  exercise cells (the cells whose first line is ``# EXERCISE``).

A "lab" below is one exercise and its checker, named after the function the reader writes;
lab 4's notebook holds two: ``merge`` (plain PyTorch) and ``attention`` (a Triton kernel).

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

from llmnote.labs import (
    LabCheckError,
    LabReport,
    check_attention,
    check_matmul,
    check_softmax,
    check_softmax_merge,
    check_vector_add,
    solutions,
)

LABS = {
    "vector_add": ("labs/01_vector_add.ipynb", check_vector_add),
    "softmax": ("labs/02_fused_softmax.ipynb", check_softmax),
    "matmul": ("labs/03_tiled_matmul.ipynb", check_matmul),
    "merge": ("labs/04_flash_attention.ipynb", check_softmax_merge),
    "attention": ("labs/04_flash_attention.ipynb", check_attention),
}
KERNEL_LABS = [lab for lab in LABS if lab != "merge"]  # the labs whose answer is a Triton kernel and launcher
NOTEBOOKS = sorted({notebook for notebook, _ in LABS.values()})
RAISES_MARK = "# NBVAL_RAISES_EXCEPTION"
# The interpreter itself trips a NumPy deprecation on every scalar index; not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


def lab_notebook(lab: str) -> nbformat.NotebookNode:
    return nbformat.read(ROOT / LABS[lab][0], as_version=4)


def labs_of(notebook: str) -> list[str]:
    return [lab for lab, (path, _) in LABS.items() if path == notebook]


def exercise_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(solutions.EXERCISE_MARK)]


def exercise_cell(nb: nbformat.NotebookNode, lab: str) -> nbformat.NotebookNode:
    """The exercise cell (first line ``# EXERCISE``) that defines the function ``lab``."""
    cells = [c for c in exercise_cells(nb) if re.search(rf"^def {lab}\(", c.source, re.MULTILINE)]
    assert len(cells) == 1, f"expected one exercise cell defining {lab}, found {len(cells)}"
    return cells[0]


def check_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(RAISES_MARK)]


def check_cell(nb: nbformat.NotebookNode, lab: str) -> nbformat.NotebookNode:
    """The check cell that grades ``lab``: it calls ``check_<...>(<lab>)``."""
    call = f"{LABS[lab][1].__name__}({lab})"
    cells = [c for c in check_cells(nb) if call in c.source]
    assert len(cells) == 1, f"expected one check cell calling {call}, found {len(cells)}"
    return cells[0]


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
        stub = exercise_cell(lab_notebook(lab), lab).source
        answer = solutions.source(lab)
        assert answer.startswith(solutions.EXERCISE_MARK)
        names = re.findall(r"^def (\w+)\(", stub, re.MULTILINE)
        assert names and names == re.findall(r"^def (\w+)\(", answer, re.MULTILINE), lab
    with pytest.raises(ValueError, match="vector_add"):
        solutions.source("flash_attention")


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
    stub = load_cell(exercise_cell(lab_notebook(lab), lab).source, tmp_path, f"stub_{lab}")
    with pytest.raises(LabCheckError, match=f"{lab}: not written yet"):
        LABS[lab][1](getattr(stub, lab), seed=0)


@pytest.mark.parametrize("lab", KERNEL_LABS)
def test_checker_fails_a_launcher_around_an_empty_kernel(lab, tmp_path):
    # the launcher is written, the kernel body is still `pass`: nothing is stored, outputs stay NaN
    source = exercise_cell(lab_notebook(lab), lab).source
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
    sm_scale,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_LOADS: tl.constexpr,
    MASK_SCORES: tl.constexpr,
    SUBTRACT_MAX: tl.constexpr,
    RESCALE: tl.constexpr,
    NORMALISE: tl.constexpr,
    MASK_STORE: tl.constexpr,
):
    """The reference kernel with one of its safeguards switched off."""
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
        if MASK_SCORES:
            s = tl.where(keys[None, :] < Skv, s, float("-inf"))
        if SUBTRACT_MAX:
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
        else:
            m_new = tl.zeros((BLOCK_M,), dtype=tl.float32)
        if RESCALE:
            alpha = tl.exp(m_i - m_new)
        else:
            alpha = tl.where(m_i == float("-inf"), 0.0, 1.0)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None] if NORMALISE else acc
    store_ok = rows[:, None] < Sq if MASK_STORE else rows[:, None] >= 0
    tl.store(out_ptr + rows[:, None] * D + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=store_ok)


def launch_attention(q, k, v, programs=triton.cdiv, dtype=None, scale=None, **switches):
    (sq, d), skv = q.shape, k.shape[0]
    out = torch.empty((sq, d), dtype=dtype or q.dtype, device=q.device)
    flags = {"mask_loads": True, "mask_scores": True, "subtract_max": True, "rescale": True, "normalise": True}
    flags |= {"mask_store": True} | switches
    attention_variant_kernel[(programs(sq, 32),)](
        q, k, v, out, sq, skv, d**-0.5 if scale is None else scale, D=d, BLOCK_M=32, BLOCK_N=32,
        **{name.upper(): value for name, value in flags.items()},
    )  # fmt: skip
    return out


WRONG_ATTENTION = {
    "no key mask": (lambda q, k, v: launch_attention(q, k, v, mask_loads=False, mask_scores=False), "NaN"),
    "padding keys score 0": (lambda q, k, v: launch_attention(q, k, v, mask_scores=False), "outputs are off"),
    "no max subtraction": (lambda q, k, v: launch_attention(q, k, v, subtract_max=False), "(?s)large scores.*(NaN|infinite)"),
    "no running-max rescale": (lambda q, k, v: launch_attention(q, k, v, rescale=False), "outputs are off"),
    "no normalisation": (lambda q, k, v: launch_attention(q, k, v, normalise=False), "outputs are off"),
    "no store mask": (lambda q, k, v: launch_attention(q, k, v, mask_store=False), "outside the output tensor"),
    "grid Sq // BLOCK_M": (lambda q, k, v: launch_attention(q, k, v, programs=lambda n, b: max(n // b, 1)), "NaN"),
    "no 1/sqrt(D) scale": (lambda q, k, v: launch_attention(q, k, v, scale=1.0), "outputs are off"),
    "float32 output": (lambda q, k, v: launch_attention(q, k, v, dtype=torch.float32), "dtype float32"),
    "q k^T v without softmax": (lambda q, k, v: ((q.float() @ k.float().T) @ v.float()).to(q.dtype), "outputs are off"),
}


@pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")  # the interpreter's exp overflows, as it should
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("wrong", WRONG_ATTENTION)
def test_attention_checker_fails_wrong_answers(wrong):
    fn, message = WRONG_ATTENTION[wrong]
    with pytest.raises(LabCheckError, match=message) as failure:
        check_attention(fn, seed=0, verbose=False)
    assert "check_attention(attention, seed=0)" in str(failure.value) and "Hint:" in str(failure.value)


# ------------------------------------------------------------------ the notebooks


@pytest.mark.parametrize("lab", LABS)
def test_committed_lab_expects_its_check_to_fail(lab):
    nb = lab_notebook(lab)
    assert "raise NotImplementedError" in exercise_cell(nb, lab).source
    assert "raises-exception" in check_cell(nb, lab).metadata.get("tags", [])
    # one exercise cell and one check cell for each lab of the notebook, nothing else
    assert len(exercise_cells(nb)) == len(check_cells(nb)) == len(labs_of(LABS[lab][0]))


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_lab_runs_clean_with_the_solution_filled_in(notebook):
    nb = nbformat.read(ROOT / notebook, as_version=4)
    checks = {}
    for lab in labs_of(notebook):
        exercise_cell(nb, lab).source = solutions.source(lab)
        check = checks[lab] = check_cell(nb, lab)
        check.source = check.source.removeprefix(RAISES_MARK).lstrip("\n")
        check.metadata["tags"] = [t for t in check.metadata.get("tags", []) if t != "raises-exception"]
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "labs")}}).execute()
    for lab, check in checks.items():
        printed = "".join(out.get("text", "") for out in check.outputs if out.output_type == "stream")
        assert re.search(rf"^{lab}: \d+ cases passed", printed), printed
