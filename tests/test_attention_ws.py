"""The warp-specialised Gluon FlashAttention kernel, compiled for Hopper without a GPU (it
runs in ``tests/test_kernels_gpu.py``): it must fit an SM and never spill."""

import re

import pytest
import torch

from llmnote.kernels import attention
from llmnote.kernels.attention import flash_ws


@pytest.mark.parametrize("causal", [False, True])
def test_compiles_for_hopper_without_spilling(causal):
    k = flash_ws.compile_for_hopper(causal)
    assert k.metadata["num_warps"] == 12  # 4 + 4 consumer warps, 1 producer warp padded to a warpgroup
    assert k.metadata["shared"] <= 227 * 1024  # Q, O, 2 K and 2 V buffers fit in an H100/H200 SM
    assert k.resources["LOCAL"] == 0  # no register spills, even at 168 registers per thread on average
    regs = set(re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", k.text("ptx")))
    assert ("dec", "24") in regs and ("inc", "240") in regs  # the producer gives registers to the consumers
    # per consumer: the score and the P V product, 8 wgmma (k = 16) each, in several places
    assert k.count("sass", r"\bHGMMA\.") >= 2 * 2 * 8


def test_not_used_off_hopper():
    q = torch.randn(1, 2, 8, 128, dtype=torch.float16)
    assert not flash_ws.use_warp_specialized(q, q, q)  # CPU tensors
    out = attention.flash_attention(q, q, q, causal=True)  # the interpreter path
    assert torch.allclose(out.float(), attention.flash_attention_triton(q, q, q, causal=True).float())
