"""LLM.int8()'s mixed-precision decomposition (Dettmers et al. 2022), simulated in plain PyTorch.

In large models a few input features (columns of the activations ``x``) carry values far larger
than the rest, in nearly every token. With one INT8 scale per token, such a column sets every
token's scale and the ordinary features round to a handful of levels. LLM.int8() splits the
product along the reduction dimension ``K``:

    x W^T = x[:, O] W[:, O]^T  +  x[:, R] W[:, R]^T,

where ``O`` are the columns whose magnitude exceeds a threshold (6.0 in the paper) and ``R`` the
rest. The outlier part, a thin GEMM of ``|O|`` columns, runs in 16 bits (here in float32); the
regular part runs in INT8 with *vector-wise* scales, one per token (row of ``x``) and one per
output channel (row of ``W``), which factor out of the integer dot product:

    x[m, R] · W[n, R] ~ s_x[m] s_w[n] (q_x[m, R] · q_w[n, R]).
"""

from __future__ import annotations

import math

import torch

__all__ = ["int8_mixed_matmul", "vectorwise_int8_matmul"]

INT8_MAX = 127.0


def _absmax_codes(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT8 codes of each row of ``v`` (M, K) with that row's absmax scale:
    integer-valued float64 codes in [-127, 127] and the scales (M, 1)."""
    scale = v.abs().amax(dim=1, keepdim=True) / INT8_MAX
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(v / scale).clamp(-INT8_MAX, INT8_MAX), scale


def _check(x: torch.Tensor, w: torch.Tensor) -> None:
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if x.dim() < 1:
        raise ValueError("x must have shape (..., K), got a scalar")
    if w.dim() != 2:
        raise ValueError(f"w must have shape (N, K), got {tuple(w.shape)}")
    if x.shape[-1] != w.shape[1]:
        raise ValueError(f"x's last dim ({x.shape[-1]}) must equal w's in_features ({w.shape[1]})")
    if x.device != w.device:
        raise ValueError(f"x and w must be on the same device, got {x.device} and {w.device}")


def vectorwise_int8_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` with ``x`` (M, K) quantized to INT8 per row (token) and ``w`` (N, K) per row
    (output channel), both symmetric absmax; returns (M, N) float32.

    The integer product is computed exactly (in float64, as an INT8 tensor core with an INT32
    accumulator would), then each output is multiplied by its token's and channel's scales.
    """
    _check(x, w)
    qx, sx = _absmax_codes(x.reshape(-1, x.shape[-1]).double())
    qw, sw = _absmax_codes(w.double())
    y = (qx @ qw.t()) * sx * sw.t()
    return y.float().reshape(*x.shape[:-1], w.shape[0])


def int8_mixed_matmul(x: torch.Tensor, w: torch.Tensor, threshold: float = 6.0) -> tuple[torch.Tensor, torch.Tensor]:
    """LLM.int8(): ``x @ w.T`` with the outlier columns of ``x`` kept in high precision.

    ``x`` (..., K) activations, ``w`` (N, K) a Linear's weight, any float dtypes. A column ``k``
    of ``x`` (an input feature, over all its tokens) is an outlier when ``max |x[..., k]|`` exceeds
    ``threshold``. Outlier columns are multiplied in float32; the rest go through
    :func:`vectorwise_int8_matmul`; the two partial products are summed.

    Returns ``(y, outlier_columns)``: ``y`` (..., N) float32, and the sorted indices of the outlier
    columns, int64 ``(num_outliers,)``. ``threshold=0`` keeps every nonzero column in float32 (the
    exact product); ``threshold=math.inf`` keeps none (plain vector-wise INT8).
    """
    _check(x, w)
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or math.isnan(threshold) or threshold < 0:
        raise ValueError(f"threshold must be a number >= 0, got {threshold!r}")
    x2 = x.reshape(-1, x.shape[-1]).float()
    wf = w.float()
    is_outlier = x2.abs().amax(dim=0) > threshold  # (K,)
    outlier_columns = torch.nonzero(is_outlier).flatten()
    regular = ~is_outlier

    y = torch.zeros(x2.shape[0], w.shape[0], dtype=torch.float32, device=x.device)
    if outlier_columns.numel():  # the thin high-precision GEMM over the outlier features
        y += x2[:, outlier_columns] @ wf[:, outlier_columns].t()
    if regular.any():  # the INT8 GEMM over the rest: a gather of the regular columns first
        y += vectorwise_int8_matmul(x2[:, regular], wf[:, regular])
    return y.reshape(*x.shape[:-1], w.shape[0]), outlier_columns
