"""A warp-specialised FlashAttention forward for Hopper, written in Gluon.

Plain Triton decides for itself which warps load, multiply and exponentiate; Gluon, Triton's
lower-level dialect (``triton.experimental.gluon``), lets the kernel say it, with explicit
layouts, shared-memory buffers, mbarriers, TMA copies and ``wgmma`` instructions. This
kernel uses that to build the structure FlashAttention-3 (Shah et al., 2024) describes for
the H100:

* **Warp specialisation.** Three partitions of one CTA: a *producer* (one warp, 24
  registers) that only issues TMA copies of Q, K and V into shared memory, and two
  *consumer* warpgroups (240 registers each, given back by the producer through
  ``setmaxnreg``), each owning 64 query rows of a 128-row tile. They talk through
  mbarriers: ``ready`` (the copy has landed) and ``empty`` (both consumers are done with
  the buffer); K and V have ``STAGES`` buffers each.
* **Intra-warpgroup overlap.** In the unmasked key blocks a consumer issues the scores of
  block ``j`` (``S = Q K_j^T``) and the product ``P_{j-1} V_{j-1}`` as two asynchronous
  ``wgmma`` groups, waits only for the first, and computes block ``j``'s softmax while the
  tensor cores work on the second.
* **Inter-warpgroup overlap** comes from the warp scheduler: the two consumers run the same
  loop on different rows, out of step, so one's exponentials fill the other's matrix
  products. FlashAttention-3 enforces the alternation with named barriers ("ping-pong");
  ``PINGPONG`` here makes the consumers take turns issuing their ``wgmma`` batches through
  a pair of mbarriers; it is off by default (its measurements: the record
  ``assets/benchmarks/attention_ws_ablation.json`` and the engineering notes,
  ``chapters/appendix/engineering_notes_gluon_attention.ipynb``).
* **Persistence** (full attention): one CTA per SM loops over tiles, and the producer loads
  the next tile's Q and first K/V blocks while the consumers finish the current one, so a
  tile's start-up overlaps the previous tile's work. Causal attention launches one CTA per
  tile instead, longest rows first, and the hardware hands each next tile to whichever SM
  is free (the measurements behind that choice: the same record and notes).

Head dim 128, fp16/bf16, contiguous tensors, Hopper (sm_90) only: ``use_warp_specialized``
says when ``flash_attention`` takes this path.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma, warpgroup_mma, warpgroup_mma_wait

__all__ = ["use_warp_specialized", "flash_attention_ws", "compile_for_hopper"]

BLOCK_M = 128  # query rows per tile: 64 per consumer warpgroup
BLOCK_N = 128  # keys per block
STAGES = 2  # K and V buffers each: 2 x 2 x 32 KiB, plus 2 x 16 KiB for Q and for O
CONSUMER_REGS, PRODUCER_REGS, MAX_REGS = 240, 24, 168  # 240 + 240 + 24 = 3 x 168 registers per thread slot


@gluon.jit
def _tile(t, n_m, HQ, GROUP, BLOCK_M: gl.constexpr):
    """Tile ``t`` -> (query head, key/value head, first query row): heads outer, and within a
    head the query blocks from the last (the longest causal rows) to the first."""
    bh = t // n_m
    first = (n_m - 1 - t % n_m) * BLOCK_M
    bhk = (bh // HQ) * (HQ // GROUP) + (bh % HQ) // GROUP
    return bh, bhk, first


@gluon.jit
def _key_blocks(first, SQ, SKV, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """(unmasked blocks, masked blocks, delta) of the tile whose first row is ``first``: key
    blocks ``[0, n_un)`` are visible to every row; the next ``n_ma`` need the causal and/or
    end-of-keys mask; row ``i`` sees key ``j`` iff ``j <= i + delta``. The same split as the
    Triton kernel's ``key_range``."""
    if CAUSAL:
        delta = SKV - SQ
        lo = gl.minimum(gl.maximum(first + delta + 1, 0), SKV) // BLOCK_N * BLOCK_N
        hi = gl.minimum(gl.maximum(gl.minimum(first + BLOCK_M, SQ) + delta, 0), SKV)
    else:
        delta = SKV - SKV
        lo = SKV // BLOCK_N * BLOCK_N
        hi = SKV
    return lo // BLOCK_N, gl.cdiv(hi - lo, BLOCK_N), delta


