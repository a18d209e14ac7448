"""GPU specifications (one table) and the ceilings measured on our own H200."""

from .ceilings import measured_ceilings
from .specs import DTYPE_BYTES, GPUS, GPUSpec, get_gpu, gpu_names

__all__ = ["DTYPE_BYTES", "GPUS", "GPUSpec", "get_gpu", "gpu_names", "measured_ceilings"]
