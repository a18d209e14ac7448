"""FlashAttention forward over variable-length sequences packed along the token dimension.

A serving engine prefills several prompts at once. Padding them to the longest wastes the
padding's FLOPs and bytes; instead the tokens of all prompts are laid end to end, q as
``(total_q, Hq, D)`` and k/v as ``(total_k, Hkv, D)``, and ``cu_seqlens`` (cumulative
offsets from 0) says where each sequence starts: FlashAttention-2's ``varlen`` interface,
which vLLM's prefill path also uses.

``flash_varlen_kernel`` is the pointer kernel of ``flash.py`` with its batch index replaced
by a lookup. The grid is ``(cdiv(max_seqlen_q, BLOCK_M), B * Hq)``, the dense kernel's with
the longest sequence standing for ``Sq``: program ``(i, b * Hq + h)`` reads sequence ``b``'s
offsets from ``cu_seqlens_q``/``cu_seqlens_k``, returns at once if that sequence has at most
``i`` query blocks, and otherwise runs query block ``i`` counted from the sequence's last,
so that every sequence's longest causal rows start first. Everything else is the dense
kernel's: ``key_range`` splits the sequence's keys into an unmasked and a masked loop and
skips the key blocks a causal tile cannot see, ``online_step`` folds each block in, and the
loads and the store are masked at the sequence's ragged ends. A program past a short
sequence's end costs two loads and an exit; launching only the real tiles instead would need
a prefix sum of the sequences' tile counts before the launch (one more kernel, or a host
synchronisation) and a search of it in every program.

The grid depends on ``max_seqlen_q``, which the caller passes (a serving engine knows its
longest prompt): nothing is read back from the GPU, so a call can be captured in a CUDA
graph. One launch configuration per head dim replaces the dense kernel's autotuning: a tuner
would time its candidates on whichever lengths came first, and its timing runs cannot happen
inside a graph capture.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..._checks import check_cu_seqlens, check_varlen
from ..common import check_device
from .common import LOG2E, online_step, positive_scale
from .flash import key_range

__all__ = ["flash_attention_varlen", "flash_varlen_kernel", "varlen_config"]


@triton.jit
def flash_varlen_kernel(
    Q,
    K,
    V,
    OUT,
    CU_Q,
    CU_K,
    sqt,
    sqh,
    sqd,
    skt,
    skh,
    skd,
    svt,
    svh,
    svd,
    sot,
    soh,
    sod,
    HQ,
    GROUP,
    qk_scale,
    CAUSAL: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    bh = tl.program_id(1)
    b = bh // HQ
    h = (bh % HQ).to(tl.int64)
    hk = h // GROUP
    q_first = tl.load(CU_Q + b)
    SQ = tl.load(CU_Q + b + 1) - q_first  # this sequence's queries
    n_m = tl.cdiv(SQ, BLOCK_M)
    if tl.program_id(0) >= n_m:  # a sequence shorter than the longest: no block here
        return
    pid_m = n_m - 1 - tl.program_id(0)  # the sequence's longest causal rows first
    k_first = tl.load(CU_K + b)
    SKV = tl.load(CU_K + b + 1) - k_first  # and its keys
    q_base = Q + q_first.to(tl.int64) * sqt + h * sqh
    k_base = K + k_first.to(tl.int64) * skt + hk * skh
    v_base = V + k_first.to(tl.int64) * svt + hk * svh

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    d_ok = dims < D
    q = tl.load(q_base + rows[:, None] * sqt + dims[None, :] * sqd, mask=(rows[:, None] < SQ) & d_ok[None, :], other=0.0)
    if UPCAST:  # the interpreter cannot multiply bf16
        q = q.to(tl.float32)
    kt_ptrs = k_base + cols[None, :] * skt + dims[:, None] * skd  # K^T tile (BLOCK_D, BLOCK_N)
    v_ptrs = v_base + cols[:, None] * svt + dims[None, :] * svd  # (BLOCK_N, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, hi, delta = key_range(pid_m * BLOCK_M, SQ, SKV, BLOCK_M, BLOCK_N, CAUSAL)

    for start in range(0, lo, BLOCK_N):  # keys every row sees, all inside the sequence: no mask
        if BLOCK_D == D:
            kt = tl.load(kt_ptrs + start * skt)
            v = tl.load(v_ptrs + start * svt)
        else:
            kt = tl.load(kt_ptrs + start * skt, mask=d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs + start * svt, mask=d_ok[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        acc, l_i, m_i = online_step(acc, l_i, m_i, tl.dot(q, kt), v, qk_scale, False)

    for start in range(lo, hi, BLOCK_N):  # the causal diagonal and the sequence's last keys
        keys = start + cols
        k_ok = keys < SKV  # keys past the end belong to the next sequence
        kt = tl.load(kt_ptrs + start * skt, mask=k_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_ptrs + start * svt, mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        visible = k_ok[None, :]
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + delta)
        s = tl.where(visible, tl.dot(q, kt), float("-inf"))
        acc, l_i, m_i = online_step(acc, l_i, m_i, s, v, qk_scale, True)

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # rows that see no key give zeros
    o_ptrs = OUT + q_first.to(tl.int64) * sot + h * soh + rows[:, None] * sot + dims[None, :] * sod
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=(rows[:, None] < SQ) & d_ok[None, :])


# (BLOCK_M, BLOCK_N, warps, stages) by head dim rounded up to 64, 128 or 256. For GPUs whose blocks
# may use 163 KiB of shared memory or more (A100, H100/H200, B200): at D = 64 and 128, a tile on
# which the dense pointer kernel ran within 4 % of its best on an H200, full and causal
# (assets/benchmarks/attention_tuning.json). For 64-99 KiB (T4, A10, L4, GeForce cards): smaller
# tiles and pipelines, which compile to 24-48 KiB of shared memory.
_LARGE_SMEM = {64: (128, 64, 8, 3), 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)}
_SMALL_SMEM = {64: (64, 64, 4, 2), 128: (64, 32, 4, 2), 256: (32, 32, 4, 1)}


def varlen_config(head_dim: int, capability: tuple[int, int] | None = None) -> triton.Config:
    """The launch configuration of ``flash_varlen_kernel`` at ``head_dim`` on a GPU of compute
    ``capability`` (default: the runtime's); 32 x 32 tiles in the interpreter."""
    if runtime.interpreting():
        return triton.Config({"BLOCK_M": 32, "BLOCK_N": 32})
    cap = capability or runtime.capability() or (0, 0)
    table = _LARGE_SMEM if cap in ((8, 0), (8, 7)) or cap[0] in (9, 10) else _SMALL_SMEM
    m, n, warps, stages = table[64 if head_dim <= 64 else 128 if head_dim <= 128 else 256]
    return triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=warps, num_stages=stages)