@gluon.jit
def producer(descs, bufs, bars, dims, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """One warp: for each tile, both halves of Q, then every key block's K and V, each copy
    waiting for its buffer to be released and arriving on its ``ready`` barrier."""
    desc_q, desc_k, desc_v, desc_o = descs
    q_smem, k_bufs, v_bufs, o_smem = bufs
    q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
    HQ, GROUP, SQ, SKV, n_tiles = dims
    n_m = gl.cdiv(SQ, BLOCK_M)
    it = 0  # key blocks loaded so far, over all tiles: buffer it % STAGES, phase (it // STAGES) & 1
    tile_phase = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        bh, bhk, first = _tile(t, n_m, HQ, GROUP, BLOCK_M)
        n_un, n_ma, delta = _key_blocks(first, SQ, SKV, BLOCK_M, BLOCK_N, CAUSAL)
        for h in gl.static_range(2):
            mbarrier.wait(q_empty.index(h), tile_phase ^ 1)  # a fresh barrier passes phase 1 at once
            mbarrier.expect(q_ready.index(h), desc_q.block_type.nbytes)
            tma.async_copy_global_to_shared(desc_q, [bh, first + h * (BLOCK_M // 2), 0], q_ready.index(h), q_smem.index(h))
        for j in range(n_un + n_ma):
            s = it % STAGES
            phase = (it // STAGES) & 1
            mbarrier.wait(k_empty.index(s), phase ^ 1)
            mbarrier.expect(k_ready.index(s), desc_k.block_type.nbytes)
            tma.async_copy_global_to_shared(desc_k, [bhk, j * BLOCK_N, 0], k_ready.index(s), k_bufs.index(s))
            mbarrier.wait(v_empty.index(s), phase ^ 1)
            mbarrier.expect(v_ready.index(s), desc_v.block_type.nbytes)
            tma.async_copy_global_to_shared(desc_v, [bhk, j * BLOCK_N, 0], v_ready.index(s), v_bufs.index(s))
            it += 1
        tile_phase ^= 1


@gluon.jit
def probs(s, m_i, l_i, qk_scale, MASKED: gl.constexpr):
    """Online-softmax step in base 2 (the Triton kernel's ``block_probs``): probabilities,
    the rescale factor of what was accumulated, the new running sum and maximum."""
    m_new = gl.maximum(m_i, gl.max(s, axis=1) * qk_scale)
    if MASKED:  # rows that have seen only masked keys keep m = -inf and p = 0
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_use, 1))
    alpha = gl.exp2(m_i - m_use)
    return p, alpha, l_i * alpha + gl.sum(p, axis=1), m_new


@gluon.jit
def take_turn(turn, HALF: gl.constexpr, k, PINGPONG: gl.constexpr):
    """Ping-pong: the k-th batch of ``wgmma`` issues of consumer ``HALF`` waits until the other
    consumer has issued its previous batch (consumer 0 goes first: a fresh barrier passes phase 1)."""
    if PINGPONG:
        mbarrier.wait(turn.index(HALF), (k & 1) ^ (1 - HALF))
    return k + 1


@gluon.jit
def pass_turn(turn, HALF: gl.constexpr, PINGPONG: gl.constexpr):
    """Ping-pong: after issuing a batch, consumer ``HALF`` hands the turn to the other one."""
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - HALF))


@gluon.jit
def _scores(q, k_bufs, k_ready, k_empty, no_acc, turn, it, turns, HALF: gl.constexpr, STAGES: gl.constexpr,
            PINGPONG: gl.constexpr):  # fmt: skip
    """``S = Q K^T`` of key block ``it`` alone: wait for K, issue, wait, release the K buffer."""
    s_i = it % STAGES
    mbarrier.wait(k_ready.index(s_i), (it // STAGES) & 1)
    kt = k_bufs.index(s_i).reshape([k_bufs.shape[2], k_bufs.shape[3]]).permute((1, 0))
    turns = take_turn(turn, HALF, turns, PINGPONG)
    s_tok = warpgroup_mma(q, kt, no_acc, use_acc=False, is_async=True)
    pass_turn(turn, HALF, PINGPONG)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(s_i))
    return s, turns


@gluon.jit
def _add_pv(p16, acc, v_bufs, v_ready, v_empty, turn, it, turns, HALF: gl.constexpr, STAGES: gl.constexpr,
            PINGPONG: gl.constexpr):  # fmt: skip
    """``acc += P V`` of key block ``it`` alone: wait for V, issue, wait, release the V buffer."""
    s_i = it % STAGES
    mbarrier.wait(v_ready.index(s_i), (it // STAGES) & 1)
    vb = v_bufs.index(s_i).reshape([v_bufs.shape[2], v_bufs.shape[3]])
    turns = take_turn(turn, HALF, turns, PINGPONG)
    o_tok = warpgroup_mma(p16, vb, acc, is_async=True)
    pass_turn(turn, HALF, PINGPONG)
    acc = warpgroup_mma_wait(0, deps=[o_tok, p16])[0]
    mbarrier.arrive(v_empty.index(s_i))
    return acc, turns


@gluon.jit
def consumer(descs, bufs, bars, dims, qk_scale, HALF: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr, OVERLAP: gl.constexpr,
              PINGPONG: gl.constexpr):  # fmt: skip
    """One warpgroup: rows ``[first + 64 HALF, first + 64 HALF + 64)`` of every tile. Releases
    each K and V buffer as soon as its ``wgmma`` has read it, and its Q buffer after the
    tile's last score product, so the producer can already fetch the next tile's Q."""
    desc_o = descs[3]
    q_smem, k_bufs, v_bufs, o_smem = bufs
    q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn = bars
    HQ, GROUP, SQ, SKV, n_tiles = dims
    HM: gl.constexpr = BLOCK_M // 2
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)  # P from registers
    o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)
    dtype: gl.constexpr = desc_o.dtype
    n_m = gl.cdiv(SQ, BLOCK_M)
    q = q_smem.index(HALF).reshape([HM, D])
    o_buf = o_smem.index(HALF)
    no_acc = gl.zeros([HM, BLOCK_N], gl.float32, s_layout)  # placeholder for use_acc=False
    cols = gl.arange(0, BLOCK_N, gl.SliceLayout(0, s_layout))
    it = 0
    turns = 0  # batches of wgmma issued (ping-pong)
    tile_phase = 0
    for t in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        bh, bhk, first = _tile(t, n_m, HQ, GROUP, BLOCK_M)
        n_un, n_ma, delta = _key_blocks(first, SQ, SKV, BLOCK_M, BLOCK_N, CAUSAL)
        last = n_un + n_ma - 1  # the block whose score product is the tile's last use of Q
        m_i = gl.full([HM], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([HM], gl.float32, gl.SliceLayout(1, s_layout))
        acc = gl.zeros([HM, D], gl.float32, o_layout)
        mbarrier.wait(q_ready.index(HALF), tile_phase)
        j0 = n_un * 0  # first block of the plain loop below
        if OVERLAP:
            if n_un > 0:
                # block 0: scores and probabilities only; its P V is issued with block 1's scores
                s, turns = _scores(q, k_bufs, k_ready, k_empty, no_acc, turn, it, turns, HALF, STAGES, PINGPONG)
                mbarrier.arrive(q_empty.index(HALF), pred=last == 0)
                p, alpha, l_i, m_i = probs(s, m_i, l_i, qk_scale, False)
                p16 = gl.convert_layout(p.to(dtype), p_layout)
                for j in range(1, n_un):
                    prev = it % STAGES
                    it += 1
                    s_i = it % STAGES
                    mbarrier.wait(k_ready.index(s_i), (it // STAGES) & 1)
                    kt = k_bufs.index(s_i).reshape([BLOCK_N, D]).permute((1, 0))
                    mbarrier.wait(v_ready.index(prev), ((it - 1) // STAGES) & 1)
                    vb = v_bufs.index(prev).reshape([BLOCK_N, D])
                    turns = take_turn(turn, HALF, turns, PINGPONG)
                    s_tok = warpgroup_mma(q, kt, no_acc, use_acc=False, is_async=True)  # S_j = Q K_j^T ...
                    o_tok = warpgroup_mma(p16, vb, acc, is_async=True)  # ... then O += P_{j-1} V_{j-1}
                    pass_turn(turn, HALF, PINGPONG)
                    s = warpgroup_mma_wait(1, deps=[s_tok])  # S_j is done; P V may still run
                    mbarrier.arrive(k_empty.index(s_i))
                    mbarrier.arrive(q_empty.index(HALF), pred=j == last)
                    p, alpha, l_i, m_i = probs(s, m_i, l_i, qk_scale, False)  # overlaps P V on the tensor cores
                    acc = warpgroup_mma_wait(0, deps=[o_tok, p16])[0]
                    mbarrier.arrive(v_empty.index(prev))
                    acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
                    p16 = gl.convert_layout(p.to(dtype), p_layout)
                acc, turns = _add_pv(p16, acc, v_bufs, v_ready, v_empty, turn, it, turns, HALF, STAGES, PINGPONG)
                it += 1
                j0 = n_un
        rows = first + HALF * HM + gl.arange(0, HM, gl.SliceLayout(1, s_layout))
        for j in range(j0, last + 1):  # the masked blocks (every block without OVERLAP), one step at a time
            s, turns = _scores(q, k_bufs, k_ready, k_empty, no_acc, turn, it, turns, HALF, STAGES, PINGPONG)
            mbarrier.arrive(q_empty.index(HALF), pred=j == last)
            keys = j * BLOCK_N + cols
            visible = gl.expand_dims(keys < SKV, 0)
            if CAUSAL:
                visible = visible & (gl.expand_dims(keys, 0) <= gl.expand_dims(rows + delta, 1))
            else:
                visible = visible & gl.expand_dims(rows >= 0, 1)  # (broadcast to the tile)
            p, alpha, l_i, m_i = probs(gl.where(visible, s, float("-inf")), m_i, l_i, qk_scale, True)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, o_rows), 1)
            p16 = gl.convert_layout(p.to(dtype), p_layout)
            acc, turns = _add_pv(p16, acc, v_bufs, v_ready, v_empty, turn, it, turns, HALF, STAGES, PINGPONG)
            it += 1
        mbarrier.arrive(q_empty.index(HALF), pred=last < 0)  # a tile that sees no key still hands Q back
        out = acc / gl.expand_dims(gl.convert_layout(gl.where(l_i == 0.0, 1.0, l_i), o_rows), 1)  # no key: zeros
        tma.store_wait(0)  # the previous tile's output has left o_buf
        o_buf.reshape([HM, D]).store(out.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(desc_o, [bh, first + HALF * HM, 0], o_buf)  # rows past SQ are clipped
        tile_phase ^= 1
    tma.store_wait(0)


@gluon.jit
def _flash_fwd_ws_kernel(desc_q, desc_k, desc_v, desc_o, HQ, GROUP, SQ, SKV, qk_scale, n_tiles,
                         CAUSAL: gl.constexpr, D: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, OVERLAP: gl.constexpr, PINGPONG: gl.constexpr, PRODUCER_REGS: gl.constexpr,
                         CONSUMER_REGS: gl.constexpr):  # fmt: skip
    """Allocate the buffers and barriers, then fork: consumer 0 (the default partition, the
    kernel's 4 warps), consumer 1 (4 more warps) and the producer (1 warp)."""
    dtype: gl.constexpr = desc_q.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2] + desc_q.block_type.shape, desc_q.layout)
    o_smem = gl.allocate_shared_memory(dtype, [2] + desc_o.block_type.shape, desc_o.layout)
    k_bufs = gl.allocate_shared_memory(dtype, [STAGES] + desc_k.block_type.shape, desc_k.layout)
    v_bufs = gl.allocate_shared_memory(dtype, [STAGES] + desc_v.block_type.shape, desc_v.layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for h in gl.static_range(2):
        mbarrier.init(q_ready.index(h), count=1)
        mbarrier.init(q_empty.index(h), count=1)
        mbarrier.init(turn.index(h), count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=2)  # both consumers read every K and V block
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(v_empty.index(s), count=2)
    descs = (desc_q, desc_k, desc_v, desc_o)
    bufs = (q_smem, k_bufs, v_bufs, o_smem)
    bars = (q_ready, q_empty, k_ready, k_empty, v_ready, v_empty, turn)
    dims = (HQ, GROUP, SQ, SKV, n_tiles)
    gl.warp_specialize(
        [
            (consumer, (descs, bufs, bars, dims, qk_scale, 0, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG)),
            (consumer, (descs, bufs, bars, dims, qk_scale, 1, D, BLOCK_M, BLOCK_N, STAGES, CAUSAL, OVERLAP, PINGPONG)),
            (producer, (descs, bufs, bars, dims, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
        ],
        [4, 1],  # warps of consumer 1 and of the producer
        [CONSUMER_REGS, PRODUCER_REGS],
    )


def use_warp_specialized(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """This kernel applies on a Hopper GPU (compute capability 9.x: ``wgmma`` and
    ``setmaxnreg``), with Triton 3.6 or newer (its Gluon API), for contiguous 16-byte-aligned
    fp16/bf16 tensors with head dim 128. (No import from the package here: ``compile_for_hopper``
    compiles this file on its own.)"""
    if not q.is_cuda or torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    if tuple(int(x) for x in triton.__version__.split(".")[:2]) < (3, 6):
        return False
    return (
        q.shape[-1] == 128
        and q.dtype in (torch.float16, torch.bfloat16)
        and all(t.is_contiguous() and t.data_ptr() % 16 == 0 for t in (q, k, v))
    )


def _descriptors(q, k, v, out) -> list:
    """TMA descriptors over ``(B*H, S, D)`` views: 64-row tiles of Q and O (one per consumer),
    ``BLOCK_N``-row tiles of K and V; reads past S are zero-filled, writes clipped."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    element = gl.bfloat16 if q.dtype == torch.bfloat16 else gl.float16
    descs = []
    for t, rows in ((q, BLOCK_M // 2), (k, BLOCK_N), (v, BLOCK_N), (out, BLOCK_M // 2)):
        block = [1, rows, t.shape[3]]
        flat = t.view(t.shape[0] * t.shape[1], t.shape[2], t.shape[3])
        descs.append(TensorDescriptor.from_tensor(flat, block, gl.NVMMASharedLayout.get_default_for(block, element)))
    return descs


def flash_attention_ws(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    causal: bool,
    qk_scale: float,
    persistent: bool | None = None,
    overlap: bool = True,
    pingpong: bool = False,
) -> torch.Tensor:
    """Run the kernel into ``out`` for already-checked inputs (``flash_attention`` does the
    checks), with ``qk_scale = sm_scale * log2 e > 0``. ``persistent`` defaults to full
    attention only; ``overlap=False`` turns off the intra-warpgroup overlap and ``pingpong=True``
    makes the consumers take turns issuing their ``wgmma`` batches (both for A/B runs)."""
    if not use_warp_specialized(q, k, v):
        raise RuntimeError(
            "the warp-specialised kernel needs a Hopper GPU (sm_90), Triton >= 3.6 and contiguous fp16/bf16 "
            f"CUDA tensors with head dim 128; got {q.dtype} {tuple(q.shape)} on {q.device} "
            "(llmnote.kernels.flash_attention picks a kernel that runs here)"
        )
    B, HQ, SQ, D = q.shape
    HKV, SKV = k.shape[1], k.shape[2]
    n_tiles = triton.cdiv(SQ, BLOCK_M) * B * HQ
    if persistent is None:
        persistent = not causal
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid = (min(n_tiles, sms) if persistent else n_tiles,)
    _flash_fwd_ws_kernel[grid](
        *_descriptors(q, k, v, out), HQ, HQ // HKV, SQ, SKV, qk_scale, n_tiles,
        causal, D, BLOCK_M, BLOCK_N, STAGES, overlap, pingpong, PRODUCER_REGS, CONSUMER_REGS, num_warps=4, maxnreg=MAX_REGS,
    )  # fmt: skip
    return out


def compile_for_hopper(causal: bool, overlap: bool = True, dtype: str = "bf16", pingpong: bool = False):
    """Compile the kernel for sm_90a without a GPU (head dim 128), with the options
    ``flash_attention_ws`` launches it with; returns ``llmnote.compile_stages.CompiledStages``
    (TTGIR, PTX, SASS, resources), which the tests and the book's page on this kernel read."""
    import inspect
    import sys

    from ...compile_stages import compile_stages

    element = {"bf16": gl.bfloat16, "fp16": gl.float16}[dtype]

    def desc(rows: int) -> str:
        return f"tensordesc<{dtype}[1,{rows},128],{gl.NVMMASharedLayout.get_default_for([1, rows, 128], element)!r}>"

    signature = {"desc_q": desc(BLOCK_M // 2), "desc_k": desc(BLOCK_N), "desc_v": desc(BLOCK_N), "desc_o": desc(BLOCK_M // 2)}
    signature |= {"HQ": "i32", "GROUP": "i32", "SQ": "i32", "SKV": "i32", "qk_scale": "fp32", "n_tiles": "i32"}
    constexprs = {"CAUSAL": causal, "D": 128, "BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N, "STAGES": STAGES, "OVERLAP": overlap,
                  "PINGPONG": pingpong, "PRODUCER_REGS": PRODUCER_REGS, "CONSUMER_REGS": CONSUMER_REGS}  # fmt: skip
    signature |= {name: "constexpr" for name in constexprs}
    source = inspect.getsource(sys.modules[__name__])
    return compile_stages(source, signature, constexprs, name="_flash_fwd_ws_kernel", aligned=[], num_warps=4, maxnreg=MAX_REGS)
