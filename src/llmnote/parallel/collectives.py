"""Collectives, timed and modelled: what all-reduce and its relatives cost, and why.

When a model is split across processes (tensor parallelism, expert parallelism), the pieces
meet through **collectives**: operations that every process of a group calls together. Five of
them cover LLM inference. With ``p`` processes each holding a vector of ``n`` bytes:

- **all-reduce**: every process ends with the element-wise sum of all ``p`` vectors;
- **all-gather**: each contributes ``n/p`` bytes, every process ends with all ``n``;
- **reduce-scatter**: every process ends with its own ``n/p`` slice of the sum;
- **broadcast**: one process's ``n`` bytes reach all the others;
- **all-to-all**: process ``i`` sends its ``j``-th slice of ``n/p`` bytes to process ``j``.

**The alpha-beta model.** Sending a message of ``m`` bytes costs ``alpha + m * beta``: a fixed
latency ``alpha`` (seconds) and a time per byte ``beta`` (seconds per byte, one over the
bandwidth). An algorithm that takes ``s`` steps and sends ``m_i`` bytes on the busiest link in
step ``i`` costs ``s * alpha + beta * sum(m_i)``. :func:`fit_alpha_beta` recovers the two
numbers from measurements; the ``*_time`` functions give each algorithm's cost.

**Ring all-reduce** (Patarasuk and Yuan, 2009, *Bandwidth optimal all-reduce algorithms for
clusters of workstations*) cuts each vector into ``p`` chunks and passes them around a ring:
``p - 1`` steps of reduce-scatter, after which each process holds one fully summed chunk, then
``p - 1`` steps of all-gather that circulate the summed chunks. Each step moves ``n/p`` bytes
per process, so each process sends ``2 (p - 1) / p * n`` bytes in all, which is the least any
all-reduce can send: the ring is bandwidth-optimal, but it pays ``2 (p - 1)`` latencies.
:func:`ring_allreduce_steps` simulates it chunk by chunk. NVIDIA's NCCL library uses rings
(and, for latency-bound sizes, trees) over NVLink, PCIe and InfiniBand.

**Recursive doubling** (Thakur, Rabenseifner and Gropp, 2005, *Optimization of collective
communication operations in MPICH*) pairs process ``i`` with ``i XOR 2^k`` in step ``k``; both
exchange their whole vector and add. It takes ``log2 p`` steps, so it pays far fewer latencies,
but each step sends all ``n`` bytes: ``log2(p) * (alpha + n * beta)``. Rabenseifner's algorithm,
from the same paper, gets both: reduce-scatter by recursive halving, then all-gather by recursive
doubling, ``2 log2(p) alpha + 2 (p - 1) / p * n * beta``. The cost of adding numbers is left out
of every formula here.

:func:`time_collectives` times the real operations of ``torch.distributed`` in a process group;
run it in every process with :func:`llmnote.parallel.launch.spawn`.
"""

from __future__ import annotations

import math
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

__all__ = [
    "OPS",
    "time_collectives",
    "slowest_rank",
    "fit_alpha_beta",
    "ring_allreduce_time",
    "recursive_doubling_allreduce_time",
    "rabenseifner_allreduce_time",
    "ring_allgather_time",
    "ring_reduce_scatter_time",
    "pairwise_alltoall_time",
    "ring_allreduce_steps",
]

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all")


# ----------------------------------------------------------------------------- measuring


def _op_runner(op: str, n_elems: int, world_size: int):
    """A no-argument function that runs collective ``op`` on a message of ``n_elems`` float32
    (the full vector: all-gather's output, reduce-scatter's input), or None if the backend
    does not provide it."""
    part = n_elems // world_size
    if op == "all_reduce":
        x = torch.ones(n_elems)
        return lambda: dist.all_reduce(x)
    if op == "broadcast":
        x = torch.ones(n_elems)
        return lambda: dist.broadcast(x, src=0)
    if op == "all_gather":
        out, x = torch.empty(n_elems), torch.ones(part)
        gather = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
        if gather is None:
            pieces = list(out.chunk(world_size))
            return lambda: dist.all_gather(pieces, x)
        return lambda: gather(out, x)
    if op == "reduce_scatter":
        out, x = torch.empty(part), torch.ones(n_elems)
        scatter = getattr(dist, "reduce_scatter_single", None) or getattr(dist, "reduce_scatter_tensor", None)
        return None if scatter is None else (lambda: scatter(out, x))
    if op == "all_to_all":
        out, x = torch.empty(n_elems), torch.ones(n_elems)
        exchange = getattr(dist, "all_to_all_single", None)
        return None if exchange is None else (lambda: exchange(out, x))
    raise ValueError(f"op must be one of {OPS}, got {op!r}")


