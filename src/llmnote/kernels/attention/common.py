"""What the attention kernels share: scores kept in base 2, one step of the online softmax
(Milakov and Gimelshein, 2018) split into its softmax half and its ``P V`` half, and the
rewrite that gives every kernel a positive softmax scale."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

__all__ = ["LOG2E", "block_probs", "online_step", "positive_scale"]

LOG2E = 1 / math.log(2)  # scores are kept in base 2: exp(x) = exp2(x * log2 e)


@triton.jit
def block_probs(s, l_i, m_i, qk_scale, MASKED: tl.constexpr):
    """The softmax half of one online step: from raw scores ``s = q k^T`` (masked entries
    -inf) to unnormalised probabilities ``p``, the factor ``alpha`` that rescales what was
    accumulated before, and the new running sum and maximum (in scaled base-2 units). The
    scale (> 0) multiplies the row maximum, and then each score inside one fused
    multiply-add, ``exp2(s * scale - m)``. With ``MASKED``, rows that have seen only -inf
    so far stay empty."""
    m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
    if MASKED:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_use = m_new
    p = tl.math.exp2(s * qk_scale - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    return p, alpha, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def online_step(acc, l_i, m_i, s, v, qk_scale, MASKED: tl.constexpr):
    """Fold one block of raw scores ``s`` and its values ``v`` into the running (acc, l, m)."""
    p, alpha, l_i, m_i = block_probs(s, l_i, m_i, qk_scale, MASKED)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, l_i, m_i


def positive_scale(q: torch.Tensor, sm_scale: float) -> tuple[torch.Tensor, float]:
    """``(q', scale)`` with ``scale > 0`` and ``q' k^T * scale == q k^T * sm_scale``: the kernels
    scale each row's maximum instead of every score, which needs a positive scale."""
    sm_scale = float(sm_scale)
    if not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be finite, got {sm_scale}")
    if sm_scale > 0:
        return q, sm_scale
    return (torch.zeros_like(q) if sm_scale == 0 else -q), (1.0 if sm_scale == 0 else -sm_scale)
