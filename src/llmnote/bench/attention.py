"""Attention benchmarks: our FlashAttention forward against the backends of
``torch.nn.functional.scaled_dot_product_attention`` (FlashAttention-2 ``sdpa-flash``,
cuDNN ``sdpa-cudnn``, memory-efficient ``sdpa-efficient``), and our paged decode kernel
against SDPA on a contiguous cache, and our variable-length (packed) prefill kernel against
the same prompts padded to the longest (our dense kernel, SDPA). Every case is checked
against a float32 reference before it is timed. Where ``flash_attention`` takes the
warp-specialised Gluon kernel (head dim 128 on a Hopper GPU), the row ``llmnote-triton``
times ``flash_attention_triton`` too: the Triton kernel the chapter builds, on the same
inputs.

FLOPs count the (query, key) pairs actually computed: ``4 x B x Hq x pairs x D`` with
``pairs = Sq x Skv`` (about half of that when causal). Decode bytes are the keys and values
read (the query and output are negligible). A packed case counts each prompt's own causal
pairs for every provider, so a padded provider's rate is the useful work it does per second;
its inputs are padded before timing (the copies into and out of the padded layout are not
counted).

Each FlashAttention provider is timed two ways, call by call (CUDA events around each call,
calls queued without waiting) and as CUDA-graph replays (10 calls per graph up to S = 2048,
2 above), and its row is the faster of the two medians; decode cases are graph replays.
Graph replays leave out host-side launch work (the autotuner's dispatch and TMA descriptors
for ours, SDPA's backend selection); call-by-call timing runs each provider as it is launched
outside a graph. Neither way is neutral for every provider, so neither is charged to anyone:
``assets/benchmarks/attention_timing.json`` (``scripts/attention_timing.py``) times the
Triton kernel and cuDNN both ways. The naive provider above S = 2048 is timed call by call
only: a graph would hold its S x S intermediates for every captured call.

The providers of a FlashAttention case take turns: ``ROUNDS`` rounds, each timing every
provider once each way, and a row is the faster of its two medians over the rounds, so that
a clock that drifts over a sustained run (on a GPU whose clocks are not locked) does not
favour whichever provider runs first. The appendix's engineering notes on the Triton
attention kernel show, from the records, how much the timing method and the run change the
numbers.
"""

from __future__ import annotations

import itertools
import statistics
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from .. import kernels, ref
from ..records import Record
from .timing import cuda_time_ms

__all__ = ["run_attention", "attention_pairs", "paged_case", "varlen_case", "naive_attention", "sdpa_with", "SDPA_BACKENDS"]

SDPA_BACKENDS = {
    "sdpa-flash": SDPBackend.FLASH_ATTENTION,
    "sdpa-cudnn": SDPBackend.CUDNN_ATTENTION,
    "sdpa-efficient": SDPBackend.EFFICIENT_ATTENTION,
}


ROUNDS = 5  # timing rounds per FlashAttention case (see the module doc)
VARLEN_LENGTHS = (1500, 137, 4000, 610, 2048, 73, 911, 3000)  # the prompts of one packed prefill batch


