"""Measure what a GPU actually delivers: copy bandwidth (HBM and, at small sizes, L2),
host<->device bandwidth over PCIe, and cuBLAS matmul rates in bf16, fp16 and fp8."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from .record import Record
from .timing import cuda_time_ms, rotating_inputs

__all__ = ["run_ceilings"]

MiB = 1 << 20


def _copy_rows(rec: Record, progress: tqdm) -> None:
    # Large copies, rotated over several buffer pairs: the HBM ceiling.
    for size in (256 * MiB, 1024 * MiB, 2048 * MiB):
        n = size // 2  # bf16 elements
        sets = rotating_inputs(lambda: (torch.empty(n, dtype=torch.bfloat16, device="cuda"), torch.randn(n, device="cuda").to(torch.bfloat16)), 2 * size, min_total_bytes=4 * 2048 * MiB, max_sets=4)
        ms = cuda_time_ms(lambda dst, src: dst.copy_(src), sets, warmup=5, rep=30)
        rec.add("copy", f"bytes={size // MiB} MiB", "bf16", "torch", ms, nbytes=2 * size)
        progress.update()
    # One buffer pair read and written again and again: small working sets stay in L2.
    # An elementwise kernel (negation), not copy_: inside a CUDA graph a plain copy becomes
    # a memcpy node that the DMA copy engines may serve, which measures a different path.
    for size in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        n = size * MiB // 2
        pair = [(torch.empty(n, dtype=torch.bfloat16, device="cuda"), torch.randn(n, device="cuda").to(torch.bfloat16))]
        ms = cuda_time_ms(lambda dst, src: torch.neg(src, out=dst), pair, warmup=20, rep=100, graph_calls=20)
        rec.add("copy-sweep", f"working set={2 * size} MiB", "bf16", "torch", ms, nbytes=2 * size * MiB)
        progress.update()


def _host_rows(rec: Record, progress: tqdm) -> None:
    size = 1024 * MiB
    dev = torch.empty(size, dtype=torch.uint8, device="cuda")
    for pinned in (True, False):
        host = torch.empty(size, dtype=torch.uint8, pin_memory=pinned)
        host.fill_(1)
        label = "pinned" if pinned else "pageable"
        ms = cuda_time_ms(lambda: dev.copy_(host, non_blocking=pinned), [()], warmup=2, rep=10)
        rec.add("h2d-copy", f"bytes=1 GiB {label}", "uint8", "torch", ms, nbytes=size)
        ms = cuda_time_ms(lambda: host.copy_(dev, non_blocking=pinned), [()], warmup=2, rep=10)
        rec.add("d2h-copy", f"bytes=1 GiB {label}", "uint8", "torch", ms, nbytes=size)
        progress.update()


def _fp8_matmul(a: torch.Tensor, b_t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # cuBLAS fp8 wants B column-major: pass the transpose of a row-major (N, K) tensor.
    return torch._scaled_mm(a, b_t.t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)


def _matmul_rows(rec: Record, progress: tqdm) -> None:
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float8_e4m3fn, "fp8")):
        for n in (1024, 2048, 4096, 8192, 16384):
            flops = 2 * n**3
            elem = torch.finfo(dtype).bits // 8
            if name == "fp8":
                scale = torch.ones((), device="cuda")
                sets = rotating_inputs(
                    lambda: (torch.randn(n, n, device="cuda").to(dtype), torch.randn(n, n, device="cuda").to(dtype), scale),
                    2 * n * n * elem,
                )
                fn = _fp8_matmul
            else:
                sets = rotating_inputs(lambda: (torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)), 2 * n * n * elem)
                fn = torch.matmul
            ms = cuda_time_ms(fn, sets, warmup=10, rep=30 if n < 16384 else 10)
            rec.add("matmul", f"M=N=K={n}", name, "torch", ms, flops=flops, nbytes=3 * n * n * elem)
            del sets
            torch.cuda.empty_cache()
            progress.update()


def run_ceilings(command: str | None = None) -> Record:
    """Measure every ceiling on the current GPU and return the record (not yet saved)."""
    if not torch.cuda.is_available():
        raise RuntimeError("measuring ceilings needs a CUDA GPU")
    rec = Record() if command is None else Record(command=command)
    with tqdm(total=3 + 11 + 2 + 15, desc="ceilings") as progress:
        _copy_rows(rec, progress)
        _host_rows(rec, progress)
        _matmul_rows(rec, progress)
    return rec
