"""Two experiments on the TMA FlashAttention kernel, both aimed at what a tile costs beyond its
key blocks (loading Q, then the first K/V blocks, before any math; draining the output at the end):

* ``prefetch``: the kernel's ``PREFETCH`` option (ask L2 for the query tile of the program one
  wave later), on and off, same tiles otherwise;
* ``persistent``: a persistent kernel that runs ALL of a program's tiles as one flat,
  software-pipelined loop over key blocks, so the next tile's K/V arrive while the current
  tile finishes. It lives here, not in the package.

What came of both: the record ``assets/benchmarks/attention_experiments.json`` and the
engineering notes (``chapters/appendix/engineering_notes_gluon_attention.ipynb``), which also
read ptxas's notes on the persistent kernel.

Providers take turns over ``ROUNDS`` rounds, each timed as CUDA-graph replays; cuDNN runs
alongside. Writes a benchmark record (kernel ``flash_attention-experiments``):

    python scripts/attention_experiments.py assets/benchmarks/attention_experiments.json
"""

from __future__ import annotations

import statistics
import sys

import torch
import triton
import triton.language as tl
from tqdm.auto import tqdm

import llmnote  # noqa: F401  (device setup)
from llmnote.bench.attention import SDPA_BACKENDS, attention_pairs, sdpa_with
from llmnote.bench.timing import cuda_time_ms
from llmnote.kernels.attention import flash as A
from llmnote.kernels.attention import key_range, online_step, prefetch_l2
from llmnote.records import Record

ROUNDS = 5


