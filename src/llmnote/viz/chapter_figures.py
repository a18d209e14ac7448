"""Schematic drawings of Chapter 1: one SM, an 8-GPU node and a rail-optimised cluster.

They are diagrams, not data: boxes and lines placed by hand, labelled from the spec table
where a number appears.
"""

from __future__ import annotations

import plotly.graph_objects as go

from ..hw import GPUSpec, get_gpu
from .common import PALETTE

__all__ = ["sm_schematic", "node_schematic", "rail_fabric_schematic"]

PCIE_COLOR, NVLINK_COLOR = PALETTE[0], PALETTE[2]


def _box(fig: go.Figure, x0: float, y0: float, x1: float, y1: float, text: str, color: str, size: int = 10) -> None:
    """A labelled rectangle from (x0, y0) to (x1, y1)."""
    fig.add_shape(type="rect", x0=x0, x1=x1, y0=y0, y1=y1, fillcolor=color, line=dict(color="#333", width=1), layer="above")
    fig.add_annotation(x=(x0 + x1) / 2, y=(y0 + y1) / 2, text=text, showarrow=False, font=dict(size=size))


def _centred_box(fig: go.Figure, x: float, y: float, w: float, h: float, text: str, color: str, size: int = 10) -> None:
    _box(fig, x - w / 2, y - h / 2, x + w / 2, y + h / 2, text, color, size)


def _line(fig: go.Figure, x0: float, y0: float, x1: float, y1: float, color: str, width: float = 1.5, dash="solid") -> None:
    fig.add_shape(type="line", x0=x0, y0=y0, x1=x1, y1=y1, line=dict(color=color, width=width, dash=dash), layer="below")


