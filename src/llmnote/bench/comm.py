"""Timing collectives in a group of processes, for the multi-GPU benchmark
(:mod:`llmnote.bench.parallel`): one process per GPU (NCCL) or CPU processes (gloo), started by
:func:`llmnote.parallel.launch.spawn`, every process checked for NVLink multicast off; a time is
the slowest process's.

The collectives are all-reduce, all-gather, reduce-scatter and all-to-all, on bf16 messages of
1 KiB to 1 GiB (powers of two). The size ``S`` of a case is the whole message: all-reduce's buffer,
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
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from ..parallel.collectives import fit_alpha_beta, slowest_rank
from ..parallel.launch import MULTICAST_OFF, spawn
from ..records import Record
from .timing import cuda_time_ms

__all__ = ["COLLECTIVES", "SIZES", "SMOKE_SIZES", "bus_bandwidth", "bus_factor", "dtype_name", "fit_lines", "multicast_seen",
           "note_group", "rank_device", "run_collectives", "run_group", "slowest", "sweep", "timed_ms", "work_dtype"]

COLLECTIVES = ("allreduce", "allgather", "reducescatter", "alltoall")
SIZES = [1 << k for k in range(10, 31)]  # 1 KiB .. 1 GiB
SMOKE_SIZES = [1 << 10, 1 << 12, 1 << 14]  # toy sizes: the code path on CPU processes, in seconds
TIMEOUT_S = 1800.0


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


# ----------------------------------------------------------------------------- inside each process


def rank_device(rank: int) -> torch.device:
    """The device of this process: ``cuda:rank`` in an NCCL group, else the CPU."""
    return torch.device("cuda", rank) if dist.is_initialized() and dist.get_backend() == "nccl" else torch.device("cpu")


def work_dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]


def multicast_seen() -> dict[str, str | None]:
    return {name: os.environ.get(name) for name in MULTICAST_OFF}


def timed_ms(fn: Callable[[], object], device: torch.device, calls: int = 1, reps: int = 10, warmup: int = 3) -> float:
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


def sweep(ops, sizes: list[int], p: int, device: torch.device) -> dict[tuple[str, int], float]:
    """``{(op, bytes): ms}`` of one call of each collective, as this process timed it."""
    dtype, times = work_dtype(device), {}
    for op in ops:
        for nbytes in sizes:
            run = _collective(op, nbytes, p, device, dtype)
            times[op, nbytes] = timed_ms(run, device, calls=_calls(nbytes, device), reps=10 if device.type == "cuda" else 3)
            del run
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return times


def _collectives_rank(rank: int, p: int, sizes: list[int]) -> dict:
    """One process's share of the collectives part."""
    device = rank_device(rank)
    return {"times": sweep(COLLECTIVES, sizes, p, device), "env": multicast_seen(), "dtype": dtype_name(work_dtype(device))}


# ----------------------------------------------------------------------------- the parent


def slowest(results: list[dict], key: str) -> dict:
    return slowest_rank([r[key] for r in results]) if results[0][key] else {}


def run_group(rec: Record, fn: Callable, p: int, *args, backend: str) -> list[dict]:
    """Run ``fn`` in a new group of ``p`` processes; check that each saw NVLink multicast off and
    note the group's size in ``meta``."""
    results = spawn(fn, p, *args, timeout=TIMEOUT_S, backend=backend)
    seen = [r["env"] for r in results]
    if any(env != MULTICAST_OFF for env in seen):
        raise RuntimeError(f"NVLink multicast is not off in every process of {fn.__name__}: {seen}")
    note_group(rec, p)
    return results


def note_group(rec: Record, p: int) -> None:
    sizes = sorted({*rec.extra_meta.get("group_sizes", []), p})
    rec.extra_meta.update(gpus=sizes[-1], group_sizes=sizes)


def fit_lines(rec: Record, times: dict, ops, p: int, dtype: str, suffix: str = "", rows: bool = True) -> dict:
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


def run_collectives(rec: Record, groups: list[int], sizes: list[int], backend: str) -> None:
    for p in groups:
        results = run_group(rec, _collectives_rank, p, sizes, backend=backend)
        times, dtype = slowest(results, "times"), results[0]["dtype"]
        for op in COLLECTIVES:
            for nbytes in sizes:
                ms = times[op, nbytes]
                rec.add(op, f"{op},gpus={p},bytes={nbytes}", dtype, "nccl" if backend == "nccl" else "gloo", ms,
                        nbytes=bus_factor(op, p) * nbytes)  # fmt: skip
            big = sizes[-1]
            print(f"{op} on {p}: {bus_bandwidth(op, big, p, times[op, big] * 1e-3) / 1e9:.1f} GB/s bus bandwidth at "
                  f"{big} bytes, {times[op, sizes[0]] * 1e3:.1f} us at {sizes[0]} bytes")  # fmt: skip
        fit_lines(rec, times, COLLECTIVES, p, dtype)
