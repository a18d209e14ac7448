"""Shared pieces of the book's plotly figures: colours, the Play/Pause + slider controls,
and tick labels with SI units for log axes."""

from __future__ import annotations

import math

__all__ = ["PALETTE", "animation_controls", "log_ticks", "si_label"]

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")

_PREFIXES = {-9: "n", -6: "µ", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P"}


def animation_controls(
    frame_names: list[str],
    prefix: str = "",
    duration_ms: int = 700,
    y: float = -0.25,
    labels: list[str] | None = None,
) -> tuple[list[dict], list[dict]]:
    """``(updatemenus, sliders)`` for a figure whose frames are named ``frame_names``.

    The Play button steps through every frame; Pause stops; the slider jumps to a frame.
    All of it runs in plotly.js, so it works on a static page. ``y`` places the row of
    controls below the plot area (in plot-height units): leave room for the x-axis title.
    ``labels`` (one per frame, default the frame names) are the slider's step labels;
    keep them short, or plotly drops every other one.
    """
    if not frame_names:
        raise ValueError("frame_names must not be empty")
    if labels is not None and len(labels) != len(frame_names):
        raise ValueError(f"labels must have one entry per frame ({len(frame_names)}), got {len(labels)}")
    play = dict(
        label="Play",
        method="animate",
        args=[
            None,
            dict(
                frame=dict(duration=duration_ms, redraw=True),
                transition=dict(duration=duration_ms // 2),
                fromcurrent=True,
                mode="immediate",
            ),
        ],
    )
    pause = dict(label="Pause", method="animate", args=[[None], dict(frame=dict(duration=0, redraw=False), mode="immediate")])
    updatemenus = [
        dict(
            type="buttons",
            direction="left",
            x=0.0,
            y=y - 0.06,
            xanchor="left",
            yanchor="top",
            showactive=False,
            buttons=[play, pause],
        )
    ]
    steps = [
        dict(label=label, method="animate", args=[[name], dict(frame=dict(duration=0, redraw=True), mode="immediate")])
        for name, label in zip(frame_names, labels or frame_names)
    ]
    sliders = [dict(active=0, x=0.3, y=y, len=0.65, xanchor="left", yanchor="top", currentvalue=dict(prefix=prefix), steps=steps)]
    return updatemenus, sliders


def si_label(value: float, unit: str) -> str:
    """``value`` (in ``unit``) with an SI prefix: ``si_label(2e9, "B") == "2 GB"``,
    ``si_label(1e-4, "s") == "100 µs"``. Unlike plotly's own SI ticks, whose "B" means
    billion, the prefix is always separated from a real unit."""
    if value <= 0:
        raise ValueError(f"value must be positive, got {value}")
    power = min(max(3 * math.floor(math.log10(value) / 3 + 1e-9), -9), 15)
    return f"{value / 10**power:.3g} {_PREFIXES[power]}{unit}"


def log_ticks(lo: float, hi: float, unit: str, scale: float = 1.0) -> dict:
    """``tickvals``/``ticktext`` for a log axis from ``lo`` to ``hi`` (axis units), labelled
    in ``unit`` with SI prefixes; ``scale`` converts an axis value to ``unit`` (1e-6 for an
    axis in µs labelled in seconds). Decades only, plus 2 and 5 when the range is short."""
    if not 0 < lo < hi:
        raise ValueError(f"need 0 < lo < hi, got {lo}, {hi}")
    steps = (1,) if math.log10(hi / lo) > 2.5 else (1, 2, 5)
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    values = [m * 10.0**e for e in decades for m in steps if lo <= m * 10.0**e <= hi]
    return dict(tickmode="array", tickvals=values, ticktext=[si_label(v * scale, unit) for v in values])
