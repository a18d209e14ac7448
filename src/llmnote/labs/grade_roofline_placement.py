"""Grader of Lab 1 (``labs/01_roofline_placement.ipynb``): count the FLOPs and bytes of a
kernel, and place it on a GPU's roofline.

The reader writes four cost functions, each returning ``(FLOPs, bytes)`` (the fewest DRAM
bytes the kernel must move: every input read once, every output written once), and a
placement function returning ``(intensity, "memory" | "compute", attainable TFLOP/s)``. They
are graded against :mod:`llmnote.roofline` and the GPU table :mod:`llmnote.hw`; a wrong
number is compared with the usual mistakes (the output not counted, elements instead of
bytes, a multiply-add as one FLOP, ...) to say which one it looks like.
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable

import numpy as np

from ..hw import DTYPE_BYTES, get_gpu
from ..models.config import ModelConfig
from ..roofline import Workload, elementwise_workload, layer_workloads, matmul_workload
from .harness import LabCheckError, LabReport, new_seed, not_written, report

__all__ = ["check_roofline_placement", "placement_figure"]

_RTOL = 1e-6  # the numbers are exact arithmetic: only the order of operations may differ


def _close(got: float, want: float) -> bool:
    return math.isclose(got, want, rel_tol=_RTOL, abs_tol=1e-12)


def _factor(got: float, want: float) -> str:
    if want == 0 or got <= 0:
        return f"got {got:,.6g}, expected {want:,.6g}"
    ratio = got / want
    off = f"{ratio:.3g}x too many" if ratio > 1 else f"{1 / ratio:.3g}x too few"
    return f"{off}: got {got:,.6g}, expected {want:,.6g}"


def _diagnose(quantity: str, got: float, want: float, mistakes: dict[str, float]) -> str:
    """What is wrong with ``got``: the first of the ``mistakes`` (message -> the value that
    mistake gives) that it matches, else how far off it is."""
    for message, value in mistakes.items():
        if _close(got, value):
            return f"{quantity} are off ({_factor(got, want)}). {message}"
    return f"{quantity} are off ({_factor(got, want)})."


def _pair(lab: str, out: object) -> tuple[float, float]:
    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(v, numbers.Real) for v in out)):
        raise LabCheckError(f"{lab} must return two numbers, (FLOPs, bytes); it returned {out!r}.")
    return float(out[0]), float(out[1])


def _cost_cases(rng: random.Random):
    """``(function name, arguments, label, expected Workload, {FLOP mistakes}, {byte mistakes})`` for each case."""
    cases = []
    for n, dtype in [(1 << 24, "bf16"), (rng.randint(1000, 10**7), "fp32"), (rng.randint(10, 10**6), "fp8")]:
        b = DTYPE_BYTES[dtype]
        flops = {"One addition per element is one FLOP.": 2 * n}
        moved = {
            "Did you count the output? The kernel reads x and y and writes out: three tensors of n elements.": 2 * n * b,
            "Count both inputs and the output: three tensors of n elements.": n * b,
            "These are elements, not bytes: multiply by elem_bytes.": 3 * n,
            "These are bits: a byte is 8 bits.": 24 * n * b,
        }
        work = elementwise_workload(n, reads=2, writes=1, flops_per_element=1, dtype=dtype)
        cases.append(("vector_add_cost", (n, b), f"vector add of n={n:,} elements, {dtype}", work, flops, moved))
    for rows, cols, dtype in [(4096, 128256, "fp32"), (rng.randint(1, 64) * 32, rng.randint(100, 50_000), "bf16")]:
        b, e = DTYPE_BYTES[dtype], rows * cols
        flops = {"Count 5 FLOPs per element: max, subtract, exp, sum, divide.": 4 * e}
        moved = {
            "Did you count the output? A fused softmax reads x once and writes the output once.": e * b,
            "That is the unfused chain of five kernels (five reads, three writes); the fused kernel reads x once and "
            "writes the output once.": 8 * e * b,
            "These are elements, not bytes: multiply by elem_bytes.": 2 * e,
        }
        work = elementwise_workload(e, reads=1, writes=1, flops_per_element=5, dtype=dtype)
        cases.append(("softmax_cost", (rows, cols, b), f"softmax of a ({rows}, {cols}) matrix, {dtype}", work, flops, moved))
    shapes = [
        (4096, 4096, 4096, "bf16", "a 4096^3 GEMM (prefill-sized)"),
        (1, 2 * 14336, 4096, "bf16", "a decode-step GEMV: M = 1, Llama-3-8B's gate/up weight"),
        (rng.randint(2, 300), rng.randint(300, 9000), rng.randint(300, 9000), "fp8", "a random product"),
    ]
    for m, n, k, dtype, what in shapes:
        b = DTYPE_BYTES[dtype]
        flops = {"A multiply-add is two FLOPs: 2 * M * N * K.": m * n * k}
        moved = {
            "Did you count the output? Read A and B once, write C (M x N) once.": (m * k + k * n) * b,
            "Each element moves once in the ideal kernel, not once for each time it is used.": 2 * m * n * k * b,
            "These are elements, not bytes: multiply by elem_bytes.": m * k + k * n + m * n,
        }
        cases.append(
            ("matmul_cost", (m, n, k, b), f"{what}, M={m}, N={n}, K={k}, {dtype}", matmul_workload(m, n, k, dtype), flops, moved)
        )
    configs = [
        (1, 32, 8, 2048, 128, "bf16", "Llama-3-8B"),
        (rng.randint(1, 8), 16, rng.choice([1, 2, 4]), rng.randint(64, 8192), 64, "fp16", "random"),
    ]
    for batch, heads, kv_heads, s, d, dtype, what in configs:
        b = DTYPE_BYTES[dtype]
        shape = ModelConfig(
            model_type="llama",
            vocab_size=1,
            hidden_size=heads * d,
            intermediate_size=4 * heads * d,
            num_layers=1,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=d,
            name=what,
        )
        work = next(w for w in layer_workloads(shape, batch, "prefill", seq_len=s, dtype=dtype) if w.name == "attention")
        full = 4 * batch * heads * s * s * d
        flops = {
            "Causal attention computes only the lower triangle of the S x S scores: half the FLOPs of full attention.": full,
            "Two products, Q K^T and P V, each 2 * S * S * D FLOPs per query head (halved by the causal mask).": full / 4,
            "FLOPs count per query head (heads), not per key/value head.": full / 2 * kv_heads / heads,
        }
        qo, kv, scores = 2 * batch * s * heads * d * b, 2 * batch * s * kv_heads * d * b, batch * heads * s * s * b
        moved = {
            "With grouped-query attention K and V have kv_heads heads, not heads.": qo + 2 * batch * s * heads * d * b,
            "Did you count the output? Read q, k and v, write o.": qo / 2 + kv,
            "FlashAttention keeps the scores on chip: they never reach DRAM.": qo + kv + 2 * scores,
            "FlashAttention keeps the scores and probabilities on chip: they never reach DRAM.": qo + kv + 4 * scores,
            "These are elements, not bytes: multiply by elem_bytes.": (qo + kv) / b,
        }
        label = f"causal prefill attention, batch={batch}, heads={heads}, kv_heads={kv_heads}, S={s}, D={d}, {dtype} ({what})"
        cases.append(("attention_cost", (batch, heads, kv_heads, s, d, b), label, work, flops, moved))
    return cases


_PLACEMENTS = [
    ("H200", "bf16", elementwise_workload(1 << 24, reads=2, writes=1, dtype="bf16", name="vector add")),
    ("H200", "bf16", matmul_workload(4096, 4096, 4096, "bf16", "4096^3 GEMM")),
    ("A100", "bf16", matmul_workload(1, 28672, 4096, "bf16", "decode GEMV")),
    ("T4", "fp16", matmul_workload(64, 4096, 4096, "fp16", "GEMM with M = 64")),
    ("H100 SXM", "fp8", matmul_workload(512, 8192, 8192, "fp8", "fp8 GEMM with M = 512")),
    ("B200", "fp4", matmul_workload(256, 8192, 8192, "fp4", "fp4 GEMM with M = 256")),
    ("L4", "fp32", elementwise_workload(1 << 20, reads=1, writes=1, flops_per_element=5, dtype="fp32", name="softmax")),
]


def _check_place(place: Callable, gpu: str, dtype: str, work: Workload) -> str | None:
    """What is wrong with ``place`` on this workload, or ``None``."""
    out = place(work.flops, work.bytes, gpu, dtype)
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        return f"place must return three values, (intensity, bound, attainable TFLOP/s); it returned {out!r}."
    intensity, bound, tflops = out
    spec = get_gpu(gpu)
    peak, bandwidth = spec.peak_tflops(dtype), spec.memory_tbps
    if not isinstance(intensity, numbers.Real) or not _close(float(intensity), work.intensity):
        hint = " Intensity is FLOPs per byte: flops / bytes." if _close(float(intensity or 0), 1 / work.intensity) else ""
        return f"the intensity is off: got {intensity!r}, expected {work.intensity:,.6g} FLOP/B.{hint}"
    word = str(bound).lower().replace("-bound", "").replace(" bound", "").strip()
    if word not in ("memory", "compute"):
        return f"the bound must be 'memory' or 'compute'; got {bound!r}."
    if word != work.bound(gpu, dtype):
        side = "left of" if work.intensity < peak / bandwidth else "right of (or on)"
        return (
            f"the bound is off: got {word!r}, expected {work.bound(gpu, dtype)!r}. The intensity "
            f"{work.intensity:,.4g} FLOP/B lies {side} the {spec.name}'s ridge point in {dtype}, peak / bandwidth = "
            f"{peak / bandwidth:,.4g} FLOP/B; work left of the ridge is memory-bound."
        )
    want = work.attainable_tflops(gpu, dtype)
    if not isinstance(tflops, numbers.Real) or not _close(float(tflops), want):
        got = float(tflops) if isinstance(tflops, numbers.Real) else float("nan")
        mistakes = {
            "Attainable is min(peak, intensity x bandwidth): it never exceeds the compute roof.": work.intensity * bandwidth,
            "Attainable is min(peak, intensity x bandwidth): left of the ridge the memory roof is lower than the peak.": peak,
            "Units: intensity (FLOP/B) x bandwidth (TB/s) is already in TFLOP/s.": want * 1e12,
            "Units: the peak from hw is in TFLOP/s and the bandwidth in TB/s; FLOP/B x TB/s = TFLOP/s.": want * 1e3,
            "Units: FLOP/B x TB/s = TFLOP/s.": want / 1e3,
        }
        return _diagnose("the attainable TFLOP/s", got, want, mistakes).replace(" are off", " is off")
    return None


def check_roofline_placement(
    vector_add_cost: Callable,
    softmax_cost: Callable,
    matmul_cost: Callable,
    attention_cost: Callable,
    place: Callable,
    *,
    seed: int | None = None,
    verbose: bool = True,
) -> LabReport:
    """Grade the four cost functions (each returns ``(FLOPs, bytes)``) and ``place(flops,
    bytes, gpu, dtype) -> (intensity, "memory" | "compute", attainable TFLOP/s)`` against
    :mod:`llmnote.roofline` on 10 kernels of fixed and random sizes (vector add, fused softmax,
    GEMMs and a decode GEMV, causal prefill attention with grouped-query heads, in fp32, bf16,
    fp16 and fp8) and 7 placements on GPUs from a T4 to a B200. Costs are checked exactly (up to
    rounding); a wrong one is named with the mistake it looks like. Raises
    :class:`~llmnote.labs.LabCheckError`."""
    __tracebackhide__ = True
    functions = {
        "vector_add_cost": vector_add_cost,
        "softmax_cost": softmax_cost,
        "matmul_cost": matmul_cost,
        "attention_cost": attention_cost,
        "place": place,
    }
    for name, fn in functions.items():
        if not callable(fn):
            raise TypeError(f"check_roofline_placement takes your function {name}, got {type(fn).__name__}")
    seed = new_seed(seed)
    cases = _cost_cases(random.Random(seed))
    total = len(cases) + len(_PLACEMENTS)
    rerun = f"Rerun this draw with check_roofline_placement(..., seed={seed})."
    labels = []
    for number, (name, args, label, work, flop_mistakes, byte_mistakes) in enumerate(cases, 1):
        where = f"{name} failed on case {number} of {total}: {label}, called as {name}{args}"
        try:
            flops, moved = _pair(name, functions[name](*args))
        except NotImplementedError:
            raise not_written(name, "every function") from None
        except LabCheckError as err:
            raise LabCheckError(f"{where}\n  {err}\n  {rerun}") from None
        except Exception as err:
            raise LabCheckError(f"{where}\n  `{name}` raised {type(err).__name__}: {err}\n  {rerun}") from err
        for quantity, got, want, mistakes in (
            ("FLOPs", flops, work.flops, flop_mistakes),
            ("bytes", moved, work.bytes, byte_mistakes),
        ):
            if not _close(got, want):
                raise LabCheckError(f"{where}\n  {_diagnose(quantity, got, want, mistakes)}\n  {rerun}")
        labels.append(label)
    for number, (gpu, dtype, work) in enumerate(_PLACEMENTS, len(cases) + 1):
        where = (
            f"place failed on case {number} of {total}: the {work.name} on the {gpu} in {dtype}, called as "
            f"place({work.flops:.6g}, {work.bytes:.6g}, {gpu!r}, {dtype!r})"
        )
        try:
            problem = _check_place(place, gpu, dtype, work)
        except NotImplementedError:
            raise not_written("place", "every function") from None
        except Exception as err:
            raise LabCheckError(f"{where}\n  `place` raised {type(err).__name__}: {err}\n  {rerun}") from err
        if problem:
            raise LabCheckError(f"{where}\n  {problem}\n  {rerun}")
        labels.append(f"the {work.name} on the {gpu}")
    return report("roofline", labels, ("fp32", "bf16", "fp16", "fp8", "fp4"), seed, verbose)


def placement_figure(
    kernels: dict[str, Callable[[], tuple[float, float]]], place: Callable, gpu: str = "H200", dtype: str = "bf16"
):
    """The roofline of ``gpu`` in ``dtype`` with each kernel where the reader's numbers put it.

    ``kernels`` maps a label to a function of no argument returning ``(FLOPs, bytes)`` (the
    reader's cost function applied to the kernel's sizes); ``place`` is the reader's placement
    function. A point sits at the reader's intensity and attainable rate, coloured by the
    bound the reader gave (blue memory, red compute): a wrong number shows as a point off the
    roof. Kernels whose
    functions still raise ``NotImplementedError`` are left out. Returns a plotly figure."""
    import plotly.graph_objects as go

    spec = get_gpu(gpu)
    peak, bandwidth = spec.peak_tflops(dtype), spec.memory_tbps
    ridge = peak / bandwidth
    points = []
    for label, cost in kernels.items():
        try:
            flops, moved = cost()
            intensity, bound, tflops = place(flops, moved, gpu, dtype)
        except NotImplementedError:
            continue
        points.append((label, flops, moved, float(intensity), str(bound), float(tflops)))
    lo = min([0.05, *(p[3] / 5 for p in points if p[3] > 0)])  # below 0.1: the corner tick labels stay apart
    hi = max([ridge * 30, *(p[3] * 5 for p in points)])
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    rates = [p[5] for p in points if p[5] > 0]  # a wrong rate may lie far off the roof: keep it in view
    y_lo, y_hi = min([peak / 1e4, *(r / 3 for r in rates)]), max([peak * 3, *(r * 3 for r in rates)])
    fig = go.Figure()
    fig.add_scatter(x=x, y=np.minimum(peak, x * bandwidth), mode="lines", name=f"roof: {bandwidth:g} TB/s, {peak:,.0f} TFLOP/s",
                    line=dict(color="black", width=3), hoverinfo="skip")  # fmt: skip
    fig.add_scatter(x=[ridge], y=[peak], mode="markers", name=f"ridge point: {ridge:.0f} FLOP/B",
                    marker=dict(symbol="diamond-open", size=12, color="black", line=dict(width=2)))  # fmt: skip
    colour = {"memory": "#1f77b4", "compute": "#d62728"}  # the book's blue and red
    symbols = ("circle", "square", "triangle-up", "star", "hexagon", "pentagon", "cross", "x")
    for n, (label, flops, moved, intensity, bound, tflops) in enumerate(points):
        fig.add_scatter(
            x=[intensity], y=[max(tflops, 1e-6)], mode="markers", name=f"{label}: {bound}-bound, {tflops:,.3g} TFLOP/s",
            marker=dict(size=15, symbol=symbols[n % len(symbols)], color=colour.get(bound.lower(), "#7f7f7f"),
                        line=dict(color="white", width=1)),
            hovertemplate=(f"<b>{label}</b><br>{flops:.3g} FLOPs, {moved:.3g} bytes<br>{intensity:,.3g} FLOP/B<br>"
                           f"{bound}-bound, {tflops:,.4g} TFLOP/s<extra></extra>"),
        )  # fmt: skip
    if not points:
        fig.add_annotation(text="Your kernels appear here once the exercise cell is written.", x=0.5, y=0.2,
                           xref="paper", yref="paper", showarrow=False, font=dict(size=14))  # fmt: skip
    fig.update_layout(
        title=f"Your placements on the {spec.name}'s roofline in {dtype}<br><sub>blue: memory-bound, red: compute-bound</sub>",
        xaxis=dict(type="log", dtick=1, title="arithmetic intensity (FLOP per byte of DRAM traffic)"),
        yaxis=dict(type="log", dtick=1, title="attainable TFLOP/s", range=[math.log10(y_lo), math.log10(y_hi)]),
        legend=dict(orientation="h", yanchor="top", y=-0.2, x=0),
        template="plotly_white",
        height=600,
        margin=dict(b=200),
    )
    return fig
