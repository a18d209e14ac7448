"""FP8 and INT8 matrix products with scales, in plain PyTorch: the readable truth that
:mod:`llmnote.kernels.gemm.scaled` is checked against.

An 8-bit matrix stands for ``data * scale``: FP8 E4M3 (Micikevicius et al., 2022) or INT8 codes,
with a float32 scale per tensor, per row, or per block (DeepSeek-AI, 2024, DeepSeek-V3: one scale
per token and 128-channel block of the activations, one per 128 x 128 block of the weights).
W8A8 inference quantizes the activations on the fly, one scale a row (token), and multiplies the
codes (Xiao et al., 2022, SmoothQuant; Dettmers et al., 2022, LLM.int8()).
"""

from __future__ import annotations

import torch

from .._checks import SCALE_BLOCK, check_quantize_rows, check_scaled_gemm, check_scaled_linear

__all__ = ["fp8_gemm", "int8_gemm", "quantize_rows", "fp8_linear", "int8_linear", "expand_scale"]

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
INT8_MAX = 127.0  # symmetric: -127 .. 127 (-128 unused)


def expand_scale(scale: torch.Tensor, rows: int, cols: int, block_rows: bool = False) -> torch.Tensor:
    """The scale of every element of a ``(rows, cols)`` matrix, float32. ``scale`` is one number
    (``()`` or ``(1,)``), one per row ``(rows,)``, or 2-D block scales: one per row and 128-column
    block ``(rows, ceil(cols/128))``, or with ``block_rows`` one per 128 x 128 block
    ``(ceil(rows/128), ceil(cols/128))``."""
    if scale.dim() == 2:
        s = scale.repeat_interleave(SCALE_BLOCK, 0)[:rows] if block_rows else scale
        return s.repeat_interleave(SCALE_BLOCK, 1)[:, :cols].float()
    return scale.float().reshape(-1, 1).expand(rows, cols)


def fp8_gemm(
    a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """``(a * a_scale) @ (b * b_scale).T`` in float32, returned as ``out_dtype``.

    a ``(M, K)`` and b ``(N, K)`` float8_e4m3fn; float32 scales per tensor (``()``/``(1,)``), per
    row (a ``(M,)``, b ``(N,)``), or block (a ``(M, ceil(K/128))``, b ``(ceil(N/128), ceil(K/128))``).
    """
    check_scaled_gemm(a, a_scale, b, b_scale, "fp8", out_dtype)
    (M, K), N = a.shape, b.shape[0]
    a_real = a.float() * expand_scale(a_scale, M, K)
    b_real = b.float() * expand_scale(b_scale, N, K, block_rows=True)
    return (a_real @ b_real.T).to(out_dtype)


def int8_gemm(
    a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """``(a * a_scale) @ (b * b_scale).T`` for int8 a ``(M, K)`` and b ``(N, K)`` with per-tensor or
    per-row float32 scales: the exact integer products ``a @ b.T`` (what an int32 accumulator
    holds; computed in float64, where every integer below 2**53 is exact), then the scales in
    float32. Returns ``out_dtype``."""
    check_scaled_gemm(a, a_scale, b, b_scale, "int8", out_dtype)
    M, N = a.shape[0], b.shape[0]
    dots = (a.double() @ b.double().T).float()
    return (dots * expand_scale(a_scale, M, 1) * expand_scale(b_scale, N, 1).T).to(out_dtype)


def quantize_rows(x: torch.Tensor, kind: str, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax quantization of activations ``x`` (M, K), one scale per row (``block=None``) or per
    row and 128-column block (``block=128``, fp8 only).

    ``scale = absmax / 448`` (fp8) or ``absmax / 127`` (int8), 1 for an all-zero group; the codes
    are ``x / scale`` rounded to nearest (ties to even) in E4M3 or to an integer in [-127, 127].
    Returns ``(data, scale)``: data ``(M, K)`` float8_e4m3fn or int8, scale float32 ``(M,)`` or
    ``(M, ceil(K/128))``.
    """
    check_quantize_rows(x, kind, block)
    top = FP8_MAX if kind == "fp8" else INT8_MAX
    M, K = x.shape
    width = K if block is None else block
    xf = x.float()
    groups = torch.nn.functional.pad(xf, (0, -K % width)).view(M, -1, width)
    # a tensor divisor: CUDA divides a tensor by a Python number as a multiplication by its
    # reciprocal, which is not always the correctly rounded quotient the kernel computes
    scale = groups.abs().amax(dim=-1) / torch.tensor(top, device=x.device)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    scaled = (xf / scale.repeat_interleave(width, 1)[:, :K]).clamp(-top, top)
    data = scaled.to(torch.float8_e4m3fn) if kind == "fp8" else torch.round(scaled).to(torch.int8)
    return data, (scale[:, 0] if block is None else scale)


def _linear(x: torch.Tensor, w, kind: str) -> torch.Tensor:
    check_scaled_linear(x, w, kind)
    N, K = w.data.shape
    rows = x.reshape(-1, K)
    xq, xs = quantize_rows(rows, kind, block=SCALE_BLOCK if w.granularity == "block" else None)
    gemm = fp8_gemm if kind == "fp8" else int8_gemm
    return gemm(xq, xs, w.data, w.scale, out_dtype=x.dtype).reshape(*x.shape[:-1], N)


def fp8_linear(x: torch.Tensor, w) -> torch.Tensor:
    """``x @ W^T`` for an FP8 weight ``w`` (a :class:`~llmnote.quant.ScaledWeight` of an (N, K)
    matrix, any granularity): x ``(..., K)`` is quantized to FP8 per row (per row and
    128-column block when ``w`` has block scales), then multiplied. Returns ``(..., N)`` in x's dtype."""
    return _linear(x, w, "fp8")


def int8_linear(x: torch.Tensor, w) -> torch.Tensor:
    """``x @ W^T`` for an INT8 weight ``w`` (per-tensor or per-row scales): x ``(..., K)`` is
    quantized to INT8 per row, then multiplied. Returns ``(..., N)`` in x's dtype."""
    return _linear(x, w, "int8")
