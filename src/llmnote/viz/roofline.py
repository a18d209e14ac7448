"""The animated roofline: memory and compute roofs for a GPU and format, and points that
move as the batch grows (a decode GEMV turning into a GEMM; a Llama layer's prefill and
decode), plus the kernels we measured on a real GPU.

Everything is precomputed into plotly frames, so the slider and the Play button work on
the static website with no kernel.
"""

from __future__ import annotations

import json

import numpy as np
import plotly.graph_objects as go

from ..hw import GPUSpec, get_gpu, measured_ceilings
from ..paths import benchmarks_dir
from ..roofline import LLAMA3_8B, TransformerShape, Workload, attainable_tflops, layer_workload, matmul_workload
from .common import PALETTE, animation_controls

__all__ = ["roofline_figure", "moving_workloads", "measured_points", "DEFAULT_BATCHES"]

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def moving_workloads(
    batch: int, shape: TransformerShape = LLAMA3_8B, dtype: str = "bf16", context: int = 4096, seq_len: int = 512
) -> list[Workload]:
    """The three points the animation moves, at one batch size."""
    return [
        matmul_workload(
            batch,
            2 * shape.intermediate,
            shape.hidden,
            dtype,
            f"decode GEMM: gate/up projection, M = batch (weights {shape.hidden}x{2 * shape.intermediate})",
        ),
        layer_workload(shape, batch, "decode", context=context, dtype=dtype),
        layer_workload(shape, batch, "prefill", seq_len=seq_len, dtype=dtype),
    ]


def measured_points(gpu: str | GPUSpec = "H200", dtype: str | None = None) -> list[dict]:
    """Rows of the recorded benchmarks (for this GPU, and ``dtype`` if given) that carry
    both a FLOP and a byte rate, so that they have a place on the roofline."""
    spec = get_gpu(gpu)
    points = []
    folder = benchmarks_dir()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        rec = json.loads(path.read_text())
        try:
            if get_gpu(rec["meta"]["gpu"]) is not spec:
                continue
        except ValueError:
            continue
        for row in rec["rows"]:
            if row["tflops"] and row["tbps"] and (dtype is None or row["dtype"] == dtype):
                points.append({**row, "topic": path.stem, "intensity": row["tflops"] / row["tbps"]})
    return points


def _hover(w: Workload, batch: int, spec: GPUSpec, dtype: str) -> str:
    return (
        f"<b>{w.name}</b><br>batch {batch}<br>intensity {w.intensity:,.1f} FLOP/B<br>"
        f"attainable {w.attainable_tflops(spec, dtype):,.0f} TFLOP/s ({w.bound(spec, dtype)}-bound)<br>"
        f"lower bound on time {w.min_time_s(spec, dtype) * 1e6:,.1f} µs"
    )


