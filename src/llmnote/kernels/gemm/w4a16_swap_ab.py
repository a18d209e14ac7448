"""One row of x on the tensor cores with the weight as the MMA's A operand ("swap AB"), the M = 1
path of :func:`llmnote.kernels.gemm.w4a16.w4a16_linear` for 16-bit x: the kernel, its autotuned
launch and the test of whether a product fits it. How a lane's words become MMA operands is in
:mod:`llmnote.kernels.gemm.w4a16_codes` (:func:`_swap_ab_step`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from .w4a16_codes import _swap_ab_group, _swap_ab_step
from .w4a16_plan import _SWAP_AB_CONFIGS, _prune_swap_ab, _sms, plan_swap_ab

__all__ = ["w4a16_swap_ab_kernel"]


@triton.jit
def _zeros4(n: tl.constexpr, like):
    z = tl.zeros_like(like)
    if n == 4:
        return (z, z, z, z)
    else:
        tl.static_assert(n == 8, "4 or 8 accumulators a thread")
        return (z, z, z, z, z, z, z, z)


@triton.jit
def w4a16_swap_ab_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, ws_ptr, lock_ptr, N, K, stride_qk, stride_g,
    GROUP: tl.constexpr, V: tl.constexpr, WARPS: tl.constexpr, SPLIT_K: tl.constexpr, PREFETCH: tl.constexpr,
    HALF: tl.constexpr, ASM: tl.constexpr,
):  # fmt: skip
    """One row of x on the tensor cores, the weight as the MMA's A operand (its M is N; 7 of its 8 B
    columns are copies of x): ``out[n] = sum_g s[g, n] * (sum_k (m + q[k, n]) x_k - (m + z[g, n]) sum_k x_k)``.

    A program takes ``32 V`` columns; its ``WARPS`` warps split its share of K (``SPLIT_K`` programs
    a column block) into runs of whole groups. Lane (g, t) of a warp loads, per 32-deep step, the
    16 bytes of columns ``4g .. 4g + 3`` (+ 32 v) of word row ``kw + t`` and the 8 entries of x they
    meet: rows g and g + 8 of an ``m16n8k16`` A tile are two weight columns, and its 16-deep K is
    four codes of each lane of the quad (see :func:`_swap_ab_step`). The sum of x over a group
    comes from the same MMAs with A = ones; the scale and zero point apply once per group and
    column. ``PREFETCH``: a group's words, scales and zero points are loaded one group ahead, into
    registers."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    lane = tl.arange(0, 32 * WARPS) % 32
    warp = tl.arange(0, 32 * WARPS) // 32
    t = lane % 4
    col = pid_n * (32 * V) + 4 * (lane // 4)
    groups = K // GROUP
    per_prog = tl.cdiv(groups, SPLIT_K)
    per_warp = tl.cdiv(per_prog, WARPS)
    g_first = pid_k * per_prog + warp * per_warp
    g_last = tl.minimum(g_first + per_warp, tl.minimum((pid_k + 1) * per_prog, groups))
    MAGIC: tl.constexpr = 128.0 if HALF == "bf16" else 1024.0
    STEP: tl.constexpr = 4 * V  # words a lane holds per 32-deep step
    zero = tl.zeros((32 * WARPS,), tl.float32)
    acc = _zeros4(4 * V, zero)
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
        c = _zeros4(4 * V, zero)
        xs = zero
        for st in tl.static_range(GROUP // 32):
            c, xs = _swap_ab_step(words, st * STEP, xk + 32 * st, c, xs, WARPS, V, HALF, ASM)
        keep = g_first + it < g_last
        new = ()
        for j in tl.static_range(4 * V):
            s = tl.where(keep, sz[2 * j].to(tl.float32), 0.0)
            new = new + (acc[j] + s * (c[j] - (sz[2 * j + 1].to(tl.float32) + MAGIC) * xs),)
        acc = new
    # the warps' partial sums added up; the four lanes of a quad hold the same sums, lane t = 0 stores them
    quad = tl.arange(0, 32)
    first = quad % 4 == 0
    cols = pid_n * (32 * V) + 4 * (quad // 4)
    for j in tl.static_range(4 * V):
        total = tl.sum(tl.reshape(acc[j], (WARPS, 32)), axis=0)
        cj = cols + 32 * (j // 4) + j % 4
        if SPLIT_K == 1:
            tl.store(out_ptr + cj, total.to(out_ptr.dtype.element_ty), mask=first)
        else:
            tl.store(ws_ptr + pid_k * N + cj, total, mask=first)
    if SPLIT_K > 1:  # as in _write: the last split of the column block to arrive sums the partials
        tl.debug_barrier()
        arrived = tl.atomic_add(lock_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            for j in tl.static_range(4 * V):
                cj = cols + 32 * (j // 4) + j % 4
                total = tl.zeros((32,), tl.float32)
                for sk in tl.static_range(SPLIT_K):
                    total += tl.load(ws_ptr + sk * N + cj, mask=first, other=0.0, cache_modifier=".cg")
                tl.store(out_ptr + cj, total.to(out_ptr.dtype.element_ty), mask=first)
            tl.atomic_xchg(lock_ptr + pid_n, 0)


_tuned_swap_ab = triton.autotune(
    _SWAP_AB_CONFIGS, key=["N", "K", "GROUP", "HALF"], prune_configs_by={"early_config_prune": _prune_swap_ab}
)(w4a16_swap_ab_kernel)


def _swap_ab_fits(x2: torch.Tensor, qw: torch.Tensor, group_size: int) -> bool:
    """Whether ``w4a16_swap_ab_kernel`` takes this one-row product: 16-bit x, whole 32-deep steps in
    a group, 32-column blocks, 16-byte vector loads of x and of the words, and on a GPU the
    ``m16n8k16`` MMA (sm_80 on)."""
    n = qw.shape[1]
    if x2.dtype not in (torch.float16, torch.bfloat16) or group_size % 32 or n % 32 or x2.stride(1) != 1:
        return False
    if x2.data_ptr() % 16 or qw.data_ptr() % 16 or qw.stride(0) % 4 or qw.stride(1) != 1:
        return False
    return runtime.interpreting() or tuple(runtime.capability() or (0, 0)) >= (8, 0)


def _swap_ab(x2: torch.Tensor, qw: torch.Tensor, s: torch.Tensor, z: torch.Tensor, group_size: int, out: torch.Tensor,
             locks: torch.Tensor):
    """``out = x2 @ W.T`` for one row of x, on the tensor cores (:func:`w4a16_swap_ab_kernel`);
    ``locks``: zeroed split-K counters, one per 32 columns at least."""
    (_, K), N = x2.shape, out.shape[1]
    interp = runtime.interpreting()
    if interp:  # one small fixed tile, loading ahead, K split when there are two groups to split
        configs = [triton.Config({"V": 1, "WARPS": 2, "SPLIT_K": 2 if K >= 2 * group_size else 1, "PREFETCH": True})]
    else:
        configs = plan_swap_ab(N, K, group_size, _sms(x2.device))
    split = max(c.kwargs["SPLIT_K"] for c in configs)
    ws = torch.empty((split, N), dtype=torch.float32, device=x2.device) if split > 1 else out
    args = (x2, qw, s, z, out, ws, locks, N, K, qw.stride(0), s.stride(0))
    flags = {"GROUP": group_size, "HALF": "bf16" if x2.dtype == torch.bfloat16 else "f16", "ASM": not interp}

    def grid(meta):
        return (N // (32 * meta["V"]), meta["SPLIT_K"])

    if interp:
        w4a16_swap_ab_kernel[grid](*args, **configs[0].kwargs, **flags, num_warps=configs[0].kwargs["WARPS"])
    else:
        _tuned_swap_ab[grid](*args, **flags)