def flash_attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None = None,
    causal: bool = False,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Attention of ``B`` packed sequences, each to its own keys (see the module doc): the
    semantics of ``llmnote.ref.flash_attention_varlen``.

    q ``(total_q, Hq, D)``, k/v ``(total_k, Hkv, D)`` with ``Hq % Hkv == 0``, ``D <= 256``, any
    strides; ``cu_seqlens_q``/``cu_seqlens_k`` int32 ``(B + 1,)`` offsets from 0 on q's device;
    ``causal`` is bottom-right aligned per sequence; ``sm_scale`` defaults to ``D ** -0.5``.

    ``max_seqlen_q``, the longest sequence's query count, sizes the grid. Given, nothing is
    read back from the GPU (the call can be captured in a CUDA graph) and the offsets are
    trusted: they must be valid and no sequence longer than ``max_seqlen_q``; a query that sees
    no key then gives zeros. ``None`` reads the offsets back (a host synchronisation), checks
    them as the reference does (``ValueError``) and takes the longest. ``max_seqlen_k`` is
    accepted for the signature of FlashAttention-2's ``flash_attn_varlen_func`` and checked
    when the offsets are read; each program reads its own key count. Returns
    ``(total_q, Hq, D)`` in q's dtype.
    """
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k)
    check_device(q=q, k=k, v=v, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k)
    total_q, HQ, D = q.shape
    if D > 256:
        raise ValueError(f"head dim {D} is above the 256 this kernel supports")
    if max_seqlen_q is None:
        cu_q, cu_k = check_cu_seqlens(cu_seqlens_q, cu_seqlens_k, total_q, k.shape[0], causal)
        max_seqlen_q = max((end - start for start, end in zip(cu_q, cu_q[1:])), default=0)
        longest_k = max((end - start for start, end in zip(cu_k, cu_k[1:])), default=0)
        if max_seqlen_k is not None and max_seqlen_k < longest_k:
            raise ValueError(f"max_seqlen_k is {max_seqlen_k}, but a sequence has {longest_k} keys")
    elif max_seqlen_q < (1 if total_q else 0):
        raise ValueError(f"max_seqlen_q must be >= 1 when q holds tokens, got {max_seqlen_q}")
    out = torch.empty_like(q)
    if total_q == 0:
        return out
    q, scale = positive_scale(q, D**-0.5 if sm_scale is None else sm_scale)
    config = varlen_config(D)
    block_m = config.kwargs["BLOCK_M"]
    batch = cu_seqlens_q.shape[0] - 1
    grid = (triton.cdiv(max_seqlen_q, block_m), batch * HQ)
    launch = {} if runtime.interpreting() else {"num_warps": config.num_warps, "num_stages": config.num_stages}
    flash_varlen_kernel[grid](
        q,
        k,
        v,
        out,
        cu_seqlens_q.contiguous(),  # the kernel reads offset b at CU + b
        cu_seqlens_k.contiguous(),
        *q.stride(),
        *k.stride(),
        *v.stride(),
        *out.stride(),
        HQ,
        HQ // k.shape[1],
        scale * LOG2E,
        CAUSAL=causal,
        D=D,
        BLOCK_D=max(16, triton.next_power_of_2(D)),
        UPCAST=runtime.interpreting() and q.dtype == torch.bfloat16,  # the interpreter cannot multiply bf16
        **config.kwargs,
        **launch,
    )
    return out
