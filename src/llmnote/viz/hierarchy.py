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
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..hw import DTYPE_BYTES, GPUSpec, get_gpu, memory_levels
from .common import animation_controls, log_ticks, si_label

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
    gpu: str | GPUSpec = "H200",
    workload: str = "matmul",
    n: int = 8192,
    numel: int = 1 << 26,
    dtype: str = "bf16",
    gpus: Sequence[str] | None = None,
) -> go.Figure:
    """Animated bars: bytes per boundary (top) and time at each level's bandwidth (bottom).

    The slowest level, or the math if that is slower, is drawn in red: it bounds the run
    time. Frames step through the naive-to-tiled matmul or the unfused-to-fused chain.
    With ``gpus`` (names of ``llmnote.hw``), a menu switches between those GPUs, ``gpu``
    first shown; a GPU whose tensor cores lack ``dtype`` runs the matmul in fp16. The menu,
    the slider and the Play button all work on a static page.
    """
    if workload not in ("matmul", "elementwise"):
        raise ValueError(f"workload must be 'matmul' or 'elementwise', got {workload!r}")
    names = list(dict.fromkeys(get_gpu(name).name for name in gpus or ()))
    if get_gpu(gpu).name not in names:
        names.insert(0, get_gpu(gpu).name)
    specs = [get_gpu(name) for name in names]
    active = names.index(get_gpu(gpu).name)
    panels = [_hierarchy_panels(spec, workload, n, numel, dtype) for spec in specs]
    frame_names = [v.label for v in panels[0].variants]
    all_bytes = [nb for p in panels for v in p.variants for nb in v.bytes]
    all_times = [t for p in panels for v in p.variants for t in p.times_us(v)]
    bytes_range = (min(all_bytes) / 3, max(all_bytes) * 8)
    time_range = (min(all_times) / 3, max(all_times) * 8)

    fig = make_subplots(
        rows=2,
        cols=1,
        vertical_spacing=0.2,
        row_heights=[0.43, 0.57],
        subplot_titles=("bytes crossing each boundary", "time at that level's bandwidth (red: the bound)"),
    )
    for g, p in enumerate(panels):
        bytes_bar, time_bar = p.traces(p.variants[0])
        bytes_bar.visible = time_bar.visible = g == active
        fig.add_trace(bytes_bar, row=1, col=1)
        fig.add_trace(time_bar, row=2, col=1)
    fig.frames = [
        go.Frame(name=name, data=[t for p in panels for t in p.traces(p.variants[i])], traces=list(range(2 * len(panels))))
        for i, name in enumerate(frame_names)
    ]
    short = [name.removesuffix(" tiles") for name in frame_names] if workload == "matmul" else None
    updatemenus, sliders = animation_controls(frame_names, prefix="", duration_ms=1200, y=-0.12, labels=short)
    if len(panels) > 1:
        updatemenus.append(
            dict(
                type="dropdown",
                direction="down",
                x=1.0,
                y=1.09,  # below the modebar that plotly shows at the top right
                xanchor="right",
                yanchor="bottom",
                active=active,
                buttons=[
                    dict(
                        label=p.spec.name,
                        method="update",
                        args=[{"visible": [i == g for i in range(len(panels)) for _ in range(2)]}, {"title.text": p.title}],
                    )
                    for g, p in enumerate(panels)
                ],
            )
        )
    fig.update_layout(
        title=dict(text=panels[active].title),
        showlegend=False,
        height=700,
        margin=dict(t=110, b=150, l=10, r=10),
        template="plotly_white",
        updatemenus=updatemenus,
        sliders=sliders,
    )
    fig.update_xaxes(type="log", title_text="bytes (log scale)", range=_log_range(bytes_range), row=1, col=1)
    fig.update_xaxes(**log_ticks(*bytes_range, "B"), row=1, col=1)
    fig.update_xaxes(type="log", title_text="time (log scale)", range=_log_range(time_range), row=2, col=1)
    fig.update_xaxes(**log_ticks(*time_range, "s", scale=1e-6), row=2, col=1)
    fig.update_yaxes(autorange="reversed", automargin=True)
    return fig


def _log_range(bounds: tuple[float, float]) -> list[float]:
    return [math.log10(bounds[0]), math.log10(bounds[1])]


@dataclass(frozen=True)
class _Panels:
    """The bars of one GPU: its traffic variants, level bandwidths and math rate."""

    spec: GPUSpec
    title: str
    variants: list[Traffic]
    bandwidths: list[float]
    peak_tflops: float
    labels: list[str]
    time_labels: list[str]

    def times_us(self, v: Traffic) -> list[float]:
        """µs per boundary at its bandwidth, then the math at the peak rate."""
        return [nb / (bw * 1e12) * 1e6 for nb, bw in zip(v.bytes, self.bandwidths)] + [v.flops / (self.peak_tflops * 1e12) * 1e6]

    def traces(self, v: Traffic) -> list[go.Bar]:
        times = self.times_us(v)
        worst = max(range(4), key=lambda i: times[i])
        colors = ["#d62728" if i == worst else "#1f77b4" for i in range(4)]
        return [
            go.Bar(
                x=list(v.bytes),
                y=self.labels,
                orientation="h",
                marker_color=colors[:3],
                text=[si_label(nb, "B") for nb in v.bytes],
                textposition="outside",
                textangle=0,
                cliponaxis=False,
                name="bytes",
                hovertemplate="%{y}<br>%{text}<extra></extra>",
            ),
            go.Bar(
                x=times,
                y=self.time_labels,
                orientation="h",
                marker_color=colors,
                text=[si_label(t * 1e-6, "s") for t in times],
                textposition="outside",
                textangle=0,
                cliponaxis=False,
                name="time",
                hovertemplate="%{y}<br>%{text}<extra></extra>",
            ),
        ]


def _hierarchy_panels(spec: GPUSpec, workload: str, n: int, numel: int, dtype: str) -> _Panels:
    if workload == "matmul":
        dtype = dtype if spec.supports(dtype) else "fp16"
        variants = [matmul_traffic(n, t, spec, dtype) for t in MATMUL_TILES]
        what = f"{n}x{n}x{n} matmul in {dtype}"
        peak = spec.peak_tflops(dtype)
        math_label = f"tensor cores @ {peak:,.0f} TFLOP/s"
    else:
        variants = [elementwise_traffic(numel, k, dtype) for k in (4, 2, 1)]
        what = f"gelu(x·s + b) + r over {numel / 2**20:.0f}M {dtype} elements"
        peak = spec.fp32_tflops
        math_label = f"CUDA cores @ {peak:,.0f} TFLOP/s"
    levels = memory_levels(spec)
    labels = _level_labels(spec)
    return _Panels(
        spec=spec,
        title=f"{spec.name}: {what}",
        variants=variants,
        bandwidths=[levels[3].bandwidth_tbps, levels[2].bandwidth_tbps, levels[1].bandwidth_tbps],
        peak_tflops=peak,
        labels=labels,
        time_labels=[*labels, f"math<br><sub>{math_label}</sub>"],
    )
