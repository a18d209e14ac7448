"""The matmul benchmark (``python -m llmnote.bench matmul``): the book's Triton matmul
against torch (cuBLAS), in one run, on square sizes in bf16 and fp16 and on the projection
shapes of Llama-3-8B at decode and prefill batch sizes. Every case is checked against a
float32 product before it is timed, and every time is a CUDA-graph replay (so Python launch
cost, which differs between providers, is not counted).
"""

from __future__ import annotations

from functools import partial

import torch
from tqdm.auto import tqdm

from .. import kernels
from ..models.zoo import MODEL_ZOO
from ..records import Record
from .timing import check_before_timing, cuda_time_ms, rotating_inputs

__all__ = ["run_matmul", "SQUARE_SIZES", "llama_projection_shapes"]

SQUARE_SIZES = (512, 1024, 2048, 3072, 4096, 6144, 8192)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def llama_projection_shapes() -> dict[str, tuple[int, int]]:
    """(N, K) of Llama-3-8B's four projection matmuls, from its config."""
    s = MODEL_ZOO["Llama-3-8B"]
    q, kv = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
    return {
        "qkv_proj": (q + 2 * kv, s.hidden_size),
        "o_proj": (s.hidden_size, q),
        "gate_up_proj": (2 * s.intermediate_size, s.hidden_size),
        "down_proj": (s.hidden_size, s.intermediate_size),
    }


def _pair(m: int, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)


def _time_matmul(rec: Record, case: str, m: int, n: int, k: int, dtype_name: str) -> None:
    dtype = DTYPES[dtype_name]
    elem = torch.finfo(dtype).bits // 8
    sets = rotating_inputs(partial(_pair, m, n, k, dtype), (m * k + k * n) * elem)
    a, b = sets[0]
    check_before_timing(f"matmul {case} {dtype_name}", kernels.matmul(a, b), torch.matmul(a.float(), b.float()), 1e-2)
    for provider, fn in (("llmnote", kernels.matmul), ("torch", torch.matmul)):
        ms = cuda_time_ms(fn, sets, warmup=5, rep=20, graph_calls=10)
        rec.add("matmul", case, dtype_name, provider, ms, flops=2 * m * n * k, nbytes=(m * k + k * n + m * n) * elem)


def run_matmul(command: str | None = None) -> Record:
    """Time every matmul case (ours and cuBLAS) on the current GPU; return the record, not yet saved."""
    rec = Record() if command is None else Record(command=command)
    shapes = llama_projection_shapes()
    cases = [(f"M=N=K={n}", n, n, n, d) for d in DTYPES for n in SQUARE_SIZES]
    cases += [
        (f"Llama-3-8B {name} M={m},N={n},K={k}", m, n, k, "bf16") for name, (n, k) in shapes.items() for m in (1, 16, 128, 4096)
    ]
    for case, m, n, k, dtype_name in tqdm(cases, desc="matmul"):
        _time_matmul(rec, case, m, n, k, dtype_name)
        torch.cuda.empty_cache()
    return rec