def _supported(run) -> bool:
    """Whether the backend runs this collective (gloo lacks some on some versions). Every rank
    tries it, and the group agrees: unsupported if any rank failed."""
    try:
        run()
        ok = 1.0
    except (RuntimeError, NotImplementedError, ValueError):
        ok = 0.0
    flag = torch.tensor([ok])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def time_collectives(rank: int, world_size: int, sizes: list[int], reps: int = 5, warmup: int = 1) -> dict:
    """Median wall time in seconds of each collective in :data:`OPS` on float32 messages of
    ``sizes`` bytes, as seen by this process: ``{(op, size): seconds}``. An op the backend
    lacks is left out. ``size`` is the whole vector (all-gather's output, reduce-scatter's
    input); it is rounded down to a multiple of ``4 * world_size`` bytes. Each timed repetition
    starts after a barrier, so every process starts the collective together. Call in every
    process of an initialised group, for example through ``spawn(time_collectives, p, sizes)``."""
    if not dist.is_initialized():
        raise ValueError("time_collectives needs an initialised process group (start it with llmnote.parallel.launch.spawn)")
    if world_size != dist.get_world_size() or rank != dist.get_rank():
        raise ValueError(f"rank {rank} of {world_size} does not match the group's "
                         f"rank {dist.get_rank()} of {dist.get_world_size()}")
    if not sizes or any(int(s) < 4 * world_size for s in sizes):
        raise ValueError(f"sizes must be a non-empty list of byte counts >= {4 * world_size}, got {sizes}")
    if reps < 1 or warmup < 0:
        raise ValueError(f"need reps >= 1 and warmup >= 0, got {reps}, {warmup}")
    times = {}
    for op in OPS:
        if not _supported(_op_runner(op, world_size, world_size)):
            continue
        for size in sizes:
            run = _op_runner(op, int(size) // 4 // world_size * world_size, world_size)
            for _ in range(warmup):
                run()
            samples = []
            for _ in range(reps):
                dist.barrier()
                start = time.perf_counter()
                run()
                samples.append(time.perf_counter() - start)
            times[op, int(size)] = statistics.median(samples)
    return times


def slowest_rank(results: list[dict]) -> dict:
    """Merge :func:`time_collectives`' results from every rank: a collective is done when its
    last process is, so keep the largest median of each ``(op, size)``."""
    if not results:
        raise ValueError("results must hold one dict per rank, got none")
    return {key: max(r[key] for r in results) for key in results[0]}


def fit_alpha_beta(sizes_bytes, seconds) -> tuple[float, float]:
    """``(alpha, beta)`` of the line ``t = alpha + beta * n`` through measured ``(n, t)`` pairs:
    alpha in seconds, beta in seconds per byte, both >= 0. The fit minimises *relative*
    error (each row weighted by ``1 / t``), so that a microsecond message counts as much as a
    ten-millisecond one, as it does on a log-log plot."""
    n = np.asarray(sizes_bytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if n.ndim != 1 or n.shape != t.shape or n.size < 2:
        raise ValueError(f"sizes_bytes and seconds must be 1-D of one length >= 2, got shapes {n.shape} and {t.shape}")
    if np.any(n <= 0) or np.any(t <= 0):
        raise ValueError("sizes_bytes and seconds must be positive")
    a = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    b = np.ones_like(t)

    def residual(x):
        return float(np.sum((a @ x - b) ** 2))

    x = np.linalg.lstsq(a, b, rcond=None)[0]
    if np.all(x >= 0):
        return float(x[0]), float(x[1])
    # The unconstrained optimum is infeasible: the constrained one lies on an edge (one term zero).
    candidates = [np.array([(a[:, 0] @ b) / (a[:, 0] @ a[:, 0]), 0.0]), np.array([0.0, (a[:, 1] @ b) / (a[:, 1] @ a[:, 1])])]
    best = min(candidates, key=residual)
    return float(best[0]), float(best[1])


# ----------------------------------------------------------------------------- the cost model


def _check(n_bytes: float, p: int, alpha: float, beta: float) -> None:
    if not (isinstance(p, int | np.integer) and p >= 1):
        raise ValueError(f"p must be an integer >= 1, got {p!r}")
    if np.any(np.asarray(n_bytes) < 0) or alpha < 0 or beta < 0:
        raise ValueError(f"n_bytes, alpha and beta must be >= 0, got {n_bytes}, {alpha}, {beta}")


def ring_allreduce_time(n_bytes, p: int, alpha: float, beta: float):
    """Ring all-reduce of ``n_bytes`` over ``p`` processes: ``2 (p-1) alpha + 2 (p-1)/p n beta``."""
    _check(n_bytes, p, alpha, beta)
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * np.asarray(n_bytes, dtype=np.float64) * beta


def recursive_doubling_allreduce_time(n_bytes, p: int, alpha: float, beta: float):
    """Recursive-doubling all-reduce (Thakur, Rabenseifner and Gropp, 2005):
    ``ceil(log2 p) (alpha + n beta)``: few steps, each moving the whole vector."""
    _check(n_bytes, p, alpha, beta)
    return math.ceil(math.log2(p)) * (alpha + np.asarray(n_bytes, dtype=np.float64) * beta)


def rabenseifner_allreduce_time(n_bytes, p: int, alpha: float, beta: float):
    """Rabenseifner's all-reduce (recursive-halving reduce-scatter, then recursive-doubling
    all-gather), for ``p`` a power of two: ``2 log2(p) alpha + 2 (p-1)/p n beta``."""
    _check(n_bytes, p, alpha, beta)
    if p & (p - 1):
        raise ValueError(f"p must be a power of two, got {p}")
    return 2 * int(math.log2(p)) * alpha + 2 * (p - 1) / p * np.asarray(n_bytes, dtype=np.float64) * beta


def ring_allgather_time(n_bytes, p: int, alpha: float, beta: float):
    """Ring all-gather to ``n_bytes`` in all (``n/p`` from each): ``(p-1) alpha + (p-1)/p n beta``."""
    _check(n_bytes, p, alpha, beta)
    return (p - 1) * alpha + (p - 1) / p * np.asarray(n_bytes, dtype=np.float64) * beta


def ring_reduce_scatter_time(n_bytes, p: int, alpha: float, beta: float):
    """Ring reduce-scatter of ``n_bytes`` (``n/p`` left on each): ``(p-1) alpha + (p-1)/p n beta``."""
    _check(n_bytes, p, alpha, beta)
    return (p - 1) * alpha + (p - 1) / p * np.asarray(n_bytes, dtype=np.float64) * beta


def pairwise_alltoall_time(n_bytes, p: int, alpha: float, beta: float):
    """Pairwise-exchange all-to-all of ``n_bytes`` per process (``n/p`` to each peer, one peer
    per step): ``(p-1) alpha + (p-1)/p n beta``."""
    _check(n_bytes, p, alpha, beta)
    return (p - 1) * alpha + (p - 1) / p * np.asarray(n_bytes, dtype=np.float64) * beta


# ----------------------------------------------------------------------------- the ring, step by step


def ring_allreduce_steps(p: int, chunks: list[list[list[float]]]) -> list[dict]:
    """Simulate ring all-reduce on ``p`` processes. ``chunks[r][c]`` is process ``r``'s chunk ``c``
    (a list of numbers; chunk ``c`` has one length on every process, lengths may differ between
    chunks). Returns one record per state, the initial one first, then one after each of the
    ``2 (p - 1)`` steps: ``{"step", "phase", "sends", "values", "owners"}``, where ``sends`` lists
    ``(source, destination, chunk)`` of that step, ``values[r][c]`` is process ``r``'s chunk ``c``
    and ``owners[r][c]`` the sorted processes whose data it sums. In reduce-scatter step ``s``,
    process ``r`` sends chunk ``(r - s) mod p`` to ``r + 1``, which adds it to its own; in
    all-gather step ``s`` it sends the summed chunk ``(r + 1 - s) mod p``, which replaces the
    receiver's. Raises ``AssertionError`` if the end state is not the sum on every process."""
    if not (isinstance(p, int) and p >= 1):
        raise ValueError(f"p must be an integer >= 1, got {p!r}")
    if len(chunks) != p or any(len(row) != p for row in chunks):
        raise ValueError(f"chunks must be p = {p} lists (one per process) of p chunks each")
    lengths = [len(chunks[0][c]) for c in range(p)]
    if any(len(row[c]) != lengths[c] for row in chunks for c in range(p)):
        raise ValueError(f"chunk c must have one length on every process; process 0 has lengths {lengths}")
    values = [[list(map(float, chunk)) for chunk in row] for row in chunks]
    owners = [[{r} for _ in range(p)] for r in range(p)]

    def record(step: int, phase: str, sends: list) -> dict:
        return {"step": step, "phase": phase, "sends": sends, "values": [[list(c) for c in row] for row in values],
                "owners": [[sorted(o) for o in row] for row in owners]}  # fmt: skip

    history = [record(0, "start", [])]
    for step in range(2 * (p - 1)):
        reducing = step < p - 1
        s = step if reducing else step - (p - 1)
        sends = [(r, (r + 1) % p, (r - s) % p if reducing else (r + 1 - s) % p) for r in range(p)]
        messages = [(dst, c, list(values[src][c]), set(owners[src][c])) for src, dst, c in sends]  # all sent at once
        for dst, c, data, who in messages:
            if reducing:
                values[dst][c] = [a + b for a, b in zip(values[dst][c], data)]
                owners[dst][c] |= who
            else:
                values[dst][c], owners[dst][c] = data, who
        history.append(record(step + 1, "reduce-scatter" if reducing else "all-gather", sends))
    total = [[sum(chunks[r][c][i] for r in range(p)) for i in range(lengths[c])] for c in range(p)]
    for r in range(p):
        for c in range(p):
            assert owners[r][c] == set(range(p)), f"process {r} chunk {c} sums only {sorted(owners[r][c])}"
            assert all(math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) for a, b in zip(values[r][c], total[c])), (r, c)
    return history
