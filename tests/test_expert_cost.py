"""The expert-parallel cost model: all-to-all bytes, experts touched, routing loads and placement."""

import numpy as np
import pytest
import torch

from llmnote.parallel.expert_cost import (
    alltoall_bytes,
    balanced_placement,
    expected_experts_touched,
    imbalance,
    rank_loads,
    route_counts,
    zipf_popularity,
)


def test_alltoall_bytes_counts_rows_leaving_the_process():
    # 128 tokens, top-8, hidden 7168, bf16, 64 processes: 63/64 of 128 * 8 rows of 14,336 bytes
    assert alltoall_bytes(128, 8, 7168, 64) == 128 * 8 * 63 / 64 * 7168 * 2
    assert alltoall_bytes(1000, 2, 16, 1) == 0  # one process keeps everything
    np.testing.assert_allclose(alltoall_bytes(np.array([1, 2]), 1, 4, 2, dtype_bytes=1), [2, 4])
    with pytest.raises(ValueError, match="n must be"):
        alltoall_bytes(10, 2, 16, 0)
    with pytest.raises(ValueError, match="tokens must be"):
        alltoall_bytes(-1, 2, 16, 2)


def test_experts_touched_matches_simulation():
    assert expected_experts_touched(1, 8, 2) == pytest.approx(2)
    assert expected_experts_touched(0, 8, 2) == 0
    g = torch.Generator().manual_seed(0)
    for experts, top_k, batch in ((8, 2, 4), (64, 6, 20)):
        picks = torch.rand(3000, batch, experts, generator=g).topk(top_k, dim=-1).indices.reshape(3000, -1)
        touched = torch.zeros(3000, experts).scatter_(1, picks, 1).sum(1).mean()
        assert float(touched) == pytest.approx(expected_experts_touched(batch, experts, top_k), rel=0.02)
    with pytest.raises(ValueError, match="top_k"):
        expected_experts_touched(4, 4, 5)


def test_routing_counts_and_skew():
    g = torch.Generator().manual_seed(1)
    uniform = zipf_popularity(16, 0.0, g)
    torch.testing.assert_close(uniform, torch.full((16,), 1 / 16, dtype=torch.float64))
    skewed = zipf_popularity(16, 1.2, g)
    assert skewed.sum().item() == pytest.approx(1) and skewed.max() / skewed.min() == pytest.approx(16**1.2)
    counts = route_counts(4000, skewed, 2, g)
    assert counts.sum() == 8000 and counts.shape == (16,)
    hottest = int(skewed.argmax())
    assert counts[hottest] == counts.max() and counts[hottest] <= 4000  # top-k picks are distinct
    even = route_counts(4000, uniform, 2, g)
    assert imbalance(rank_loads(even, 4)) < 1.05 < imbalance(rank_loads(counts, 4))
    with pytest.raises(ValueError, match="multiple of n"):
        rank_loads(counts, 3)


def test_balanced_placement():
    counts = torch.tensor([10, 10, 10, 10, 1, 1, 1, 1])
    assert rank_loads(counts, 4).tolist() == [20, 20, 2, 2]
    loads, placed = balanced_placement(counts, 4)
    assert loads.tolist() == [11.0] * 4 and sorted(sum(placed, [])) == list(range(8))
    assert all(len(p) == 2 for p in placed)
    # one very hot expert: only a replica can split its load
    hot = torch.tensor([60, 5, 5, 5, 5, 5, 5, 10])
    plain, _ = balanced_placement(hot, 4)
    replicated, placed = balanced_placement(hot, 4, redundant=4)
    assert imbalance(plain) == pytest.approx(65 / 25)
    assert imbalance(replicated) < 1.3 and sum(p.count(0) for p in placed) >= 3
    assert replicated.sum().item() == pytest.approx(100)
    with pytest.raises(ValueError, match="divisible"):
        balanced_placement(hot, 3)
    with pytest.raises(ValueError, match="positive mean"):
        imbalance(torch.zeros(3))
