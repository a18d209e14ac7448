"""Grader of Lab 7 (``labs/07_quantization.ipynb``): group-wise quantization in plain PyTorch
(``quantize_groups``, ``dequantize_groups``), packing 4-bit codes into int32 words (``pack_int4``)
and a Triton W4A16 GEMV (``w4a16_gemv``).

The format is the book's (:mod:`llmnote.quant.formats`): one float scale ``s`` and one integer
zero point ``z`` per group of ``group_size`` consecutive weights of a row, ``w ~ (q - z) * s``
(the affine scheme of Jacob et al., 2018, in groups as GPTQ, Frantar et al., 2022, and AWQ, Lin
et al., 2023, store it); codes packed eight to an int32 word along K, ``(K // 8, N)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..quant.formats import pack_codes, quantize_weight, unpack_codes
from .harness import (
    Case,
    Draw,
    LabCheckError,
    LabReport,
    check_launcher,
    compare,
    dtype_name,
    first_index,
    grade_launcher,
    new_seed,
    not_written,
    report,
)
from .sandbox import fenced

__all__ = ["check_quantize_groups", "check_pack_int4", "check_w4a16_gemv"]

_STEP_SLACK = 1e-4  # in steps: float32 rounding of w / s + z, far below a real rounding mistake
_GEMV_TOL = {torch.float32: (1e-4, 1e-4), torch.float16: (4e-3, 4e-3), torch.bfloat16: (3e-2, 2e-2)}  # atol per sqrt(K)


def _plain(name: str, fn: object, signature: str) -> None:
    from triton.runtime.jit import KernelInterface

    if isinstance(fn, KernelInterface) or not callable(fn):
        raise TypeError(f"{name} takes your plain PyTorch function `{signature}`, got {type(fn).__name__}")


def _call(fn: Callable, name: str, unwritten: str, where: str, rerun: str, args: tuple):
    """``fn(*args)``; the stub's NotImplementedError becomes "not written yet", any other error a LabCheckError."""
    __tracebackhide__ = True
    try:
        return fn(*args)
    except NotImplementedError:
        raise not_written(name, unwritten) from None
    except Exception as err:
        raise LabCheckError(f"{where}\n  `{name}` raised {type(err).__name__}: {err}\n  {rerun}") from err


def _expand(per_group: torch.Tensor, group_size: int) -> torch.Tensor:
    """(N, K // G) -> (N, K): each group's value for every weight of the group, float64."""
    return per_group.double().repeat_interleave(group_size, dim=1)


# ------------------------------------------------------------- part 1: quantize, dequantize


def _scale_misreading(g: torch.Tensor, got: float, bits: int, dtype: torch.dtype) -> str:
    """A hint naming the mistake a wrong scale ``got`` looks like, for one group's weights ``g``."""
    levels, amax, lo, hi = 2**bits - 1, float(g.abs().max()), float(g.min()), float(g.max())
    want = (max(hi, 0) - min(lo, 0)) / levels
    if dtype != torch.float32 and abs(got - want) <= 1e-2 * want:
        return f"Compute in float32 (w.float()): min, max and the division in {dtype_name(dtype)} round the scale."
    candidates = {
        "This is a symmetric grid (a step of max|w| over half the codes). The lab asks for the asymmetric one: "
        "cut [min, max] into 2**bits - 1 steps, so that a skewed group uses all its codes.": (
            amax / (2 ** (bits - 1) - 1), amax / 2 ** (bits - 1)),
        "Widen the range to contain 0 first: min(w.min(), 0) and max(w.max(), 0). Then 0 has an exact code (the zero "
        "point), and a group of positive weights gets zero point 0.": ((hi - lo) / levels,),
        f"{2**bits} codes make 2**bits - 1 = {levels} steps between the lowest and the highest: divide by {levels}.": (
            (max(hi, 0) - min(lo, 0)) / 2**bits,),
    }  # fmt: skip
    for hint, values in candidates.items():
        if any(abs(got - v) <= 1e-5 * abs(v) for v in values):
            return hint
    return "scale = (max(w, 0) - min(w, 0)) / (2**bits - 1), over the group_size weights of one row's group."


