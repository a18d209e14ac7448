"""GPU specifications (one table) and the ceilings measured on a real GPU (the recorded H200)."""

from .hierarchy import NETWORK_GBPS, Level, bandwidth_ladder, memory_levels
from .measured_ceilings import measured_ceilings
from .occupancy import Occupancy, max_blocks_per_sm, occupancy
from .specs import DTYPE_BYTES, GPUS, GPUSpec, get_gpu, gpu_names

__all__ = [
    "NETWORK_GBPS",
    "Occupancy",
    "max_blocks_per_sm",
    "occupancy",
    "Level",
    "bandwidth_ladder",
    "memory_levels",
    "DTYPE_BYTES",
    "GPUS",
    "GPUSpec",
    "get_gpu",
    "gpu_names",
    "measured_ceilings",
]
