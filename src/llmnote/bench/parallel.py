"""The multi-GPU benchmark (``run_parallel``): collectives, tensor-parallel decode, and the engine
split over two GPUs. One process per GPU, started here (:func:`llmnote.parallel.launch.spawn`,
NCCL, process ``r`` on ``cuda:r``), for every group size of 2, 4 and 8 that the machine holds;
NVLink multicast (NVLS) stays off in every process (:data:`~llmnote.parallel.launch.MULTICAST_OFF`).
Every timing is the slowest process's: a collective, or a step of a split model, is done when
its last process is done.

**collectives**: all-reduce, all-gather, reduce-scatter and all-to-all on bf16 messages of 1 KiB
to 1 GiB, their bus bandwidth and the alpha-beta line fitted to their times
(:mod:`llmnote.bench.comm`, which says how each is timed and what its bus bandwidth means).

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
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from ..layers import TensorParallel
from ..models import ModelConfig, random_model
from ..parallel.launch import disable_multicast
from ..records import Record
from .comm import (
    SIZES,
    SMOKE_SIZES,
    dtype_name,
    fit_lines,
    multicast_seen,
    note_group,
    rank_device,
    run_collectives,
    run_group,
    slowest,
    sweep,
    timed_ms,
    work_dtype,
)
from .decode import SHAPES, attention_flops, filled_cache, kv_bytes
from .serving import QWEN3_0_6B, THROUGHPUT, THROUGHPUT_CASE, engine_run, random_checkpoint, throughput_workload
from .timing import cuda_time_ms

__all__ = ["PARTS", "GROUP_SIZES", "TP_DEGREES", "predict_decode_ms", "run_parallel"]

PARTS = ("collectives", "tp-decode", "engine")
GROUP_SIZES = (2, 4, 8)
TP_DEGREES = (1, 2, 4, 8)
DECODE_FIT_SIZES = [1 << k for k in range(10, 25, 2)]  # 1 KiB .. 16 MiB: a decode step's messages
DECODE_BATCHES, DECODE_CONTEXT = (1, 64), 1024
ENGINE_TP = 2

# Toy sizes: every part's code path on CPU processes (gloo) or, on request, on GPUs, in seconds.
SMOKE_FIT_SIZES = [1 << 10, 1 << 12, 1 << 14]
SMOKE_DECODE = ModelConfig(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=256, dtype="bfloat16")  # fmt: skip
SMOKE_ENGINE = ModelConfig(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True,
                           max_position_embeddings=256, dtype="bfloat16")  # fmt: skip
SMOKE_WORK = dict(num=6, prompt=(5, 40), output=(3, 20), seed=0)


# ----------------------------------------------------------------------------- conventions


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


def _ceilings(device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """The prediction's two rates on this GPU, as the ceilings suite measures them: a 1 GiB
    device copy (bytes read and written per second) and an 8192^3 matrix product."""
    elems, n = (512 << 20, 8192) if device.type == "cuda" else (1 << 20, 256)
    src = torch.empty(elems, dtype=dtype, device=device).normal_()
    dst = torch.empty_like(src)
    copy_ms = timed_ms(lambda: dst.copy_(src), device, reps=20)
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    matmul_ms = timed_ms(lambda: torch.mm(a, b), device, reps=20)
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
    device = rank_device(rank)
    dtype = work_dtype(device)
    out = {"env": multicast_seen(), "dtype": dtype_name(dtype), "step": {}, "comm": {}, "times": {}, "ceilings": None}
    if ceilings and rank == 0:
        out["ceilings"] = _ceilings(device, dtype)
    if p > 1:
        out["times"] = sweep(("allreduce", "allgather"), fit_sizes, p, device)
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
                out["step"][batch] = timed_ms(functools.partial(model.decode, token, cache), device, reps=3, warmup=1)
            del cache
            if p > 1:
                comm = _decode_collectives(config, batch, p, device, dtype)
                out["comm"][batch] = timed_ms(comm, device, reps=10 if gpu else 3)
            if gpu:
                torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------- the parent


def _run_tp_decode(rec: Record, degrees: list[int], config: ModelConfig, name: str, batches, context: int,
                   fit_sizes: list[int], backend: str) -> None:  # fmt: skip
    rates = None
    for tp in degrees:
        results = run_group(rec, _tp_decode_rank, tp, config, batches, context, fit_sizes, rates is None, backend=backend)
        dtype = results[0]["dtype"]
        if rates is None:
            c = results[0]["ceilings"]
            rec.add("copy", f"bytes={c['copy_mib']} MiB", dtype, "torch", c["copy_ms"], nbytes=c["copy_bytes"])
            rec.add("matmul", f"M=N=K={c['matmul_n']}", dtype, "torch", c["matmul_ms"], flops=c["matmul_flops"])
            rates = (c["copy_bytes"] / (c["copy_ms"] * 1e9), c["matmul_flops"] / (c["matmul_ms"] * 1e9))
        fits = {}
        if tp > 1:
            fits = fit_lines(rec, slowest(results, "times"), ("allreduce", "allgather"), tp, dtype, ",decode", rows=False)
        step, comm = slowest(results, "step"), slowest(results, "comm")
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
    dtype = work_dtype(torch.device(device))
    prompts, lengths = throughput_workload(**work, vocab=min(10000, config.vocab_size))
    tokens = sum(len(q) for q in prompts) + sum(lengths)
    outputs, seconds = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = random_checkpoint(config, Path(tmp) / "throughput")
        for tp in (1, ENGINE_TP):
            seconds[tp], outputs[tp], traffic, log = engine_run(ckpt, config, prompts, lengths, device, dtype, tp)
            assert [len(o) for o in outputs[tp]] == lengths
            rec.add("serving-tp", f"{case},tp={tp}", dtype_name(dtype), "llmnote", seconds[tp] * 1e3,
                    2 * config.num_matmul_params * tokens, traffic)  # fmt: skip
            note_group(rec, tp)
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
        run_collectives(rec, groups, SMOKE_SIZES if smoke else SIZES, backend)
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