def _quantize_problem(w: torch.Tensor, got: object, bits: int, group_size: int) -> tuple[str, str] | None:
    """``(what is wrong, hint)`` for ``quantize_groups(w, bits, group_size)`` returning ``got``."""
    if not (isinstance(got, (tuple, list)) and len(got) == 3 and all(isinstance(t, torch.Tensor) for t in got)):
        return f"`quantize_groups` returned a {type(got).__name__}, not three tensors", "End with `return codes, scales, zeros`."
    n, k = w.shape
    levels, shape = 2**bits - 1, (n, k // group_size)
    for name, t, want_shape, want_dtype in zip(
        ("codes", "scales", "zeros"), got, ((n, k), shape, shape), (torch.uint8, torch.float32, torch.float32)
    ):
        if tuple(t.shape) != want_shape or t.dtype != want_dtype:
            return (
                f"{name} has shape {tuple(t.shape)} and dtype {dtype_name(t.dtype)}, expected {want_shape} and "
                f"{dtype_name(want_dtype)}",
                "One code per weight, (N, K) uint8; one scale and one zero point per group of a row, (N, K // group_size) "
                "float32.",
            )
    q, s, z = (t.double().to(w.device) for t in got)
    groups = w.double().view(n, -1, group_size)
    lo, hi = groups.amin(-1).clamp(max=0), groups.amax(-1).clamp(min=0)
    bad = ~torch.isfinite(s) | ~torch.isfinite(z) | (s <= 0)
    if bad.any():
        at = first_index(bad)
        hint = "Every scale must be a positive number."
        if hi[at] == lo[at]:
            hint = "This group's weights are all 0: (max - min) / levels is 0, and -min / 0 is NaN. Give such groups "
            hint += "scale 1 (torch.where(scale > 0, scale, 1.0)): any positive step represents 0 exactly."
        return f"row {at[0]}, group {at[1]} has scale {s[at]:.6g} and zero point {z[at]:.6g}", hint
    want = (hi - lo) / levels
    off = (want > 0) & ((s - want).abs() > 1e-5 * want)
    if off.any():
        at = first_index(off)
        return (
            f"the scale: row {at[0]}, group {at[1]} (weights {at[1] * group_size}..{(at[1] + 1) * group_size - 1}) has scale "
            f"{s[at]:.6g}, expected (max(w, 0) - min(w, 0)) / {levels} = {want[at]:.6g}",
            _scale_misreading(groups[at], float(s[at]), bits, w.dtype),
        )
    bad = (z != z.round()) | (z < 0) | (z > levels) | ((z + lo / s).abs() > 0.5 + _STEP_SLACK)
    if bad.any():
        at = first_index(bad)
        return (
            f"the zero point: row {at[0]}, group {at[1]} has zero point {z[at]:.6g}, expected round(-min(w, 0) / scale) = "
            f"{float(torch.round(-lo[at] / s[at])):.0f}",
            f"The zero point is the code of 0: an integer in [0, {levels}], so that a weight of 0 comes back exactly.",
        )
    if (q > levels).any():
        at = first_index(q > levels)
        return (
            f"codes[{at[0]}, {at[1]}] is {q[at]:.0f}, above the largest {bits}-bit code {levels}",
            f"Clamp the codes to [0, {levels}] before .to(torch.uint8), which wraps around instead of clamping.",
        )
    s_full, z_full = _expand(s, group_size), _expand(z, group_size)
    steps = (w.double() - (q - z_full) * s_full).abs() / s_full
    if (steps > 0.5 + _STEP_SLACK).any():
        at = tuple(int(i) for i in torch.unravel_index(steps.argmax().cpu(), steps.shape))
        ratio = w.double() / s_full
        down = (ratio.floor() + z_full, ratio.trunc() + z_full, (ratio + z_full).trunc())
        hint = "q = clamp(round(w / scale) + zero, 0, 2**bits - 1), with the scale and zero point of the weight's own group."
        if any(torch.equal(q, d.clamp(0, levels)) for d in down):
            hint = "These codes are rounded down or truncated (torch.floor, torch.trunc, .to(torch.uint8) alone): use torch.round"
        return (
            f"the error bound: w[{at[0]}, {at[1]}] = {float(w[at]):.6g} comes back as (q - z) * s = "
            f"{float((q[at] - z_full[at]) * s_full[at]):.6g}, {float(steps[at]):.3f} steps away; rounding to the nearest "
            "code keeps every weight within 0.5 steps",
            hint,
        )
    return None


def _dequantize_hint(out: torch.Tensor, q, s, z, group_size: int) -> str:
    """A hint naming the mistake ``out`` looks like, among the usual ones."""
    n_groups = s.shape[1]
    s_full, z_full = _expand(s, group_size), _expand(z, group_size)
    tiled_s, tiled_z = s.double().repeat(1, group_size), z.double().repeat(1, group_size)
    candidates = {
        "The zero point is missing: w = (q - z) * s.": q * s_full,
        "The zero point is a code, not a value: subtract it before scaling, (q - z) * s, not q * s - z.": q * s_full - z_full,
        "Weight k belongs to group k // group_size: expand with repeat_interleave(group_size, dim=1) (or view as "
        "(N, K // group_size, group_size)); .repeat tiles the groups and gives group k % (K // group_size).": (
            (q - tiled_z) * tiled_s if n_groups > 1 else None),
        "The sign: (q - z) * s.": (z_full - q) * s_full,
    }  # fmt: skip
    for hint, alternative in candidates.items():
        if alternative is not None and compare(out, alternative.float(), 1e-6, 1e-5, "") is None:
            return hint
    return "w[n, k] = (codes[n, k] - zeros[n, k // group_size]) * scales[n, k // group_size], in float32."


def _weights(draw: Draw, kind: str, n: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    w = torch.randn(n, k, generator=draw.gen)
    if kind == "positive":
        w = w.abs() + 0.5
    elif kind == "negative":
        w = -w.abs() - 0.5
    elif kind == "zeros":
        w[0], w[1, : k // 2] = 0.0, 0.0  # a pruned row, and a row whose first groups are all 0
    elif kind == "outliers":
        w = w * 0.02
        w.view(-1)[torch.randperm(n * k, generator=draw.gen)[: max(n * k // 100, 1)]] = 1.0
    return w.to(draw.device, dtype)


def check_quantize_groups(
    quantize_groups: Callable, dequantize_groups: Callable, *, seed: int | None = None, verbose: bool = True
) -> LabReport:
    """Grade ``quantize_groups(w, bits, group_size) -> (codes, scales, zeros)`` and
    ``dequantize_groups(codes, scales, zeros, group_size) -> w_hat`` (plain PyTorch).

    ``w`` is (N, K), K a multiple of ``group_size``; ``codes`` (N, K) uint8, ``scales`` and
    ``zeros`` (N, K // group_size) float32. Asymmetric round-to-nearest: per group,
    ``s = (max(w, 0) - min(w, 0)) / (2**bits - 1)`` (1 for an all-zero group), ``z = round(-min(w, 0) / s)``,
    ``q = clamp(round(w / s) + z, 0, 2**bits - 1)``. 12 quantize cases (bits 2, 3, 4; groups of 8 to 128;
    all-positive, all-negative and all-zero groups, outliers; float32, float16, bfloat16 weights) check
    the scale, the zero point and the error bound ``|w - (q - z) s| <= s / 2``; 5 dequantize cases compare
    with ``(q - z) * s``. Raises :class:`~llmnote.labs.LabCheckError`."""
    __tracebackhide__ = True
    _plain("check_quantize_groups", quantize_groups, "quantize_groups(w, bits, group_size)")
    _plain("check_quantize_groups", dequantize_groups, "dequantize_groups(codes, scales, zeros, group_size)")
    seed = new_seed(seed)
    draw = Draw(seed, [torch.float32, torch.float16, torch.bfloat16])
    rng = draw.rng
    rerun = f"Rerun this draw with check_quantize_groups(quantize_groups, dequantize_groups, seed={seed})."
    quantize_cases = [  # label, N, K, group_size, bits, kind of weights
        ("one group per row", 3, 32, 32, 4, "gauss"),
        ("4 bits, groups of 32", 37, 128, 32, 4, "gauss"),
        ("3 bits", 20, 96, 32, 3, "gauss"),
        ("2 bits, groups of 16", 11, 64, 16, 2, "gauss"),
        ("all-zero groups (max = min = 0)", 5, 64, 16, 4, "zeros"),
        ("all weights positive: the range widens down to 0", 9, 64, 32, 4, "positive"),
        ("all weights negative: the range widens up to 0", 9, 64, 32, 3, "negative"),
        ("weights of 0.02 and a few outliers of 1.0", 16, 256, 128, 4, "outliers"),
        ("groups of 8", 6, 40, 8, 4, "gauss"),
    ]
    for _ in range(3):
        g = rng.choice([8, 16, 32, 64, 128])
        quantize_cases.append(("random", rng.randint(1, 48), g * rng.randint(1, 4), g, rng.choice([2, 3, 4]), "gauss"))
    labels, dtypes = [], []
    total = len(quantize_cases) + 5
    for number, (label, n, k, g, bits, kind) in enumerate(quantize_cases, 1):
        w = _weights(draw, kind, n, k, draw.dtype())
        label = f"N={n}, K={k}, group_size={g}, bits={bits}, {label}, {dtype_name(w.dtype)}"
        where, before = f"quantize_groups failed on case {number} of {total}: {label}", w.clone()
        got = _call(quantize_groups, "quantize_groups", "quantize_groups and dequantize_groups", where, rerun, (w, bits, g))
        problem = ("`quantize_groups` changed its input w", "Compute new tensors; never write into w.")
        problem = problem if not torch.equal(w, before) else _quantize_problem(w, got, bits, g)
        if problem is not None:
            raise LabCheckError(f"{where}\n  {problem[0]}.\n  Hint: {problem[1]}\n  {rerun}")
        labels.append(f"quantize_groups: {label}")
        dtypes.append(w.dtype)
    for number in range(len(quantize_cases) + 1, total + 1):
        g, bits = rng.choice([8, 16, 32, 64]), rng.choice([2, 3, 4])
        n, k = rng.randint(1, 40), g * rng.randint(1, 4)
        levels = 2**bits - 1
        q = torch.randint(0, levels + 1, (n, k), generator=draw.gen, dtype=torch.uint8).to(draw.device)
        s = (torch.rand(n, k // g, generator=draw.gen) * 0.1 + 1e-3).to(draw.device)
        z = torch.randint(0, levels + 1, (n, k // g), generator=draw.gen).float().to(draw.device)
        label = f"N={n}, K={k}, group_size={g}, bits={bits}, random codes"
        where = f"dequantize_groups failed on case {number} of {total}: {label}"
        before = (q.clone(), s.clone(), z.clone())
        out = _call(dequantize_groups, "dequantize_groups", "dequantize_groups", where, rerun, (q, s, z, g))
        want = ((q.double() - _expand(z, g)) * _expand(s, g)).float()
        if not all(torch.equal(a, b) for a, b in zip((q, s, z), before)):
            problem = "`dequantize_groups` changed an input", "Compute a new tensor; never write into the inputs."
        elif not isinstance(out, torch.Tensor):
            problem = f"`dequantize_groups` returned a {type(out).__name__}, not a tensor", "Return the (N, K) weights."
        elif tuple(out.shape) != (n, k) or out.dtype != torch.float32:
            problem = (f"the output has shape {tuple(out.shape)} and dtype {dtype_name(out.dtype)}, expected ({n}, {k}) "
                       "and float32", "One weight per code, (N, K), in the scales' dtype (float32).")  # fmt: skip
        else:
            problem = compare(out, want, 1e-6, 1e-5, "")
            problem = None if problem is None else (problem[0], _dequantize_hint(out, q.double(), s, z, g))
        if problem is not None:
            raise LabCheckError(f"{where}\n  {problem[0]}.\n  Hint: {problem[1]}\n  {rerun}")
        labels.append(f"dequantize_groups: {label}")
        dtypes.append(torch.float32)
    return report("quantize_groups", labels, dtypes, seed, verbose)


# -------------------------------------------------------------------- part 2: pack_int4


def _pack_problem(codes: torch.Tensor, got: object) -> tuple[str, str] | None:
    n, k = codes.shape
    layout = "word i of column n holds codes[n, 8 i + j] at bits 4 j .. 4 j + 3, for j = 0..7"
    if not isinstance(got, torch.Tensor):
        return f"`pack_int4` returned a {type(got).__name__}, not a tensor", "Return the (K // 8, N) int32 words."
    if tuple(got.shape) != (k // 8, n):
        hint = f"The words are (K // 8, N), a row of words per eight consecutive k: {layout}."
        if tuple(got.shape) == (n, k // 8):
            hint = "These words are (N, K // 8): transpose to (K // 8, N). " + hint
        return f"the output has shape {tuple(got.shape)}, expected (K // 8, N) = ({k // 8}, {n})", hint
    if got.dtype != torch.int32:
        return (
            f"the output has dtype {dtype_name(got.dtype)}, expected int32",
            "Return int32 words. A word whose top nibble is 8 or more is negative in int32 (bit 31 is the sign): that "
            "is the same 32 bits, and .to(torch.int32) on int64 words wraps them that way.",
        )
    want = pack_codes(codes, 4)
    if torch.equal(got, want):
        return None
    at = first_index(got != want)
    what = (
        f"the bits: word {at} is {int(got[at]) & 0xFFFFFFFF:#010x}, expected {int(want[at]) & 0xFFFFFFFF:#010x} "
        f"(codes[{at[1]}, {8 * at[0]}..{8 * at[0] + 7}] = {codes[at[1], 8 * at[0] : 8 * at[0] + 8].tolist()})"
    )
    reversed_order = pack_codes(codes.view(n, k // 8, 8).flip(-1).reshape(n, k), 4)
    if torch.equal(got, reversed_order):
        return what, f"The nibble order is reversed: code 8 i + j goes to bits 4 j .. 4 j + 3 (the first code lowest). {layout}."
    return what, f"{layout}. Shift in int32 (uint8 << 4 overflows), and combine the shifted codes with a sum or |."


def check_pack_int4(pack_int4: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade ``pack_int4(codes) -> words``: (N, K) uint8 codes in [0, 16), K a multiple of 8, packed
    into (K // 8, N) int32 words (packed along K), code ``8 i + j`` of row ``n`` at bits ``4 j`` of word
    ``(i, n)``; bit-exact against :func:`llmnote.quant.pack_codes`. 10 cases, from one word to
    (70, 256), all codes 15 (every word -1) and the codes of a real quantized weight. Raises
    :class:`~llmnote.labs.LabCheckError`."""
    __tracebackhide__ = True
    _plain("check_pack_int4", pack_int4, "pack_int4(codes)")
    seed = new_seed(seed)
    draw = Draw(seed, [torch.float32])
    rng, gen, device = draw.rng, draw.gen, draw.device
    rerun = f"Rerun this draw with check_pack_int4(pack_int4, seed={seed})."

    def randint(n: int, k: int) -> torch.Tensor:
        return torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8).to(device)

    cases = [
        ("one word: N=1, K=8, codes 1..8", torch.arange(1, 9, dtype=torch.uint8, device=device)[None]),
        ("N=3, K=16, every code 15 (every word is -1)", torch.full((3, 16), 15, dtype=torch.uint8, device=device)),
        ("N=5, K=24, random codes", randint(5, 24)),
        ("N=70, K=40, N larger than K", randint(70, 40)),
        ("N=1, K=256, a single long row", randint(1, 256)),
        ("N=33, K=128, the codes of a 4-bit quantized weight",
         quantize_weight(torch.randn(33, 128, generator=gen).to(device), 4, 32).codes()),
    ]  # fmt: skip
    for _ in range(4):
        n, k = rng.randint(1, 64), 8 * rng.randint(1, 32)
        cases.append((f"N={n}, K={k}, random codes", randint(n, k)))
    for number, (label, codes) in enumerate(cases, 1):
        where = f"pack_int4 failed on case {number} of {len(cases)}: {label}"
        before = codes.clone()
        got = _call(pack_int4, "pack_int4", "pack_int4", where, rerun, (codes,))
        changed = "`pack_int4` changed its input", "Build new tensors; never write into codes."
        problem = _pack_problem(codes, got) if torch.equal(codes, before) else changed
        if problem is not None:
            raise LabCheckError(f"{where}\n  {problem[0]}.\n  Hint: {problem[1]}\n  {rerun}")
    return report("pack_int4", [label for label, _ in cases], ["uint8"] * len(cases), seed, verbose)


# ------------------------------------------------------------------ part 3: the W4A16 GEMV


def _dequantize_packed(packed: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int, order=None):
    """The (N, K) float64 weight of packed 4-bit codes and (K // G, N) scales and zeros; ``order``
    permutes the eight codes of each word (to model a wrong unpacking)."""
    q = unpack_codes(packed, 4).double()
    if order is not None:
        q = q.view(q.shape[0], -1, 8)[:, :, order].reshape(q.shape)
    return q, _expand(scales.t(), group_size), _expand(zeros.t(), group_size)


def _gemv_reference(x, packed, scales, zeros, group_size):
    q, s, z = _dequantize_packed(packed, scales, zeros, group_size)
    return (((q - z) * s) @ x.double()).to(x.dtype)


def _gemv_misreading(case: Case, out: torch.Tensor) -> str | None:
    x, packed, scales, zeros = (t.double() if t.is_floating_point() else t for t in case.inputs)
    g = dict(case.kwargs)["group_size"]
    q, s, z = _dequantize_packed(packed, scales, zeros, g)
    rq = _dequantize_packed(packed, scales, zeros, g, order=list(range(7, -1, -1)))[0]
    candidates = {
        "Your outputs equal x @ (q * s).T: the zero point is missing. Dequantize as (q - z) * s.": q * s,
        "Your outputs match codes unpacked in reverse order: code k sits at bits 4 * (k % 8) of word k // 8 (the "
        "first code lowest): (word >> (4 * (k % 8))) & 0xF.": (rq - z) * s,
        "Your outputs equal x @ (q * s - z).T: the zero point is a code; subtract it before scaling.": q * s - z,
    }
    for hint, w in candidates.items():
        if compare(out, (w @ x).to(out.dtype), case.atol, case.rtol, "") is None:
            return hint
    return None


def check_w4a16_gemv(w4a16_gemv: Callable, *, seed: int | None = None, verbose: bool = True) -> LabReport:
    """Grade the launcher ``w4a16_gemv(x, packed, scales, zeros, group_size) -> (N,)``: ``x`` (K,),
    ``packed`` the (K // 8, N) int32 words of 4-bit codes, ``scales`` and ``zeros`` (K // group_size, N)
    in ``x``'s dtype (the layout of :class:`llmnote.quant.QuantizedWeight`); the output is
    ``x @ W.T`` in ``x``'s dtype, ``W[n, k] = (q[n, k] - z) * s`` with the group's ``s`` and ``z``,
    accumulated in float32 by the reader's Triton kernel. 12 cases: N from 1 to 200 (not multiples of a
    block), K from 32 to 512 (not always a multiple of 64), groups of 16 to 128, skewed groups whose
    zero point is 0 or 15. Raises :class:`~llmnote.labs.LabCheckError`."""
    __tracebackhide__ = True
    check_launcher("w4a16_gemv", w4a16_gemv, "w4a16_gemv(x, packed, scales, zeros, group_size)")
    seed = new_seed(seed)
    draw = Draw(seed)
    rng = draw.rng
    block_hint = (
        "Each program computes BLOCK_N outputs (mask cols < N) and walks K in steps of BLOCK_K (mask k < K on the loads of "
        "x, the words, the scales and the zeros, other=0)."
    )
    unpack_hint = "Code k of column n is (word >> (4 * (k % 8))) & 0xF, word = packed[k // 8, n]; its group is k // group_size."
    configs = [  # label, N, K, group_size, kind of weights
        ("a single output", 1, 32, 32, "gauss"),
        ("N not a multiple of the block", 17, 64, 32, "gauss"),
        ("whole blocks, one group per column", 64, 128, 128, "gauss"),
        ("K = 96, not a multiple of 64", 100, 96, 32, "gauss"),
        ("groups of 16, K = 48", 33, 48, 16, "gauss"),
        ("five groups of 64", 45, 320, 64, "gauss"),
        ("long K", 8, 512, 128, "gauss"),
        ("all weights positive: every zero point is 0", 40, 128, 32, "positive"),
        ("all weights negative: every zero point is 15", 40, 128, 32, "negative"),
        ("N = 200", 200, 64, 64, "gauss"),
    ]
    for _ in range(2):
        g = rng.choice([16, 32, 64, 128])
        configs.append(("random", rng.randint(1, 200), g * rng.randint(1, 4), g, "gauss"))
    cases = []
    for label, n, k, g, kind in configs:
        dtype = draw.dtype()
        qw = quantize_weight(_weights(draw, kind, n, k, dtype), bits=4, group_size=g)
        packed, _ = fenced(qw.qweight.shape, torch.int32, draw.device, -1)  # guard words: every code 15
        packed.copy_(qw.qweight)
        x = draw.randn((k,), dtype)
        atol, rtol = _GEMV_TOL[dtype]
        hint = f"{unpack_hint} {block_hint}"
        inputs = (x, packed, draw.fence(qw.scales, dtype), draw.fence(qw.zeros, dtype))
        cases.append(Case(f"N={n}, K={k}, group_size={g}, {label}", inputs, hint, atol * k**0.5, rtol, (("group_size", g),)))
    last: dict = {}

    def watched(*args, **kwargs):
        last.update(args=args, out=None)
        last["out"] = w4a16_gemv(*args, **kwargs)
        return last["out"]

    formula = "out[n] = sum over k of x[k] * (q[n, k] - z) * s, with s and z of row k // group_size, column n."
    try:
        return grade_launcher("w4a16_gemv", "w4a16_gemv_kernel", watched, cases, _gemv_reference, formula, seed, verbose)
    except LabCheckError as err:
        out = last.get("out")
        case = next((c for c in cases if last and c.inputs[0] is last["args"][0]), None)
        if "outputs are off" not in str(err) or case is None or not isinstance(out, torch.Tensor):
            raise
        diagnosis = _gemv_misreading(case, out)
        if diagnosis is None:
            raise
        raise LabCheckError(str(err).replace("\n  Hint: ", f"\n  Hint: {diagnosis} ", 1)) from None
