"""Pure PyTorch reference of the quantized linear layers' products.

``w4a16_linear`` is what the W4A16 kernel must compute: the activations times the weight that the
packed integer codes and group scales stand for (Frantar et al., 2022, GPTQ; Lin et al., 2023,
AWQ, store weights this way). It dequantizes the whole weight, which is exactly the memory
traffic the kernel exists to avoid; here it is the readable truth.
"""

from __future__ import annotations

import torch

from .._checks import check_w4a16_linear

__all__ = ["w4a16_linear"]


def w4a16_linear(x: torch.Tensor, qweight) -> torch.Tensor:
    """``x @ qweight.dequantize().T``: x ``(..., K)`` fp16/bf16/fp32, ``qweight`` a
    :class:`~llmnote.quant.QuantizedWeight` of an ``(N, K)`` weight (codes of any width, 2 to 8
    bits). Multiplies in float32 and returns ``(..., N)`` in x's dtype."""
    check_w4a16_linear(x, qweight, four_bit_only=False)
    w = qweight.dequantize()  # (N, K), rounded to the weight's dtype as a 16-bit kernel would see it
    return (x.float() @ w.float().t()).to(x.dtype)
