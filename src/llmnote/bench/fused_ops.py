"""The fused-ops benchmark (``python -m llmnote.bench fused_ops``): the book's Triton
softmax, rms_norm, rope and silu_mul against torch eager and ``torch.compile``, in one run,
in bf16. Every case is checked against the reference in :mod:`llmnote.ref` before it is
timed, and every time is a CUDA-graph replay (so Python launch cost, which differs between
providers, is not counted).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .. import kernels, ref
from ..records import Record
from .timing import check_before_timing, cuda_time_ms, rotating_inputs

__all__ = ["run_fused_ops"]


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
    """Time every fused-op case (ours, eager, compiled) on the current GPU; return the record, not yet saved."""
    rec = Record() if command is None else Record(command=command)
    cases = _fused_cases()
    for op, case, make, nbytes, ours, eager, reference in tqdm(cases, desc="fused ops"):
        sets = rotating_inputs(make, nbytes)
        expected = reference(*(t.float() if t.dtype == torch.bfloat16 else t for t in sets[0]))
        check_before_timing(f"{op} {case}", ours(*sets[0]), expected, 1e-2)
        compiled = torch.compile(eager, dynamic=False)
        for provider, fn in (("llmnote", ours), ("torch", eager), ("torch-compile", compiled)):
            ms = cuda_time_ms(fn, sets, warmup=5, rep=30, graph_calls=10)
            rec.add(op, case, "bf16", provider, ms, nbytes=nbytes)
        del sets
        torch.cuda.empty_cache()
    return rec
