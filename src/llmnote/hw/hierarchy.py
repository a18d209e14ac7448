"""The memory hierarchy and the bandwidth ladder of a GPU, from registers to the network.

DRAM numbers come from the spec table. Datasheets do not give on-chip bandwidths, so
these are derived from per-clock widths stated in NVIDIA's architecture whitepapers and
the CUDA programming guide, and labelled as estimates:

* registers: each of the 4 SM sub-partitions feeds 32 lanes with up to 3 operands of
  4 bytes per clock, 1536 B/clock/SM;
* shared memory / L1: 32 banks of 4 bytes, 128 B/clock/SM;
* L2: about 2.5x DRAM bandwidth, the ratio microbenchmarks report on Ampere and Hopper
  (our own H200 measurement is in ``assets/benchmarks/ceilings.json``, ``copy-sweep``).
"""

from __future__ import annotations

from dataclasses import dataclass

from .specs import GPUSpec, get_gpu

__all__ = ["Level", "memory_levels", "bandwidth_ladder", "NETWORK_GBPS"]

# Links off the node, per GPU and per direction (one NIC per GPU, as in DGX-class nodes).
NETWORK_GBPS = {
    "InfiniBand NDR (400 Gb/s)": 50.0,
    "Ethernet 100 Gb/s": 12.5,
}


@dataclass(frozen=True)
class Level:
    name: str
    capacity_bytes: float | None  # None for links
    bandwidth_tbps: float  # aggregate over the whole GPU, TB/s
    estimate: bool  # True when derived from per-clock widths rather than a datasheet


def memory_levels(gpu: str | GPUSpec = "H200") -> list[Level]:
    """Registers, shared memory/L1, L2, DRAM: fastest and smallest first."""
    spec = get_gpu(gpu)
    clock_sms = spec.boost_clock_mhz * 1e6 * spec.sm_count
    return [
        Level("Registers", spec.registers_per_sm_kb * 1024 * spec.sm_count, 1536 * clock_sms / 1e12, True),
        Level("Shared memory / L1", spec.l1_smem_per_sm_kb * 1024 * spec.sm_count, 128 * clock_sms / 1e12, True),
        Level("L2 cache", spec.l2_mb * 2**20, 2.5 * spec.memory_tbps, True),
        Level(f"DRAM ({spec.memory_type})", spec.memory_gb * 1e9, spec.memory_tbps, False),
    ]


def bandwidth_ladder(gpu: str | GPUSpec = "H200") -> list[Level]:
    """Every level a byte can come from, down to another node's memory, in TB/s."""
    spec = get_gpu(gpu)
    ladder = memory_levels(spec)
    if spec.nvlink_gbps:
        ladder.append(Level("NVLink (to a peer GPU, one direction)", None, spec.nvlink_gbps / 2 / 1000, False))
    ladder.append(Level(f"{spec.pcie} (to the host, one direction)", None, spec.pcie_gbps / 1000, False))
    ladder += [Level(f"{name} (to another node)", None, gbps / 1000, False) for name, gbps in NETWORK_GBPS.items()]
    return ladder