def roofline_figure(
    gpu: str | GPUSpec = "H200",
    dtype: str = "bf16",
    shape: TransformerShape = LLAMA3_8B,
    batches: tuple[int, ...] = DEFAULT_BATCHES,
    context: int = 4096,
    seq_len: int = 512,
    show_measured: bool = True,
) -> go.Figure:
    """The animated roofline figure (frames over ``batches``, a slider and Play/Pause)."""
    spec = get_gpu(gpu)
    if not spec.supports(dtype):
        raise ValueError(f"{spec.name} tensor cores do not support {dtype}")
    if not batches or any(int(b) < 1 for b in batches):
        raise ValueError("batches must be a non-empty sequence of positive integers")
    peak, bw = spec.peak_tflops(dtype), spec.memory_tbps
    ridge = peak / bw
    x = np.logspace(-1, 4.5, 300)
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=x,
            y=attainable_tflops(x, spec, dtype),
            mode="lines",
            name=f"roof (datasheet: {bw:g} TB/s, {peak:,.0f} TFLOP/s)",
            line=dict(color="black", width=3),
            hoverinfo="skip",
        )
    )
    ceilings = measured_ceilings() if show_measured else None
    if ceilings is not None and get_gpu(ceilings.gpu) is spec and ceilings.matmul_tflops.get(dtype):
        m_peak = ceilings.matmul_tflops[dtype]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=np.minimum(m_peak, x * ceilings.copy_tbps),
                mode="lines",
                name=f"roof (measured: {ceilings.copy_tbps:.2f} TB/s copy, {m_peak:,.0f} TFLOP/s cuBLAS)",
                line=dict(color="gray", width=2, dash="dash"),
                hoverinfo="skip",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=[ridge],
            y=[peak],
            mode="markers+text",
            name=f"ridge point: {ridge:.0f} FLOP/B",
            marker=dict(symbol="diamond", size=12, color="black"),
            text=[f"ridge {ridge:.0f} FLOP/B"],
            textposition="top left",
            hovertemplate=f"ridge point<br>{ridge:.1f} FLOP/byte<extra></extra>",
        )
    )
    if show_measured:
        # Only points of this format: an fp8 kernel has its own, higher compute roof.
        points = measured_points(spec, dtype)
        groups = sorted({(p["kernel"], p["provider"]) for p in points})
        for i, (kernel, provider) in enumerate(groups):
            rows = [p for p in points if (p["kernel"], p["provider"]) == (kernel, provider)]
            fig.add_trace(
                go.Scatter(
                    x=[p["intensity"] for p in rows],
                    y=[p["tflops"] for p in rows],
                    mode="markers",
                    name=f"measured: {kernel} ({provider})",
                    marker=dict(symbol="x", size=9, color=PALETTE[(i + 3) % len(PALETTE)]),
                    text=[
                        f"{p['kernel']} {p['case']} {p['dtype']} ({p['provider']})<br>"
                        f"{p['tflops']:.1f} TFLOP/s, {p['tbps']:.2f} TB/s"
                        for p in rows
                    ],
                    hovertemplate="%{text}<extra>measured</extra>",
                )
            )
    # Faint trails show the whole path each moving point takes; the frames move the markers.
    paths = [moving_workloads(int(b), shape, dtype, context, seq_len) for b in batches]
    for j in range(3):
        fig.add_trace(
            go.Scatter(
                x=[p[j].intensity for p in paths],
                y=[p[j].attainable_tflops(spec, dtype) for p in paths],
                mode="lines",
                line=dict(color=PALETTE[j], width=1, dash="dot"),
                showlegend=False,
                hoverinfo="skip",
            )
        )
    first_moving = len(fig.data)
    labels = [
        "decode GEMM (M = batch)",
        f"decode layer, {context} tokens of context",
        f"prefill layer, {seq_len} tokens per prompt",
    ]

    def point_traces(b: int, works: list[Workload]) -> list[go.Scatter]:
        return [
            go.Scatter(
                x=[w.intensity],
                y=[w.attainable_tflops(spec, dtype)],
                mode="markers+text",
                name=labels[j],
                text=[f"B={b}"],
                textposition="bottom right",
                marker=dict(size=16, color=PALETTE[j], line=dict(color="white", width=1)),
                hovertext=[_hover(w, b, spec, dtype)],
                hoverinfo="text",
            )
            for j, w in enumerate(works)
        ]

    for trace in point_traces(int(batches[0]), paths[0]):
        fig.add_trace(trace)
    moving = list(range(first_moving, first_moving + 3))
    fig.frames = [go.Frame(name=str(b), data=point_traces(int(b), works), traces=moving) for b, works in zip(batches, paths)]
    updatemenus, sliders = animation_controls([str(b) for b in batches], prefix="batch size: ", y=-0.22)
    fig.update_layout(
        title=f"Roofline of the {spec.name} in {dtype}: {shape.name} work as the batch grows",
        xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte of DRAM traffic)", range=[-1, 4.5]),
        yaxis=dict(type="log", title="attainable TFLOP/s", range=[np.log10(max(peak / 3e4, 1e-2)), np.log10(peak * 2.5)]),
        legend=dict(orientation="h", yanchor="top", y=-0.6, x=0),
        updatemenus=updatemenus,
        sliders=sliders,
        height=760,
        margin=dict(t=60, b=320),
        template="plotly_white",
    )
    return fig
