"""FlashAttention forward in Triton.

``flash_attention`` follows FlashAttention-2 (Dao, 2023): one program owns a block of
``BLOCK_M`` query rows of one head and streams the keys and values past it in blocks of
``BLOCK_N``, keeping the running row maximum ``m``, the running denominator ``l`` and the
unnormalised output in registers (the online softmax of Milakov and Gimelshein, 2018), so
the ``Sq x Skv`` score matrix never reaches memory. Scores are kept in base 2 (the scale is
multiplied by log2 e once, and ``exp2`` is one instruction). Key blocks are split in two
loops: the blocks every row of the tile may see run without any mask; only the blocks on
the causal diagonal or past the end of the keys pay for masking, and blocks above the
diagonal are skipped. Causal programs start with the heaviest query blocks, which keeps
the last wave of the grid short. Grouped-query heads read their shared key/value head.

On a Hopper GPU, head dim 128 in fp16/bf16 goes to a warp-specialised kernel written in
Gluon instead (``flash_ws``: FlashAttention-3's producer warp, two consumer warpgroups and
intra-warpgroup overlap); ``flash_attention_triton`` keeps the Triton kernels for every
case, for comparison.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..._checks import check_qkv
from ..common import check_device
from .common import LOG2E, block_probs, online_step, positive_scale

try:  # Gluon (Triton's explicit-layout dialect) ships with recent Triton releases
    from . import flash_ws
except ImportError:  # pragma: no cover - an older Triton: the Triton kernels serve every case
    flash_ws = None

__all__ = [
    "flash_attention",
    "flash_attention_triton",
    "flash_dispatch",
    "flash_launch",
    "flash_fwd_kernel",
    "flash_fwd_tma_kernel",
    "key_range",
    "prefetch_l2",
    "attention_configs",
    "tma_attention_configs",
    "use_tma",
]


def attention_configs(head_dim: int) -> list[triton.Config]:
    """Autotuning candidates for Hopper-class GPUs; narrower key blocks for wide heads so
    that the pipelined K/V buffers fit in shared memory."""
    if head_dim <= 64:
        shapes = [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4), (64, 64, 4, 4), (128, 128, 4, 2)]
    elif head_dim <= 128:
        shapes = [(128, 64, 8, 3), (128, 128, 8, 2), (128, 64, 4, 3), (128, 128, 8, 3), (64, 64, 4, 3), (128, 32, 4, 4)]
    else:
        shapes = [(64, 32, 4, 2), (64, 64, 8, 2), (128, 32, 8, 2)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s) for m, n, w, s in shapes]


@triton.jit
def key_range(first, SQ, SKV, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """``(lo, hi, delta)`` for the query block whose first row is ``first``. Keys ``[0, lo)``
    exist and are visible to every row of the block: no mask at all. Keys ``[lo, hi)`` need
    the causal and/or end-of-sequence mask; keys from ``hi`` on are skipped. Row ``i`` sees
    key ``j`` iff ``j <= i + delta`` (bottom-right alignment)."""
    if CAUSAL:
        delta = SKV - SQ
        lo = tl.minimum(tl.maximum(first + delta + 1, 0), SKV) // BLOCK_N * BLOCK_N
        hi = tl.minimum(tl.maximum(tl.minimum(first + BLOCK_M, SQ) + delta, 0), SKV)
    else:
        delta = 0
        lo = SKV // BLOCK_N * BLOCK_N
        hi = SKV
    return lo, hi, delta


@triton.jit
def flash_fwd_kernel(
    Q,
    K,
    V,
    OUT,
    sqb,
    sqh,
    sqm,
    sqd,
    skb,
    skh,
    skn,
    skd,
    svb,
    svh,
    svn,
    svd,
    sob,
    soh,
    som,
    sod,
    HQ,
    GROUP,
    SQ,
    SKV,
    qk_scale,
    CAUSAL: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m = tl.cdiv(SQ, BLOCK_M) - 1 - tl.program_id(0)  # the longest causal rows first
    bh = tl.program_id(1)
    b = (bh // HQ).to(tl.int64)
    h = (bh % HQ).to(tl.int64)
    hk = h // GROUP
    q_base = Q + b * sqb + h * sqh
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    d_ok = dims < D
    q = tl.load(q_base + rows[:, None] * sqm + dims[None, :] * sqd, mask=(rows[:, None] < SQ) & d_ok[None, :], other=0.0)
    if UPCAST:  # the interpreter cannot multiply bf16
        q = q.to(tl.float32)
    kt_ptrs = k_base + cols[None, :] * skn + dims[:, None] * skd  # K^T tile (BLOCK_D, BLOCK_N)
    v_ptrs = v_base + cols[:, None] * svn + dims[None, :] * svd  # (BLOCK_N, BLOCK_D)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, hi, delta = key_range(pid_m * BLOCK_M, SQ, SKV, BLOCK_M, BLOCK_N, CAUSAL)

    for start in range(0, lo, BLOCK_N):
        if BLOCK_D == D:
            kt = tl.load(kt_ptrs + start * skn)
            v = tl.load(v_ptrs + start * svn)
        else:
            kt = tl.load(kt_ptrs + start * skn, mask=d_ok[:, None], other=0.0)
            v = tl.load(v_ptrs + start * svn, mask=d_ok[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        acc, l_i, m_i = online_step(acc, l_i, m_i, tl.dot(q, kt), v, qk_scale, False)

    for start in range(lo, hi, BLOCK_N):
        keys = start + cols
        k_ok = keys < SKV
        kt = tl.load(kt_ptrs + start * skn, mask=k_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_ptrs + start * svn, mask=k_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        visible = k_ok[None, :]
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + delta)
        s = tl.where(visible, tl.dot(q, kt), float("-inf"))
        acc, l_i, m_i = online_step(acc, l_i, m_i, s, v, qk_scale, True)

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]  # rows that see no key give zeros
    o_ptrs = OUT + b * sob + h * soh + rows[:, None] * som + dims[None, :] * sod
    tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=(rows[:, None] < SQ) & d_ok[None, :])


@triton.jit
def prefetch_l2(P, bh, first, S, ROWS: tl.constexpr, D: tl.constexpr):
    """Ask L2 for rows ``[first, first + ROWS)`` of head ``bh`` of a contiguous ``(B*H, S, D)``
    2-byte tensor: one ``prefetch.global.L2`` per 128-byte line, nothing written to registers."""
    lines = tl.arange(0, ROWS * D * 2 // 128)
    rows = tl.minimum(first + lines // (D * 2 // 128), S - 1)
    ptrs = P + (bh * S + rows).to(tl.int64) * D + (lines % (D * 2 // 128)) * 64
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def flash_fwd_tma_kernel(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    Q,
    HQ,
    GROUP,
    SQ,
    SKV,
    qk_scale,
    NEXT,
    CAUSAL: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    ROTATE: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """The same algorithm for Hopper and newer: Q, K, V and O move through the Tensor
    Memory Accelerator (TMA) as 3-D ``(B*H, S, D)`` tiles, zero-filled past the sequence end.

    ``WARP_SPECIALIZE`` is passed to ``tl.range(..., warp_specialize=...)`` of the unmasked loop.

    With ``ROTATE`` the unmasked loop is software-pipelined by hand: each step first computes
    the scores of the next key block, then issues the ``P V`` product of the current one,
    then runs the next block's softmax. Triton waits for a ``wgmma`` only where its result is
    needed, so the tensor cores can work on ``P V`` while the exponentials of the next block
    run (the intra-warpgroup overlap of FlashAttention-3, written in plain Triton). Its timings
    are in ``assets/benchmarks/attention_tuning.json``; the appendix's engineering notes on the
    Triton attention kernel discuss them.

    With ``PREFETCH`` the program first asks L2 for the query tile of the program launched
    ``NEXT`` programs after it (``NEXT`` = the SM count: one wave later, for tiles that fill an
    SM), so that tile's first load, which nothing overlaps, hits L2 instead of HBM. ``Q`` is
    the raw pointer of the contiguous query tensor the descriptor ``desc_q`` reads."""
    n_m = tl.cdiv(SQ, BLOCK_M)
    if PREFETCH:  # the query tile of the program launched NEXT programs later: in L2 by the time it starts
        later = tl.program_id(1) * n_m + tl.program_id(0) + NEXT
        if later < n_m * tl.num_programs(1):
            prefetch_l2(Q, later // n_m, (n_m - 1 - later % n_m) * BLOCK_M, SQ, BLOCK_M, D)
    pid_m = n_m - 1 - tl.program_id(0)
    bh = tl.program_id(1)
    bhk = (bh // HQ) * (HQ // GROUP) + (bh % HQ) // GROUP
    first = pid_m * BLOCK_M
    rows = first + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    q = desc_q.load([bh, first, 0]).reshape(BLOCK_M, D)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    lo, hi, delta = key_range(first, SQ, SKV, BLOCK_M, BLOCK_N, CAUSAL)
    if ROTATE:
        if lo > 0:
            k = desc_k.load([bhk, 0, 0]).reshape(BLOCK_N, D)
            p, alpha, l_i, m_i = block_probs(tl.dot(q, tl.trans(k)), l_i, m_i, qk_scale, False)
            for start in tl.range(BLOCK_N, lo, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
                k = desc_k.load([bhk, start, 0]).reshape(BLOCK_N, D)
                s = tl.dot(q, tl.trans(k))  # scores of this block ...
                v = desc_v.load([bhk, start - BLOCK_N, 0]).reshape(BLOCK_N, D)
                acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])  # ... P V of the previous one ...
                p, alpha, l_i, m_i = block_probs(s, l_i, m_i, qk_scale, False)  # ... overlaps this softmax
            v = desc_v.load([bhk, lo - BLOCK_N, 0]).reshape(BLOCK_N, D)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    else:
        for start in tl.range(0, lo, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
            k = desc_k.load([bhk, start, 0]).reshape(BLOCK_N, D)
            v = desc_v.load([bhk, start, 0]).reshape(BLOCK_N, D)
            acc, l_i, m_i = online_step(acc, l_i, m_i, tl.dot(q, tl.trans(k)), v, qk_scale, False)
    for start in range(lo, hi, BLOCK_N):
        keys = start + cols
        k = desc_k.load([bhk, start, 0]).reshape(BLOCK_N, D)
        v = desc_v.load([bhk, start, 0]).reshape(BLOCK_N, D)
        visible = keys[None, :] < SKV
        if CAUSAL:
            visible = visible & (keys[None, :] <= rows[:, None] + delta)
        s = tl.where(visible, tl.dot(q, tl.trans(k)), float("-inf"))
        acc, l_i, m_i = online_step(acc, l_i, m_i, s, v, qk_scale, True)
    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    desc_o.store([bh, first, 0], out.to(desc_o.dtype).reshape(1, BLOCK_M, D))


def tma_attention_configs(head_dim: int) -> list[triton.Config]:
    """Autotuning candidates for the TMA kernel at ``head_dim``: (BLOCK_M, BLOCK_N, warps,
    stages, ROTATE, PREFETCH), taken from the front-runners of ``scripts/tune_attention.py``
    (record: ``assets/benchmarks/attention_tuning.json``). The 8-warp 128-query tiles come
    twice, with and without ``PREFETCH`` (ask L2 for the query tile of the program ``NEXT`` =
    SM-count programs later: one wave ahead when one program fills an SM), so the autotuner
    keeps whichever is faster for the shape. ``WARP_SPECIALIZE`` stays off: Triton 3.6 does
    not warp-specialise this loop on Hopper (it rejects 4 warps and emits the same machine
    code with 8)."""
    if head_dim <= 64:
        shapes = [(128, 64, 8, 3, False, False), (128, 64, 8, 3, False, True), (128, 64, 4, 3, False, False),
                  (64, 64, 4, 3, False, False), (64, 64, 4, 3, True, False)]  # fmt: skip
    elif head_dim <= 128:
        shapes = [(128, 128, 8, 3, False, False), (128, 128, 8, 3, False, True), (64, 64, 4, 3, False, False),
                  (128, 64, 4, 2, False, False), (128, 64, 8, 3, False, False)]  # fmt: skip
    else:
        shapes = [(64, 64, 4, 3, False, False), (128, 64, 8, 2, False, False), (128, 32, 8, 3, False, False),
                  (64, 32, 4, 3, False, False)]  # fmt: skip
    return [
        triton.Config(
            {"BLOCK_M": m, "BLOCK_N": n, "WARP_SPECIALIZE": False, "ROTATE": rot, "PREFETCH": pf},
            num_warps=w,
            num_stages=st,
            pre_hook=_set_blocks,
        )
        for m, n, w, st, rot, pf in shapes
    ]


def _set_blocks(nargs: dict) -> None:
    """Give the TMA descriptors the tile shapes of the configuration being launched."""
    d = nargs["D"]
    nargs["desc_q"].block_shape = nargs["desc_o"].block_shape = [1, nargs["BLOCK_M"], d]
    nargs["desc_k"].block_shape = nargs["desc_v"].block_shape = [1, nargs["BLOCK_N"], d]


def _tma_descriptors(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> list:
    from triton.tools.tensor_descriptor import TensorDescriptor

    descs = []
    for t in (q, k, v, out):
        flat = t.view(t.shape[0] * t.shape[1], t.shape[2], t.shape[3])
        descs.append(TensorDescriptor.from_tensor(flat, [1, 64, t.shape[3]]))  # block shape set per config
    return descs


def use_tma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """The TMA kernel runs on Hopper or newer for contiguous tensors with a power-of-two
    head dim of 64, 128 or 256 (TMA needs 16-byte aligned rows and whole tiles)."""
    if runtime.interpreting() or not q.is_cuda or (runtime.capability() or (0, 0)) < (9, 0):
        return False
    return q.shape[-1] in (64, 128, 256) and all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (q, k, v))


_TUNED: dict[tuple[str, int], triton.runtime.Autotuner] = {}


def _tuned(kernel, configs, head_dim: int) -> triton.runtime.Autotuner:
    """``kernel`` autotuned over ``configs(head_dim)`` (built once per kernel and head dim),
    re-tuned for every new (heads, group, lengths, causal, head dim)."""
    name = (kernel.fn.__name__, head_dim)
    if name not in _TUNED:
        key = ["HQ", "GROUP", "SQ", "SKV", "CAUSAL", "D"]
        _TUNED[name] = triton.autotune(configs=configs(head_dim), key=key)(kernel)
    return _TUNED[name]


def flash_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """``softmax(q k^T * sm_scale) v`` without materialising the scores (see the module doc).

    q ``(B, Hq, Sq, D)``, k/v ``(B, Hkv, Skv, D)`` with ``Hq % Hkv == 0``; any strides;
    ``causal`` is bottom-right aligned (query ``i`` sees key ``j`` iff ``j <= i + Skv - Sq``);
    ``sm_scale`` defaults to ``D ** -0.5``. fp16/bf16 (and fp32) on a GPU; fp32/fp16 (bf16
    computed in fp32) in the interpreter. Returns ``(B, Hq, Sq, D)`` in q's dtype.
    """
    return flash_dispatch(q, k, v, causal, sm_scale, warp_specialized=True)


def flash_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, sm_scale: float | None = None
) -> torch.Tensor:
    """``flash_attention`` on the Triton kernels only (the TMA kernel on Hopper and newer,
    the pointer kernel elsewhere), never the Gluon one: the kernel of Chapter 4's Triton pages,
    for comparison where ``flash_attention`` takes the Gluon kernel."""
    return flash_dispatch(q, k, v, causal, sm_scale, warp_specialized=False)


def flash_dispatch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float | None, warp_specialized: bool
) -> torch.Tensor:
    """The body of ``flash_attention`` (``warp_specialized=True``: the Gluon kernel where it
    applies) and of ``flash_attention_triton``: check the inputs, settle empty ones, make the
    scale positive, and launch one kernel."""
    check_qkv(q, k, v)
    check_device(q=q, k=k, v=v)
    D = q.shape[-1]
    if D > 256:
        raise ValueError(f"head dim {D} is above the 256 this kernel supports")
    out = torch.empty_like(q)
    if q.numel() == 0:
        return out
    if k.shape[2] == 0:
        return out.zero_()
    q, scale = positive_scale(q, D**-0.5 if sm_scale is None else sm_scale)
    if runtime.interpreting():  # one small tile shape; bf16 computed in fp32
        flash_launch(q, k, v, out, causal, scale, "pointers", triton.Config({"BLOCK_M": 16, "BLOCK_N": 16}))
    elif warp_specialized and runtime.is_hopper() and flash_ws is not None and flash_ws.use_warp_specialized(q, k, v):
        flash_ws.flash_attention_ws(q, k, v, out, causal, scale * LOG2E)
    else:
        flash_launch(q, k, v, out, causal, scale, "tma" if use_tma(q, k, v) else "pointers")
    return out


def flash_launch(q, k, v, out, causal: bool, scale: float, kernel: str, config: triton.Config | None = None) -> None:
    """Run the ``"tma"`` or the ``"pointers"`` kernel into ``out``: autotuned, or with exactly
    ``config`` (what ``scripts/tune_attention.py`` sweeps)."""
    B, HQ, SQ, D = q.shape
    HKV, SKV = k.shape[1], k.shape[2]
    if kernel == "tma":
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 1
        args = (*_tma_descriptors(q, k, v, out), q, HQ, HQ // HKV, SQ, SKV, scale * LOG2E, sms)
        consts = {"CAUSAL": causal, "D": D}
        jit, configs, tuned_dim = flash_fwd_tma_kernel, tma_attention_configs, D
    else:
        block_d = max(16, triton.next_power_of_2(D))
        args = (q, k, v, out, *q.stride(), *k.stride(), *v.stride(), *out.stride(), HQ, HQ // HKV, SQ, SKV, scale * LOG2E)
        upcast = runtime.interpreting() and q.dtype == torch.bfloat16  # the interpreter cannot multiply bf16
        consts = {"CAUSAL": causal, "D": D, "BLOCK_D": block_d, "UPCAST": upcast}
        jit, configs, tuned_dim = flash_fwd_kernel, attention_configs, block_d

    def grid(meta):
        return (triton.cdiv(SQ, meta["BLOCK_M"]), B * HQ)

    if config is None:
        _tuned(jit, configs, tuned_dim)[grid](*args, **consts)
        return
    if kernel == "tma":
        _set_blocks({**dict(zip(("desc_q", "desc_k", "desc_v", "desc_o"), args)), "D": D, **config.kwargs})
    options = {name: value for name, value in config.all_kwargs().items() if name not in config.kwargs}  # warps, stages, ...
    launch = {} if runtime.interpreting() else options
    jit[grid](*args, **consts, **config.kwargs, **launch)
