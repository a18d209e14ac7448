"""Live controls (ipywidgets) on top of the static figures, for a running kernel.

The website has no kernel: there the plotly figures carry the same controls
(``roofline_explorer_figure``, ``memory_hierarchy_figure(..., gpus=...)``), and the cells
that call these explorers are removed from the pages.
"""

from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from IPython.display import display

from ..hw import get_gpu, gpu_names
from ..roofline import LLAMA3_8B, attainable_tflops
from .hierarchy import MATMUL_TILES, matmul_traffic
from .roofline_figures import FORMATS, moving_workloads

__all__ = ["roofline_explorer", "roofline_snapshot", "hierarchy_explorer", "hierarchy_text"]


def roofline_snapshot(gpu: str, dtype: str, batch: int):
    """A matplotlib roofline with the three moving workloads at one batch size."""
    spec = get_gpu(gpu)
    x = np.logspace(-1, 4.5, 200)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.loglog(x, attainable_tflops(x, spec, dtype), "k-", lw=2, label=f"{spec.name} {dtype} roof")
    for w, color in zip(moving_workloads(batch, LLAMA3_8B, dtype), ("tab:blue", "tab:red", "tab:green")):
        ax.loglog(
            [w.intensity],
            [w.attainable_tflops(spec, dtype)],
            "o",
            ms=10,
            color=color,
            label=f"{w.name.split(':')[0]}: {w.intensity:.0f} FLOP/B, {w.bound(spec, dtype)}-bound",
        )
    ax.axvline(spec.ridge_point(dtype), color="gray", ls=":", label=f"ridge {spec.ridge_point(dtype):.0f} FLOP/B")
    ax.set(xlabel="FLOP per byte", ylabel="TFLOP/s", title=f"batch = {batch}")
    ax.legend(fontsize=7, loc="lower right")
    plt.close(fig)
    return fig


def roofline_explorer(gpu: str = "H200", dtype: str = "bf16") -> widgets.VBox:
    """GPU, format and batch controls redrawing the roofline (matplotlib) as they change."""
    gpu_w = widgets.Dropdown(options=gpu_names(), value=get_gpu(gpu).name, description="GPU")
    dtype_w = widgets.Dropdown(options=[f for f in FORMATS if get_gpu(gpu).supports(f)], value=dtype, description="format")
    batch_w = widgets.IntSlider(value=0, min=0, max=10, description="log2 batch")
    out = widgets.Output()

    def redraw(*_):
        supported = [f for f in FORMATS if get_gpu(gpu_w.value).supports(f)]
        if list(dtype_w.options) != supported:
            dtype_w.options = supported
            dtype_w.value = "bf16" if "bf16" in supported else "fp16"
        with out:
            out.clear_output(wait=True)
            display(roofline_snapshot(gpu_w.value, dtype_w.value, 2**batch_w.value))

    for w in (gpu_w, dtype_w, batch_w):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([gpu_w, dtype_w, batch_w]), out])


def hierarchy_text(gpu: str, tile: int, n: int) -> str:
    """Bytes per boundary of an ``n``-cubed matmul with ``tile``-sized tiles, as text."""
    dtype = "bf16" if get_gpu(gpu).supports("bf16") else "fp16"
    t = matmul_traffic(n, tile, gpu, dtype)
    names = ("DRAM → L2", "L2 → SMs", "shared → registers")
    return "\n".join(f"{name:20s} {nb / 1e9:10.2f} GB" for name, nb in zip(names, t.bytes))


def hierarchy_explorer(gpu: str = "H200", n: int = 8192) -> widgets.VBox:
    """GPU and tile-size controls printing the bytes per boundary of an ``n``-cubed matmul."""
    gpu_w = widgets.Dropdown(options=gpu_names(), value=get_gpu(gpu).name, description="GPU")
    tile_w = widgets.SelectionSlider(options=list(MATMUL_TILES), value=128, description="tile")
    out = widgets.Output()

    def redraw(*_):
        with out:
            out.clear_output(wait=True)
            print(hierarchy_text(gpu_w.value, tile_w.value, n))

    for w in (gpu_w, tile_w):
        w.observe(redraw, names="value")
    redraw()
    return widgets.VBox([widgets.HBox([gpu_w, tile_w]), out])
