"""Shared pieces of the book's plotly figures: colours and the Play/Pause + slider controls."""

from __future__ import annotations

__all__ = ["PALETTE", "animation_controls"]

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")


def animation_controls(
    frame_names: list[str], prefix: str = "", duration_ms: int = 700, y: float = -0.25
) -> tuple[list[dict], list[dict]]:
    """``(updatemenus, sliders)`` for a figure whose frames are named ``frame_names``.

    The Play button steps through every frame; Pause stops; the slider jumps to a frame.
    All of it runs in plotly.js, so it works on a static page. ``y`` places the row of
    controls below the plot area (in plot-height units): leave room for the x-axis title.
    """
    if not frame_names:
        raise ValueError("frame_names must not be empty")
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
        dict(label=name, method="animate", args=[[name], dict(frame=dict(duration=0, redraw=True), mode="immediate")])
        for name in frame_names
    ]
    sliders = [dict(active=0, x=0.3, y=y, len=0.7, xanchor="left", yanchor="top", currentvalue=dict(prefix=prefix), steps=steps)]
    return updatemenus, sliders
