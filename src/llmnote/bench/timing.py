"""Timing GPU work properly: CUDA events, warm-up, many repetitions, the median, inputs
rotated so that repeated runs do not just measure a warm L2 cache, and a correctness check
before anything is timed."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch

__all__ = ["check_before_timing", "cuda_time_ms", "rotating_inputs"]


def rotating_inputs(
    make: Callable[[], tuple], bytes_per_set: int, min_total_bytes: int = 256 << 20, max_sets: int = 32
) -> list[tuple]:
    """Build enough independent input sets that cycling through them overflows the L2.

    ``make()`` returns one tuple of arguments; ``bytes_per_set`` is its size. The sets
    together cover at least ``min_total_bytes`` (default 256 MiB, five times an H100's L2).
    """
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be positive, got {bytes_per_set}")
    count = max(1, min(max_sets, -(-min_total_bytes // bytes_per_set)))
    return [make() for _ in range(count)]


def cuda_time_ms(
    fn: Callable[..., object],
    inputs: Sequence[tuple],
    warmup: int = 10,
    rep: int = 50,
    min_time_ms: float = 0.0,
    graph_calls: int = 0,
) -> float:
    """Median milliseconds of ``fn(*inputs[i % len(inputs)])`` timed with CUDA events.

    Each call is bracketed by its own pair of events and the calls are queued without
    waiting, so while the CPU stays ahead of the GPU, launch gaps are not counted.
    ``warmup`` calls run first (compilation, autotuning, cuBLAS heuristics).
    With ``min_time_ms`` the repetition count grows until that much time is covered.

    Kernels shorter than a Python launch (tens of microseconds of CPU time for a
    framework call) starve the GPU: it idles between calls, and the events around a call
    then include the wait for its launch. ``graph_calls=n`` captures ``n`` calls in one CUDA graph,
    times each replay and divides by ``n``, which removes launch gaps.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("cuda_time_ms needs a CUDA GPU; on a CPU the book shows recorded numbers instead")
    if not inputs:
        raise ValueError("inputs must hold at least one argument tuple")
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    if graph_calls > 0:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(graph_calls):
                fn(*inputs[i % len(inputs)])
        per_replay = cuda_time_ms(graph.replay, [()], warmup=3, rep=max(5, rep // 5), min_time_ms=min_time_ms)
        return per_replay / graph_calls
    times: list[float] = []
    done = 0
    while done < rep or sum(times) < min_time_ms:
        # Queue a batch of calls, each between its own events, and synchronize once: the
        # CPU runs ahead of the GPU, so host-side launch cost stays out of the numbers.
        batch = max(rep - done, 10)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(batch)]
        for j, (start, end) in enumerate(events):
            args = inputs[(done + j) % len(inputs)]
            start.record()
            fn(*args)
            end.record()
        torch.cuda.synchronize()
        times.extend(start.elapsed_time(end) for start, end in events)
        done += batch
    return statistics.median(times)


def check_before_timing(name: str, out: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    """Raise ``AssertionError`` unless ``out`` is within relative error ``tol`` of ``expected``
    (Frobenius norms; NaN fails): a wrong kernel is never timed."""
    err = ((out.float() - expected.float()).norm() / expected.float().norm()).item()
    if not err < tol:  # also catches NaN
        raise AssertionError(f"{name}: relative error {err:.2e} exceeds {tol:.0e}; not timing a wrong kernel")
