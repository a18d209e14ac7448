"""The block pool of a paged KV cache, animated step by step.

A notebook drives a real :class:`~llmnote.layers.KVCache` through prefill and decode steps
and takes a :func:`pool_snapshot` after each one: which request holds which blocks and how
many tokens it has written. :func:`paged_pool_figure` draws the pool as a grid of blocks,
each a row of ``block_size`` token slots: a written slot in its request's colour, a slot
reserved but not yet written (the partly filled last block) in a pale tint of it, a free
block grey. Below the grid, each request's block table. Every frame is precomputed, so the
slider and the Play button work on a static page.
"""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from .common import PALETTE, animation_controls

__all__ = ["PoolSnapshot", "pool_snapshot", "paged_pool_figure"]

FREE_GREY = "#e3e3e3"


@dataclass(frozen=True)
class PoolSnapshot:
    """The pool after one step: ``tables[name]`` the blocks request ``name`` holds, in order,
    and ``lens[name]`` the tokens it has written. ``label`` names the step."""

    label: str
    tables: dict[str, list[int]]
    lens: dict[str, int]


def pool_snapshot(cache, label: str, names: list[str | None]) -> PoolSnapshot:
    """Record ``cache``'s block tables and lengths; ``names[s]`` is the request in cache
    sequence ``s`` (``None`` for an unused sequence)."""
    if len(names) != len(cache.tables):
        raise ValueError(f"names needs one entry per cache sequence ({len(cache.tables)}), got {len(names)}")
    used = [(n, s) for s, n in enumerate(names) if n is not None]
    return PoolSnapshot(label, {n: list(cache.tables[s]) for n, s in used}, {n: cache.lens[s] for n, s in used})


def _pale(hex_color: str, keep: float = 0.3) -> str:
    r, g, b = (int(hex_color[i : i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{round(255 - keep * (255 - c)):02x}" for c in (r, g, b))


def paged_pool_figure(
    snapshots: list[PoolSnapshot], num_blocks: int, block_size: int, per_row: int = 8, title: str = ""
) -> go.Figure:
    """The pool of ``num_blocks`` blocks, ``per_row`` to a row, one animation frame per snapshot."""
    if not snapshots:
        raise ValueError("snapshots must not be empty")
    names = list(dict.fromkeys(n for snap in snapshots for n in snap.tables))
    color = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    # z codes: 0 free, 1..n written by request i, n+1..2n reserved by request i but not written
    codes = [FREE_GREY, *(color[n] for n in names), *(_pale(color[n]) for n in names)]
    scale = [[edge / len(codes), c] for i, c in enumerate(codes) for edge in (i, i + 1)]
    rows = -(-num_blocks // per_row)
    width = per_row * (block_size + 1) - 1  # one empty column between blocks

    def grid(snap: PoolSnapshot) -> go.Heatmap:
        z = [[None] * width for _ in range(rows)]
        hover = [[""] * width for _ in range(rows)]
        text = [[""] * width for _ in range(rows)]  # the token number in each written slot
        owner = {}
        for i, n in enumerate(names):
            for logical, block in enumerate(snap.tables.get(n, [])):
                owner[block] = (i, n, logical)
        for block in range(num_blocks):
            r, x0 = block // per_row, (block % per_row) * (block_size + 1)
            for slot in range(block_size):
                if block not in owner:
                    z[r][x0 + slot], hover[r][x0 + slot] = 0, f"block {block}: free"
                    continue
                i, n, logical = owner[block]
                token = logical * block_size + slot
                written = token < snap.lens[n]
                z[r][x0 + slot] = 1 + i if written else 1 + len(names) + i
                what = f"token {token}" if written else "reserved, not yet written"
                hover[r][x0 + slot] = f"block {block}, offset {slot}: request {n}, {what}<br>slot {block * block_size + slot}"
                text[r][x0 + slot] = str(token) if written else ""
        return go.Heatmap(
            z=z,
            text=text,
            customdata=hover,
            texttemplate="%{text}",
            textfont=dict(size=9, color="white"),
            hovertemplate="%{customdata}<extra></extra>",
            colorscale=scale,
            zmin=-0.5,
            zmax=len(codes) - 0.5,
            showscale=False,
            xgap=1,
            ygap=16,
            hoverongaps=False,
        )

    def tables(k: int) -> go.Scatter:
        snap, lines = snapshots[k], []
        for n in names:
            if n in snap.tables:
                lines.append(f"<b>{n}</b>: {snap.lens[n]} tokens, table {snap.tables[n]}")
            else:
                lines.append(f"<b>{n}</b>: " + ("finished" if any(n in s.tables for s in snapshots[:k]) else "waiting"))
        return go.Scatter(
            x=[-0.5] * len(names),
            y=[rows + 0.2 + 0.45 * k for k in range(len(names))],
            text=lines,
            mode="text",
            textposition="middle right",
            textfont=dict(size=12),
            hoverinfo="skip",
            showlegend=False,
        )

    def headline(snap: PoolSnapshot) -> str:
        used = sum(len(t) for t in snap.tables.values())
        return f"{title}<br><sup>{snap.label}: {used} of {num_blocks} blocks in use</sup>"

    first = snapshots[0]
    fig = go.Figure([grid(first), tables(0)])
    for n in names:  # legend entries: one colour per request
        fig.add_trace(
            go.Scatter(
                x=[None], y=[None], mode="markers", marker=dict(symbol="square", size=12, color=color[n]), name=f"request {n}"
            )
        )
    fig.add_trace(
        go.Scatter(x=[None], y=[None], mode="markers", marker=dict(symbol="square", size=12, color=FREE_GREY), name="free block")
    )
    fig.frames = [
        go.Frame(name=s.label, data=[grid(s), tables(k)], traces=[0, 1], layout=dict(title_text=headline(s)))
        for k, s in enumerate(snapshots)
    ]
    for block in range(num_blocks):
        fig.add_annotation(
            x=(block % per_row) * (block_size + 1) + (block_size - 1) / 2,
            y=block // per_row - 0.5,
            text=f"block {block}",
            showarrow=False,
            font=dict(size=9, color="#555"),
        )
    labels = [str(k) for k in range(len(snapshots))]
    updatemenus, sliders = animation_controls(
        [s.label for s in snapshots], prefix="step ", duration_ms=600, y=-0.04, labels=labels
    )
    fig.update_layout(
        title=dict(text=headline(first)),
        template="plotly_white",
        height=230 + 70 * rows + 25 * len(names),
        xaxis=dict(visible=False, range=[-1, width + 1]),
        yaxis=dict(visible=False, autorange=False, range=[rows + 0.45 * len(names) + 0.1, -0.9]),
        legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
        margin=dict(t=110, b=90, l=10, r=10),
        updatemenus=updatemenus,
        sliders=sliders,
    )
    return fig
