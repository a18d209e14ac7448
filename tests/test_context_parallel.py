"""Ring attention across CPU processes equals the whole attention, and zigzag balances causal work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llmnote.parallel.context import rank_positions, ring_attention, ring_attention_runs, ring_schedule
from llmnote.parallel.launch import spawn
from llmnote.ref.attention import flash_attention


def exact(q, k, v, causal):
    """Float64 softmax attention with grouped-query heads, (H, S, D)."""
    group = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


def inputs(hq=2, hkv=2, seq=64, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(h, seq, dim, dtype=torch.float64, generator=g) for h in (hq, hkv, hkv)]


def reassemble(results, shape):
    out = np.zeros(shape)
    for r in results:
        out[:, r["positions"]] = r["out"]
    return torch.from_numpy(out)


RUNS = [(causal, layout) for causal in (False, True) for layout in ("contiguous", "zigzag")]


_RESULTS: dict[int, list] = {}


def run_all(world):
    """Every run of RUNS on grouped-query inputs, in one group of processes (starting them costs seconds)."""
    if world not in _RESULTS:
        _RESULTS[world] = spawn(ring_attention_runs, world, *inputs(hq=4, hkv=2), RUNS)
    return _RESULTS[world]


@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_equals_reference(world):
    q, k, v = inputs(hq=4, hkv=2)  # grouped-query: 2 query heads per key/value head
    per_rank = run_all(world)
    for i, (causal, layout) in enumerate(RUNS):
        want = exact(q, k, v, causal)
        ref = flash_attention(q.float()[None], k.float()[None], v.float()[None], causal=causal)[0].double()
        torch.testing.assert_close(want, ref, rtol=0, atol=1e-5)
        results = [runs[i] for runs in per_rank]
        got = reassemble(results, q.shape)
        assert (got - want).abs().max() < 1e-12, f"{layout}, causal={causal}"
        covered = np.sort(np.concatenate([r["positions"] for r in results]))
        assert (covered == np.arange(q.shape[1])).all()
        for r, res in enumerate(results):
            assert res["sources"] == [(r - s) % world for s in range(world)]
            assert sum(res["sent_bytes"]) == (world - 1) * 2 * k.shape[0] * (q.shape[1] // world) * k.shape[2] * 8


def test_causal_work_balance():
    world, seq = 4, 64
    per_rank = run_all(world)
    work = {}
    for layout in ("contiguous", "zigzag"):
        results = [runs[RUNS.index((True, layout))] for runs in per_rank]
        work[layout] = [sum(r["pairs"]) for r in results]
        assert sum(work[layout]) == seq * (seq + 1) // 2, "every visible (query, key) pair exactly once"
    zig, con = work["zigzag"], work["contiguous"]
    assert max(zig) / min(zig) == 1.0
    block = seq // world
    assert con[0] == block * (block + 1) // 2 and con[-1] == (world - 1) * block**2 + block * (block + 1) // 2
    assert 0.85 * (2 * world - 1) < con[-1] / con[0] <= 2 * world - 1
    # the analytic schedule agrees with what the processes did, tile for tile
    for layout, counts in (("contiguous", con), ("zigzag", zig)):
        tiles = [t for step in ring_schedule(world, layout) for t in step]
        assert sorted({(qc, kc) for _, qc, kc in tiles}) == [(a, b) for a in range(2 * world) for b in range(a + 1)]
        c = seq // (2 * world)
        modelled = [sum(c * (c + 1) // 2 if qc == kc else c * c for r, qc, kc in tiles if r == rank) for rank in range(world)]
        assert modelled == counts, layout


def test_bad_inputs():
    with pytest.raises(ValueError, match="divisible by 8"):
        rank_positions(60, 4, "zigzag")
    with pytest.raises(ValueError, match="layout"):
        rank_positions(64, 4, "striped")
    q, k, v = inputs(seq=60)
    with pytest.raises(ValueError, match="divisible"):
        ring_attention(0, 4, q, k, v, True, "zigzag")
    with pytest.raises(ValueError, match="heads"):
        ring_attention(0, 1, q[:1], k, v)
    with pytest.raises(TypeError, match="float32 or float64"):
        ring_attention(0, 1, q.half(), k.half(), v.half())


def test_one_process_is_plain_attention():
    q, k, v = inputs(hq=2, hkv=1, seq=12)
    for causal in (False, True):
        res = ring_attention(0, 1, q, k, v, causal)
        torch.testing.assert_close(res["out"], exact(q, k, v, causal), rtol=0, atol=1e-12)
        assert res["sent_bytes"] == [0]
