"""The roofline model: arithmetic intensity, attainable performance, and where the work of
an LLM (matmuls, attention, elementwise ops) lands for a given GPU and format.

Attainable rate = min(peak compute, intensity x memory bandwidth), with intensity the
FLOPs a kernel performs per byte it must move through DRAM (Williams, Waterman and
Patterson, "Roofline", CACM 2009). Byte counts here are the *fewest* a kernel can move:
each input read once, each output written once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .hw import DTYPE_BYTES, GPUSpec, get_gpu
from .models.config import ModelConfig
from .models.zoo import MODEL_ZOO

__all__ = [
    "Workload",
    "LLAMA3_8B",
    "LLAMA3_70B",
    "attainable_tflops",
    "ridge_point",
    "matmul_workload",
    "elementwise_workload",
    "layer_workloads",
    "layer_workload",
    "crossing_batch",
    "wave_quantization",
]


def _bytes_per(dtype: str) -> float:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return DTYPE_BYTES[dtype]


def attainable_tflops(
    intensity,
    gpu: str | GPUSpec = "H200",
    dtype: str = "bf16",
    bandwidth_tbps: float | None = None,
    peak_tflops: float | None = None,
):
    """Roofline: ``min(peak, intensity * bandwidth)`` in TFLOP/s; ``intensity`` in FLOP/byte.

    Accepts a scalar or an array. ``bandwidth_tbps``/``peak_tflops`` override the
    datasheet values (for instance with measured ceilings).
    """
    spec = get_gpu(gpu)
    bw = spec.memory_tbps if bandwidth_tbps is None else bandwidth_tbps
    peak = spec.peak_tflops(dtype) if peak_tflops is None else peak_tflops
    x = np.asarray(intensity, dtype=float)
    if np.any(x <= 0):
        raise ValueError("intensity must be positive")
    out = np.minimum(peak, x * bw)
    return float(out) if out.ndim == 0 else out


def ridge_point(gpu: str | GPUSpec = "H200", dtype: str = "bf16") -> float:
    """FLOP/byte where the bandwidth roof meets the compute roof."""
    return get_gpu(gpu).ridge_point(dtype)


@dataclass(frozen=True)
class Workload:
    """A piece of work: how many FLOPs it does and the fewest DRAM bytes it must move."""

    name: str
    flops: float
    bytes: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    def bound(self, gpu: str | GPUSpec = "H200", dtype: str = "bf16") -> str:
        """``"memory"`` left of the ridge point, ``"compute"`` right of it."""
        return "memory" if self.intensity < ridge_point(gpu, dtype) else "compute"

    def min_time_s(self, gpu: str | GPUSpec = "H200", dtype: str = "bf16") -> float:
        """Lower bound on run time: the larger of compute time and memory time."""
        spec = get_gpu(gpu)
        return max(self.flops / (spec.peak_tflops(dtype) * 1e12), self.bytes / (spec.memory_tbps * 1e12))

    def attainable_tflops(self, gpu: str | GPUSpec = "H200", dtype: str = "bf16") -> float:
        return attainable_tflops(self.intensity, gpu, dtype)


def matmul_workload(m: int, n: int, k: int, dtype: str = "bf16", name: str | None = None) -> Workload:
    """``(m, k) @ (k, n)``: ``2mnk`` FLOPs; read A and B once, write C once."""
    for label, v in (("m", m), ("n", n), ("k", k)):
        if not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{label} must be a positive integer, got {v!r}")
    b = _bytes_per(dtype)
    return Workload(name or f"matmul {m}x{k}x{n}", 2.0 * m * n * k, (m * k + k * n + m * n) * b)


def crossing_batch(n: int, k: int, gpu: str | GPUSpec = "H200", dtype: str = "bf16", limit: int = 1 << 16) -> int:
    """Smallest M at which an ``(M, K) @ (K, N)`` product reaches the ridge point (compute-bound)."""
    target = ridge_point(gpu, dtype)
    for m in range(1, limit):
        if matmul_workload(m, n, k, dtype).intensity >= target:
            return m
    raise ValueError(f"no M below {limit} makes a ({n}, {k}) product compute-bound on {get_gpu(gpu).name} in {dtype}")


def wave_quantization(m: int, n: int, sms: int, block_m: int = 128, block_n: int = 128) -> tuple[int, int, float]:
    """Tiles of an ``m x n`` output, the waves they take on ``sms`` SMs (one tile per SM at a
    time), and the share of SM slots those waves keep busy."""
    tiles = math.ceil(m / block_m) * math.ceil(n / block_n)
    waves = math.ceil(tiles / sms)
    return tiles, waves, tiles / (waves * sms)


def elementwise_workload(
    numel: int, reads: int = 1, writes: int = 1, flops_per_element: float = 1.0, dtype: str = "bf16", name: str = "elementwise"
) -> Workload:
    """An elementwise kernel reading ``reads`` and writing ``writes`` tensors of ``numel`` elements."""
    if numel < 1 or reads < 0 or writes < 0 or reads + writes == 0:
        raise ValueError("numel must be >= 1 and the kernel must read or write something")
    return Workload(name, flops_per_element * numel, (reads + writes) * numel * _bytes_per(dtype))


# The book's running examples (sizes from the models' published config.json files).
LLAMA3_8B = MODEL_ZOO["Llama-3-8B"]
LLAMA3_70B = MODEL_ZOO["Llama-3-70B"]


def layer_workloads(
    shape: ModelConfig, batch: int, phase: str, seq_len: int = 512, context: int = 4096, dtype: str = "bf16"
) -> list[Workload]:
    """The work of one Llama-style decoder layer (``shape``: a model of the zoo, or any
    :class:`~llmnote.models.ModelConfig` with MHA, GQA or MQA attention), op by op.

    ``phase="prefill"``: ``batch`` prompts of ``seq_len`` tokens each, causal attention
    computed FlashAttention-style (scores never reach DRAM).
    ``phase="decode"``: one new token for each of ``batch`` sequences that already hold
    ``context`` tokens in the KV cache; attention reads that cache.
    """
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be 'prefill' or 'decode', got {phase!r}")
    if batch < 1 or seq_len < 1 or context < 1:
        raise ValueError("batch, seq_len and context must be >= 1")
    if shape.attention == "mla":
        raise ValueError(f"layer_workloads counts MHA/GQA/MQA layers; {shape.name or 'this model'} uses MLA")
    b = _bytes_per(dtype)
    h, d = shape.hidden_size, shape.head_dim
    q_width, kv_width = shape.num_heads * d, shape.num_kv_heads * d
    tokens = batch * (seq_len if phase == "prefill" else 1)
    ops = [
        matmul_workload(tokens, q_width + 2 * kv_width, h, dtype, "qkv_proj"),
        matmul_workload(tokens, h, q_width, dtype, "o_proj"),
        matmul_workload(tokens, 2 * shape.intermediate_size, h, dtype, "gate_up_proj"),
        matmul_workload(tokens, h, shape.intermediate_size, dtype, "down_proj"),
    ]
    if phase == "prefill":
        # QK^T and PV over the causal half of the seq_len x seq_len score matrix.
        flops = 4.0 * batch * shape.num_heads * d * seq_len * seq_len / 2
        moved = batch * seq_len * (2 * q_width + 2 * kv_width) * b  # read q, k, v; write o
    else:
        flops = 4.0 * batch * shape.num_heads * d * context
        moved = batch * (2 * context * kv_width + 2 * q_width) * b  # read the K and V caches
    ops.insert(1, Workload("attention", flops, moved))
    return ops


def layer_workload(
    shape: ModelConfig, batch: int, phase: str, seq_len: int = 512, context: int = 4096, dtype: str = "bf16"
) -> Workload:
    """All of :func:`layer_workloads` summed into one point for the roofline."""
    ops = layer_workloads(shape, batch, phase, seq_len, context, dtype)
    return Workload(f"{shape.name or 'decoder'} layer, {phase}", sum(op.flops for op in ops), sum(op.bytes for op in ops))
