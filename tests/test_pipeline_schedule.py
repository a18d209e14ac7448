"""The modelled GPipe schedule: its bubble is (P - 1) / (m + P - 1), no stage runs two
micro-batches at once, a micro-batch visits the stages in order, and the slowest stage sets the pace."""

import itertools

import pytest

from llmnote.parallel.schedule import bubble_fraction, gpipe_schedule, idle_fraction, makespan


@pytest.mark.parametrize("stages, micro_batches", list(itertools.product([1, 2, 3, 4, 8], [1, 2, 5, 8, 16])))
def test_idle_share_of_equal_stages_is_the_bubble_formula(stages, micro_batches):
    bars = gpipe_schedule(stages, micro_batches, 2.5)
    assert len(bars) == stages * micro_batches
    assert makespan(bars) == pytest.approx(2.5 * (micro_batches + stages - 1))
    assert idle_fraction(bars) == pytest.approx((stages - 1) / (micro_batches + stages - 1))
    assert idle_fraction(bars) == pytest.approx(bubble_fraction(stages, micro_batches))


@pytest.mark.parametrize("times", [[1.0, 1.0, 1.0, 1.0], [3.0, 2.0, 2.0], [1.0, 4.0, 0.5], [0.2]])
def test_no_stage_runs_two_micro_batches_at_once_and_each_follows_the_previous_stage(times):
    m = 6
    bars = gpipe_schedule(len(times), m, times)
    at = {(b.stage, b.micro_batch): b for b in bars}
    for s, t in enumerate(times):
        own = sorted((b for b in bars if b.stage == s), key=lambda b: b.start)
        assert [b.micro_batch for b in own] == list(range(m))
        assert all(b.end - b.start == pytest.approx(t) for b in own)
        assert all(a.end <= b.start + 1e-12 for a, b in zip(own, own[1:]))  # one at a time
        if s:
            assert all(at[s, k].start >= at[s - 1, k].end for k in range(m))  # after the stage before ends it
    assert at[0, 0].start == 0.0
    assert makespan(bars) == pytest.approx(sum(times) + (m - 1) * max(times))  # the slowest stage sets the pace


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="stages must be >= 1"):
        gpipe_schedule(0, 4)
    with pytest.raises(ValueError, match="micro_batches must be >= 1"):
        gpipe_schedule(2, 0)
    with pytest.raises(ValueError, match="one time per stage"):
        gpipe_schedule(3, 4, [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        gpipe_schedule(2, 4, [1.0, 0.0])
    with pytest.raises(ValueError, match="must not be empty"):
        makespan([])
