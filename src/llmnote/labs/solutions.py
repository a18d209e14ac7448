"""Reference answers to the labs, written as a reader would write them in the exercise cells
(same kernel and launcher names and signatures as the stubs in ``labs/*.ipynb``).

Try the lab first. The book's production kernels (``llmnote.kernels``) go further:
several rows per program, online softmax for very long rows, grouped tile order and
autotuning for matmul, causal masks, grouped-query heads, exp2 and TMA for attention.

:func:`source` returns a lab's answer as the text of its exercise cell; the tests run each
lab notebook with that text in place of the stub.
"""

from __future__ import annotations

import inspect
import textwrap

import torch
import triton
import triton.language as tl

__all__ = [
    "add_kernel",
    "vector_add",
    "softmax_kernel",
    "softmax",
    "matmul_kernel",
    "matmul",
    "merge",
    "attention_kernel",
    "attention",
    "source",
    "EXERCISE_MARK",
]

EXERCISE_MARK = "# EXERCISE"  # the first line of every lab's exercise cell


# ------------------------------------------------------------------ lab 1: vector add


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK: tl.constexpr):
    pid = tl.program_id(0)  # which block of BLOCK elements this program owns
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n_elements  # the last block may run past the end
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


def vector_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = out.numel()
    BLOCK = 1024
    grid = (triton.cdiv(n, BLOCK),)  # enough programs to cover every element
    add_kernel[grid](x, y, out, n, BLOCK=BLOCK)
    return out


# -------------------------------------------------------------- lab 2: fused softmax


@triton.jit
def softmax_kernel(x_ptr, out_ptr, n_cols, x_row_stride, out_row_stride, BLOCK: tl.constexpr):
    row = tl.program_id(0)  # one program per row
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    # Padding lanes read -inf: they never win the max and add exp(-inf) = 0 to the sum.
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)  # the largest value becomes 0: exp cannot overflow
    numerator = tl.exp(x)
    y = numerator / tl.sum(numerator, axis=0)
    tl.store(out_ptr + row * out_row_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    n_rows, n_cols = x.shape
    out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    BLOCK = triton.next_power_of_2(n_cols)  # the whole row fits in one block
    num_warps = 4 if BLOCK <= 2048 else 8 if BLOCK <= 8192 else 16
    softmax_kernel[(n_rows,)](x, out, n_cols, x.stride(0), out.stride(0), BLOCK=BLOCK, num_warps=num_warps)
    return out


# --------------------------------------------------------------- lab 3: tiled matmul


@triton.jit
def matmul_kernel(
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
):
    pid_m = tl.program_id(0)  # this program computes the tile C[pid_m, pid_n]
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak  # (BLOCK_M, BLOCK_K)
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn  # (BLOCK_K, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < K - k), other=0.0)
        b = tl.load(b_ptrs, mask=(rk[:, None] < K - k) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)  # tensor cores on a GPU; float32 accumulation
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    M, K = a.shape
    K2, N = b.shape
    assert K == K2, f"inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}"
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    BLOCK_M, BLOCK_N, BLOCK_K = 64, 64, 32
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    matmul_kernel[grid](
        a, b, c, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )  # fmt: skip
    return c


# ------------------------------------------------- lab 4: online softmax and attention


def merge(m1, l1, o1, m2, l2, o2):
    m_new = torch.maximum(m1, m2)  # the max over both key sets
    # Two empty parts (m1 = m2 = -inf) would give exp(-inf - -inf) = NaN: measure from 0
    # instead, so both factors are exp(-inf) = 0 and the result stays empty (-inf, 0, 0).
    base = torch.where(m_new == -float("inf"), torch.zeros_like(m_new), m_new)
    alpha1, alpha2 = torch.exp(m1 - base), torch.exp(m2 - base)  # both <= 1: no overflow
    l_new = alpha1 * l1 + alpha2 * l2
    o_new = alpha1[..., None] * o1 + alpha2[..., None] * o2  # o stays unnormalised
    return m_new, l_new, o_new


@triton.jit
def attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, Sq, Skv, sm_scale, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)  # this program's query rows
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, D)
    row_ok = rows < Sq
    q = tl.load(q_ptr + rows[:, None] * D + dims[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)  # running max of each row's scores
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)  # running sum of exp(score - m_i)
    acc = tl.zeros((BLOCK_M, D), dtype=tl.float32)  # running sum of exp(score - m_i) * v
    for start in range(0, Skv, BLOCK_N):
        keys = start + cols
        key_ok = keys < Skv
        k = tl.load(k_ptr + keys[:, None] * D + dims[None, :], mask=key_ok[:, None], other=0.0)
        v = tl.load(v_ptr + keys[:, None] * D + dims[None, :], mask=key_ok[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * sm_scale  # (BLOCK_M, BLOCK_N) scores, float32
        s = tl.where(key_ok[None, :], s, float("-inf"))  # keys past the end get weight 0
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: every block holds a real key
        alpha = tl.exp(m_i - m_new)  # rescales what was summed relative to the old max
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / l_i[:, None]  # normalise once, at the end
    tl.store(out_ptr + rows[:, None] * D + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    Sq, D = q.shape
    Skv = k.shape[0]
    out = torch.empty_like(q)
    BLOCK_M, BLOCK_N = 32, 32
    grid = (triton.cdiv(Sq, BLOCK_M),)  # one program per BLOCK_M query rows
    attention_kernel[grid](q, k, v, out, Sq, Skv, D**-0.5, D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return out


_ANSWERS = {
    "vector_add": (add_kernel, vector_add),
    "softmax": (softmax_kernel, softmax),
    "matmul": (matmul_kernel, matmul),
    "merge": (merge,),
    "attention": (attention_kernel, attention),
}


def source(lab: str) -> str:
    """The answer to ``lab`` ("vector_add", "softmax", "matmul", "merge" or "attention"; lab 4
    has two exercise cells, "merge" and "attention") as the text of its exercise cell: the
    marker line, then the kernel (if any) and the function exactly as written above."""
    if lab not in _ANSWERS:
        raise ValueError(f"lab must be one of {', '.join(_ANSWERS)}, got {lab!r}")
    fns = [getattr(fn, "fn", fn) for fn in _ANSWERS[lab]]  # a @triton.jit kernel keeps its Python function in .fn
    parts = [textwrap.dedent(inspect.getsource(fn)).strip() for fn in fns]
    return f"{EXERCISE_MARK}: the reference answer from llmnote.labs.solutions\n" + "\n\n\n".join(parts) + "\n"
