"""Launch the TMA FlashAttention kernel once per configuration, for Nsight Compute: the best
plain configuration (128 x 128 tiles, 8 warps, 3 stages), the same with 2 stages, and the
rotated loop with 2 stages (3 do not fit in shared memory). B=4, H=32, S=4096, D=128, bf16.

    ncu --clock-control none -k regex:flash_fwd_tma --section SpeedOfLight --section WarpStateStats \\
        --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy --csv --page details \\
        python scripts/profile_attention_rotate.py > attention_rotate.ncu.csv

The profiler's own log lines (``==PROF==``, ``==WARNING==``) and this script's ``done`` are
removed from the CSV kept in ``assets/benchmarks/profiles/``.
"""

import torch
import triton

import llmnote  # noqa: F401  (device setup)
from llmnote.kernels import attention

CONFIGS = [(128, 128, 8, 3, False), (128, 128, 8, 2, False), (128, 128, 8, 2, True)]  # (BLOCK_M, BLOCK_N, warps, stages, ROTATE)


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(4, 32, 4096, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    for bm, bn, warps, stages, rotate in CONFIGS:
        meta = {"BLOCK_M": bm, "BLOCK_N": bn, "WARP_SPECIALIZE": False, "ROTATE": rotate, "PREFETCH": False}
        config = triton.Config(meta, num_warps=warps, num_stages=stages)
        attention.flash_launch(q, k, v, torch.empty_like(q), False, 128**-0.5, "tma", config)
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