def attention_pairs(sq: int, skv: int, causal: bool) -> int:
    """(query, key) pairs a causal (bottom-right aligned) or full attention computes."""
    if not causal:
        return sq * skv
    return sum(max(0, min(skv, i + skv - sq + 1)) for i in range(sq))


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """Attention as three eager PyTorch operations in the input dtype: the (B, H, Sq, Skv)
    scores and probabilities are written to and read back from memory in full."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        sq, skv = q.shape[-2], k.shape[-2]
        scores = scores.masked_fill(torch.ones(sq, skv, dtype=torch.bool, device=q.device).triu(skv - sq + 1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _time(fn, args: tuple, rep: int, graph_calls: int, warmup: int = 5) -> float:
    """``cuda_time_ms`` with a CUDA graph when asked; a provider that cannot be captured
    is timed call by call instead (and said so)."""
    try:
        return cuda_time_ms(fn, [args], warmup=warmup, rep=rep, graph_calls=graph_calls)
    except RuntimeError as err:
        if not graph_calls:
            raise
        print(f"CUDA-graph capture failed ({str(err)[:120]}); timing call by call")
        torch.cuda.synchronize()
        return cuda_time_ms(fn, [args], warmup=warmup, rep=rep)


def _check(name: str, out: torch.Tensor, expected: torch.Tensor, tol: float = 2e-2) -> None:
    err = ((out.float() - expected).norm() / expected.norm()).item()
    if not err < tol:
        raise AssertionError(f"{name}: relative error {err:.2e} above {tol}")


def paged_case(batch: int, hq: int, hkv: int, d: int, seq_len: int, block_size: int, dtype=torch.bfloat16, seed: int = 0):
    """A paged cache holding ``batch`` sequences of ``seq_len`` tokens in shuffled blocks,
    the matching contiguous (B, Hkv, S, D) keys/values, and a query."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    per_seq = -(-seq_len // block_size)
    blocks = batch * per_seq
    k = torch.randn(batch, hkv, seq_len, d, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(batch, hkv, seq_len, d, device="cuda", dtype=dtype, generator=g)
    q = torch.randn(batch, hq, d, device="cuda", dtype=dtype, generator=g)
    tables = torch.randperm(blocks, device="cuda", generator=g).view(batch, per_seq).to(torch.int32)
    k_cache = torch.zeros(blocks, block_size, hkv, d, device="cuda", dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    pad = per_seq * block_size - seq_len
    for cache, dense in ((k_cache, k), (v_cache, v)):
        paged = F.pad(dense, (0, 0, 0, pad)).view(batch, hkv, per_seq, block_size, d).permute(0, 2, 3, 1, 4)
        cache[tables.long()] = paged
    lens = torch.full((batch,), seq_len, device="cuda", dtype=torch.int32)
    return q, k_cache, v_cache, tables, lens, k, v


def _flash_cases():
    """(B, Hq, Hkv, S, D, causal) of the chapter's sweep: B=4, H=32, S=512..16384, D=64 and
    128, full and causal."""
    for d in (64, 128):
        for causal in (False, True):
            for s in (512, 1024, 2048, 4096, 8192, 16384):
                yield 4, 32, 32, s, d, causal


def sdpa_with(backend: SDPBackend, causal: bool):
    """``scaled_dot_product_attention(q, k, v)`` restricted to one backend (the restriction
    applies inside each call, so the function can be timed or captured in a CUDA graph)."""

    def run(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return run


def _flash_case(rec: Record, b: int, hq: int, hkv: int, s: int, d: int, causal: bool) -> None:
    g = torch.Generator(device="cuda").manual_seed(s + d)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, hkv, hkv))
    ours = partial(kernels.flash_attention, causal=causal)
    if s <= 4096:  # the float32 reference materialises B x H x S x S scores
        _check(f"flash {s} {d} {causal}", ours(q, k, v), ref.flash_attention(q, k, v, causal).float())
    case = f"B={b},H={hq},S={s},D={d},causal={causal}"
    expected = ours(q, k, v).float()
    providers = {"llmnote": ours}
    if kernels.attention.flash_ws is not None and kernels.attention.flash_ws.use_warp_specialized(q, k, v):
        providers["llmnote-triton"] = partial(kernels.attention.flash_attention_triton, causal=causal)
    if s <= 8192:  # at 16384 the scores and probabilities (two S x S bf16 tensors) would fill the whole GPU
        providers["naive"] = partial(naive_attention, causal=causal)
    for name, backend in SDPA_BACKENDS.items():
        providers[name] = sdpa_with(backend, causal)
    for name, fn in list(providers.items()):
        try:
            out = fn(q, k, v)
        except RuntimeError:  # this backend does not take the case
            del providers[name]
            continue
        _check(f"{name} {case}", out, expected)
    del out, expected
    rep = 10 if s >= 8192 else 30
    graph = 10 if s <= 2048 else 2
    ways = {name: [0] if name == "naive" and s > 2048 else [0, graph] for name in providers}  # graph calls; 0: call by call
    times = {(name, calls): [] for name in providers for calls in ways[name]}
    for _ in range(ROUNDS):  # the providers take turns: each round times every one of them, each way
        for (name, calls), ms in times.items():
            ms.append(_time(providers[name], (q, k, v), rep, calls, warmup=2 if name == "naive" else 5))
    flops = 4 * b * hq * attention_pairs(s, s, causal) * d
    nbytes = 2 * (2 * q.numel() + k.numel() + v.numel())  # read q, k, v; write o
    for name in providers:
        extra = 2 * 2 * b * hq * s * s * 2 if name == "naive" else 0  # scores and probabilities, written and read
        best = min(statistics.median(times[name, calls]) for calls in ways[name])
        rec.add("flash_attention", case, "bf16", name, best, flops, nbytes + extra)


def _decode_case(rec: Record, b: int, hq: int, hkv: int, d: int, n: int, bs: int) -> None:
    q, kc, vc, tables, lens, k, v = paged_case(b, hq, hkv, d, n, bs)
    expected = ref.flash_attention(q[:, :, None], k, v)[:, :, 0].float()
    kv_bytes = 2 * k.numel() * k.element_size()
    flops = 4 * b * hq * n * d
    case = f"B={b},Hq={hq},Hkv={hkv},D={d},T={n},block={bs}"
    auto = kernels.attention.decode_splits(b, hkv, n, torch.cuda.get_device_properties(0).multi_processor_count)
    for provider, splits in (("llmnote", auto), ("llmnote-nosplit", 1)):
        if provider == "llmnote-nosplit" and auto == 1:
            continue
        ours = partial(kernels.paged_attention_decode, num_splits=splits, max_seq_len=n)
        args = (q, kc, vc, tables, lens)
        _check(f"paged {case} splits={splits}", ours(*args), expected)
        rec.add(
            "paged_attention_decode", case, "bf16", provider, cuda_time_ms(ours, [args], 5, 50, graph_calls=10), flops, kv_bytes
        )
    sdpa = partial(F.scaled_dot_product_attention, enable_gqa=True)
    args = (q[:, :, None], k, v)
    with sdpa_kernel(list(SDPA_BACKENDS.values())):
        try:
            _check(f"sdpa {case}", sdpa(*args)[:, :, 0], expected)
        except RuntimeError as err:  # no fused backend for this case
            print(f"sdpa-contiguous skipped for {case}: {err}")
            return
        ms = cuda_time_ms(sdpa, [args], warmup=5, rep=50, graph_calls=10)
    rec.add("paged_attention_decode", case, "bf16", "sdpa-contiguous", ms, flops, kv_bytes)


def varlen_case(lengths, hq: int, hkv: int, d: int, dtype=torch.bfloat16, device="cuda", seed: int = 0):
    """Prompts of ``lengths`` tokens as a serving engine packs them, q ``(total, Hq, D)``, k and
    v ``(total, Hkv, D)`` with int32 ``cu_seqlens`` ``(B + 1,)``; then the same prompts
    zero-padded to the longest, ``(B, H, S_max, D)``, as a dense kernel takes them."""
    g = torch.Generator(device=device).manual_seed(seed)
    q = torch.randn(sum(lengths), hq, d, device=device, dtype=dtype, generator=g)
    k, v = (torch.randn(sum(lengths), hkv, d, device=device, dtype=dtype, generator=g) for _ in range(2))
    offsets = [0, *itertools.accumulate(lengths)]

    def padded(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros(len(lengths), x.shape[1], max(lengths), d)
        for i, (start, end) in enumerate(zip(offsets, offsets[1:])):
            out[i, :, : end - start] = x[start:end].transpose(0, 1)
        return out

    cu_seqlens = torch.tensor(offsets, device=device, dtype=torch.int32)
    return q, k, v, cu_seqlens, padded(q), padded(k), padded(v)


def _varlen_case(rec: Record, lengths: tuple[int, ...], hq: int, hkv: int, d: int) -> None:
    q, k, v, cu, qp, kp, vp = varlen_case(lengths, hq, hkv, d)
    s_max = max(lengths)

    def unpad(out: torch.Tensor) -> torch.Tensor:  # (B, H, S_max, D) -> (total, H, D)
        return torch.cat([out[i, :, :n].transpose(0, 1) for i, n in enumerate(lengths)])

    def sdpa_padded(q, k, v):
        with sdpa_kernel(list(SDPA_BACKENDS.values())):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    # Padded with Sq = Skv = S_max, each prompt's causal rows see only its own keys: the padding is at the end.
    ours = partial(kernels.flash_attention_varlen, max_seqlen_q=s_max, max_seqlen_k=s_max, causal=True)
    providers = {
        "llmnote": (ours, (q, k, v, cu, cu)),
        "llmnote-padded": (partial(kernels.flash_attention, causal=True), (qp, kp, vp)),
        "sdpa-padded": (sdpa_padded, (qp, kp, vp)),
    }
    expected = ref.flash_attention_varlen(q, k, v, cu, cu, causal=True).float()
    case = f"B={len(lengths)},Hq={hq},Hkv={hkv},D={d},S={min(lengths)}..{s_max},total={sum(lengths)},causal=True"
    _check(f"varlen {case}", ours(q, k, v, cu, cu), expected)
    _check(f"padded {case}", unpad(kernels.flash_attention(qp, kp, vp, causal=True)), expected)
    try:
        _check(f"sdpa-padded {case}", unpad(sdpa_padded(qp, kp, vp)), expected)
    except RuntimeError as err:  # no fused SDPA backend for this case
        print(f"sdpa-padded skipped for {case}: {str(err)[:120]}")
        del providers["sdpa-padded"]
    del expected
    times = {(name, calls): [] for name in providers for calls in (0, 10)}  # graph calls; 0: call by call
    for _ in range(ROUNDS):
        for (name, calls), ms in times.items():
            ms.append(_time(providers[name][0], providers[name][1], 30, calls))
    flops = sum(4 * hq * attention_pairs(n, n, True) * d for n in lengths)
    nbytes = 2 * (2 * q.numel() + k.numel() + v.numel())  # the packed q, k, v and output
    for name in providers:
        best = min(statistics.median(times[name, calls]) for calls in (0, 10))
        rec.add("flash_attention_varlen", case, "bf16", name, best, flops, nbytes)


def run_attention() -> Record:
    if not torch.cuda.is_available():
        raise RuntimeError("the attention benchmark needs a CUDA GPU")
    rec = Record()
    for case in tqdm(list(_flash_cases()), desc="flash_attention"):
        _flash_case(rec, *case)
        torch.cuda.empty_cache()
    decode = [(64, 32, 8, 128, 4096, bs) for bs in (16, 32, 128)] + [(8, 32, 8, 128, 32768, 16)]
    for case in tqdm(decode, desc="paged decode"):
        _decode_case(rec, *case)
        torch.cuda.empty_cache()
    for d in (64, 128):
        _varlen_case(rec, VARLEN_LENGTHS, 32, 8, d)
        torch.cuda.empty_cache()
    return rec
