"""The multi-GPU benchmark (``run_parallel``): collectives, tensor-parallel decode, and the engine
split over two GPUs. One process per GPU, started here (:func:`llmnote.parallel.launch.spawn`,
NCCL, process ``r`` on ``cuda:r``), for every group size of 2, 4 and 8 that the machine holds;
NVLink multicast (NVLS) stays off in every process (:data:`~llmnote.parallel.launch.MULTICAST_OFF`).
Every timing is the slowest process's: a collective, or a step of a split model, is done when
its last process is done.

**collectives**: all-reduce, all-gather, reduce-scatter and all-to-all on bf16 messages of 1 KiB
to 1 GiB (powers of two). The size ``S`` of a case is the whole message: all-reduce's buffer,
all-gather's output, reduce-scatter's input, all-to-all's buffer on each process. Each size is
captured in a CUDA graph (many calls in a row, so that small messages are not timed as Python
launches) and the replays timed with CUDA events. A time ``t`` says two rates. The *algorithm
bandwidth* ``S / t`` depends on the group size even for a perfect network; the **bus bandwidth**
scales it by what the bandwidth-optimal algorithm must move over each process's busiest link::

    all-reduce                         bus = S / t * 2 (p - 1) / p
    all-gather, reduce-scatter         bus = S / t * (p - 1) / p
    all-to-all                         bus = S / t * (p - 1) / p

(a ring all-reduce sends ``2 (p - 1) / p * S`` bytes from each process, a ring all-gather
``(p - 1) / p * S``; an all-to-all keeps ``1/p`` of its buffer at home). So bus bandwidth compares
directly with a link's speed, whatever ``p`` is. Per operation and group size, the line
``t = alpha + beta * S`` is fitted to the times (:func:`~llmnote.parallel.collectives.fit_alpha_beta`,
relative error): ``alpha`` the latency, ``1 / beta`` the algorithm bandwidth of large messages.

**tp-decode**: one decode step of a Llama-3-8B-shaped model (random bf16 weights, each process
building only its shard) split over ``TP = 1, 2, 4, 8`` processes, batch 1 and 64, every sequence
holding 1024 tokens in a paged cache, the step replayed from a CUDA graph. Beside it, the step's
communication alone, replayed the same way: the ``2 L + 1`` all-reduces of ``batch x hidden``
activations (two per layer, one for the vocabulary-split embedding) and the all-gather of the
logits. The prediction uses the GPU's own ceilings (Chapter 1's roofline), measured in the same
run on one GPU, and the alpha-beta lines of an all-reduce and all-gather sweep of 1 KiB to 16 MiB
in the same group (:func:`predict_decode_ms`)::

    memory        = (2 bytes x matmul weights + KV bytes of batch x (context + 1) tokens) / TP / copy bandwidth
    compute       = (2 x matmul weights x batch + attention FLOPs) / TP / matmul rate
    communication = (2 L + 1) x allreduce(batch x hidden x 2 bytes) + allgather(batch x vocab x 2 bytes)
    step          = max(memory, compute) + communication      (communication not overlapped)

**engine**: ``LLM(..., tensor_parallel_size=2)`` against ``tensor_parallel_size=1`` on the serving
suite's offline throughput workload (:mod:`llmnote.bench.serving`: a Qwen3-0.6B-shaped model with
random weights, 256 requests of 100 to 1024 prompt and 100 to 1024 new tokens, greedy): the whole
run's wall time, and how many requests' outputs equal one GPU's (bf16 partial sums add up in
another order when split, so a near-tie may go the other way).

The record, ``assets/benchmarks/parallel.json`` (``p`` GPUs in a group, ``t`` the TP degree):

- kernels ``allreduce``, ``allgather``, ``reducescatter``, ``alltoall``; case
  ``allreduce,gpus=p,bytes=S``; provider ``nccl``; ``median_ms`` one call; ``tbps`` the bus
  bandwidth (the row's bytes are ``S`` times the bus factor);
- kernel ``alpha-beta``; case ``allreduce,gpus=p``; provider ``fit``; ``median_ms`` is ``alpha``
  and ``tbps`` the bus bandwidth of ``1 / beta`` (the line's slope, on the scale of the rows above);
- kernel ``tp-decode``; case ``llama3-8b,batch=b,tp=t``; providers ``llmnote`` (the measured
  step), ``llmnote-communication`` (its collectives alone), ``predicted`` (the step) and
  ``predicted-memory``, ``predicted-compute``, ``predicted-communication`` (its terms); only
  ``llmnote`` carries rates, per GPU (a GPU's share of the FLOPs and bytes over the step's time);
  communication rows are left out at ``TP = 1``;
- kernels ``copy`` and ``matmul``, provider ``torch``: the rates the prediction used;
- kernel ``serving-tp``; case ``Qwen3-0.6B,256 requests,in 100-1024,out 100-1024,tp=t``; provider
  ``llmnote``; ``median_ms`` the whole run; rates summed over the GPUs.

``meta`` adds ``gpus`` (the most GPUs one measurement used), ``group_sizes`` (the process counts
run), ``multicast_off`` (the variables, checked in every process started), ``alpha_beta``, every
fit: ``{"allreduce,gpus=p": {"alpha_s", "beta_s_per_byte", "bytes": [smallest, largest]}}``, the
decode sweeps' under ``"allreduce,gpus=p,decode"``, and ``serving_tp_identical``: how many of the
engine's requests got the same tokens at TP 2 as at TP 1.
"""

