"""The book's figures and widgets. Plotly figures animate on the static site; the
``*_explorer`` functions add live ipywidgets controls in a running kernel."""

from .explorer import hierarchy_explorer, roofline_explorer
from .figures import GENERATION_GPUS, bandwidth_ladder_figure, generations_figure, specs_table
from .hierarchy import elementwise_traffic, matmul_traffic, memory_hierarchy_figure
from .roofline import measured_points, roofline_figure

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
    "roofline_figure",
    "specs_table",
]
