"""RoPE's frequencies and the ways long-context models rescale them.

RoPE (Su et al., 2021) rotates dimension pair ``i`` of a head by ``position * f_i`` with
``f_i = theta^(-2i/d)``: fast rotations for small ``i``, slow ones for large ``i``. To run
past the trained context, the slow (low-frequency) pairs, which never completed a turn
during training, must be slowed further, while the fast ones can stay as they are:

* ``linear`` (position interpolation, Chen et al. 2023): every frequency divided by ``factor``;
* ``ntk`` ("NTK-aware" scaling, bloc97 2023): ``theta`` raised to ``theta * factor^(d/(d-2))``,
  which leaves the fastest pair alone and divides the slowest by exactly ``factor``;
* ``yarn`` (Peng et al. 2023): pairs that turn more than ``beta_fast`` times over the original
  context keep their frequency, pairs turning fewer than ``beta_slow`` times are interpolated
  by ``factor``, a linear ramp in between; attention logits are sharpened by
  ``(0.1 ln(factor) + 1)^2``;
* ``llama3`` (Meta, Llama 3.1): the same idea with the ramp set by wavelengths
  (``low_freq_factor``, ``high_freq_factor``).
"""

from __future__ import annotations

import math

import torch

__all__ = ["rope_frequencies", "yarn_attention_scale", "ROPE_SCALINGS"]

ROPE_SCALINGS = ("default", "linear", "ntk", "yarn", "llama3")


def _base(head_dim: int, theta: float) -> torch.Tensor:
    if head_dim % 2 or head_dim < 2:
        raise ValueError(f"head_dim must be even and >= 2, got {head_dim}")
    return theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def _ramp(rotations: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """0 at or below ``low`` rotations, 1 at or above ``high``, linear in between."""
    return ((rotations - low) / (high - low)).clamp(0.0, 1.0)


def rope_frequencies(
    head_dim: int,
    theta: float = 10000.0,
    scaling: str = "default",
    factor: float = 1.0,
    original_context: int = 4096,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    low_freq_factor: float = 1.0,
    high_freq_factor: float = 4.0,
) -> torch.Tensor:
    """The ``head_dim / 2`` rotation frequencies (radians per position), float32."""
    if scaling not in ROPE_SCALINGS:
        raise ValueError(f"scaling must be one of {ROPE_SCALINGS}, got {scaling!r}")
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    freq = _base(head_dim, theta)
    if scaling == "linear":
        freq = freq / factor
    elif scaling == "ntk":
        freq = _base(head_dim, theta * factor ** (head_dim / (head_dim - 2)))
    elif scaling == "yarn":
        rotations = original_context * freq / (2 * math.pi)  # turns over the original context
        keep = _ramp(rotations, beta_slow, beta_fast)
        freq = keep * freq + (1 - keep) * freq / factor
    elif scaling == "llama3":
        wavelength = 2 * math.pi / freq
        keep = _ramp(original_context / wavelength, low_freq_factor, high_freq_factor)
        freq = keep * freq + (1 - keep) * freq / factor
    return freq.float()


def yarn_attention_scale(factor: float) -> float:
    """YaRN's multiplier on attention logits: ``(0.1 ln(factor) + 1)^2`` (1 when not scaling)."""
    return (0.1 * math.log(factor) + 1.0) ** 2 if factor > 1 else 1.0