@triton.jit
def _tile_steps(first, SQ, SKV, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """Key blocks a tile visits (at least one, so that rows that see no key still get their zeros)
    and ``lo``, where its masked blocks begin."""
    lo, hi, delta = key_range(first, SQ, SKV, BLOCK_M, BLOCK_N, CAUSAL)
    return tl.maximum(tl.cdiv(hi, BLOCK_N), 1), lo, delta


@triton.jit
def _flash_fwd_persistent_kernel(
    desc_q,
    desc_k,
    desc_v,
    desc_o,
    Q,
    OUT,
    HQ,
    GROUP,
    SQ,
    SKV,
    qk_scale,
    BH,
    CAUSAL: tl.constexpr,
    D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PER_SM: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    """The TMA kernel made persistent: a fixed grid of programs, each working through its
    list of tiles in ONE flat loop over all of its key blocks, so the software pipeline that
    prefetches K and V runs across tile boundaries: the next tile's first key blocks arrive
    while the current tile finishes, and no program pays a fresh launch, a Q-then-K/V start
    and an output drain per tile. At a tile's first step Q is loaded and the running maximum
    and sum restart (alpha = 0 then clears the accumulator); blocks from ``lo`` on are
    masked; the last step normalises and stores the output, with plain stores (a TMA
    store's staging buffer would not fit beside Q and three 128 x 128 K/V stages).

    Tiles are numbered head by head, the longest query block (the last one, under a causal
    mask) first. Programs take them in rounds of ``PROGS``, alternating direction every
    round (a snake), so a program that gets a long tile in one round gets a short one in the
    next. The move to the next tile is branch-free scalar arithmetic: the software pipeline
    computes it steps ahead, for the loads. ``PER_SM`` (programs per SM) only sizes the grid."""
    prog = tl.program_id(0)
    PROGS = tl.num_programs(0)
    n_m = tl.cdiv(SQ, BLOCK_M)
    n_tiles = n_m * BH
    total = 0
    for kk in range(0, tl.cdiv(n_tiles, PROGS)):
        i = kk * PROGS + tl.where(kk % 2 == 0, prog, PROGS - 1 - prog)
        if i < n_tiles:
            steps, lo, delta = _tile_steps((n_m - 1 - i % n_m) * BLOCK_M, SQ, SKV, BLOCK_M, BLOCK_N, CAUSAL)
            total += steps
    # tile i is (head i // n_m, query block n_m - 1 - i % n_m); from round k to k + 1 the
    # index grows by 2 * (PROGS - prog) - 1 (k even) or 2 * prog + 1 (k odd)
    bh = prog // n_m
    r = prog % n_m
    hop_even = 2 * (PROGS - prog) - 1
    hop_odd = 2 * prog + 1
    k = 0
    j = 0
    cols = tl.arange(0, BLOCK_N)
    q = tl.zeros([BLOCK_M, D], dtype=desc_q.dtype)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, D], dtype=tl.float32)
    for _ in tl.range(0, total):
        first = (n_m - 1 - r) * BLOCK_M
        steps, lo, delta = _tile_steps(first, SQ, SKV, BLOCK_M, BLOCK_N, CAUSAL)
        bhk = (bh // HQ) * (HQ // GROUP) + (bh % HQ) // GROUP
        start = j * BLOCK_N
        kb = desc_k.load([bhk, start, 0]).reshape(BLOCK_N, D)
        vb = desc_v.load([bhk, start, 0]).reshape(BLOCK_N, D)
        hop = tl.where(k % 2 == 0, hop_even, hop_odd)
        r_next = r + hop % n_m
        wrap = r_next >= n_m
        bh_next = bh + hop // n_m + wrap.to(tl.int32)
        r_next = tl.where(wrap, r_next - n_m, r_next)
        if j == 0:
            q = desc_q.load([bh, first, 0]).reshape(BLOCK_M, D)
            if PREFETCH:  # the next tile's Q into L2 now, so that its load will hit L2
                prefetch_l2(Q, bh_next, (n_m - 1 - r_next) * BLOCK_M, SQ, BLOCK_M, D)
        m_i = tl.where(j == 0, float("-inf"), m_i)  # a new tile: alpha = 0 clears acc
        l_i = tl.where(j == 0, 0.0, l_i)
        s = tl.dot(q, tl.trans(kb))
        if start >= lo:
            keys = start + cols
            visible = keys[None, :] < SKV
            if CAUSAL:
                visible = visible & (keys[None, :] <= first + tl.arange(0, BLOCK_M)[:, None] + delta)
            s = tl.where(visible, s, float("-inf"))
        acc, l_i, m_i = online_step(acc, l_i, m_i, s, vb, qk_scale, True)
        if j == steps - 1:
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            o_rows = first + tl.arange(0, BLOCK_M)
            o_ptrs = OUT + (bh * SQ + o_rows).to(tl.int64)[:, None] * D + tl.arange(0, D)[None, :]
            tl.store(o_ptrs, out.to(OUT.dtype.element_ty), mask=o_rows[:, None] < SQ)
        j += 1
        done = j == steps
        bh = tl.where(done, bh_next, bh)
        r = tl.where(done, r_next, r)
        k += done.to(tl.int32)
        j = tl.where(done, 0, j)


def persistent(q, k, v, causal: bool, bm: int, bn: int, warps: int, stages: int, per_sm: int, prefetch: bool, sms: int = 0):
    """Launch the persistent kernel: ``per_sm`` programs on each of ``sms`` SMs (default: the
    GPU's count), each with its snake of tiles. On a CPU (the interpreter) only the tiles and
    programs matter."""
    out = torch.empty_like(q)
    B, HQ, SQ, D = q.shape
    descs = A._tma_descriptors(q, k, v, out)
    A._set_blocks({**dict(zip(("desc_q", "desc_k", "desc_v", "desc_o"), descs)), "D": D, "BLOCK_M": bm, "BLOCK_N": bn})
    sms = sms or torch.cuda.get_device_properties(q.device).multi_processor_count
    options = {"num_warps": warps, "num_stages": stages} if q.is_cuda else {}
    _flash_fwd_persistent_kernel[(min(triton.cdiv(SQ, bm) * B * HQ, sms * per_sm),)](
        *descs, q, out, HQ, HQ // k.shape[1], SQ, k.shape[2], D**-0.5 * A.LOG2E, B * HQ,
        CAUSAL=causal, D=D, BLOCK_M=bm, BLOCK_N=bn, PER_SM=per_sm, PREFETCH=prefetch, **options,
    )  # fmt: skip
    return out


def tma(q, k, v, causal: bool, prefetch: bool):
    """The package's TMA kernel with the tiles its autotuner tries first at d = 128 (128 x 128, 8 warps, 3 stages)."""
    out = torch.empty_like(q)
    meta = {"BLOCK_M": 128, "BLOCK_N": 128, "WARP_SPECIALIZE": False, "ROTATE": False, "PREFETCH": prefetch}
    A.flash_launch(q, k, v, out, causal, q.shape[-1] ** -0.5, "tma", triton.Config(meta, num_warps=8, num_stages=3))
    return out


def providers(causal: bool) -> dict:
    return {
        "sdpa-cudnn": sdpa_with(SDPA_BACKENDS["sdpa-cudnn"], causal),
        "tma": lambda q, k, v: tma(q, k, v, causal, False),
        "tma, prefetch": lambda q, k, v: tma(q, k, v, causal, True),
        "persistent 128x128": lambda q, k, v: persistent(q, k, v, causal, 128, 128, 8, 3, 1, True),
        "persistent 64x64, 2 per SM": lambda q, k, v: persistent(q, k, v, causal, 64, 64, 4, 3, 2, True),
    }


def check() -> None:
    """Odd shapes (partial tiles, Sq != Skv, GQA): every provider but cuDNN against float32 SDPA."""
    torch.manual_seed(0)
    for b, hq, hkv, sq, skv, causal in ((2, 8, 2, 1000, 1000, True), (1, 4, 1, 777, 300, True), (1, 2, 2, 129, 4000, False)):
        q = torch.randn(b, hq, sq, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(b, hkv, skv, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        mask = torch.ones(sq, skv, device="cuda", dtype=torch.bool).tril(skv - sq) if causal else None
        f32 = (t.float() for t in (q, k, v))
        expected = torch.nan_to_num(torch.nn.functional.scaled_dot_product_attention(*f32, attn_mask=mask, enable_gqa=True))
        for name, fn in providers(causal).items():
            if name != "sdpa-cudnn":
                err = (fn(q, k, v).float() - expected).abs().max().item()
                assert err < 3e-2, (name, b, hq, hkv, sq, skv, causal, err)


def main(path: str) -> None:
    check()
    rec = Record(command=f"python scripts/attention_experiments.py {path}")
    for s, causal in tqdm([(4096, True), (4096, False), (2048, True), (8192, True)], desc="cases"):
        case = f"B=4,H=32,S={s},D=128,causal={causal}"
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(4, 32, s, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        fns = providers(causal)
        expected = fns["sdpa-cudnn"](q, k, v).float()
        for name, fn in fns.items():
            err = ((fn(q, k, v).float() - expected).norm() / expected.norm()).item()
            assert err < 2e-2, (name, case, err)
        times = {name: [] for name in fns}
        for _ in range(ROUNDS):
            for name, fn in fns.items():
                times[name].append(cuda_time_ms(fn, [(q, k, v)], warmup=3, rep=10 if s >= 8192 else 30, graph_calls=2))
        flops = 4 * 4 * 32 * attention_pairs(s, s, causal) * 128
        for name, ms in times.items():
            rec.add("flash_attention-experiments", case, "bf16", name, statistics.median(ms), flops)
    rec.save(path)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "attention_experiments.json")
