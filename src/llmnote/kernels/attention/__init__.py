"""Attention kernels in Triton and Gluon.

* ``common``: what they share (base-2 scores, one online-softmax step, a positive scale);
* ``flash``: the FlashAttention forward (a pointer kernel, its TMA variant for Hopper and
  newer, their launch configurations, and the dispatcher behind ``flash_attention``);
* ``flash_ws``: the warp-specialised Gluon kernel ``flash_attention`` runs on Hopper;
* ``varlen``: the forward over sequences packed along the token dimension;
* ``paged``: decode attention against a paged KV cache, with split-KV and its merge.
"""

from .common import LOG2E, block_probs, online_step, positive_scale
from .flash import (
    attention_configs,
    flash_attention,
    flash_attention_triton,
    flash_dispatch,
    flash_fwd_kernel,
    flash_fwd_tma_kernel,
    flash_launch,
    flash_ws,
    key_range,
    prefetch_l2,
    tma_attention_configs,
    use_tma,
)
from .paged import decode_splits, merge_splits_kernel, paged_attention_decode, paged_decode_kernel
from .varlen import flash_attention_varlen, flash_varlen_kernel, varlen_config

__all__ = [
    "LOG2E",
    "attention_configs",
    "block_probs",
    "decode_splits",
    "flash_attention",
    "flash_attention_triton",
    "flash_attention_varlen",
    "flash_dispatch",
    "flash_fwd_kernel",
    "flash_fwd_tma_kernel",
    "flash_launch",
    "flash_varlen_kernel",
    "flash_ws",
    "key_range",
    "merge_splits_kernel",
    "online_step",
    "paged_attention_decode",
    "paged_decode_kernel",
    "positive_scale",
    "prefetch_l2",
    "tma_attention_configs",
    "use_tma",
    "varlen_config",
]

if flash_ws is not None:  # None on a Triton without Gluon: the Triton kernels then serve every case
    from .flash_ws import compile_for_hopper, flash_attention_ws, use_warp_specialized

    __all__ += ["compile_for_hopper", "flash_attention_ws", "use_warp_specialized"]