from __future__ import annotations

import functools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from ..layers import TensorParallel
from ..models import ModelConfig, random_model
from ..parallel.collectives import fit_alpha_beta, slowest_rank
from ..parallel.launch import MULTICAST_OFF, disable_multicast, spawn
from ..records import Record
from .decode import SHAPES, attention_flops, filled_cache, kv_bytes
from .serving import QWEN3_0_6B, THROUGHPUT, THROUGHPUT_CASE, engine_run, random_checkpoint, throughput_workload
from .timing import cuda_time_ms

__all__ = ["PARTS", "COLLECTIVES", "GROUP_SIZES", "TP_DEGREES", "bus_factor", "bus_bandwidth", "predict_decode_ms",
           "run_parallel"]  # fmt: skip

PARTS = ("collectives", "tp-decode", "engine")
COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall")
GROUP_SIZES = (2, 4, 8)
TP_DEGREES = (1, 2, 4, 8)
SIZES = [1 << k for k in range(10, 31)]  # 1 KiB .. 1 GiB
DECODE_FIT_SIZES = [1 << k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB: a decode step's messages
DECODE_BATCHES, DECODE_CONTEXT = (1, 64), 1024
ENGINE_TP = 2
TIMEOUT_S = 1800.0

# Toy sizes: every part's code path on CPU processes (gloo) or, on request, on GPUs, in seconds.
SMOKE_SIZES = [1 << 10, 1 << 12, 1 << 14]
SMOKE_FIT_SIZES = [1 << 10, 1 << 12, 1 << 14]
SMOKE_DECODE = ModelConfig(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256, dtype="bfloat16")  # fmt: skip
SMOKE_ENGINE = ModelConfig(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True,
                           max_position_embeddings=256, dtype="bfloat16")  # fmt: skip
SMOKE_WORK = dict(num=6, prompt=(5, 40), output=(3, 20), seed=0)


# ----------------------------------------------------------------------------- conventions


def bus_factor(op: str, p: int) -> float:
    """What the bandwidth-optimal algorithm of ``op`` moves over each process's busiest link, per
    byte of the message: ``2 (p - 1) / p`` for all-reduce, ``(p - 1) / p`` for the others."""
    if op not in COLLECTIVES:
        raise ValueError(f"op must be one of {COLLECTIVES}, got {op!r}")
    if not (isinstance(p, int) and p >= 1):
        raise ValueError(f"p must be an integer >= 1, got {p!r}")
    return (2 if op == "allreduce" else 1) * (p - 1) / p


def bus_bandwidth(op: str, nbytes: float, p: int, seconds: float) -> float:
    """Bus bandwidth in bytes per second of ``op`` on a message of ``nbytes`` (the whole message:
    see the module's table) over ``p`` processes that took ``seconds``."""
    if nbytes <= 0 or seconds <= 0:
        raise ValueError(f"nbytes and seconds must be positive, got {nbytes} and {seconds}")
    return nbytes / seconds * bus_factor(op, p)


def predict_decode_ms(config: ModelConfig, batch: int, context: int, tp: int, copy_tbps: float, matmul_tflops: float,
                      allreduce: tuple[float, float] | None = None, allgather: tuple[float, float] | None = None,
                      elem_bytes: int = 2) -> dict[str, float]:  # fmt: skip
    """A decode step of ``batch`` sequences holding ``context`` tokens, split over ``tp`` GPUs, by
    the roofline and the alpha-beta model: ``{"memory", "compute", "communication", "step"}`` in
    milliseconds (the formulas are in the module's docstring). ``copy_tbps``: bytes read per second
    (TB/s); ``matmul_tflops``: the matrix-multiply rate; ``allreduce``/``allgather``: ``(alpha,
    beta)`` of the fitted line ``t = alpha + beta * bytes`` in the group of ``tp``, needed when
    ``tp > 1``."""
    if batch < 1 or context < 0 or tp < 1:
        raise ValueError(f"need batch >= 1, context >= 0 and tp >= 1, got {batch}, {context}, {tp}")
    if config.num_kv_heads % tp or config.vocab_size % tp:
        raise ValueError(f"tp={tp} must divide the KV heads ({config.num_kv_heads}) and the vocabulary ({config.vocab_size})")
    if copy_tbps <= 0 or matmul_tflops <= 0:
        raise ValueError(f"copy_tbps and matmul_tflops must be positive, got {copy_tbps} and {matmul_tflops}")
    if tp > 1 and (allreduce is None or allgather is None):
        raise ValueError("tp > 1 needs the allreduce and allgather fits (alpha, beta)")
    weights = elem_bytes * config.num_matmul_params
    kv = kv_bytes(config, batch, context + 1, elem_bytes)
    flops = 2 * config.num_matmul_params * batch + attention_flops(config, batch, 1, context + 1)
    memory = (weights + kv) / tp / (copy_tbps * 1e12)
    compute = flops / tp / (matmul_tflops * 1e12)
    communication = 0.0
    if tp > 1:
        line = lambda fit, n: fit[0] + fit[1] * n  # noqa: E731
        activations, logits = batch * config.hidden_size * elem_bytes, batch * config.vocab_size * elem_bytes
        communication = (2 * config.num_layers + 1) * line(allreduce, activations) + line(allgather, logits)
    ms = {"memory": memory * 1e3, "compute": compute * 1e3, "communication": communication * 1e3}
    ms["step"] = max(ms["memory"], ms["compute"]) + ms["communication"]
    return ms


# ----------------------------------------------------------------------------- inside each process


def _rank_device(rank: int) -> torch.device:
    """The device of this process: ``cuda:rank`` in an NCCL group, else the CPU."""
    return torch.device("cuda", rank) if dist.is_initialized() and dist.get_backend() == "nccl" else torch.device("cpu")


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


def _multicast_seen() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in MULTICAST_OFF}


