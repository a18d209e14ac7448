"""The one table of GPU specifications the whole book reads.

Every number here comes from the vendor's datasheet or architecture whitepaper named in
``sources``; tensor-core rates are **dense** (NVIDIA's headline numbers are often "with
sparsity", twice these). Where a format is not supported by the tensor cores the rate is
``None``. Change a number here and every figure and calculation in the book follows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["GPUSpec", "GPUS", "DTYPE_BYTES", "get_gpu", "gpu_names"]

# Bytes per element of the formats the book talks about.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "tf32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
    "fp4": 0.5,
    "int4": 0.5,
}


@dataclass(frozen=True)
class GPUSpec:
    """One GPU's headline numbers. Units are in the field names."""

    name: str
    architecture: str  # Volta, Turing, Ampere, Ada Lovelace, Hopper, Blackwell
    compute_capability: str
    year: int
    sm_count: int
    boost_clock_mhz: int  # maximum boost clock (Hopper's tensor-core rates assume 1830 MHz)
    memory_type: str
    memory_gb: float
    memory_tbps: float  # peak DRAM bandwidth, TB/s (1e12 bytes/s)
    l2_mb: float
    smem_per_sm_kb: int  # largest shared-memory carve-out one SM can give to blocks
    l1_smem_per_sm_kb: int  # the combined L1 / shared-memory array per SM
    registers_per_sm_kb: int  # 32-bit register file per SM
    max_threads_per_sm: int
    tensor_cores_per_sm: int
    fp32_tflops: float  # plain (CUDA-core) fp32 FMA rate
    tensor_tflops: dict[str, float | None]  # dense tensor-core rate per input format
    nvlink_gbps: float | None  # total NVLink bandwidth per GPU, both directions, GB/s
    pcie: str
    pcie_gbps: float  # host link, one direction, GB/s (theoretical)
    tdp_w: int
    features: tuple[str, ...]  # what this generation added that LLM inference uses
    sources: tuple[str, ...] = field(default=())

    @property
    def max_warps_per_sm(self) -> int:
        return self.max_threads_per_sm // 32

    def peak_tflops(self, dtype: str) -> float:
        """Dense peak rate for matrix work in ``dtype`` (fp32 means CUDA cores)."""
        dtype = dtype.lower()
        if dtype == "fp32":
            return self.fp32_tflops
        if dtype not in self.tensor_tflops:
            raise ValueError(f"dtype must be one of {sorted(self.tensor_tflops) + ['fp32']}, got {dtype!r}")
        rate = self.tensor_tflops[dtype]
        if rate is None:
            raise ValueError(f"{self.name} tensor cores do not support {dtype}")
        return rate

    def supports(self, dtype: str) -> bool:
        return dtype.lower() == "fp32" or self.tensor_tflops.get(dtype.lower()) is not None

    def ridge_point(self, dtype: str = "bf16") -> float:
        """Arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
        return self.peak_tflops(dtype) / self.memory_tbps


def _rates(tf32=None, fp16=None, bf16=None, fp8=None, int8=None, fp4=None) -> dict[str, float | None]:
    return {"tf32": tf32, "fp16": fp16, "bf16": bf16, "fp8": fp8, "int8": int8, "fp4": fp4}


_DC_SMEM = "https://docs.nvidia.com/cuda/cuda-c-programming-guide/#features-and-technical-specifications"

_H100 = GPUSpec(
    name="H100 SXM",
    architecture="Hopper",
    compute_capability="9.0",
    year=2022,
    sm_count=132,
    boost_clock_mhz=1980,
    memory_type="HBM3",
    memory_gb=80,
    memory_tbps=3.35,
    l2_mb=50,
    smem_per_sm_kb=228,
    l1_smem_per_sm_kb=256,
    registers_per_sm_kb=256,
    max_threads_per_sm=2048,
    tensor_cores_per_sm=4,
    fp32_tflops=67,
    tensor_tflops=_rates(tf32=494.7, fp16=989.4, bf16=989.4, fp8=1978.9, int8=1978.9),
    nvlink_gbps=900,
    pcie="PCIe 5.0 x16",
    pcie_gbps=64,
    tdp_w=700,
    features=(
        "FP8 (E4M3/E5M2) tensor cores",
        "TMA (tensor memory accelerator)",
        "wgmma (warp-group matrix multiply)",
        "thread-block clusters, distributed shared memory",
        "NVLink 4 / NVSwitch",
    ),
    sources=(
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
        "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper",
        _DC_SMEM,
    ),
)

# The H200 is the H100's die and clocks with more, faster memory.
_H200 = replace(
    _H100,
    name="H200",
    year=2024,
    memory_type="HBM3e",
    memory_gb=141,
    memory_tbps=4.8,
    l2_mb=60,  # what the driver reports on our H200 (an H100 SXM reports 50)
    features=("the H100's compute with 141 GB of HBM3e at 4.8 TB/s",),
    sources=("https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446", _DC_SMEM),
)

GPUS: dict[str, GPUSpec] = {
    spec.name: spec
    for spec in [
        GPUSpec(
            name="V100",
            architecture="Volta",
            compute_capability="7.0",
            year=2017,
            sm_count=80,
            boost_clock_mhz=1530,
            memory_type="HBM2",
            memory_gb=32,
            memory_tbps=0.90,
            l2_mb=6,
            smem_per_sm_kb=96,
            l1_smem_per_sm_kb=128,
            registers_per_sm_kb=256,
            max_threads_per_sm=2048,
            tensor_cores_per_sm=8,
            fp32_tflops=15.7,
            tensor_tflops=_rates(fp16=125),
            nvlink_gbps=300,
            pcie="PCIe 3.0 x16",
            pcie_gbps=16,
            tdp_w=300,
            features=("first tensor cores (fp16 in, fp32 accumulate)", "independent thread scheduling", "NVLink 2"),
            sources=(
                "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
                "https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf",
            ),
        ),
        GPUSpec(
            name="T4",
            architecture="Turing",
            compute_capability="7.5",
            year=2018,
            sm_count=40,
            boost_clock_mhz=1590,
            memory_type="GDDR6",
            memory_gb=16,
            memory_tbps=0.32,
            l2_mb=4,
            smem_per_sm_kb=64,
            l1_smem_per_sm_kb=96,
            registers_per_sm_kb=256,
            max_threads_per_sm=1024,
            tensor_cores_per_sm=8,
            fp32_tflops=8.1,
            tensor_tflops=_rates(fp16=65, int8=130),
            nvlink_gbps=None,
            pcie="PCIe 3.0 x16",
            pcie_gbps=16,
            tdp_w=70,
            features=("INT8/INT4 tensor cores", "70 W inference card"),
            sources=(
                "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf",
                "https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf",
            ),
        ),
        GPUSpec(
            name="A100",
            architecture="Ampere",
            compute_capability="8.0",
            year=2020,
            sm_count=108,
            boost_clock_mhz=1410,
            memory_type="HBM2e",
            memory_gb=80,
            memory_tbps=2.039,
            l2_mb=40,
            smem_per_sm_kb=164,
            l1_smem_per_sm_kb=192,
            registers_per_sm_kb=256,
            max_threads_per_sm=2048,
            tensor_cores_per_sm=4,
            fp32_tflops=19.5,
            tensor_tflops=_rates(tf32=156, fp16=312, bf16=312, int8=624),
            nvlink_gbps=600,
            pcie="PCIe 4.0 x16",
            pcie_gbps=32,
            tdp_w=400,
            features=("BF16 and TF32 tensor cores", "async copy global->shared (cp.async)", "2:4 sparsity", "MIG"),
            sources=(
                "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
                "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf",
            ),
        ),
        GPUSpec(
            name="L4",
            architecture="Ada Lovelace",
            compute_capability="8.9",
            year=2023,
            sm_count=58,
            boost_clock_mhz=2040,
            memory_type="GDDR6",
            memory_gb=24,
            memory_tbps=0.30,
            l2_mb=48,
            smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128,
            registers_per_sm_kb=256,
            max_threads_per_sm=1536,
            tensor_cores_per_sm=4,
            fp32_tflops=30.3,
            tensor_tflops=_rates(tf32=60, fp16=121, bf16=121, fp8=242.5, int8=242.5),
            nvlink_gbps=None,
            pcie="PCIe 4.0 x16",
            pcie_gbps=32,
            tdp_w=72,
            features=("FP8 tensor cores on a 72 W card", "large L2 for a small DRAM bus"),
            sources=(
                "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/l4/PB-11316-001_v01.pdf",
                "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
            ),
        ),
        GPUSpec(
            name="RTX 4090",
            architecture="Ada Lovelace",
            compute_capability="8.9",
            year=2022,
            sm_count=128,
            boost_clock_mhz=2520,
            memory_type="GDDR6X",
            memory_gb=24,
            memory_tbps=1.008,
            l2_mb=72,
            smem_per_sm_kb=100,
            l1_smem_per_sm_kb=128,
            registers_per_sm_kb=256,
            max_threads_per_sm=1536,
            tensor_cores_per_sm=4,
            fp32_tflops=82.6,
            # GeForce: rates with fp32 accumulation (what LLM kernels use) are half the fp16-accumulate ones.
            tensor_tflops=_rates(tf32=82.6, fp16=165.2, bf16=165.2, fp8=330.3, int8=660.6),
            nvlink_gbps=None,
            pcie="PCIe 4.0 x16",
            pcie_gbps=32,
            tdp_w=450,
            features=("consumer Ada: FP8 tensor cores, 72 MB L2", "no NVLink"),
            sources=("https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",),
        ),
        _H100,
        _H200,
        GPUSpec(
            name="B200",
            architecture="Blackwell",
            compute_capability="10.0",
            year=2025,
            sm_count=148,
            boost_clock_mhz=1965,
            memory_type="HBM3e",
            memory_gb=180,
            memory_tbps=7.7,
            l2_mb=126,
            smem_per_sm_kb=228,
            l1_smem_per_sm_kb=256,
            registers_per_sm_kb=256,
            max_threads_per_sm=2048,
            tensor_cores_per_sm=4,
            fp32_tflops=75,
            tensor_tflops=_rates(tf32=1100, fp16=2250, bf16=2250, fp8=4500, int8=4500, fp4=9000),
            nvlink_gbps=1800,
            pcie="PCIe 5.0 x16",
            pcie_gbps=64,
            tdp_w=1000,
            features=(
                "FP4 (NVFP4, MXFP4) and FP6 tensor cores, block-scaled formats in hardware",
                "tcgen05 MMA with tensor memory (TMEM, 256 KB per SM)",
                "two dies as one GPU",
                "NVLink 5 (1.8 TB/s), NVL72 racks",
            ),
            sources=(
                "https://resources.nvidia.com/en-us-dgx-systems/dgx-b200-datasheet",
                "https://resources.nvidia.com/en-us-blackwell-architecture",
                "https://chipsandcheese.com/p/nvidias-b200-keeping-the-cuda-juggernaut",
            ),
        ),
    ]
}

_ALIASES = {
    "h100": "H100 SXM",
    "h100-sxm": "H100 SXM",
    "nvidia h100 80gb hbm3": "H100 SXM",
    "nvidia h200": "H200",
    "rtx4090": "RTX 4090",
    "4090": "RTX 4090",
    "nvidia geforce rtx 4090": "RTX 4090",
    "tesla t4": "T4",
    "nvidia a100-sxm4-80gb": "A100",
    "nvidia l4": "L4",
    "tesla v100-sxm2-32gb": "V100",
    "nvidia b200": "B200",
}


def gpu_names() -> list[str]:
    """Names accepted by :func:`get_gpu`, oldest architecture first."""
    return list(GPUS)


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """Look a GPU up by table name, alias or ``torch.cuda.get_device_name()`` string."""
    if isinstance(name, GPUSpec):
        return name
    if not isinstance(name, str):
        raise TypeError(f"name must be a str or GPUSpec, got {type(name).__name__}")
    if name in GPUS:
        return GPUS[name]
    key = name.strip().lower()
    for table_name in GPUS:
        if table_name.lower() == key:
            return GPUS[table_name]
    if key in _ALIASES:
        return GPUS[_ALIASES[key]]
    raise ValueError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}")