def sm_schematic(gpu: GPUSpec | str = "H200", fp32_lanes_per_sm: int = 128) -> go.Figure:
    """One streaming multiprocessor: four sub-partitions (scheduler, registers, FP32 lanes,
    tensor core) above the shared L1/shared-memory array and the TMA. Sizes from ``gpu``."""
    gpu = get_gpu(gpu)
    parts = gpu.tensor_cores_per_sm  # one tensor core per sub-partition
    lanes = fp32_lanes_per_sm // parts
    registers_kb = gpu.registers_per_sm_kb // parts
    fig = go.Figure()
    _box(fig, 0, 0, 10, 9.4, "", "#fafafa")
    fig.add_annotation(
        x=5, y=9.1, text=f"one SM of the {gpu.name} (schematic; {gpu.sm_count} per GPU)", showarrow=False, font=dict(size=13)
    )
    for q in range(parts):
        x0, y0 = 0.2 + 4.9 * (q % 2), 5.05 - 3.85 * (q // 2)
        _box(fig, x0, y0, x0 + 4.7, y0 + 3.7, "", "#f0f4fa")
        fig.add_annotation(x=x0 + 2.35, y=y0 + 3.45, text=f"sub-partition {q}", showarrow=False, font=dict(size=11, color="#555"))
        _box(
            fig,
            x0 + 0.15,
            y0 + 2.5,
            x0 + 4.55,
            y0 + 3.2,
            f"warp scheduler + dispatch: 1 warp-instruction/clock, ≤{gpu.max_warps_per_sm // parts} warps",
            "#fde2c8",
        )
        _box(
            fig,
            x0 + 0.15,
            y0 + 1.65,
            x0 + 4.55,
            y0 + 2.35,
            f"register file: {registers_kb} KB ({registers_kb * 1024 // 4:,} x 32-bit)",
            "#e3d7f0",
        )
        _box(fig, x0 + 0.15, y0 + 0.15, x0 + 2.5, y0 + 1.5, f"{lanes} FP32 lanes<br>+ INT, FP64,<br>SFU, LD/ST", "#dbe9f6")
        _box(fig, x0 + 2.65, y0 + 0.15, x0 + 4.55, y0 + 1.5, "tensor core<br>(4th gen)", "#c6e8c6")
    _box(
        fig,
        0.2,
        0.15,
        7.6,
        1.0,
        f"L1 data cache / shared memory: {gpu.l1_smem_per_sm_kb} KB (up to {gpu.smem_per_sm_kb} KB as shared memory)",
        "#fff3b0",
    )
    _box(fig, 7.8, 0.15, 9.8, 1.0, "TMA<br>(tile copies)", "#f6d5d5")
    fig.update_layout(
        xaxis=dict(visible=False, range=[-0.1, 10.1]),
        yaxis=dict(visible=False, range=[-0.1, 9.5]),
        height=520,
        template="plotly_white",
        margin=dict(l=5, r=5, t=10, b=5),
    )
    return fig


def node_schematic() -> go.Figure:
    """An HGX-class 8-GPU node: two CPUs, four PCIe switches (each shared by two GPUs and
    their NICs) and four NVSwitches that every GPU reaches over NVLink."""
    fig = go.Figure()
    for cpu in (0, 1):
        x = 1.5 + 4 * cpu
        _centred_box(fig, x, 10.2, 2.6, 0.6, "host DRAM (DDR5)", "#eeeeee")
        _centred_box(fig, x, 9.1, 2.6, 0.7, f"CPU {cpu}", "#dddddd")
        _line(fig, x, 9.9, x, 9.45, "#555", 3)
    _line(fig, 2.8, 9.1, 4.2, 9.1, "#555", 3, "dot")
    for sw in range(4):
        x = 2 * sw + 0.5
        _centred_box(fig, x, 7.7, 1.7, 0.5, "PCIe switch", "#dbe9f6")
        _line(fig, x, 7.95, 1.5 + 4 * (sw // 2), 8.75, PCIE_COLOR, 3)
    nvswitch_x = (0.5, 2.5, 4.5, 6.5)
    for g in range(8):
        sw_x = 2 * (g // 2) + 0.5
        _line(fig, g - 0.05, 6.55, sw_x, 7.45, PCIE_COLOR)  # NIC to its PCIe switch
        _line(fig, g + 0.33, 5.3, sw_x, 7.45, PCIE_COLOR)  # GPU to the same switch
        _centred_box(fig, g - 0.05, 6.3, 0.5, 0.5, f"NIC {g}", "#fde2c8", 9)
        _centred_box(fig, g, 4.8, 0.8, 1.0, f"GPU {g}<br>HBM", "#d5efd5")
        for x in nvswitch_x:
            _line(fig, g, 4.3, x, 2.95, NVLINK_COLOR, 1)
    for x in nvswitch_x:
        _centred_box(fig, x, 2.7, 1.7, 0.5, "NVSwitch", "#c6e8c6")
    for name, color in (
        ("PCIe 5.0 x16", PCIE_COLOR),
        ("NVLink 4 (18 links per GPU over 4 switches)", NVLINK_COLOR),
        ("CPU-to-CPU link", "#555"),
    ):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", line=dict(color=color, width=3), name=name))
    fig.update_layout(
        title="An HGX-class 8-GPU node (schematic)<br><sup>the PCIe layout varies by vendor; NIC i is cabled to rail i</sup>",
        xaxis=dict(visible=False, range=[-0.7, 7.7]),
        yaxis=dict(visible=False, range=[2.2, 10.7]),
        height=500,
        template="plotly_white",
        legend=dict(orientation="h", y=-0.02),
        margin=dict(l=10, r=10, t=70, b=10),
    )
    return fig


def rail_fabric_schematic(nodes: int = 4, gpus_per_node: int = 8) -> go.Figure:
    """A rail-optimised cluster: GPU i of every node reaches leaf switch ("rail") i through
    its NIC; the leaves meet at two spine switches."""
    node_w = gpus_per_node + 1.5
    fig = go.Figure()
    leaf_x = [i * (nodes * node_w - 1.5) / (gpus_per_node - 1) for i in range(gpus_per_node)]
    for s, sx in enumerate((leaf_x[1] + 3, leaf_x[-2] - 3)):
        _centred_box(fig, sx, 8.2, 3.0, 0.6, f"spine {s}", "#eeeeee")
        for lx in leaf_x:
            _line(fig, lx, 6.3, sx, 7.9, "#999", 1)
    for i, lx in enumerate(leaf_x):
        _centred_box(fig, lx, 6.0, 2.6, 0.6, f"rail {i} leaf", "#fde2c8", 9)
    for n in range(nodes):
        x0 = n * node_w
        fig.add_shape(
            type="rect",
            x0=x0 - 0.6,
            x1=x0 + gpus_per_node - 0.4,
            y0=-0.1,
            y1=2.0,
            line=dict(color="#333", width=1, dash="dot"),
            layer="below",
        )
        fig.add_annotation(
            x=x0 + (gpus_per_node - 1) / 2, y=-0.45, text=f"node {n} (NVSwitch inside)", showarrow=False, font=dict(size=10)
        )
        _centred_box(fig, x0 + (gpus_per_node - 1) / 2, 0.35, gpus_per_node - 0.2, 0.35, "NVSwitch", "#c6e8c6", 9)
        for g in range(gpus_per_node):
            _line(fig, x0 + g, 1.7, leaf_x[g], 5.7, PALETTE[g % len(PALETTE)], 1.2)
            _centred_box(fig, x0 + g, 1.25, 0.75, 0.6, f"{g}", "#d5efd5", 9)
            _line(fig, x0 + g, 0.95, x0 + g, 0.55, NVLINK_COLOR, 1)
    fig.update_layout(
        title="Rail-optimised fabric (schematic)<br><sup>GPU i of every node is cabled, through its NIC, to leaf switch i</sup>",
        xaxis=dict(visible=False, range=[-1.5, nodes * node_w - 0.5]),
        yaxis=dict(visible=False, range=[-0.8, 8.8]),
        height=430,
        template="plotly_white",
        showlegend=False,
        margin=dict(l=10, r=10, t=70, b=10),
    )
    return fig
