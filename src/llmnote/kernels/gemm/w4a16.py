"""W4A16: a linear layer whose weight is read as 4-bit integer codes with group scales.

``w4a16_linear(x, qweight)`` computes ``x @ W.T`` for a weight ``W`` (N, K) stored as in
:class:`llmnote.quant.QuantizedWeight` (the format of GPTQ, Frantar et al., 2022, and AWQ, Lin
et al., 2023): codes of 2 to 4 bits, eight to an int32 word along K (``qweight`` is
``(K // 8, N)``), a 16-bit scale and zero point per group of ``group_size`` rows of K, and
``w[n, k] = (q - z) * s``. The kernels unpack and dequantize the words in registers.

**Why decode is memory-bound.** At M = 1 a linear layer does 2*N*K FLOPs on N*K weights: in
bf16 one FLOP a byte, far below an H200's ratio of compute to bandwidth, so the time is the time
to stream the weight. A 4-bit code with a 16-bit scale and zero per 128 weights costs 0.53 byte
instead of 2 (N = 28672, K = 4096: 62.4 MB instead of 235 MB), a 3.8x shorter stream, provided
unpacking keeps pace with memory. No code goes through an integer-to-float conversion: one
logical operation and one exact FMA give ``q - z`` (:func:`_code_minus_zero`, the 2**23 trick),
and for one row of x the code is read in place as a subnormal float, one logical operation and
the FMA of the product itself (:func:`_gemv_row_tile`); for the tensor cores two codes at a time
become the 16-bit pair an operand register holds, exactly (:func:`_unpack_pairs`, inline PTX on a
GPU), or, one row on the tensor cores, the pair ``(m + q_j, m + q_{j+4})`` of one word, the offset
m taken off once per group with the sum of x. The first three live in
:mod:`llmnote.kernels.gemm.w4a16_codes`, the last in :mod:`llmnote.kernels.gemm.w4a16_swap_ab_codes`
(:func:`_swap_ab_step`).

**Four regimes.** M <= 16 with 16-bit x, ``w4a16_swap_ab_kernel``
(:mod:`llmnote.kernels.gemm.w4a16_swap_ab`): the product on the tensor cores with the weight as
the MMA's A operand (its 16 rows are 16 weight columns; its 8 B columns all the same x at one row,
else up to 8 rows of x, two sets of MMAs for 16), so unpacking costs one shift and one LOP3 per
pair of codes, once for all rows, and the multiply-adds cost nothing on the CUDA cores; sm_80 on,
N a multiple of 32, groups a multiple of 32. At 9 to 16 rows it runs where it was timed faster
than the ``tl.dot`` path below, once per shape (:func:`_swap_ab_wins`). Otherwise, M <= 16,
``w4a16_gemv_kernel``: a program per ``BLOCK_N`` columns and K slice.
The codes of a word are peeled off one at a time (code j of every word is row ``8*i + j`` of the
tile), each times the matching strided slice of x, so nothing is reshaped. Products are float32
FMAs on subnormal codes (one row, a GEMV: the zero point and scale apply once per word) or
``tl.dot`` on 16-row tiles, x's K tile loaded once and split into the eight slices (when a K tile
lies in one group, the scale multiplies the partial sum ``sum_k x_k (q_k - z)`` once). M up to
``DEQUANT_M``,
``w4a16_gemm_kernel``: the tiled GEMM of :mod:`llmnote.kernels.gemm.matmul` (grouped tile order,
pipelined loads) with the weight tile unpacked to ``(BLOCK_K, BLOCK_N)``, dequantized, cast to x's
dtype and fed to ``tl.dot``, float32 accumulation. From ``DEQUANT_M`` rows on the weight is
dequantized once (``w4a16_dequant_kernel``) and multiplied by cuBLAS: the fused GEMM unpacks every
weight again for each ``BLOCK_M`` rows, taking issue slots from the tensor cores, and on an H200
the one extra pass over the weight costs less from 128 rows on (measured on both Llama-3-8B
shapes; at 64 rows the fused kernel wins).

**Wide one-row tiles** (``WIDE``, not among the autotuner's candidates): tiles wide enough that
each thread holds every word row of its columns, in one group, so that the products are summed
over the rows inside the thread and the scale and zero point apply once per column and tile (3.2
to 3.7 instead of 4.3 instructions a code in the sm_90 loop). On an H100 the best of them took 14%
longer than the autotuned tile on both Llama-3-8B shapes; ``scripts/w4a16_decode_profile.py
--sweep --wide`` times them.

**Split-K.** N = 4096 columns in 64-wide tiles make only 64 programs for 132 SMs. The first two
kernels can split K into ``SPLIT_K`` slices (as Hoque et al., 2024, do for W4A16 in Triton): each
slice writes its float32 partial tile to a workspace and counts itself in; the last to arrive
sums the partials, writes the output and resets the counter, in the same launch. The counters
are one zeroed buffer per device: launches running at once on two streams of a device could mix
them. Tiles and splits are autotuned per (bucket of M, N, K, group size); the interpreter runs
small fixed tiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..._checks import check_quantized_weight, check_w4a16_linear
from ..common import check_device
from .matmul import _next_pow2, grouped_tile
from .w4a16_codes import (
    _MAGIC,
    _MAGIC_BITS,
    CODE_BIT,
    SUB_SHIFT,
    _code_minus_zero,
    _gemv_row_tile,
    _strided_slices,
    _unpack_pairs,
)
from .w4a16_plan import (
    _GEMM_CONFIGS,
    _GEMV_CONFIGS,
    DEQUANT_M,
    SMALL_M,
    _prune,
    _sms,
    gemm_configs,
    gemv_configs,
    plan_configs,
    plan_swap_ab,
    swap_ab_configs,
)
from .w4a16_swap_ab import _swap_ab, _swap_ab_fits, w4a16_swap_ab_kernel

__all__ = ["w4a16_linear", "w4a16_dequantize", "w4a16_gemv_kernel", "w4a16_swap_ab_kernel", "w4a16_gemm_kernel"]
__all__ += ["w4a16_dequant_kernel", "gemv_configs", "gemm_configs", "swap_ab_configs", "plan_configs", "plan_swap_ab"]
__all__ += ["SMALL_M", "DEQUANT_M", "SUB_SHIFT", "CODE_BIT"]


@triton.jit
def _k_range(K, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, pid_k):
    """The K tiles ``[first, last)`` of split ``pid_k``."""
    per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K)
    first = pid_k * per_split
    return first, tl.minimum(first + per_split, tl.cdiv(K, BLOCK_K))


@triton.jit
def _group_params(s_ptr, z_ptr, k0, rkw, rn, K, group_size, stride_g, ONE_GROUP: tl.constexpr):
    """Scales and zero points in float32 for the word rows ``rkw`` of the K tile at ``k0``:
    ``(1, BLOCK_N)`` when the tile lies in one group, else one group row per word row (a word
    never straddles two groups)."""
    if ONE_GROUP:  # loaded as vectors, then broadcast: the tile keeps the layout of the words
        offs = (k0 // group_size) * stride_g + rn
        s = tl.load(s_ptr + offs)[None, :]
        z = tl.load(z_ptr + offs)[None, :]
    else:
        kk = k0 + 8 * rkw
        offs = (kk // group_size)[:, None] * stride_g + rn[None, :]
        s = tl.load(s_ptr + offs, mask=kk[:, None] < K, other=0.0)
        z = tl.load(z_ptr + offs, mask=kk[:, None] < K, other=0.0)
    return s.to(tl.float32), z.to(tl.float32)


@triton.jit
def _write(acc, out_ptr, ws_ptr, lock_ptr, cm, cn, M, N, ws_stride, stride_om, tile, pid_k, SPLIT_K: tl.constexpr):
    """Store a finished ``(len(cm), len(cn))`` tile, or with split-K its partial; the last split
    of a tile to arrive sums the partials, stores the output and resets the tile's counter."""
    inside = (cm[:, None] < M) & (cn[None, :] < N)
    out_ptrs = out_ptr + cm[:, None].to(tl.int64) * stride_om + cn[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=inside)
    else:
        offs = cm[:, None].to(tl.int64) * N + cn[None, :]
        tl.store(ws_ptr + pid_k.to(tl.int64) * ws_stride + offs, acc, mask=inside)
        tl.debug_barrier()  # every thread's partial is written before the count goes up
        arrived = tl.atomic_add(lock_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:
            total = tl.zeros_like(acc)
            for s in tl.static_range(SPLIT_K):  # read through L2 (.cg): other SMs wrote them
                total += tl.load(ws_ptr + s * ws_stride + offs, mask=inside, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=inside)
            tl.atomic_xchg(lock_ptr + tile, 0)


@triton.jit
def w4a16_gemv_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, ws_ptr, lock_ptr,
    M, N, K, group_size, M_BUCKET, ws_stride,
    stride_xm, stride_xk, stride_qk, stride_g, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    EVEN_K: tl.constexpr, ONE_GROUP: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    ASM: tl.constexpr = False, WIDE: tl.constexpr = False,
):  # fmt: skip
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    tl.static_assert(not WIDE or (BLOCK_M == 1 and ONE_GROUP), "wide one-row tiles lie in one group")
    BLOCK_KW: tl.constexpr = BLOCK_K // 8  # int32 words per column of a K tile
    rm = tl.arange(0, BLOCK_M) % M  # rows past M repeat rows below it (loaded, never stored)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rkw = tl.arange(0, BLOCK_KW)
    first, last = _k_range(K, BLOCK_K, SPLIT_K, pid_k)
    limit = tl.minimum(K, last * BLOCK_K)  # the end of this split's K rows
    q_ptrs = qw_ptr + (first * BLOCK_KW + rkw)[:, None] * stride_qk + rn[None, :]
    if WIDE:  # partial sums per column; no prefetch: one tile is already 8 to 16 16-byte loads a thread
        acc = tl.zeros((1, BLOCK_N), dtype=tl.float32)
    elif BLOCK_M == 1:  # per-thread partial sums, reduced over K once at the end; words prefetched
        acc = tl.zeros((BLOCK_KW, BLOCK_N), dtype=tl.float32)
        ahead = tl.load(q_ptrs, mask=(first * BLOCK_K + 8 * rkw)[:, None] < limit, other=0)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(first, last):
        k0 = t * BLOCK_K
        s, z = _group_params(s_ptr, z_ptr, k0, rkw, rn, K, group_size, stride_g, ONE_GROUP)
        if BLOCK_M == 1:
            if WIDE:
                words = tl.load(q_ptrs, mask=(k0 + 8 * rkw)[:, None] < limit, other=0)
            else:
                words = ahead
                ahead = tl.load(q_ptrs + BLOCK_KW * stride_qk, mask=(k0 + BLOCK_K + 8 * rkw)[:, None] < limit, other=0)
            acc = _gemv_row_tile(acc, words, s, z, x_ptr, k0 + 8 * rkw, K, stride_xk, EVEN_K, WIDE)
        else:  # 16 rows on the tensor cores: code j of every word against x's slice j
            rk = k0 + tl.arange(0, BLOCK_K)
            x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk
            if EVEN_K:
                words = tl.load(q_ptrs)
                xt = tl.load(x_ptrs)
            else:
                words = tl.load(q_ptrs, mask=(k0 + 8 * rkw)[:, None] < K, other=0)
                xt = tl.load(x_ptrs, mask=rk[None, :] < K, other=0.0)
            # (Triton's interpreter cannot multiply bf16: UPCAST multiplies in float32 there)
            xs = _strided_slices(xt.to(tl.float32) if UPCAST else xt, BLOCK_M, BLOCK_KW)
            ws = _unpack_pairs(words, s, z, not ONE_GROUP, ASM, tl.float32 if UPCAST else xt.dtype)
            part = tl.zeros_like(acc)  # sum_k x_k (q_k - z), scaled once below when the tile is one group
            for j in tl.static_range(8):
                part = tl.dot(xs[j], ws[j], part, input_precision=PRECISION)
            acc += part * s if ONE_GROUP else part
        q_ptrs += BLOCK_KW * stride_qk
    if BLOCK_M == 1 and not WIDE:
        acc = tl.sum(acc, axis=0)[None, :]
    cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    _write(acc, out_ptr, ws_ptr, lock_ptr, tl.arange(0, BLOCK_M), cn, M, N, ws_stride, stride_om, pid_n, pid_k, SPLIT_K)


