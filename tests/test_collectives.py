"""The collectives' cost model, the ring simulation, and live timing in a gloo group."""

from __future__ import annotations

import random

import numpy as np
import pytest

from llmnote.parallel.collectives import (
    OPS,
    fit_alpha_beta,
    pairwise_alltoall_time,
    rabenseifner_allreduce_time,
    recursive_doubling_allreduce_time,
    ring_allgather_time,
    ring_allreduce_steps,
    ring_allreduce_time,
    ring_reduce_scatter_time,
    slowest_rank,
    time_collectives,
)
from llmnote.parallel.launch import spawn


@pytest.mark.parametrize("alpha, beta", [(20e-6, 1 / 5e9), (3e-6, 1 / 450e9), (1e-3, 0.0)])
def test_fit_recovers_alpha_and_beta(alpha: float, beta: float) -> None:
    rng = np.random.default_rng(0)
    sizes = 4096 * 2.0 ** np.arange(13)
    exact = alpha + beta * sizes
    a, b = fit_alpha_beta(sizes, exact)
    assert a == pytest.approx(alpha, rel=1e-6) and b == pytest.approx(beta, rel=1e-6, abs=1e-18)
    noisy = exact * rng.uniform(0.97, 1.03, size=sizes.size)
    a, b = fit_alpha_beta(sizes, noisy)
    assert a == pytest.approx(alpha, rel=0.1)
    np.testing.assert_allclose(a + b * sizes, exact, rtol=0.05)  # the line, at every size


def test_fit_never_returns_a_negative_term() -> None:
    sizes = np.array([1e3, 1e4, 1e5, 1e6])
    a, b = fit_alpha_beta(sizes, 1e-9 * sizes - 1e-7 * (sizes < 5e3) + 1e-6)  # data that pull alpha below zero
    assert a >= 0 and b > 0
    with pytest.raises(ValueError, match="sizes_bytes"):
        fit_alpha_beta([1.0], [1.0])


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_ring_simulation_ends_with_the_sum_everywhere(p: int) -> None:
    rng = random.Random(p)
    lengths = [rng.choice([1, 3, 5, 7]) for _ in range(p)]  # odd, unequal chunk sizes
    chunks = [[[rng.uniform(-1, 1) for _ in range(n)] for n in lengths] for _ in range(p)]
    history = ring_allreduce_steps(p, chunks)
    assert len(history) == 1 + 2 * (p - 1)
    assert [h["phase"] for h in history[1:]] == ["reduce-scatter"] * (p - 1) + ["all-gather"] * (p - 1)
    total = [np.sum([chunks[r][c] for r in range(p)], axis=0) for c in range(p)]
    for r in range(p):
        for c in range(p):
            np.testing.assert_allclose(history[-1]["values"][r][c], total[c], rtol=1e-12)
            assert history[-1]["owners"][r][c] == list(range(p))
    after_rs = history[p - 1]["owners"]  # after reduce-scatter each process holds exactly one complete chunk
    assert all(sum(len(o) == p for o in row) == 1 for row in after_rs)
    for h in history[1:]:  # every process sends one chunk to its right-hand neighbour each step
        assert sorted(src for src, _, _ in h["sends"]) == list(range(p))
        assert all(dst == (src + 1) % p for src, dst, _ in h["sends"])


def test_ring_simulation_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="chunks"):
        ring_allreduce_steps(2, [[[1.0], [2.0]]])
    with pytest.raises(ValueError, match="one length"):
        ring_allreduce_steps(2, [[[1.0], [2.0]], [[1.0, 2.0], [3.0]]])


def test_cost_model_limits() -> None:
    alpha, beta = 5e-6, 1 / 400e9
    for f in (ring_allreduce_time, recursive_doubling_allreduce_time, ring_allgather_time, ring_reduce_scatter_time,
              pairwise_alltoall_time, rabenseifner_allreduce_time):
        assert f(1e6, 1, alpha, beta) == 0  # one process: nothing to send
    n = 1e12
    assert ring_allreduce_time(n, 1024, alpha, beta) / (2 * n * beta) == pytest.approx(1, rel=2e-3)
    assert ring_allreduce_time(0, 8, alpha, beta) == pytest.approx(14 * alpha)
    assert recursive_doubling_allreduce_time(0, 8, alpha, beta) == pytest.approx(3 * alpha)
    big, small = 1e9, 1e3  # p = 8: the ring wins on bandwidth, recursive doubling on latency
    assert ring_allreduce_time(big, 8, alpha, beta) < recursive_doubling_allreduce_time(big, 8, alpha, beta)
    assert ring_allreduce_time(small, 8, alpha, beta) > recursive_doubling_allreduce_time(small, 8, alpha, beta)
    assert rabenseifner_allreduce_time(big, 8, alpha, beta) <= ring_allreduce_time(big, 8, alpha, beta)
    assert ring_allgather_time(n, 4, alpha, beta) + ring_reduce_scatter_time(n, 4, alpha, beta) == pytest.approx(
        ring_allreduce_time(n, 4, alpha, beta))
    with pytest.raises(ValueError, match="p must"):
        ring_allreduce_time(1e6, 0, alpha, beta)


def test_time_collectives_in_two_processes() -> None:
    sizes = [64, 4096]
    results = spawn(time_collectives, 2, sizes, 2)
    assert len(results) == 2
    merged = slowest_rank(results)
    assert {op for op, _ in merged} == set(OPS)  # gloo provides all five
    for op in OPS:
        for size in sizes:
            assert 0 < merged[op, size] < 5, (op, size, merged[op, size])