def _timed_ms(fn: Callable[[], object], device: torch.device, calls: int = 1, reps: int = 10, warmup: int = 3) -> float:
    """Median milliseconds of one ``fn()`` in this process. On a GPU: ``calls`` calls captured in
    one CUDA graph, each replay timed with CUDA events, divided by ``calls``. On a CPU: the wall
    clock around ``calls`` calls in a row."""
    if device.type == "cuda":
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        ms = cuda_time_ms(graph.replay, [()], warmup=2, rep=reps) / calls
        del graph
        return ms
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) * 1e3 / calls)
    return statistics.median(times)


def _collective(op: str, nbytes: int, p: int, device: torch.device, dtype: torch.dtype) -> Callable[[], object]:
    """A no-argument call of ``op`` on a message of ``nbytes`` (the whole message, as in the
    module's table), its buffers allocated once."""
    n = nbytes // (torch.finfo(dtype).bits // 8)
    if n % p:
        raise ValueError(f"a message of {nbytes} bytes does not split into {p} equal parts of {dtype}")
    whole, part = torch.zeros(n, dtype=dtype, device=device), torch.zeros(n // p, dtype=dtype, device=device)
    if op == "allreduce":
        return lambda: dist.all_reduce(whole)
    if op == "allgather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(whole, part)
    if op == "reducescatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, whole)
    if op == "alltoall":
        out = torch.empty_like(whole)
        return lambda: dist.all_to_all_single(out, whole)
    raise ValueError(f"op must be one of {COLLECTIVES}, got {op!r}")


def _calls(nbytes: int, device: torch.device) -> int:
    """Calls per timed replay: enough that a small message's replay is not dominated by the
    replay's own overhead (about 16 MiB of messages a replay, at most 100 calls)."""
    return max(1, min(100, (16 << 20) // nbytes)) if device.type == "cuda" else 2


def _sweep(ops, sizes: list[int], p: int, device: torch.device) -> dict[tuple[str, int], float]:
    """``{(op, bytes): ms}`` of one call of each collective, as this process timed it."""
    dtype, times = _dtype(device), {}
    for op in ops:
        for nbytes in sizes:
            run = _collective(op, nbytes, p, device, dtype)
            times[op, nbytes] = _timed_ms(run, device, calls=_calls(nbytes, device), reps=10 if device.type == "cuda" else 3)
            del run
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return times


def _collectives_rank(rank: int, p: int, sizes: list[int]) -> dict:
    """One process's share of the collectives part."""
    device = _rank_device(rank)
    return {"times": _sweep(COLLECTIVES, sizes, p, device), "env": _multicast_seen(), "dtype": _dtype_name(_dtype(device))}


def _ceilings(device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """The prediction's two rates on this GPU, as the ceilings suite measures them: a 1 GiB
    device copy (bytes read and written per second) and an 8192^3 matrix product."""
    elems, n = (512 << 20, 8192) if device.type == "cuda" else (1 << 20, 256)
    src = torch.empty(elems, dtype=dtype, device=device).normal_()
    dst = torch.empty_like(src)
    copy_ms = _timed_ms(lambda: dst.copy_(src), device, reps=20)
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    matmul_ms = _timed_ms(lambda: torch.mm(a, b), device, reps=20)
    size = elems * src.element_size()
    return {"copy_ms": copy_ms, "copy_bytes": 2 * size, "copy_mib": size >> 20, "matmul_ms": matmul_ms,
            "matmul_flops": 2 * n**3, "matmul_n": n}  # fmt: skip


def _decode_collectives(config: ModelConfig, batch: int, p: int, device: torch.device, dtype: torch.dtype):
    """The collectives of one tensor-parallel decode step, alone: ``2 L + 1`` all-reduces of the
    ``(batch, hidden)`` activations and the all-gather of the ``(batch, vocab / p)`` logit slices."""
    x = torch.zeros(batch, config.hidden_size, dtype=dtype, device=device)
    logits = torch.zeros(batch, config.vocab_size // p, dtype=dtype, device=device)
    parts = [torch.empty_like(logits) for _ in range(p)]

    def step():
        for _ in range(2 * config.num_layers + 1):
            dist.all_reduce(x)
        dist.all_gather(parts, logits)

    return step


def _tp_decode_rank(rank: int, p: int, config: ModelConfig, batches: tuple[int, ...], context: int, fit_sizes: list[int],
                    ceilings: bool) -> dict:  # fmt: skip
    """One process's share of a tensor-parallel decode run: step and communication times per
    batch, the fit sweep, and (on rank 0, if asked) the GPU's ceilings."""
    device = _rank_device(rank)
    dtype = _dtype(device)
    out = {"env": _multicast_seen(), "dtype": _dtype_name(dtype), "step": {}, "comm": {}, "times": {}, "ceilings": None}
    if ceilings and rank == 0:
        out["ceilings"] = _ceilings(device, dtype)
    if p > 1:
        out["times"] = _sweep(("allreduce", "allgather"), fit_sizes, p, device)
    tp = TensorParallel(rank=rank, size=p) if p > 1 else TensorParallel()
    gpu = device.type == "cuda"
    with torch.no_grad():
        model = random_model(config, device=device, dtype=dtype, seed=0, tp=tp)
        for batch in batches:
            cache = filled_cache(model, batch, context)
            generator = torch.Generator(device=device).manual_seed(batch)  # the same tokens on every rank
            token = torch.randint(0, config.vocab_size, (batch,), device=device, generator=generator)
            if gpu:
                out["step"][batch] = cuda_time_ms(model.decode, [(token, cache)], warmup=3, rep=20, graph_calls=1)
            else:
                out["step"][batch] = _timed_ms(functools.partial(model.decode, token, cache), device, reps=3, warmup=1)
            del cache
            if p > 1:
                comm = _decode_collectives(config, batch, p, device, dtype)
                out["comm"][batch] = _timed_ms(comm, device, reps=10 if gpu else 3)
            if gpu:
                torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------- the parent


def _slowest(results: list[dict], key: str) -> dict:
    return slowest_rank([r[key] for r in results]) if results[0][key] else {}


def _ranks(rec: Record, fn: Callable, p: int, *args, backend: str) -> list[dict]:
    """Run ``fn`` in a new group of ``p`` processes; check that each saw NVLink multicast off and
    note the group's size in ``meta``."""
    results = spawn(fn, p, *args, timeout=TIMEOUT_S, backend=backend)
    seen = [r["env"] for r in results]
    if any(env != MULTICAST_OFF for env in seen):
        raise RuntimeError(f"NVLink multicast is not off in every process of {fn.__name__}: {seen}")
    _note_group(rec, p)
    return results


def _note_group(rec: Record, p: int) -> None:
    sizes = sorted({*rec.extra_meta.get("group_sizes", []), p})
    rec.extra_meta.update(gpus=sizes[-1], group_sizes=sizes)


def _fit(rec: Record, times: dict, ops, p: int, dtype: str, suffix: str = "", rows: bool = True) -> dict:
    """Fit ``t = alpha + beta * bytes`` per op; into ``meta["alpha_beta"]`` (and, with ``rows``,
    an ``alpha-beta`` row each). Returns ``{op: (alpha, beta)}``."""
    fits = {}
    for op in ops:
        sizes = sorted(n for o, n in times if o == op)
        alpha, beta = fit_alpha_beta(sizes, [times[op, n] * 1e-3 for n in sizes])
        fits[op] = (alpha, beta)
        key = f"{op},gpus={p}{suffix}"
        rec.extra_meta.setdefault("alpha_beta", {})[key] = {"alpha_s": alpha, "beta_s_per_byte": beta,
                                                            "bytes": [sizes[0], sizes[-1]]}  # fmt: skip
        if rows and alpha > 0 and beta > 0:
            rec.add("alpha-beta", key, dtype, "fit", alpha * 1e3, nbytes=bus_factor(op, p) * alpha / beta)
        print(f"  {key}: alpha {alpha * 1e6:.1f} us, 1/beta {1 / beta / 1e9 if beta else float('inf'):.1f} GB/s")
    return fits


def _run_collectives(rec: Record, groups: list[int], sizes: list[int], backend: str) -> None:
    for p in groups:
        results = _ranks(rec, _collectives_rank, p, sizes, backend=backend)
        times, dtype = _slowest(results, "times"), results[0]["dtype"]
        for op in COLLECTIVES:
            for nbytes in sizes:
                ms = times[op, nbytes]
                rec.add(op, f"{op},gpus={p},bytes={nbytes}", dtype, "nccl" if backend == "nccl" else "gloo", ms,
                        nbytes=bus_factor(op, p) * nbytes)  # fmt: skip
            big = sizes[-1]
            print(f"{op} on {p}: {bus_bandwidth(op, big, p, times[op, big] * 1e-3) / 1e9:.1f} GB/s bus bandwidth at "
                  f"{big} bytes, {times[op, sizes[0]] * 1e3:.1f} us at {sizes[0]} bytes")  # fmt: skip
        _fit(rec, times, COLLECTIVES, p, dtype)


def _run_tp_decode(rec: Record, degrees: list[int], config: ModelConfig, name: str, batches, context: int,
                   fit_sizes: list[int], backend: str) -> None:  # fmt: skip
    rates = None
    for tp in degrees:
        results = _ranks(rec, _tp_decode_rank, tp, config, batches, context, fit_sizes, rates is None, backend=backend)
        dtype = results[0]["dtype"]
        if rates is None:
            c = results[0]["ceilings"]
            rec.add("copy", f"bytes={c['copy_mib']} MiB", dtype, "torch", c["copy_ms"], nbytes=c["copy_bytes"])
            rec.add("matmul", f"M=N=K={c['matmul_n']}", dtype, "torch", c["matmul_ms"], flops=c["matmul_flops"])
            rates = (c["copy_bytes"] / (c["copy_ms"] * 1e9), c["matmul_flops"] / (c["matmul_ms"] * 1e9))
        fits = {}
        if tp > 1:
            fits = _fit(rec, _slowest(results, "times"), ("allreduce", "allgather"), tp, dtype, ",decode", rows=False)
        step, comm = _slowest(results, "step"), _slowest(results, "comm")
        elem = 2 if dtype == "bf16" else 4
        for batch in batches:
            case = f"{name},batch={batch},tp={tp}"
            flops = (2 * config.num_matmul_params * batch + attention_flops(config, batch, 1, context + 1)) / tp
            nbytes = (elem * config.num_matmul_params + kv_bytes(config, batch, context + 1, elem)) / tp
            rec.add("tp-decode", case, dtype, "llmnote", step[batch], flops, nbytes)
            if tp > 1:
                rec.add("tp-decode", case, dtype, "llmnote-communication", comm[batch])
            pred = predict_decode_ms(config, batch, context, tp, *rates, fits.get("allreduce"), fits.get("allgather"), elem)
            rec.add("tp-decode", case, dtype, "predicted", pred["step"])
            for term in ("memory", "compute", "communication"):
                if pred[term] > 0:
                    rec.add("tp-decode", case, dtype, f"predicted-{term}", pred[term])
            print(f"{case}: measured {step[batch]:.3f} ms (communication {comm.get(batch, 0):.3f}), predicted "
                  f"{pred['step']:.3f} (memory {pred['memory']:.3f}, compute {pred['compute']:.3f}, "
                  f"communication {pred['communication']:.3f})")  # fmt: skip


def _run_engine(rec: Record, config: ModelConfig, work: dict, device: str, case: str) -> None:
    dtype = _dtype(torch.device(device))
    prompts, lengths = throughput_workload(**work, vocab=min(10000, config.vocab_size))
    tokens = sum(len(q) for q in prompts) + sum(lengths)
    outputs, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = random_checkpoint(config, Path(tmp) / "throughput")
        for tp in (1, ENGINE_TP):
            seconds[tp], outputs[tp], traffic, log = engine_run(ckpt, config, prompts, lengths, device, dtype, tp)
            assert [len(o) for o in outputs[tp]] == lengths
            rec.add("serving-tp", f"{case},tp={tp}", _dtype_name(dtype), "llmnote", seconds[tp] * 1e3,
                    2 * config.num_matmul_params * tokens, traffic)  # fmt: skip
            _note_group(rec, tp)
            print(f"engine, tp={tp}: {sum(lengths) / seconds[tp]:.0f} output tok/s, {len(log)} steps")
    same = sum(a == b for a, b in zip(outputs[1], outputs[ENGINE_TP]))
    rec.extra_meta["serving_tp_identical"] = {"tp": ENGINE_TP, "identical": same, "requests": len(prompts)}
    print(f"engine: tp={ENGINE_TP} {seconds[1] / seconds[ENGINE_TP]:.2f}x tp=1; {same} of {len(prompts)} outputs identical")


def _group_sizes(device: str, gpus: list[int] | None = None) -> list[int]:
    """The group sizes to measure: ``gpus`` if given (each checked against the GPUs present),
    else those of :data:`GROUP_SIZES` that fit; on the CPU, ``gpus`` or ``[2]``."""
    if device == "cpu":
        return sorted(gpus or [2])
    present = torch.cuda.device_count()
    if present < 2:
        raise RuntimeError(f"the parallel benchmark needs at least 2 GPUs (it measures groups of "
                           f"{', '.join(map(str, GROUP_SIZES))} GPUs, as many as are present); torch sees {present}")  # fmt: skip
    sizes = sorted(gpus) if gpus else [n for n in GROUP_SIZES if n <= present]
    too_many = [n for n in sizes if n > present or n < 2]
    if too_many:
        raise ValueError(f"group sizes {too_many} do not fit: each needs 2 .. {present} GPUs")
    return sizes


def run_parallel(parts: tuple[str, ...] = PARTS, gpus: list[int] | None = None, smoke: bool = False,
                 device: str | None = None) -> Record:  # fmt: skip
    """The multi-GPU suite, the ``parts`` of :data:`PARTS` named, on groups of every size in
    ``gpus`` (default: 2, 4 and 8, those the machine holds). ``smoke`` runs every part at toy
    sizes to check the harness: on CPU processes with gloo unless ``device="cuda"``."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; the parts are {', '.join(PARTS)}")
    device = device or ("cpu" if smoke else "cuda")
    if device not in ("cpu", "cuda") or (device == "cpu" and not smoke):
        raise ValueError(f"device must be 'cuda', or 'cpu' with smoke=True; got {device!r}")
    groups = _group_sizes(device, gpus)
    # Before any process starts: each inherits it (the engine's workers too), and the processes
    # started here set it again and report what they saw.
    rec = Record(extra_meta={"multicast_off": disable_multicast()})
    backend = "nccl" if device == "cuda" else "gloo"
    if "collectives" in parts:
        _run_collectives(rec, groups, SMOKE_SIZES if smoke else SIZES, backend)
    if "tp-decode" in parts:
        degrees = [t for t in TP_DEGREES if t == 1 or t in groups]
        config, name = (SMOKE_DECODE, "tiny") if smoke else (SHAPES["llama-3-8b"], "llama3-8b")
        _run_tp_decode(rec, degrees, config, name, DECODE_BATCHES if not smoke else (1, 4), DECODE_CONTEXT if not smoke else 32,
                       SMOKE_FIT_SIZES if smoke else DECODE_FIT_SIZES, backend)  # fmt: skip
    if "engine" in parts:
        if device == "cuda" and torch.cuda.device_count() < ENGINE_TP:
            raise RuntimeError(f"the engine part needs {ENGINE_TP} GPUs")
        config, work = (SMOKE_ENGINE, SMOKE_WORK) if smoke else (QWEN3_0_6B, THROUGHPUT)
        case = THROUGHPUT_CASE if not smoke else f"{work['num']} requests"
        _run_engine(rec, config, work, device, case)
    return rec
