"""Up to 16 rows of x on the tensor cores with the weight as the MMA's A operand ("swap AB"), the
decode path of :func:`llmnote.kernels.gemm.w4a16.w4a16_linear` for 16-bit x: the kernel, its
autotuned launch and the test of whether a product fits it. How a lane's words become MMA operands is in
:mod:`llmnote.kernels.gemm.w4a16_swap_ab_codes` (:func:`_swap_ab_step`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from .w4a16_plan import _SWAP_AB_CONFIGS, _prune_swap_ab, _sms, plan_swap_ab
from .w4a16_swap_ab_codes import _pair, _swap_ab_group, _swap_ab_step, _warp_run

__all__ = ["w4a16_swap_ab_kernel"]


@triton.jit
def _zeros(n: tl.constexpr, like):
    z = tl.zeros_like(like)
    out = ()
    for _ in tl.static_range(n):
        out = out + (z,)
    return out


@triton.jit
def _place(i: tl.constexpr, pid_n, lane, M, V: tl.constexpr, ROWS: tl.constexpr):
    """The output column and x row of accumulator ``i`` in the lanes ``lane`` (see :func:`_swap_ab_step`),
    and which lanes store it."""
    NB: tl.constexpr = 2 if ROWS == 16 else 1
    PER_V: tl.constexpr = 4 if ROWS == 1 else ROWS
    RP: tl.constexpr = 2 if ROWS == 1 else 4
    v: tl.constexpr = i // PER_V
    s: tl.constexpr = i % PER_V // (NB * RP)
    r: tl.constexpr = i % RP
    col = pid_n * (32 * V) + 4 * (lane // 4) + 32 * v + 2 * s + r // (RP // 2)
    if ROWS == 1:  # the four lanes of a quad hold the same sums: lane t = 0 stores them
        return col, tl.zeros_like(lane), lane % 4 == 0
    else:
        row = 8 * (i % PER_V // RP % NB) + 2 * (lane % 4) + r % 2
        return col, row, row < M


@triton.jit
def _deq_operands(sz, keep, V: tl.constexpr, ASM: tl.constexpr, MAGIC: tl.constexpr):
    """For ``DEQ``: per 32-column block the four scales of a lane's columns (zero for a warp past
    its run), then their four zero points. On a GPU each 16-bit value twice in a 32-bit register,
    the zero point as ``-(m + z)``, as the PTX unit takes them; in the interpreter as float32."""
    sw = ()
    for v in tl.static_range(V):
        for j in tl.static_range(4):
            sc = sz[2 * (4 * v + j)]
            if ASM:
                sw = sw + (tl.where(keep, _pair(sc), 0),)
            else:
                sw = sw + (tl.where(keep, sc.to(tl.float32), 0.0),)
        for j in tl.static_range(4):
            zp = sz[2 * (4 * v + j) + 1]
            if ASM:
                sw = sw + (_pair((-(zp.to(tl.float32) + MAGIC)).to(zp.dtype)),)
            else:
                sw = sw + (zp.to(tl.float32),)
    return sw


@triton.jit
def w4a16_swap_ab_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, ws_ptr, lock_ptr, M, N, K, stride_xm, stride_qk, stride_g, stride_om,
    GROUP: tl.constexpr, ROWS: tl.constexpr, V: tl.constexpr, WARPS: tl.constexpr, SPLIT_K: tl.constexpr,
    PREFETCH: tl.constexpr, HALF: tl.constexpr, ASM: tl.constexpr, DEQ: tl.constexpr = False,
):  # fmt: skip
    """Up to 16 rows of x on the tensor cores, the weight as the MMA's A operand (its M is N):
    ``out[m, n] = sum_g s[g, n] * (sum_k (c + q[k, n]) x[m, k] - (c + z[g, n]) sum_k x[m, k])``,
    c = 128 (bf16) or 1024 (fp16).

    ``ROWS = 1``: one row, all 8 B columns copies of x. ``ROWS`` = 8 or 16: B column n of block b
    is x row ``8b + n`` (one or two blocks; the unpacked words serve both). A program takes ``32 V``
    columns; its ``WARPS`` warps split its share of K (``SPLIT_K`` programs a column block) into
    runs of whole groups. Lane (g, t) of a warp loads, per 32-deep step, the 16 bytes of columns
    ``4g .. 4g + 3`` (+ 32 v) of word row ``kw + t`` and the 8 entries of x they meet: rows g and g
    + 8 of an ``m16n8k16`` A tile are two weight columns, and its 16-deep K is four codes of each
    lane of the quad (see :func:`_swap_ab_step`). The sums of x over a group come from the same
    MMAs with A = ones; the scale and zero point apply once per group, column and row.
    ``PREFETCH``: a group's words, scales and zero points are loaded one group ahead, into registers.
    ``DEQ``: the codes become ``(q - z) s`` in 16 bits before the MMAs (two FMAs a pair of codes,
    rounded once, as a dequantize-then-GEMM would round them), so the MMAs accumulate the output
    directly: no per-group sums, no sums of x, fewer registers (sm_90: 52 instead of 64 at one row,
    72 instead of 95 at 16), more instructions; a candidate of the autotuner at 8 and 16 rows
    (:func:`~llmnote.kernels.gemm.w4a16_plan.swap_ab_configs`)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    lane = tl.arange(0, 32 * WARPS) % 32
    t = lane % 4
    col = pid_n * (32 * V) + 4 * (lane // 4)
    g_first, g_last, per_warp = _warp_run(pid_k, K, GROUP, SPLIT_K, WARPS)
    MAGIC: tl.constexpr = 128.0 if HALF == "bf16" else 1024.0
    STEP: tl.constexpr = 4 * V  # words a lane holds per 32-deep step
    NB: tl.constexpr = 2 if ROWS == 16 else 1
    PER_V: tl.constexpr = 4 if ROWS == 1 else ROWS  # accumulators a lane holds per 32 columns
    RP: tl.constexpr = 2 if ROWS == 1 else 4
    SUMS: tl.constexpr = 1 if ROWS == 1 else 2 * NB  # sums of x a lane holds
    zero = tl.zeros((32 * WARPS,), tl.float32)
    acc = _zeros(PER_V * V, zero)
    if PREFETCH:
        g0 = tl.maximum(tl.minimum(g_first, g_last - 1), 0)
        ahead = _swap_ab_group(qw_ptr, s_ptr, z_ptr, g0, t, col, stride_qk, stride_g, GROUP, V, ASM)
    for it in range(per_warp):
        gi = tl.maximum(tl.minimum(g_first + it, g_last - 1), 0)  # a warp past its run reloads its last group
        if PREFETCH:
            words, sz = ahead
            nxt = tl.maximum(tl.minimum(g_first + it + 1, g_last - 1), 0)
            ahead = _swap_ab_group(qw_ptr, s_ptr, z_ptr, nxt, t, col, stride_qk, stride_g, GROUP, V, ASM)
        else:
            words, sz = _swap_ab_group(qw_ptr, s_ptr, z_ptr, gi, t, col, stride_qk, stride_g, GROUP, V, ASM)
        xk = x_ptr + 8 * (gi * (GROUP // 8) + t)
        if DEQ:
            sw = _deq_operands(sz, g_first + it < g_last, V, ASM, MAGIC)
            xs = _zeros(SUMS, zero)
            for st in tl.static_range(GROUP // 32):
                acc, xs = _swap_ab_step(words, st * STEP, xk + 32 * st, M, stride_xm, acc, xs, WARPS, V, ROWS, HALF, ASM,
                                        True, sw)  # fmt: skip
        else:
            c = _zeros(PER_V * V, zero)
            xs = _zeros(SUMS, zero)
            for st in tl.static_range(GROUP // 32):
                c, xs = _swap_ab_step(words, st * STEP, xk + 32 * st, M, stride_xm, c, xs, WARPS, V, ROWS, HALF, ASM)
            keep = g_first + it < g_last
            new = ()
            for i in tl.static_range(PER_V * V):
                # the scale and zero point of its column (word 4v + 2s + r // (RP / 2)), the sum of x of its row
                scale = sz[2 * (4 * (i // PER_V) + 2 * (i % PER_V // (NB * RP)) + i % RP // (RP // 2))].to(tl.float32)
                zp = sz[2 * (4 * (i // PER_V) + 2 * (i % PER_V // (NB * RP)) + i % RP // (RP // 2)) + 1].to(tl.float32)
                if ROWS == 1:
                    xsum = xs[0]
                else:
                    xsum = xs[2 * (i % PER_V // RP % NB) + i % 2]
                new = new + (acc[i] + tl.where(keep, scale, 0.0) * (c[i] - (zp + MAGIC) * xsum),)
            acc = new
    # the warps' partial sums added up
    quad = tl.arange(0, 32)
    for i in tl.static_range(PER_V * V):
        total = tl.sum(tl.reshape(acc[i], (WARPS, 32)), axis=0)
        ci, ri, mine = _place(i, pid_n, quad, M, V, ROWS)
        if SPLIT_K == 1:
            tl.store(out_ptr + ri * stride_om + ci, total.to(out_ptr.dtype.element_ty), mask=mine)
        else:
            tl.store(ws_ptr + (pid_k * M + ri) * N + ci, total, mask=mine)
    if SPLIT_K > 1:  # as in _write: the last split of the column block to arrive sums the partials
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            for i in tl.static_range(PER_V * V):
                ci, ri, mine = _place(i, pid_n, quad, M, V, ROWS)
                total = tl.zeros((32,), tl.float32)
                for sk in tl.static_range(SPLIT_K):
                    total += tl.load(ws_ptr + (sk * M + ri) * N + ci, mask=mine, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + ri * stride_om + ci, total.to(out_ptr.dtype.element_ty), mask=mine)
            tl.atomic_xchg(lock_ptr + pid_n, 0)


_tuned_swap_ab = triton.autotune(
    _SWAP_AB_CONFIGS, key=["N", "K", "GROUP", "HALF", "ROWS"], prune_configs_by={"early_config_prune": _prune_swap_ab}
)(w4a16_swap_ab_kernel)


def _rows(m: int) -> int:
    """The kernel's ``ROWS`` for ``m`` rows of x: 1, or one or two 8-row blocks."""
    return 1 if m == 1 else 8 if m <= 8 else 16


def _swap_ab_fits(x2: torch.Tensor, qw: torch.Tensor, group_size: int) -> bool:
    """Whether ``w4a16_swap_ab_kernel`` takes this product: 1 to 16 rows of 16-bit x, whole 32-deep
    steps in a group, 32-column blocks, 16-byte vector loads of x and of the words, and on a GPU
    the ``m16n8k16`` MMA (sm_80 on)."""
    (m, _), n = x2.shape, qw.shape[1]
    if not 1 <= m <= 16 or x2.dtype not in (torch.float16, torch.bfloat16) or group_size % 32 or n % 32:
        return False
    if x2.stride(1) != 1 or (m > 1 and x2.stride(0) % 8) or x2.data_ptr() % 16:
        return False
    if qw.data_ptr() % 16 or qw.stride(0) % 4 or qw.stride(1) != 1:
        return False
    return runtime.interpreting() or tuple(runtime.capability() or (0, 0)) >= (8, 0)


def _swap_ab(x2: torch.Tensor, qw: torch.Tensor, s: torch.Tensor, z: torch.Tensor, group_size: int, out: torch.Tensor,
             locks: torch.Tensor):
    """``out = x2 @ W.T`` for 1 to 16 rows of x, on the tensor cores (:func:`w4a16_swap_ab_kernel`);
    ``locks``: zeroed split-K counters, one per 32 columns at least."""
    (M, K), N = x2.shape, out.shape[1]
    rows, interp = _rows(M), runtime.interpreting()
    if interp:  # one small fixed tile, loading ahead, K split when there are two groups to split
        configs = [triton.Config({"V": 1, "WARPS": 2, "SPLIT_K": 2 if K >= 2 * group_size else 1, "PREFETCH": True})]
    else:
        configs = plan_swap_ab(N, K, group_size, _sms(x2.device), rows=rows)
    split = max(c.kwargs["SPLIT_K"] for c in configs)
    ws = torch.empty((split, M, N), dtype=torch.float32, device=x2.device) if split > 1 else out
    args = (x2, qw, s, z, out, ws, locks, M, N, K, x2.stride(0), qw.stride(0), s.stride(0), out.stride(0))
    flags = {"GROUP": group_size, "ROWS": rows, "HALF": "bf16" if x2.dtype == torch.bfloat16 else "f16", "ASM": not interp}

    def grid(meta):
        return (N // (32 * meta["V"]), meta["SPLIT_K"])

    if interp:
        w4a16_swap_ab_kernel[grid](*args, **configs[0].kwargs, **flags, num_warps=configs[0].kwargs["WARPS"])
    else:
        _tuned_swap_ab[grid](*args, **flags)
