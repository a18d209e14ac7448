"""The memory-hierarchy widget: how many bytes cross each level of a GPU for one piece of
work, and what each crossing costs in time at that level's bandwidth.

Two workloads, each animated over its variants:

* ``"matmul"``: an ``n x n x n`` product computed naively (every multiply-add fetches
  both operands) and with square tiles of growing size staged in shared memory;
* ``"elementwise"``: the chain ``gelu(x * s + b) + r`` run as four kernels, two, or one.

The traffic model (stated in :func:`matmul_traffic` and :func:`elementwise_traffic`) is
deliberately simple: it is the arithmetic of reuse, not a cache simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..hw import DTYPE_BYTES, GPUSpec, get_gpu, memory_levels
from .common import animation_controls

__all__ = ["Traffic", "matmul_traffic", "elementwise_traffic", "memory_hierarchy_figure", "MATMUL_TILES"]

MATMUL_TILES = (1, 16, 32, 64, 128, 256)
BOUNDARIES = ("DRAM → L2", "L2 → SMs (shared/L1)", "shared/L1 → registers/tensor cores")


@dataclass(frozen=True)
class Traffic:
    """Bytes crossing each boundary (ordered as ``BOUNDARIES``) and the FLOPs performed."""

    label: str
    bytes: tuple[float, float, float]
    flops: float


def matmul_traffic(n: int, tile: int, gpu: str | GPUSpec = "H200", dtype: str = "bf16") -> Traffic:
    """Traffic of ``C = A @ B`` with all three ``n x n``, computed with ``tile x tile`` blocks.

    * shared/L1 -> registers and tensor cores: each multiply-add needs two operands. A
      warp group that keeps a ``tile/2 x tile`` block of C in its accumulators (as Hopper's
      ``wgmma`` does) uses each fetched element of A ``tile`` times and each element of B
      ``tile/2`` times: ``n^3 b (2/tile + 1/tile)``. The naive kernel reuses nothing: ``2 n^3 b``.
    * L2 -> SMs: a block loads a ``tile x n`` panel of A and an ``n x tile`` panel of B for
      its ``tile x tile`` piece of C: ``2 n^3 b / tile`` plus writing C.
    * DRAM -> L2: the blocks running at once (one per SM, launched in grouped order so
      they form a square) share their panels through L2, a further ``sqrt(SMs)`` reuse;
      never less than reading A and B and writing C once.
    ``tile=1`` is the naive kernel with no reuse at all.
    """
    spec = get_gpu(gpu)
    if n < 1 or tile < 1:
        raise ValueError("n and tile must be positive")
    b = DTYPE_BYTES[dtype]
    fma_operands = 2.0 * n**3 * b
    to_registers = fma_operands if tile == 1 else n**3 * b * (1 / max(1, tile // 2) + 1 / tile)
    c_bytes = n * n * b
    l2_to_sm = fma_operands / tile + c_bytes
    dram = max(3 * c_bytes, fma_operands / (tile * math.sqrt(spec.sm_count)) + c_bytes)
    label = "naive" if tile == 1 else f"{tile}x{tile} tiles"
    return Traffic(label, (dram, l2_to_sm, to_registers), 2.0 * n**3)


def elementwise_traffic(numel: int, kernels: int, dtype: str = "bf16") -> Traffic:
    """``gelu(x * s + b) + r`` over ``numel`` elements, run as 4, 2 or 1 kernels.

    Every kernel reads its inputs from DRAM and writes its output back; between kernels
    the intermediate makes a full round trip. 4 kernels move 9 tensors, 2 move 5, 1
    moves 3. Elementwise work uses no shared memory, so every level sees the same bytes.
    """
    moved = {4: 9, 2: 5, 1: 3}
    if kernels not in moved:
        raise ValueError(f"kernels must be 4, 2 or 1, got {kernels}")
    nbytes = moved[kernels] * numel * DTYPE_BYTES[dtype]
    label = {4: "4 kernels (eager)", 2: "2 kernels", 1: "1 fused kernel"}[kernels]
    return Traffic(label, (nbytes, nbytes, nbytes), 23.0 * numel)


def _level_labels(spec: GPUSpec) -> list[str]:
    levels = memory_levels(spec)  # registers, shared/L1, L2, DRAM

    def fmt(level) -> str:
        cap = level.capacity_bytes
        size = f"{cap / 1e9:.0f} GB" if cap >= 1e9 else f"{cap / 2**20:.0f} MiB"
        approx = "≈" if level.estimate else ""
        return f"{size} @ {approx}{level.bandwidth_tbps:.1f} TB/s"

    return [
        f"DRAM → L2<br><sub>{levels[3].name}: {fmt(levels[3])}</sub>",
        f"L2 → SMs<br><sub>L2: {fmt(levels[2])}</sub>",
        f"shared/L1 → registers<br><sub>shared+L1: {fmt(levels[1])}</sub>",
    ]


def memory_hierarchy_figure(
    gpu: str | GPUSpec = "H200", workload: str = "matmul", n: int = 8192, numel: int = 1 << 26, dtype: str = "bf16"
) -> go.Figure:
    """Animated bars: bytes per boundary (left) and time at each level's bandwidth (right).

    The slowest level, or the math if that is slower, is drawn in red: it bounds the run
    time. Frames step through the naive-to-tiled matmul or the unfused-to-fused chain.
    """
    spec = get_gpu(gpu)
    if workload == "matmul":
        variants = [matmul_traffic(n, t, spec, dtype) for t in MATMUL_TILES]
        what = f"{n}x{n}x{n} matmul in {dtype}"
    elif workload == "elementwise":
        variants = [elementwise_traffic(numel, k, dtype) for k in (4, 2, 1)]
        what = f"gelu(x·s + b) + r over {numel / 2**20:.0f}M {dtype} elements"
    else:
        raise ValueError(f"workload must be 'matmul' or 'elementwise', got {workload!r}")
    levels = memory_levels(spec)
    bandwidths = [levels[3].bandwidth_tbps, levels[2].bandwidth_tbps, levels[1].bandwidth_tbps]
    peak = spec.peak_tflops(dtype) if workload == "matmul" else spec.fp32_tflops
    labels = _level_labels(spec)
    time_labels = [
        *labels,
        "math<br><sub>"
        + (f"tensor cores @ {peak:,.0f} TFLOP/s" if workload == "matmul" else f"CUDA cores @ {peak:,.0f} TFLOP/s")
        + "</sub>",
    ]

    def traces(v: Traffic) -> list[go.Bar]:
        times = [nb / (bw * 1e12) * 1e6 for nb, bw in zip(v.bytes, bandwidths)] + [v.flops / (peak * 1e12) * 1e6]
        worst = max(range(4), key=lambda i: times[i])
        colors = ["#d62728" if i == worst else "#1f77b4" for i in range(4)]
        return [
            go.Bar(
                x=list(v.bytes),
                y=labels,
                orientation="h",
                marker_color=colors[:3],
                text=[f"{nb / 1e9:,.2f} GB" for nb in v.bytes],
                textposition="auto",
                textangle=0,
                name="bytes",
                hovertemplate="%{y}<br>%{x:.3s}B<extra></extra>",
            ),
            go.Bar(
                x=times,
                y=time_labels,
                orientation="h",
                marker_color=colors,
                text=[f"{t:,.0f} µs" for t in times],
                textposition="outside",
                textangle=0,
                cliponaxis=False,
                name="time",
                xaxis="x2",
                yaxis="y2",
                hovertemplate="%{y}<br>%{x:,.1f} µs<extra></extra>",
            ),
        ]

    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.22,
        subplot_titles=("bytes crossing each boundary", "time at that level's bandwidth (red: the bound)"),
    )
    first = traces(variants[0])
    fig.add_trace(first[0], row=1, col=1)
    fig.add_trace(first[1], row=1, col=2)
    fig.frames = [go.Frame(name=v.label, data=traces(v), traces=[0, 1]) for v in variants]
    max_bytes = max(max(v.bytes) for v in variants)
    min_bytes = min(min(v.bytes) for v in variants)
    max_time = max(max(nb / (bw * 1e12) * 1e6 for nb, bw in zip(v.bytes, bandwidths)) for v in variants)
    updatemenus, sliders = animation_controls([v.label for v in variants], prefix="", duration_ms=1200, y=-0.3)
    fig.update_layout(
        title=f"{spec.name}: {what}",
        showlegend=False,
        height=560,
        margin=dict(t=90, b=190, l=10),
        template="plotly_white",
        updatemenus=updatemenus,
        sliders=sliders,
    )
    fig.update_xaxes(type="log", title="bytes", range=[math.log10(min_bytes / 3), math.log10(max_bytes * 3)], row=1, col=1)
    fig.update_xaxes(
        type="log",
        title="µs",
        range=[math.log10(max(min(v.flops for v in variants) / (peak * 1e12) * 1e6, 1e-2) / 3), math.log10(max_time * 3)],
        row=1,
        col=2,
    )
    fig.update_yaxes(autorange="reversed", row=1, col=1)
    fig.update_yaxes(autorange="reversed", row=1, col=2)
    return fig
