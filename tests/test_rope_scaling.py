"""RoPE frequencies and their long-context rescalings."""

import math

import pytest
import torch

from llmnote import ref
from llmnote.models import rope_frequencies, yarn_attention_scale

D, THETA, CTX = 128, 10000.0, 4096


def test_default_frequencies_match_the_rope_tables():
    freq = rope_frequencies(D, THETA)
    cos, _ = ref.rope_cos_sin(5, D, base=THETA)
    torch.testing.assert_close(cos[3, : D // 2], torch.cos(3 * freq))
    assert freq[0] == 1.0 and torch.all(freq[1:] < freq[:-1])


def test_linear_and_ntk():
    base = rope_frequencies(D, THETA)
    torch.testing.assert_close(rope_frequencies(D, THETA, "linear", 4.0), base / 4)
    ntk = rope_frequencies(D, THETA, "ntk", 4.0)
    assert ntk[0] == base[0]  # the fastest pair is untouched...
    torch.testing.assert_close(ntk[-1], base[-1] / 4, rtol=1e-5, atol=0)  # ...the slowest divided by the factor
    assert torch.all(ntk <= base + 1e-12) and torch.all(ntk >= base / 4 - 1e-12)


@pytest.mark.parametrize("scaling", ["yarn", "llama3"])
def test_ramped_scalings_keep_fast_pairs_and_interpolate_slow_ones(scaling):
    base = rope_frequencies(D, THETA)
    scaled = rope_frequencies(D, THETA, scaling, 8.0, CTX)
    rotations = CTX * base / (2 * math.pi)
    fast, slow = rotations > 64, rotations < 0.5
    assert fast.any() and slow.any()
    torch.testing.assert_close(scaled[fast], base[fast])
    torch.testing.assert_close(scaled[slow], base[slow] / 8)
    ratio = scaled / base
    assert torch.all(ratio[1:] <= ratio[:-1] + 1e-7)  # the interpolation grows monotonically toward slow pairs


def test_yarn_attention_scale_and_errors():
    assert yarn_attention_scale(1.0) == 1.0
    assert yarn_attention_scale(8.0) == pytest.approx((0.1 * math.log(8) + 1) ** 2)
    with pytest.raises(ValueError, match="scaling"):
        rope_frequencies(D, THETA, "dynamic")
    with pytest.raises(ValueError, match="factor"):
        rope_frequencies(D, THETA, "linear", 0.5)
    with pytest.raises(ValueError, match="even"):
        rope_frequencies(7)
