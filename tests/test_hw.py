"""The spec table, the hierarchy model and the occupancy calculator."""

import math

import pytest

from llmnote import hw

REQUIRED = ("A100", "H100 SXM", "H200", "B200", "L4", "T4", "RTX 4090")


def test_table_covers_the_gpus_the_book_uses():
    for name in REQUIRED:
        assert name in hw.GPUS


@pytest.mark.parametrize("name", list(hw.GPUS))
def test_every_spec_is_complete_and_sourced(name):
    s = hw.get_gpu(name)
    assert s.sources and all(src.startswith("https://") for src in s.sources)
    assert s.sm_count > 0 and s.memory_gb > 0 and s.memory_tbps > 0 and s.l2_mb > 0
    assert 0 < s.smem_per_sm_kb <= s.l1_smem_per_sm_kb
    assert s.registers_per_sm_kb == 256
    assert s.fp32_tflops > 0 and s.pcie_gbps > 0
    # Tensor cores are faster than CUDA cores, and halving the format never lowers the rate.
    rates = [s.tensor_tflops[f] for f in ("fp16", "fp8", "fp4") if s.tensor_tflops[f]]
    assert rates[0] > s.fp32_tflops
    assert rates == sorted(rates)
    if s.tensor_tflops["bf16"]:
        assert s.tensor_tflops["bf16"] == s.tensor_tflops["fp16"]


def test_datasheet_numbers_of_the_h200():
    h200, h100 = hw.get_gpu("H200"), hw.get_gpu("H100 SXM")
    assert (h200.memory_gb, h200.memory_tbps) == (141, 4.8)
    assert h200.tensor_tflops == h100.tensor_tflops  # same Hopper die, same clocks
    assert h200.ridge_point("bf16") == pytest.approx(989.4 / 4.8)
    assert h100.ridge_point("bf16") > h200.ridge_point("bf16")


@pytest.mark.parametrize("name,flops_per_clock_per_tensor_core", [("V100", 128), ("A100", 512)])
def test_tensor_rates_follow_from_clock_and_units(name, flops_per_clock_per_tensor_core):
    s = hw.get_gpu(name)
    rate = s.boost_clock_mhz * 1e6 * s.sm_count * s.tensor_cores_per_sm * flops_per_clock_per_tensor_core / 1e12
    assert rate == pytest.approx(s.tensor_tflops["fp16"], rel=0.01)


def test_lookup_by_driver_name_and_errors():
    assert hw.get_gpu("NVIDIA H200").name == "H200"
    assert hw.get_gpu("h100").name == "H100 SXM"
    with pytest.raises(ValueError, match="unknown GPU"):
        hw.get_gpu("Voodoo2")
    with pytest.raises(TypeError):
        hw.get_gpu(3)
    with pytest.raises(ValueError, match="do not support fp8"):
        hw.get_gpu("A100").peak_tflops("fp8")
    with pytest.raises(ValueError, match="dtype must be one of"):
        hw.get_gpu("A100").peak_tflops("fp64x")


def test_memory_levels_are_ordered_fast_and_small_to_slow_and_big():
    for name in hw.GPUS:
        levels = hw.memory_levels(name)
        bws = [lv.bandwidth_tbps for lv in levels]
        assert bws == sorted(bws, reverse=True)
        assert levels[-1].capacity_bytes > levels[2].capacity_bytes  # DRAM > L2
        assert not levels[-1].estimate


def test_bandwidth_ladder_descends_and_includes_the_links():
    ladder = hw.bandwidth_ladder("H200")
    names = [lv.name for lv in ladder]
    assert any("NVLink" in n for n in names) and any("PCIe" in n for n in names)
    bws = [lv.bandwidth_tbps for lv in ladder]
    assert bws == sorted(bws, reverse=True)
    assert not any("NVLink" in lv.name for lv in hw.bandwidth_ladder("L4"))  # no NVLink on L4


def test_register_estimate_follows_from_per_clock_widths():
    s = hw.get_gpu("H200")
    regs = hw.memory_levels(s)[0]
    assert regs.bandwidth_tbps == pytest.approx(1536 * s.boost_clock_mhz * 1e6 * s.sm_count / 1e12)
    assert regs.capacity_bytes == 256 * 1024 * 132


@pytest.mark.parametrize(
    "threads,regs,smem,blocks,limit",
    [
        (256, 32, 0, 8, "threads"),  # 2048 threads / 256
        (256, 128, 0, 2, "registers"),  # 65536 regs / (256 * 128)
        (128, 64, 96 * 1024, 2, "shared memory"),  # 228 KB / (96 KB + 1 KB reserved)
        (32, 16, 0, 32, "blocks"),  # the 32-blocks-per-SM cap
    ],
)
def test_occupancy_on_hopper(threads, regs, smem, blocks, limit):
    occ = hw.occupancy("H200", threads, regs, smem)
    assert (occ.blocks_per_sm, occ.limited_by) == (blocks, limit)
    assert occ.warps_per_sm == blocks * math.ceil(threads / 32)
    assert 0 < occ.fraction <= 1


def test_occupancy_rejects_impossible_kernels():
    with pytest.raises(ValueError, match="threads_per_block"):
        hw.occupancy("H200", 2048)
    with pytest.raises(ValueError, match="registers_per_thread"):
        hw.occupancy("H200", 128, 300)
    with pytest.raises(ValueError, match="smem_per_block_bytes"):
        hw.occupancy("T4", 128, 32, 100 * 1024)
    with pytest.raises(ValueError, match="smem_per_block_bytes"):  # 1 KB of the 228 KB is reserved per block
        hw.occupancy("H200", 256, 32, 228 * 1024)
    assert hw.occupancy("H200", 256, 32, 227 * 1024).blocks_per_sm == 1


def test_measured_ceilings_come_from_the_record():
    c = hw.measured_ceilings()
    assert c is not None, "assets/benchmarks/ceilings.json is part of the book"
    assert hw.get_gpu(c.gpu).name == "H200"
    spec = hw.get_gpu("H200")
    # Measured copy bandwidth and cuBLAS rates are real fractions of the datasheet.
    assert 0.6 * spec.memory_tbps < c.copy_tbps < spec.memory_tbps
    assert 0.5 * spec.tensor_tflops["bf16"] < c.matmul_tflops["bf16"] < spec.tensor_tflops["bf16"]
    assert c.matmul_tflops["fp8"] > c.matmul_tflops["bf16"]
    assert 0 < c.h2d_gbps < spec.pcie_gbps
