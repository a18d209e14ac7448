"""Static figures of Chapter 1: the bandwidth ladder and the GPU generations."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..hw import GPUS, GPUSpec, bandwidth_ladder, get_gpu, measured_ceilings
from .common import PALETTE

__all__ = ["bandwidth_ladder_figure", "generations_figure", "specs_table", "GENERATION_GPUS"]

# One data-centre flagship per generation, Volta to Blackwell.
GENERATION_GPUS = ("V100", "A100", "H100 SXM", "H200", "B200")


def bandwidth_ladder_figure(gpu: str | GPUSpec = "H200") -> go.Figure:
    """Horizontal bars, log scale: TB/s from registers down to another node's memory."""
    spec = get_gpu(gpu)
    ladder = bandwidth_ladder(spec)
    names = [f"{lv.name}{' (estimate)' if lv.estimate else ''}" for lv in ladder]
    values = [lv.bandwidth_tbps for lv in ladder]
    fig = go.Figure(
        go.Bar(
            name="bandwidth (spec table)",
            cliponaxis=False,
            x=values,
            y=names,
            orientation="h",
            marker_color=[PALETTE[0] if lv.capacity_bytes else PALETTE[4] for lv in ladder],
            text=[f"{v * 1000:,.0f} GB/s" if v < 1 else f"{v:,.1f} TB/s" for v in values],
            textposition="outside",
            hovertemplate="%{y}<br>%{x:.3f} TB/s<extra></extra>",
        )
    )
    ceilings = measured_ceilings()
    if ceilings is not None and get_gpu(ceilings.gpu) is spec:
        dram = next(n for n in names if n.startswith("DRAM"))
        host = next(n for n in names if "to the host" in n)
        measured = [("measured: device copy", ceilings.copy_tbps, dram)]
        if ceilings.h2d_gbps:
            measured.append(("measured: host → device, pinned", ceilings.h2d_gbps / 1000, host))
        fig.add_trace(
            go.Scatter(
                x=[m[1] for m in measured],
                y=[m[2] for m in measured],
                mode="markers",
                marker=dict(symbol="x", size=14, color="black"),
                name="measured on our H200",
                text=[m[0] for m in measured],
                hovertemplate="%{text}: %{x:.3f} TB/s<extra></extra>",
            )
        )
    fig.update_layout(
        title=f"The bandwidth ladder of an {spec.name} (blue: memories on the GPU, orange: links)",
        xaxis=dict(
            type="log", title="bandwidth, TB/s (log scale)", range=[math.log10(min(values) / 2), math.log10(max(values) * 10)]
        ),
        yaxis=dict(autorange="reversed"),
        height=430,
        margin=dict(l=10, r=40),
        template="plotly_white",
        legend=dict(x=0.7, y=0.05),
    )
    return fig


def generations_figure(names: tuple[str, ...] = GENERATION_GPUS) -> go.Figure:
    """Dense tensor throughput per format, DRAM bandwidth, and the ridge point, by generation."""
    specs = [get_gpu(n) for n in names]
    fig = make_subplots(
        rows=2,
        cols=1,
        subplot_titles=("dense tensor-core TFLOP/s (log)", "DRAM TB/s and the bf16/fp16 ridge point"),
        specs=[[{}], [{"secondary_y": True}]],
        vertical_spacing=0.16,
    )
    labels = [f"{s.name}<br>{s.architecture} {s.year}" for s in specs]
    for i, fmt in enumerate(("fp16", "bf16", "fp8", "fp4")):
        fig.add_trace(
            go.Bar(x=labels, y=[s.tensor_tflops.get(fmt) for s in specs], name=fmt, marker_color=PALETTE[i]), row=1, col=1
        )
    fig.add_trace(go.Bar(x=labels, y=[s.memory_tbps for s in specs], name="DRAM TB/s", marker_color=PALETTE[5]), row=2, col=1)
    fig.add_trace(
        go.Scatter(
            x=labels,
            y=[s.ridge_point("fp16") for s in specs],
            name="ridge point (FLOP/B, fp16)",
            mode="lines+markers",
            marker_color="black",
        ),
        row=2,
        col=1,
        secondary_y=True,
    )
    fig.update_xaxes(tickangle=0)
    fig.update_yaxes(type="log", title_text="TFLOP/s", row=1, col=1)
    fig.update_yaxes(title_text="TB/s", row=2, col=1)
    fig.update_yaxes(title_text="FLOP per byte", rangemode="tozero", row=2, col=1, secondary_y=True)
    fig.update_layout(
        barmode="group",
        height=720,
        template="plotly_white",
        legend=dict(orientation="h", y=-0.12),
        title="Compute grew faster than bandwidth: every generation needs more reuse per byte",
    )
    return fig


def specs_table(names: tuple[str, ...] | None = None):
    """A pandas DataFrame of the spec table (one row per GPU) for display in notebooks."""
    import pandas as pd

    specs = [get_gpu(n) for n in (names or tuple(GPUS))]
    rows = []
    for s in specs:
        rows.append(
            {
                "GPU": s.name,
                "architecture": s.architecture,
                "CC": s.compute_capability,
                "year": s.year,
                "SMs": s.sm_count,
                "memory": f"{s.memory_gb:g} GB {s.memory_type}",
                "TB/s": s.memory_tbps,
                "L2 MB": s.l2_mb,
                "smem/SM KB": s.smem_per_sm_kb,
                "fp32 TFLOP/s": s.fp32_tflops,
                **{f"{k} TFLOP/s": v for k, v in s.tensor_tflops.items()},
                "NVLink GB/s": s.nvlink_gbps,
                "host link": s.pcie,
                "TDP W": s.tdp_w,
            }
        )
    return pd.DataFrame(rows).set_index("GPU")
