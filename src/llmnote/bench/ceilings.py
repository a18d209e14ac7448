"""Measure what a GPU actually delivers: copy bandwidth (HBM and, at small sizes, L2),
host<->device bandwidth over PCIe, and cuBLAS matmul rates in bf16, fp16 and fp8."""

from __future__ import annotations

from functools import partial

import torch
from tqdm.auto import tqdm

from ..records import Record
from .timing import cuda_time_ms, rotating_inputs

__all__ = ["run_ceilings"]

MiB = 1 << 20


def _random(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, device="cuda").to(dtype)


def _copy_pair(numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(numel, dtype=torch.bfloat16, device="cuda"), _random((numel,), torch.bfloat16)


def _copy(dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    return dst.copy_(src, non_blocking=non_blocking)


def _copy_rows(rec: Record, progress: tqdm) -> None:
    # Large copies, rotated over several buffer pairs: the HBM ceiling.
    for size in (256 * MiB, 1024 * MiB, 2048 * MiB):
        sets = rotating_inputs(partial(_copy_pair, size // 2), 2 * size, min_total_bytes=4 * 2048 * MiB, max_sets=4)
        ms = cuda_time_ms(_copy, sets, warmup=5, rep=30)
        rec.add("copy", f"bytes={size // MiB} MiB", "bf16", "torch", ms, nbytes=2 * size)
        progress.update()
    # One buffer pair read and written again and again: small working sets stay in L2.
    # An elementwise kernel (negation), not copy_: inside a CUDA graph a plain copy becomes
    # a memcpy node that the DMA copy engines may serve, which measures a different path.
    for size in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
        pair = [_copy_pair(size * MiB // 2)]
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
        ms = cuda_time_ms(_copy, [(dev, host, pinned)], warmup=2, rep=10)
        rec.add("h2d-copy", f"bytes=1 GiB {label}", "uint8", "torch", ms, nbytes=size)
        ms = cuda_time_ms(_copy, [(host, dev, pinned)], warmup=2, rep=10)
        rec.add("d2h-copy", f"bytes=1 GiB {label}", "uint8", "torch", ms, nbytes=size)
        progress.update()


def _host_sweep_rows(rec: Record, progress: tqdm) -> None:
    # Pinned host-to-device copies from 4 KiB to 256 MiB: a fixed cost, then the link's rate.
    for size_kib in (4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144):
        size = size_kib * 1024
        host = torch.empty(size, dtype=torch.uint8, pin_memory=True).fill_(1)
        dev = torch.empty(size, dtype=torch.uint8, device="cuda")
        ms = cuda_time_ms(_copy, [(dev, host, True)], warmup=3, rep=20)
        rec.add("h2d-sweep", f"bytes={size_kib} KiB pinned", "uint8", "torch", ms, nbytes=size)
        progress.update()


def _fp8_matmul(a: torch.Tensor, b_t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # cuBLAS fp8 wants B column-major: pass the transpose of a row-major (N, K) tensor.
    return torch._scaled_mm(a, b_t.t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)


def _square_pair(n: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    pair = (_random((n, n), dtype), _random((n, n), dtype))
    return (*pair, torch.ones((), device="cuda")) if dtype == torch.float8_e4m3fn else pair


def _matmul_rows(rec: Record, progress: tqdm) -> None:
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float16, "fp16"), (torch.float8_e4m3fn, "fp8")):
        fn = _fp8_matmul if name == "fp8" else torch.matmul
        elem = torch.finfo(dtype).bits // 8
        for n in (1024, 2048, 4096, 8192, 16384):
            sets = rotating_inputs(partial(_square_pair, n, dtype), 2 * n * n * elem)
            # Replayed from a CUDA graph: small products finish faster than Python can launch them.
            ms = cuda_time_ms(fn, sets, warmup=10, rep=30 if n < 16384 else 10, graph_calls=10)
            rec.add("matmul", f"M=N=K={n}", name, "torch", ms, flops=2 * n**3, nbytes=3 * n * n * elem)
            del sets
            torch.cuda.empty_cache()
            progress.update()


def run_ceilings(command: str | None = None) -> Record:
    """Measure every ceiling on the current GPU and return the record (not yet saved)."""
    if not torch.cuda.is_available():
        raise RuntimeError("measuring ceilings needs a CUDA GPU")
    rec = Record() if command is None else Record(command=command)
    with tqdm(total=3 + 11 + 2 + 9 + 15, desc="ceilings") as progress:
        _copy_rows(rec, progress)
        _host_rows(rec, progress)
        _host_sweep_rows(rec, progress)
        _matmul_rows(rec, progress)
    return rec