@triton.jit
def w4a16_gemm_kernel(
    x_ptr, qw_ptr, s_ptr, z_ptr, out_ptr, ws_ptr, lock_ptr,
    M, N, K, group_size, M_BUCKET, ws_stride,
    stride_xm, stride_xk, stride_qk, stride_g, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr, ONE_GROUP: tl.constexpr, UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    pid, pid_k = tl.program_id(0), tl.program_id(1)
    pid_m, pid_n = grouped_tile(pid, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    BLOCK_KW: tl.constexpr = BLOCK_K // 8
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk, rkw = tl.arange(0, BLOCK_K), tl.arange(0, BLOCK_KW)
    j3 = tl.arange(0, 8)[None, :, None]  # code j of a word, as a dimension: see _code_minus_zero
    nib3 = 4 * (j3 % 4)
    step3 = 1.0 / (1 << nib3).to(tl.float32)
    first, last = _k_range(K, BLOCK_K, SPLIT_K, pid_k)
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + (first * BLOCK_K + rk)[None, :] * stride_xk
    q_ptrs = qw_ptr + (first * BLOCK_KW + rkw)[:, None] * stride_qk + rn[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(first, last):
        k0 = t * BLOCK_K
        if EVEN_K:
            x = tl.load(x_ptrs)
            words = tl.load(q_ptrs)
        else:
            x = tl.load(x_ptrs, mask=(k0 + rk)[None, :] < K, other=0.0)
            words = tl.load(q_ptrs, mask=(k0 + 8 * rkw)[:, None] < K, other=0)
        s, z = _group_params(s_ptr, z_ptr, k0, rkw, rn, K, group_size, stride_g, ONE_GROUP)
        v = tl.where(j3 < 4, (words | _MAGIC_BITS)[:, None, :], ((words >> 16) | _MAGIC_BITS)[:, None, :])
        bits = (v & ((15 << nib3) | _MAGIC_BITS)).to(tl.float32, bitcast=True)
        w = (bits * step3 - (z[:, None, :] + _MAGIC * step3)) * s[:, None, :]  # (BLOCK_KW, 8, BLOCK_N)
        w = tl.reshape(w.to(tl.float32 if UPCAST else x.dtype), (BLOCK_K, BLOCK_N))
        acc = tl.dot(x.to(tl.float32) if UPCAST else x, w, acc, input_precision=PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        q_ptrs += BLOCK_KW * stride_qk
    cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tile = pid_m * tl.cdiv(N, BLOCK_N) + pid_n
    _write(acc, out_ptr, ws_ptr, lock_ptr, cm, cn, M, N, ws_stride, stride_om, tile, pid_k, SPLIT_K)


@triton.jit
def w4a16_dequant_kernel(
    qw_ptr, s_ptr, z_ptr, w_ptr, N, K, group_size, stride_qk, stride_g, stride_wn,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ONE_GROUP: tl.constexpr,
):  # fmt: skip
    """The weight ``w[n, k] = (q - z) * s``, an ``(N, K)`` matrix in w's dtype: the eight codes of
    each word interleaved back into K order in registers, so that every row is stored along K."""
    pid_k, pid_n = tl.program_id(0), tl.program_id(1)
    BLOCK_KW: tl.constexpr = BLOCK_K // 8
    k0, rkw = pid_k * BLOCK_K, tl.arange(0, BLOCK_KW)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    words = tl.load(qw_ptr + (k0 // 8 + rkw)[:, None] * stride_qk + rn[None, :], mask=(k0 + 8 * rkw)[:, None] < K, other=0)
    s, z = _group_params(s_ptr, z_ptr, k0, rkw, rn, K, group_size, stride_g, ONE_GROUP)
    low, high = words | _MAGIC_BITS, (words >> 16) | _MAGIC_BITS
    # each tl.join adds a last axis; joined as below, code j sits at [..., j // 4, j // 2 % 2, j % 2]
    c0, c1, c2, c3 = (_code_minus_zero(low, high, z, 0) * s, _code_minus_zero(low, high, z, 1) * s,
                      _code_minus_zero(low, high, z, 2) * s, _code_minus_zero(low, high, z, 3) * s)
    c4, c5, c6, c7 = (_code_minus_zero(low, high, z, 4) * s, _code_minus_zero(low, high, z, 5) * s,
                      _code_minus_zero(low, high, z, 6) * s, _code_minus_zero(low, high, z, 7) * s)
    codes = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    tile = tl.reshape(tl.permute(codes, (1, 0, 2, 3, 4)), (BLOCK_N, BLOCK_K))  # column k0 + 8i + j: word i, code j
    cn, rk = pid_n * BLOCK_N + tl.arange(0, BLOCK_N), k0 + tl.arange(0, BLOCK_K)
    mask = (cn[:, None] < N) & (rk[None, :] < K)
    tl.store(w_ptr + cn[:, None].to(tl.int64) * stride_wn + rk[None, :], tile.to(w_ptr.dtype.element_ty), mask=mask)


_KEY = ["M_BUCKET", "N", "K", "group_size"]
_ONE_GROUP = {"ONE_GROUP": lambda args: args["group_size"] % args["BLOCK_K"] == 0}
_HEURISTICS = {**_ONE_GROUP, "EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0}
_gemv = triton.heuristics(_HEURISTICS)(w4a16_gemv_kernel)
_gemm = triton.heuristics(_HEURISTICS)(w4a16_gemm_kernel)
_tuned_gemv = triton.autotune(_GEMV_CONFIGS, key=_KEY, prune_configs_by={"early_config_prune": _prune(True)})(_gemv)
_tuned_gemm = triton.autotune(_GEMM_CONFIGS, key=_KEY, prune_configs_by={"early_config_prune": _prune(False)})(_gemm)
_LOCKS: dict[torch.device, torch.Tensor] = {}


def _locks(device: torch.device, count: int) -> torch.Tensor:
    """A zeroed int32 counter per output tile, shared by the launches on ``device``; every
    split-K launch leaves its counters at zero again."""
    if device not in _LOCKS or _LOCKS[device].numel() < count:
        _LOCKS[device] = torch.zeros(max(count, 4096), dtype=torch.int32, device=device)
    return _LOCKS[device]


def _parts(qweight) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return qweight.qweight.contiguous(), qweight.scales.contiguous(), qweight.zeros.contiguous()


def w4a16_linear(x: torch.Tensor, qweight) -> torch.Tensor:
    """``x @ W.T`` for x ``(..., K)`` fp16/bf16 (fp32 too) and ``qweight`` a
    :class:`~llmnote.quant.QuantizedWeight` of an ``(N, K)`` weight ``W`` with 2- to 4-bit codes.

    Returns ``(..., N)`` in x's dtype, equal to ``x @ qweight.dequantize().T`` within 16-bit
    rounding; float32 accumulation. 5- to 8-bit codes (8-bit containers) raise ``ValueError``.
    From ``DEQUANT_M`` rows on, the weight is dequantized once by :func:`w4a16_dequantize` and
    multiplied by cuBLAS.
    """
    check_w4a16_linear(x, qweight)
    N, K = qweight.shape
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if M >= DEQUANT_M:  # the very product of x @ W.T in 16 bits (the same operands and call), after one pass
        out = x2 @ w4a16_dequantize(qweight, x.dtype)
    else:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
        if M > 0:
            _fused(x2, qweight, out)
    return out.reshape(*x.shape[:-1], N)


def w4a16_dequantize(qweight, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``qweight.dequantize().T``: the ``(K, N)`` weight in ``dtype`` (default: the scales'),
    written by one Triton pass over the packed codes into an ``(N, K)`` buffer and returned as its
    transposed view, so ``x @ w4a16_dequantize(q)`` is the same cuBLAS product as ``x @ W.T``."""
    check_quantized_weight(qweight)
    (N, K), dtype = qweight.shape, dtype or qweight.scales.dtype
    qw, s, z = _parts(qweight)
    check_device(qweight=qw, scales=s, zeros=z)
    w = torch.empty((N, K), dtype=dtype, device=qw.device)
    bn, bk = (32, 32) if runtime.interpreting() else (128, 64)
    grid = (triton.cdiv(K, bk), triton.cdiv(N, bn))
    args = (qw, s, z, w, N, K, qweight.group_size, qw.stride(0), s.stride(0), w.stride(0))
    w4a16_dequant_kernel[grid](*args, BLOCK_N=bn, BLOCK_K=bk, ONE_GROUP=qweight.group_size % bk == 0)
    return w.t()


_SWAP_AB_CHOICE: dict[tuple, bool] = {}  # (device, N, K, group size, dtype) -> tensor-core decode faster at 9 to 16 rows


def _replay_ms(fn, device: torch.device, calls: int = 8, reps: int = 7) -> float:
    """Milliseconds of one ``fn()`` as a model runs it: ``calls`` calls captured in one CUDA graph
    (no host launch cost), each after a read of twice the L2's size (the last call's weight gone
    from the L2, and no dirty lines left to write back, as a flush by writing would), minus a graph
    of the reads alone; the median of ``reps`` replays each."""
    buffer = torch.zeros(2 * torch.cuda.get_device_properties(device).L2_cache_size // 4, dtype=torch.float32, device=device)
    total = torch.empty((), dtype=torch.float32, device=device)

    def median_replay(body) -> float:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                body()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[reps // 2]

    def flush():
        torch.sum(buffer, 0, out=total)

    return (median_replay(lambda: (flush(), fn())) - median_replay(flush)) / calls


def _swap_ab_wins(key: tuple, swap, dot, device: torch.device) -> bool:
    """Whether the tensor-core decode kernel (``swap``) beats the 16-row ``tl.dot`` decode kernel
    (``dot``) for 9 to 16 rows of this shape: both timed once on the GPU, the answer kept. At 16
    rows neither wins everywhere (on an H200 ``swap`` was 5% faster on Llama-3-8B's
    ``gate_up_proj`` and 26% slower on its ``down_proj``), so, like the autotuner within a kernel,
    the dispatcher measures, the way a model runs them (:func:`_replay_ms`: CUDA-graph replays,
    the weight not in the L2). Inside a CUDA graph capture nothing can be timed: an unseen shape
    takes ``swap`` there."""
    if key not in _SWAP_AB_CHOICE:
        if torch.cuda.is_current_stream_capturing():
            return True
        swap(), dot()  # each autotuned and compiled before the capture
        _SWAP_AB_CHOICE[key] = _replay_ms(swap, device) <= _replay_ms(dot, device)
    return _SWAP_AB_CHOICE[key]


def _fused(x2: torch.Tensor, qweight, out: torch.Tensor) -> None:
    """``out = x2 @ W.T`` for x2 ``(M, K)`` with ``0 < M < DEQUANT_M``: the tensor-core decode kernel, the
    decode kernel or the tiled kernel."""
    (M, K), N = x2.shape, out.shape[1]
    qw, s, z = _parts(qweight)
    check_device(x=x2, qweight=qw, scales=s, zeros=z)
    group = qweight.group_size
    if _swap_ab_fits(x2, qw, group):

        def swap():
            _swap_ab(x2, qw, s, z, group, out, _locks(x2.device, N // 32))

        key = (x2.device, N, K, group, x2.dtype)
        if M <= 8 or runtime.interpreting() or _swap_ab_wins(key, swap, lambda: _decode(x2, qw, s, z, group, out), x2.device):
            swap()
            return
    _decode(x2, qw, s, z, group, out)


def _decode(x2: torch.Tensor, qw: torch.Tensor, s: torch.Tensor, z: torch.Tensor, group: int, out: torch.Tensor) -> None:
    """``out = x2 @ W.T`` by the decode kernel (up to ``SMALL_M`` rows) or the tiled kernel."""
    (M, K), N = x2.shape, out.shape[1]
    small = M <= SMALL_M
    bucket = 1 if M == 1 else SMALL_M if small else _next_pow2(M)
    interp = runtime.interpreting()
    if interp:  # small fixed tiles, with a split of K whenever there are two K tiles to split
        bk = 128 if small else 32
        meta = {"BLOCK_N": 32, "BLOCK_K": bk, "SPLIT_K": 2 if K > bk else 1}
        extra = {"BLOCK_M": 1 if M == 1 else SMALL_M} if small else {"BLOCK_M": 32, "GROUP_M": 2}
        configs = [triton.Config({**meta, **extra})]
    else:
        configs = plan_configs(small, bucket, N, K, x2.element_size(), _sms(x2.device), tuple(runtime.capability()))
    split = max(c.kwargs["SPLIT_K"] for c in configs)
    tiles = max(triton.cdiv(M, c.kwargs["BLOCK_M"]) * triton.cdiv(N, c.kwargs["BLOCK_N"]) for c in configs)
    ws = torch.empty((split, M, N), dtype=torch.float32, device=x2.device) if split > 1 else out
    locks = _locks(x2.device, tiles if split > 1 else 1)
    args = (x2, qw, s, z, out, ws, locks, M, N, K, group, bucket, M * N)
    args += (x2.stride(0), x2.stride(1), qw.stride(0), s.stride(0), out.stride(0))
    flags = {"UPCAST": interp and x2.dtype == torch.bfloat16, "PRECISION": "ieee" if x2.dtype == torch.float32 else "tf32"}
    if small and M > 1:  # packed 16-bit unpacking (PTX) for the tensor-core path, on a GPU
        flags["ASM"] = not interp and x2.dtype in (torch.float16, torch.bfloat16)

    def grid(meta):
        rows = 1 if small else triton.cdiv(M, meta["BLOCK_M"])
        return (rows * triton.cdiv(N, meta["BLOCK_N"]), meta["SPLIT_K"])

    if interp:
        (_gemv if small else _gemm)[grid](*args, **configs[0].kwargs, **flags)
    else:
        (_tuned_gemv if small else _tuned_gemm)[grid](*args, **flags)
