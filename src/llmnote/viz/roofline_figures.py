"""The animated roofline: memory and compute roofs for a GPU and format, and points that
move as the batch grows (a decode GEMV turning into a GEMM; a Llama layer's prefill and
decode), plus the kernels we measured on a real GPU.

Everything is precomputed into plotly frames and menus, so the slider, the Play button and
the explorer's GPU and format menus work on the static website with no kernel.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ..hw import GPUSpec, get_gpu, gpu_names, measured_ceilings
from ..models.config import ModelConfig
from ..records import load_record, record_topics
from ..roofline import LLAMA3_8B, Workload, attainable_tflops, layer_workload, matmul_workload
from .common import PALETTE, animation_controls

__all__ = ["roofline_figure", "roofline_explorer_figure", "moving_workloads", "measured_points", "DEFAULT_BATCHES", "FORMATS"]

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# The formats of the explorer's menu, in the order it lists them.
FORMATS = ("fp16", "bf16", "fp8", "fp4", "int8", "tf32", "fp32")
MOVING_COLORS = PALETTE[:3]
# Intensity axis of every roofline: 0.1 to about 30,000 FLOP/B.
X_RANGE = (-1.0, 4.5)


def moving_workloads(
    batch: int, shape: ModelConfig = LLAMA3_8B, dtype: str = "bf16", context: int = 4096, seq_len: int = 512
) -> list[Workload]:
    """The three points the animation moves, at one batch size."""
    return [
        matmul_workload(
            batch,
            2 * shape.intermediate_size,
            shape.hidden_size,
            dtype,
            f"decode GEMM: gate/up projection, M = batch (weights {shape.hidden_size}x{2 * shape.intermediate_size})",
        ),
        layer_workload(shape, batch, "decode", context=context, dtype=dtype),
        layer_workload(shape, batch, "prefill", seq_len=seq_len, dtype=dtype),
    ]


# Kernels whose recorded dtype is that of their 16-bit inputs and outputs while their products run
# in 8 bits: they belong on the roofline of the 8-bit format. (Their "torch" rows repeat the bf16
# cuBLAS time recorded under w4a16_linear, and are left out.)
COMPUTE_DTYPE = {"fp8_linear": "fp8", "int8_linear": "int8"}


def measured_points(gpu: str | GPUSpec = "H200", dtype: str | None = None) -> list[dict]:
    """Rows of the recorded benchmarks (for this GPU, and ``dtype`` if given: the dtype the
    products run in, see ``COMPUTE_DTYPE``) that carry both a FLOP and a byte rate, so that they
    have a place on the roofline. A whole serving run (kernels ``serving`` and ``serving-tp``: about
    a thousand steps, its rates averaged over all of them) is not one operation and is left out."""
    spec = get_gpu(gpu)
    points = []
    for topic in record_topics():
        rec = load_record(topic)
        try:
            if get_gpu(rec["meta"]["gpu"]) is not spec:
                continue
        except ValueError:
            continue
        for row in rec["rows"]:
            if (row["kernel"] in COMPUTE_DTYPE and row["provider"] == "torch") or row["kernel"] in ("serving", "serving-tp"):
                continue
            compute = COMPUTE_DTYPE.get(row["kernel"], row["dtype"])
            if row["tflops"] and row["tbps"] and (dtype is None or compute == dtype):
                points.append({**row, "topic": topic, "intensity": row["tflops"] / row["tbps"]})
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
    shape: ModelConfig = LLAMA3_8B,
    batches: tuple[int, ...] = DEFAULT_BATCHES,
    context: int = 4096,
    seq_len: int = 512,
    show_measured: bool = True,
) -> go.Figure:
    """The animated roofline figure (frames over ``batches``, a slider and Play/Pause)."""
    spec = get_gpu(gpu)
    if not spec.supports(dtype):
        raise ValueError(f"{spec.name} tensor cores do not support {dtype}")
    _check_batches(batches)
    peak, bw = spec.peak_tflops(dtype), spec.memory_tbps
    ridge = peak / bw
    x = np.logspace(*X_RANGE, 300)
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
                name=f"roof (measured: {ceilings.copy_tbps:.2f} TB/s, {m_peak:,.0f} TFLOP/s)",
                line=dict(color="gray", width=2, dash="dash"),
                hoverinfo="skip",
            )
        )
    fig.add_trace(_ridge_trace(ridge, peak))
    if show_measured:
        # Only points of this format: an fp8 kernel has its own, higher compute roof.
        # One legend entry per kernel; the marker tells ours (x) from the reference (o).
        points = measured_points(spec, dtype)
        for i, kernel in enumerate(sorted({p["kernel"] for p in points})):
            # Ours first: the legend shows the first point's marker.
            rows = sorted((p for p in points if p["kernel"] == kernel), key=lambda p: not p["provider"].startswith("llmnote"))
            fig.add_trace(
                go.Scatter(
                    x=[p["intensity"] for p in rows],
                    y=[p["tflops"] for p in rows],
                    mode="markers",
                    name=f"measured: {kernel}",
                    legendgroup="measured",
                    legendgrouptitle_text=f"measured on an {spec.name} (x: llmnote, o: reference)",
                    marker=dict(
                        symbol=["x" if p["provider"].startswith("llmnote") else "circle-open" for p in rows],
                        size=8,
                        color=PALETTE[(i + 3) % len(PALETTE)],
                    ),
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
                line=dict(color=MOVING_COLORS[j], width=1, dash="dot"),
                showlegend=False,
                hoverinfo="skip",
            )
        )
    first_moving = len(fig.data)
    labels = _moving_labels(context, seq_len)

    def point_traces(b: int, works: list[Workload]) -> list[go.Scatter]:
        return [
            go.Scatter(
                x=[w.intensity],
                y=[w.attainable_tflops(spec, dtype)],
                mode="markers",
                name=labels[j],
                legendgroup="moving",
                marker=dict(size=16, color=MOVING_COLORS[j], line=dict(color="white", width=1)),
                hovertext=[_hover(w, b, spec, dtype)],
                hoverinfo="text",
            )
            for j, w in enumerate(works)
        ]

    for trace in point_traces(int(batches[0]), paths[0]):
        fig.add_trace(trace)
    moving = list(range(first_moving, first_moving + 3))
    fig.frames = [go.Frame(name=str(b), data=point_traces(int(b), works), traces=moving) for b, works in zip(batches, paths)]
    # Pixel layout: 480 px of plot, then the x-axis title, the controls, and the legend.
    plot_px = 480
    updatemenus, sliders = animation_controls([str(b) for b in batches], prefix="batch size: ", y=-75 / plot_px)
    fig.update_layout(
        title=f"Roofline of the {spec.name} in {dtype}: {shape.name} work as the batch grows",
        xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte of DRAM traffic)", range=list(X_RANGE), dtick=1),
        yaxis=dict(
            type="log", title="attainable TFLOP/s", range=[np.log10(max(peak / 3e4, 1e-2)), np.log10(peak * 2.5)], dtick=1
        ),
        legend=dict(orientation="h", yanchor="top", y=-190 / plot_px, x=0),
        updatemenus=updatemenus,
        sliders=sliders,
        height=plot_px + 80 + 380,
        margin=dict(t=80, b=380, r=20),  # the title clears the modebar
        template="plotly_white",
    )
    return fig


def roofline_explorer_figure(
    gpu: str | GPUSpec = "H200",
    dtype: str = "bf16",
    shape: ModelConfig = LLAMA3_8B,
    batches: tuple[int, ...] = DEFAULT_BATCHES,
    context: int = 4096,
    seq_len: int = 512,
    gpus: tuple[str, ...] | None = None,
    formats: tuple[str, ...] = FORMATS,
) -> go.Figure:
    """The roofline of every GPU and format, picked from two menus, with the three moving
    workloads on a batch slider (and Play/Pause): the static-page twin of the live
    ``roofline_explorer``. ``gpu`` and ``dtype`` are shown first; ``gpus`` defaults to the
    whole spec table. A format a GPU's tensor cores lack shows a note instead of a roof.

    Every (GPU, format) pair has its own traces. The GPU menu sets their ``visible``, the
    format menu their ``opacity`` (and legend and hover), so the two menus compose; the
    batch frames only move ``selectedpoints``, so they compose with both.
    """
    names = [get_gpu(g).name for g in (gpus or gpu_names())]
    spec = get_gpu(gpu)
    if spec.name not in names:
        names.insert(0, spec.name)
    if dtype not in formats:
        raise ValueError(f"dtype must be one of formats {formats}, got {dtype!r}")
    if not spec.supports(dtype):
        raise ValueError(f"{spec.name} tensor cores do not support {dtype}")
    _check_batches(batches)
    labels = _moving_labels(context, seq_len)
    specs = [get_gpu(n) for n in names]
    peaks = [g.peak_tflops(f) for g in specs for f in formats if g.supports(f)]
    y_range = [np.log10(min(g.memory_tbps for g in specs) * 10 ** X_RANGE[0] / 2), np.log10(max(peaks) * 3)]

    fig = go.Figure()
    owner: list[tuple[int, int]] = []  # (GPU index, format index) of each trace
    legend: list[bool] = []  # whether the trace has a legend entry when its pair is shown
    hover: list[str] = []  # its hoverinfo when shown
    moving: list[int] = []
    for gi, g in enumerate(specs):
        for fi, fmt in enumerate(formats):
            if not g.supports(fmt):
                traces = [
                    go.Scatter(
                        x=[10 ** np.mean(X_RANGE)],
                        y=[10 ** np.mean(y_range)],
                        mode="text",
                        text=[f"The {g.name}'s tensor cores do not support {fmt}:<br>pick another format or GPU."],
                        textfont=dict(size=15),
                        showlegend=False,
                    )
                ]
                flags = [(False, "skip")]
            else:
                peak, bw = g.peak_tflops(fmt), g.memory_tbps
                roof_x = [10 ** X_RANGE[0], peak / bw, 10 ** X_RANGE[1]]
                paths = [moving_workloads(int(b), shape, fmt, context, seq_len) for b in batches]
                traces = [
                    go.Scatter(
                        x=roof_x,
                        y=[bw * roof_x[0], peak, peak],
                        mode="lines",
                        name=f"{g.name} {fmt} roof: {bw:g} TB/s, {peak:,.0f} TFLOP/s",
                        line=dict(color="black", width=3),
                    ),
                    _ridge_trace(peak / bw, peak),
                ]
                flags = [(True, "skip"), (False, "text")]
                for j in range(3):
                    moving.append(len(fig.data) + len(traces))
                    traces.append(
                        go.Scatter(
                            x=[p[j].intensity for p in paths],
                            y=[p[j].attainable_tflops(g, fmt) for p in paths],
                            mode="lines+markers",
                            name=labels[j],
                            line=dict(color=MOVING_COLORS[j], width=1, dash="dot"),
                            marker=dict(size=16, color=MOVING_COLORS[j], line=dict(color="white", width=1)),
                            selectedpoints=[0],
                            unselected=dict(marker=dict(size=7, opacity=0.5)),
                            hovertext=[_hover(p[j], int(b), g, fmt) for b, p in zip(batches, paths)],
                        )
                    )
                    flags.append((True, "text"))
            for trace, (in_legend, info) in zip(traces, flags):
                # The same rules as the menus' (below): GPU -> visible, format -> the rest.
                chosen_format = fmt == dtype
                trace.update(visible=g is spec, opacity=1 if chosen_format else 0, showlegend=in_legend and chosen_format)
                trace.hoverinfo = info if chosen_format else "skip"
                fig.add_trace(trace)
                owner.append((gi, fi))
                legend.append(in_legend)
                hover.append(info)

    gpu_menu = [
        dict(label=g.name, method="restyle", args=[{"visible": [o[0] == gi for o in owner]}]) for gi, g in enumerate(specs)
    ]
    format_menu = [
        dict(
            label=fmt,
            method="restyle",
            args=[
                {
                    "opacity": [1 if o[1] == fi else 0 for o in owner],
                    "showlegend": [leg and o[1] == fi for o, leg in zip(owner, legend)],
                    "hoverinfo": [info if o[1] == fi else "skip" for o, info in zip(owner, hover)],
                }
            ],
        )
        for fi, fmt in enumerate(formats)
    ]
    menu = dict(type="dropdown", direction="down", y=1.02, yanchor="bottom", xanchor="left", showactive=True)
    plot_px = 480
    updatemenus, sliders = animation_controls([str(b) for b in batches], prefix="batch size: ", y=-75 / plot_px)
    updatemenus += [
        dict(menu, x=0.1, active=names.index(spec.name), buttons=gpu_menu),
        dict(menu, x=0.52, active=formats.index(dtype), buttons=format_menu),
    ]
    fig.frames = [
        go.Frame(name=str(b), data=[go.Scatter(selectedpoints=[i]) for _ in moving], traces=moving) for i, b in enumerate(batches)
    ]
    fig.update_layout(
        title=f"Roofline explorer: {shape.name} work on any GPU, format and batch",
        annotations=[
            dict(text=text, x=x, y=1.02, xref="paper", yref="paper", xanchor="right", yanchor="bottom", yshift=8, showarrow=False)
            for text, x in (("GPU", 0.09), ("format", 0.51))
        ],
        xaxis=dict(type="log", title="arithmetic intensity (FLOP per byte of DRAM traffic)", range=list(X_RANGE), dtick=1),
        yaxis=dict(type="log", title="attainable TFLOP/s", range=y_range, dtick=1),
        legend=dict(orientation="h", yanchor="top", y=-190 / plot_px, x=0),
        updatemenus=updatemenus,
        sliders=sliders,
        height=plot_px + 110 + 290,
        margin=dict(t=110, b=290, r=20),
        template="plotly_white",
    )
    return fig


def _check_batches(batches: tuple[int, ...]) -> None:
    if not batches or any(int(b) < 1 for b in batches):
        raise ValueError("batches must be a non-empty sequence of positive integers")


def _moving_labels(context: int, seq_len: int) -> list[str]:
    return [
        "decode GEMM (M = batch)",
        f"decode layer, {context} tokens of context",
        f"prefill layer, {seq_len} tokens per prompt",
    ]


def _ridge_trace(ridge: float, peak: float) -> go.Scatter:
    return go.Scatter(
        x=[ridge],
        y=[peak],
        mode="markers+text",
        name=f"ridge point: {ridge:.0f} FLOP/B",
        showlegend=False,
        marker=dict(symbol="diamond", size=12, color="black"),
        text=[f"ridge {ridge:.0f} FLOP/B"],
        textposition="top left",
        hovertext=[f"ridge point<br>{ridge:.1f} FLOP/byte"],
        hoverinfo="text",
    )
