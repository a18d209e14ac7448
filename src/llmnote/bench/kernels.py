"""Benchmarks of the book's Triton kernels against their peers, measured in one run.

``matmul``: ours vs torch (cuBLAS) on square sizes and on the projection shapes of
Llama-3-8B at decode and prefill batch sizes. ``fused_ops``: softmax, rms_norm, rope and
silu_mul, ours vs torch eager and torch.compile. Every case is checked for correctness
against the reference before it is timed, and every time is a CUDA-graph replay (so
Python launch cost, which differs between providers, is not counted).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .. import kernels, ref
from ..roofline import LLAMA3_8B
from .record import Record
from .timing import cuda_time_ms, rotating_inputs

__all__ = ["run_matmul", "run_fused_ops", "SQUARE_SIZES", "llama_projection_shapes"]

SQUARE_SIZES = (512, 1024, 2048, 3072, 4096, 6144, 8192)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def llama_projection_shapes() -> dict[str, tuple[int, int]]:
    """(N, K) of Llama-3-8B's four projection matmuls, from its config."""
    s = LLAMA3_8B
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return {
        "qkv_proj": (q + 2 * kv, s.hidden),
        "o_proj": (s.hidden, q),
        "gate_up_proj": (2 * s.intermediate, s.hidden),
        "down_proj": (s.hidden, s.intermediate),
    }


def _relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return ((out.float() - expected.float()).norm() / expected.float().norm()).item()


def _check(name: str, out: torch.Tensor, expected: torch.Tensor, tol: float) -> None:
    err = _relative_error(out, expected)
    if not err < tol:  # also catches NaN
        raise AssertionError(f"{name}: relative error {err:.2e} exceeds {tol:.0e}; not timing a wrong kernel")


def _pair(m: int, n: int, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(k, n, device="cuda", dtype=dtype)


def _time_matmul(rec: Record, case: str, m: int, n: int, k: int, dtype_name: str) -> None:
    dtype = DTYPES[dtype_name]
    elem = torch.finfo(dtype).bits // 8
    sets = rotating_inputs(partial(_pair, m, n, k, dtype), (m * k + k * n) * elem)
    a, b = sets[0]
    _check(f"matmul {case} {dtype_name}", kernels.matmul(a, b), torch.matmul(a.float(), b.float()), 1e-2)
    for provider, fn in (("llmnote", kernels.matmul), ("torch", torch.matmul)):
        ms = cuda_time_ms(fn, sets, warmup=5, rep=20, graph_calls=10)
        rec.add("matmul", case, dtype_name, provider, ms, flops=2 * m * n * k, nbytes=(m * k + k * n + m * n) * elem)


def run_matmul(command: str | None = None) -> Record:
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


def _eager_rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, 1e-6)


def _eager_silu_mul(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    return F.silu(g) * u


def _fused_cases() -> list[tuple]:
    """(op, case, make_inputs, bytes, ours, eager, reference)."""
    bf16 = torch.bfloat16
    cases = []
    for rows, cols in ((4096, 4096), (16384, 8192), (65536, 1024), (1024, 65536)):
        make = partial(lambda r, c: (torch.randn(r, c, device="cuda", dtype=bf16) * 8,), rows, cols)
        cases.append(
            (
                "softmax",
                f"rows={rows},cols={cols}",
                make,
                2 * rows * cols * 2,
                kernels.softmax,
                partial(torch.softmax, dim=-1),
                ref.softmax,
            )
        )
    for tokens, hidden in ((4096, 4096), (16384, 4096), (16384, 8192)):
        make = partial(
            lambda t, h: (torch.randn(t, h, device="cuda", dtype=bf16), torch.randn(h, device="cuda", dtype=bf16)), tokens, hidden
        )
        cases.append(
            (
                "rms_norm",
                f"tokens={tokens},hidden={hidden}",
                make,
                (2 * tokens * hidden + hidden) * 2,
                kernels.rms_norm,
                _eager_rms_norm,
                ref.rms_norm,
            )
        )
    for batch, heads, seq in ((1, 32, 4096), (8, 32, 2048), (16, 32, 4096)):
        cos, sin = ref.rope_cos_sin(seq, 128, device="cuda")
        make = partial(
            lambda b, h, s, c, si: (torch.randn(b, h, s, 128, device="cuda", dtype=bf16), c, si), batch, heads, seq, cos, sin
        )
        nbytes = 2 * batch * heads * seq * 128 * 2 + 2 * seq * 128 * 4
        cases.append(
            ("rope", f"B={batch},H={heads},S={seq},D=128", make, nbytes, kernels.apply_rope, ref.apply_rope, ref.apply_rope)
        )
    for tokens, inter in ((4096, 14336), (16384, 14336)):
        make = partial(lambda t, i: tuple(torch.randn(t, i, device="cuda", dtype=bf16) for _ in range(2)), tokens, inter)
        cases.append(
            (
                "silu_mul",
                f"tokens={tokens},intermediate={inter}",
                make,
                3 * tokens * inter * 2,
                kernels.silu_mul,
                _eager_silu_mul,
                ref.silu_mul,
            )
        )
    return cases


def run_fused_ops(command: str | None = None) -> Record:
    rec = Record() if command is None else Record(command=command)
    cases = _fused_cases()
    for op, case, make, nbytes, ours, eager, reference in tqdm(cases, desc="fused ops"):
        sets = rotating_inputs(make, nbytes)
        _check(f"{op} {case}", ours(*sets[0]), reference(*(t.float() if t.dtype == torch.bfloat16 else t for t in sets[0])), 1e-2)
        compiled = torch.compile(eager, dynamic=False)
        for provider, fn in (("llmnote", ours), ("torch", eager), ("torch-compile", compiled)):
            ms = cuda_time_ms(fn, sets, warmup=5, rep=30, graph_calls=10)
            rec.add(op, case, "bf16", provider, ms, nbytes=nbytes)
        del sets
        torch.cuda.empty_cache()
    return rec
