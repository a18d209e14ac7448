"""Data parallelism and ZeRO-1 train exactly as one process on the whole batch; the memory formulas."""

from __future__ import annotations

import numpy as np
import pytest

from llmnote.parallel.data_parallel import (
    communication_per_gpu,
    train_data_parallel,
    train_single,
    train_zero1,
    training_memory_per_gpu,
)
from llmnote.parallel.launch import spawn


def test_memory_at_the_papers_point():
    # ZeRO's Figure 1: 7.5B parameters on 64 GPUs: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB.
    expected = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gb in expected.items():
        assert round(training_memory_per_gpu(7.5e9, 64, stage)["total"] / 1e9, 1) == gb


def test_memory_by_kind():
    m = training_memory_per_gpu(1e9, 4, 2)
    assert m == {"weights": 2e9, "gradients": 0.5e9, "optimizer": 3e9, "total": 5.5e9}
    assert all(training_memory_per_gpu(1e9, 1, s)["total"] == 16e9 for s in range(4))
    with pytest.raises(ValueError):
        training_memory_per_gpu(1e9, 0, 1)
    with pytest.raises(ValueError):
        training_memory_per_gpu(1e9, 2, 4)


def test_communication():
    assert communication_per_gpu(1e9, 8, 0) == communication_per_gpu(1e9, 8, 2) == 2 * 7 / 8 * 2e9
    assert communication_per_gpu(1e9, 8, 3) == 1.5 * communication_per_gpu(1e9, 8, 1)


def test_dp_and_zero1_equal_single_process():
    reference = train_single(steps=4, batch=8).numpy()
    dp = spawn(train_data_parallel, 2, 4, 8)
    zero = spawn(train_zero1, 2, 4, 8)
    for run in (dp, zero):
        for r in run:
            np.testing.assert_allclose(r["params"], reference, rtol=0, atol=1e-10)
    full = dp[0]["optimizer_state_bytes"]
    assert full == 2 * reference.size * 8  # two float64 moments per parameter
    assert [r["optimizer_state_bytes"] for r in zero] == [full // 2, full // 2]
    assert zero[0]["shard"] == (0, reference.size // 2) and zero[1]["shard"] == (reference.size // 2, reference.size)
    assert not np.allclose(reference, train_single(steps=0).numpy())  # training moved the parameters


def test_zero1_with_uneven_shards():
    reference = train_single(steps=3, batch=12).numpy()
    zero = spawn(train_zero1, 3, 3, 12)
    assert reference.size % 3  # the flat vector is padded
    for r in zero:
        np.testing.assert_allclose(r["params"], reference, rtol=0, atol=1e-10)
    assert sum(r["shard"][1] - r["shard"][0] for r in zero) == reference.size
