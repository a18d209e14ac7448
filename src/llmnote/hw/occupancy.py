"""Occupancy: how many warps an SM can keep resident for a kernel, and what limits it.

The SM holds a block only if it has room for all of it: threads, registers and shared
memory. Whichever runs out first sets the number of resident blocks. The rules follow
the CUDA programming guide's occupancy section (register allocation per warp in units of
256, 1 KB of shared memory reserved per block from compute capability 8.0 on).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .specs import GPUSpec, get_gpu

__all__ = ["Occupancy", "occupancy", "max_blocks_per_sm"]

_MAX_BLOCKS = {"7.0": 32, "7.5": 16, "8.0": 32, "8.6": 16, "8.9": 24, "9.0": 32, "10.0": 32}


def max_blocks_per_sm(gpu: str | GPUSpec) -> int:
    return _MAX_BLOCKS[get_gpu(gpu).compute_capability]


@dataclass(frozen=True)
class Occupancy:
    blocks_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int
    limited_by: str  # "threads", "registers", "shared memory" or "blocks"

    @property
    def fraction(self) -> float:
        """Resident warps over the most the SM can hold."""
        return self.warps_per_sm / self.max_warps_per_sm


def occupancy(
    gpu: str | GPUSpec, threads_per_block: int, registers_per_thread: int = 32, smem_per_block_bytes: int = 0
) -> Occupancy:
    """Resident blocks and warps per SM for a kernel with these resources."""
    spec = get_gpu(gpu)
    if not 1 <= threads_per_block <= 1024:
        raise ValueError(f"threads_per_block must be in [1, 1024], got {threads_per_block}")
    if not 1 <= registers_per_thread <= 255:
        raise ValueError(f"registers_per_thread must be in [1, 255], got {registers_per_thread}")
    reserved = 1024 if float(spec.compute_capability) >= 8.0 else 0
    smem_limit = spec.smem_per_sm_kb * 1024 - reserved
    if not 0 <= smem_per_block_bytes <= smem_limit:
        raise ValueError(f"smem_per_block_bytes must be in [0, {smem_limit}] on {spec.name}")
    warps = math.ceil(threads_per_block / 32)
    regs_per_warp = math.ceil(registers_per_thread * 32 / 256) * 256
    limits = {
        "threads": spec.max_threads_per_sm // (warps * 32),
        "registers": (spec.registers_per_sm_kb * 1024 // 4) // (regs_per_warp * warps),
        "shared memory": (spec.smem_per_sm_kb * 1024) // (smem_per_block_bytes + reserved) if smem_per_block_bytes else 10**9,
        "blocks": max_blocks_per_sm(spec),
    }
    limited_by = min(limits, key=limits.get)
    blocks = limits[limited_by]
    return Occupancy(blocks, blocks * warps, spec.max_warps_per_sm, limited_by)
