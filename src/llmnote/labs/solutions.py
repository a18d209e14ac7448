"""Reference answers to the labs, written as a reader would write them in the exercise cells
(same kernel and launcher names and signatures as the stubs in ``labs/*.ipynb``).

Try the lab first. The book's production kernels (``llmnote.kernels``) go further:
several rows per program, online softmax for very long rows, grouped tile order and
autotuning for matmul, skipped key blocks, exp2 and TMA for attention.

:func:`source` returns a lab's answer as the text of its exercise cell; the tests run each
lab notebook with that text in place of the stub.
"""

from __future__ import annotations

import inspect
import textwrap
from collections import OrderedDict, deque

import torch
import triton
import triton.language as tl

from .. import hw
from .grade_kv_cache_decode import DecodeLayer, LayerCache

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
    "vector_add_cost",
    "softmax_cost",
    "matmul_cost",
    "attention_cost",
    "place",
    "decode_step",
    "quantize_groups",
    "dequantize_groups",
    "pack_int4",
    "w4a16_gemv_kernel",
    "w4a16_gemv",
    "MyBlockManager",
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
    q_ptr, k_ptr, v_ptr, out_ptr, Sq, Skv, GROUP, sm_scale,
    D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    head = tl.program_id(1)  # this program's query head...
    kv_head = head // GROUP  # ...reads the key/value head it shares with GROUP - 1 others
    q_ptr += head * Sq * D
    out_ptr += head * Sq * D
    k_ptr += kv_head * Skv * D
    v_ptr += kv_head * Skv * D
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
        visible = key_ok[None, :]  # keys past the end get weight 0
        if CAUSAL:  # bottom-right aligned: row i sees key j iff j <= i + (Skv - Sq)
            visible = visible & (keys[None, :] <= rows[:, None] + (Skv - Sq))
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        # A row that has seen no key yet has m_new = -inf: measure from 0 there, so exp gives 0, not NaN.
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)  # rescales what was summed relative to the old max
        p = tl.exp(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # normalise once, at the end; a row with no key gives 0
    tl.store(out_ptr + rows[:, None] * D + dims[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    Hq, Sq, D = q.shape
    Hkv, Skv, _ = k.shape
    out = torch.empty_like(q)
    BLOCK_M, BLOCK_N = 32, 32
    grid = (triton.cdiv(Sq, BLOCK_M), Hq)  # one program per BLOCK_M query rows of one head
    attention_kernel[grid](
        q, k, v, out, Sq, Skv, Hq // Hkv, D**-0.5, D=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=causal
    )  # fmt: skip
    return out


# ------------------------------------------------------- lab 5: roofline placement


def vector_add_cost(n: int, elem_bytes: float) -> tuple[float, float]:
    flops = n  # one addition per element
    bytes_moved = 3 * n * elem_bytes  # read x and y, write out
    return flops, bytes_moved


def softmax_cost(rows: int, cols: int, elem_bytes: float) -> tuple[float, float]:
    flops = 5 * rows * cols  # max, subtract, exp, sum, divide
    bytes_moved = 2 * rows * cols * elem_bytes  # fused: read x once, write the output once
    return flops, bytes_moved


def matmul_cost(m: int, n: int, k: int, elem_bytes: float) -> tuple[float, float]:
    flops = 2 * m * n * k  # a multiply and an add for each of the m * n * k terms
    bytes_moved = (m * k + k * n + m * n) * elem_bytes  # read A and B once, write C once
    return flops, bytes_moved


def attention_cost(batch: int, heads: int, kv_heads: int, seq_len: int, head_dim: int, elem_bytes: float) -> tuple[float, float]:
    # Q K^T and P V, 2 * S * S * D FLOPs each per query head, over the causal half of the scores
    flops = batch * heads * 4 * seq_len * seq_len * head_dim / 2
    # FlashAttention keeps the scores on chip: read q, k and v, write o (k and v have kv_heads heads)
    bytes_moved = batch * seq_len * (2 * heads + 2 * kv_heads) * head_dim * elem_bytes
    return flops, bytes_moved


def place(flops: float, bytes_moved: float, gpu: str, dtype: str) -> tuple[float, str, float]:
    spec = hw.get_gpu(gpu)
    peak, bandwidth = spec.peak_tflops(dtype), spec.memory_tbps  # TFLOP/s and TB/s
    intensity = flops / bytes_moved  # FLOP per byte
    bound = "memory" if intensity < peak / bandwidth else "compute"  # left or right of the ridge point
    return intensity, bound, min(peak, intensity * bandwidth)  # FLOP/B x TB/s = TFLOP/s


# ---------------------------------------------------- lab 6: a decode step with a KV cache


def decode_step(x: torch.Tensor, cache: LayerCache, layer: DecodeLayer) -> torch.Tensor:
    B = x.shape[0]
    H, Hkv, D = layer.heads, layer.kv_heads, layer.head_dim
    q = layer.q_proj(x).view(B, H, D)  # the new token only: the past is already in the cache
    k = layer.k_proj(x).view(B, Hkv, D)
    v = layer.v_proj(x).view(B, Hkv, D)
    t = cache.length
    cache.k[:, :, t] = k  # append at position t
    cache.v[:, :, t] = v
    cache.length = t + 1
    keys, values = cache.k[:, :, : t + 1], cache.v[:, :, : t + 1]  # (B, Hkv, t + 1, D), the new token included
    q = q.view(B, Hkv, H // Hkv, D)  # query head h reads key/value head h // (H // Hkv)
    scores = q.float() @ keys.float().transpose(-1, -2) * D**-0.5  # (B, Hkv, group, t + 1)
    out = torch.softmax(scores, dim=-1) @ values.float()  # no mask: every cached position is in the past
    return out.reshape(B, H, D).to(x.dtype)


# ------------------------------------------- lab 7: group-wise quantization and a W4A16 GEMV


def quantize_groups(w: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    N, K = w.shape
    levels = 2**bits - 1  # the largest code
    groups = w.float().reshape(N, K // group_size, group_size)
    lo = groups.amin(dim=-1).clamp(max=0)  # the range, widened to contain 0...
    hi = groups.amax(dim=-1).clamp(min=0)  # ...so that 0 gets a code of its own
    scales = (hi - lo) / levels
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))  # an all-zero group: any step will do
    zeros = torch.round(-lo / scales)  # the code that stands for 0
    q = torch.round(groups / scales[..., None]) + zeros[..., None]
    codes = q.clamp(0, levels).to(torch.uint8).reshape(N, K)
    return codes, scales, zeros


def dequantize_groups(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    N, K = codes.shape
    q = codes.float().reshape(N, K // group_size, group_size)
    w = (q - zeros[..., None]) * scales[..., None]  # each group's zero point and scale, broadcast over its weights
    return w.reshape(N, K)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    N, K = codes.shape
    nibbles = codes.to(torch.int32).t().reshape(K // 8, 8, N)  # nibbles[i, j, n] = codes[n, 8 * i + j]
    shifts = 4 * torch.arange(8, dtype=torch.int32, device=codes.device)  # code j of a word at bits 4j .. 4j + 3
    return (nibbles << shifts[None, :, None]).sum(dim=1, dtype=torch.int32)  # disjoint bits: the sum is an OR


@triton.jit
def w4a16_gemv_kernel(
    x_ptr, packed_ptr, scales_ptr, zeros_ptr, out_ptr, N, K, group_size,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)  # the outputs this program computes
    col_ok = cols < N
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        k_ok = k < K
        ok = k_ok[:, None] & col_ok[None, :]
        # Row k of the (BLOCK_K, BLOCK_N) tile reads word k // 8: eight neighbouring rows share a word.
        words = tl.load(packed_ptr + (k // 8)[:, None] * N + cols[None, :], mask=ok, other=0)
        q = (words >> (4 * (k % 8))[:, None]) & 0xF  # the mask also drops the sign bits >> copies in
        group = (k // group_size)[:, None] * N + cols[None, :]
        s = tl.load(scales_ptr + group, mask=ok, other=0.0).to(tl.float32)
        z = tl.load(zeros_ptr + group, mask=ok, other=0.0).to(tl.float32)
        w = (q.to(tl.float32) - z) * s  # the dequantized weights, only ever in registers
        xk = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        acc += tl.sum(w * xk[:, None], axis=0)
    tl.store(out_ptr + cols, acc.to(out_ptr.dtype.element_ty), mask=col_ok)


def w4a16_gemv(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    K, N = x.shape[0], packed.shape[1]
    out = torch.empty((N,), dtype=x.dtype, device=x.device)
    BLOCK_N, BLOCK_K = 32, 64
    grid = (triton.cdiv(N, BLOCK_N),)  # one program per BLOCK_N outputs
    w4a16_gemv_kernel[grid](x, packed, scales, zeros, out, N, K, group_size, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return out


# ------------------------------------------- lab 8: a paged KV block manager with prefix caching


class MyBlockManager:
    def __init__(self, num_blocks: int, block_size: int):
        self.num_blocks, self.block_size = num_blocks, block_size
        self.ref_count = [0] * num_blocks  # how many block tables hold each block
        self.hash_of: list[int | None] = [None] * num_blocks  # a block's chained hash, once it is full and computed
        self.cached: dict[int, int] = {}  # the prefix cache: chained hash -> the block registered under it
        self.free_list: deque[int] = deque(range(num_blocks))  # blocks with no holder and no hash
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached blocks no table holds, least recently used first

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_list) + len(self.lru)  # an allocation may evict any cached block that no table holds

    def _hashes(self, token_ids: list[int], num_blocks: int) -> list[int]:
        bs, hashes, parent = self.block_size, [], None
        for i in range(num_blocks):
            parent = hash((parent, tuple(token_ids[i * bs : (i + 1) * bs])))  # chained: the block and all before it
            hashes.append(parent)
        return hashes

    def _take(self) -> int:
        if self.free_list:
            block = self.free_list.popleft()
        else:
            block, _ = self.lru.popitem(last=False)  # evict the least recently used cached block
            del self.cached[self.hash_of[block]]  # its prefix is no longer cached
            self.hash_of[block] = None
        self.ref_count[block] = 1
        return block

    def allocate(self, token_ids: list[int]) -> tuple[list[int], int]:
        table = []
        # only full blocks before the one holding the last token: that token is computed anyway
        for h in self._hashes(token_ids, (len(token_ids) - 1) // self.block_size):
            block = self.cached.get(h)
            if block is None:
                break
            if self.ref_count[block] == 0:
                del self.lru[block]  # held again: no longer evictable
            self.ref_count[block] += 1
            table.append(block)
        num_cached_tokens = len(table) * self.block_size
        self.append(table, token_ids, num_cached_tokens)  # new blocks for the rest of the prompt
        return table, num_cached_tokens

    def append(self, block_table: list[int], token_ids: list[int], num_computed: int) -> None:
        while len(block_table) * self.block_size < len(token_ids):
            block_table.append(self._take())
        for block, h in zip(block_table, self._hashes(token_ids, num_computed // self.block_size)):
            if self.hash_of[block] is None:  # full and computed for the first time
                self.hash_of[block] = h
                self.cached.setdefault(h, block)  # if another block holds h already, this one stays private

    def free(self, block_table: list[int]) -> None:
        for block in reversed(block_table):  # last block first: a prefix's end is evicted before its start
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                if self.cached.get(self.hash_of[block]) == block:
                    self.lru[block] = None  # stays findable until evicted; the newest at the end
                else:
                    self.hash_of[block] = None
                    self.free_list.append(block)


_ANSWERS = {
    "vector_add": (add_kernel, vector_add),
    "softmax": (softmax_kernel, softmax),
    "matmul": (matmul_kernel, matmul),
    "merge": (merge,),
    "attention": (attention_kernel, attention),
    "roofline": (vector_add_cost, softmax_cost, matmul_cost, attention_cost, place),
    "decode_step": (decode_step,),
    "quantize": (quantize_groups, dequantize_groups),
    "pack_int4": (pack_int4,),
    "w4a16_gemv": (w4a16_gemv_kernel, w4a16_gemv),
    "block_manager": (MyBlockManager,),
}


def source(lab: str) -> str:
    """The answer to ``lab`` ("vector_add", "softmax", "matmul", "merge", "attention", "roofline",
    "decode_step", "quantize", "pack_int4", "w4a16_gemv" or "block_manager"; lab 4 has two exercise
    cells, "merge" and "attention", lab 7 three, "quantize", "pack_int4" and "w4a16_gemv") as the
    text of its exercise cell: the marker line, then the kernel (if any) and the functions (or, for
    "block_manager", the class) exactly as written above."""
    if lab not in _ANSWERS:
        raise ValueError(f"lab must be one of {', '.join(_ANSWERS)}, got {lab!r}")
    fns = [getattr(fn, "fn", fn) for fn in _ANSWERS[lab]]  # a @triton.jit kernel keeps its Python function in .fn
    parts = [textwrap.dedent(inspect.getsource(fn)).strip() for fn in fns]
    return f"{EXERCISE_MARK}: the reference answer from llmnote.labs.solutions\n" + "\n\n\n".join(parts) + "\n"
