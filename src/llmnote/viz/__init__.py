"""The book's figures and widgets. Plotly figures animate, and their menus and sliders
respond, on the static site with no kernel (``roofline_explorer_figure`` and
``memory_hierarchy_figure(..., gpus=...)`` are the static twins of the live controls); the
``*_explorer`` functions add live ipywidgets controls in a running kernel (imported on
first use, so the figures work where ipywidgets is not installed)."""

import importlib

from .figures import GENERATION_GPUS, bandwidth_ladder_figure, generations_figure, specs_table
from .hierarchy import elementwise_traffic, matmul_traffic, memory_hierarchy_figure
from .roofline_figures import measured_points, roofline_explorer_figure, roofline_figure

__all__ = [
    "GENERATION_GPUS",
    "bandwidth_ladder_figure",
    "elementwise_traffic",
    "generations_figure",
    "hierarchy_explorer",
    "matmul_traffic",
    "measured_points",
    "memory_hierarchy_figure",
    "roofline_explorer",
    "roofline_explorer_figure",
    "roofline_figure",
    "specs_table",
]


def __getattr__(name: str):
    if name in ("roofline_explorer", "hierarchy_explorer", "explorer"):
        explorer = importlib.import_module(f"{__name__}.explorer")
        return explorer if name == "explorer" else getattr(explorer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
