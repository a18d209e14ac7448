"""The quantized-linear benchmark (``python -m llmnote.bench quant``): W4A16, FP8 and INT8
linears against cuBLAS in bf16 and against torch's own low-precision operators, on the two
largest projections of Llama-3-8B (gate_up: N=28672, K=4096; down: N=4096, K=14336) at decode
(M = 1, 16, 64) and prefill (M = 256, 4096) batch sizes, all with bf16 activations and outputs.

- ``w4a16_linear``: ``llmnote`` (:func:`llmnote.kernels.w4a16_linear`, 4-bit codes in groups of
  128), ``torch-int4`` (``torch._weight_int4pack_mm``, the tinygemm kernel, on the same codes).
- ``fp8_linear``: ``llmnote`` (:func:`llmnote.kernels.fp8_gemm`), ``torch-scaled-mm``
  (``torch._scaled_mm``), both with one float32 scale per row of x and of the weight.
- ``int8_linear``: ``llmnote`` (:func:`llmnote.kernels.int8_gemm`), ``torch-int-mm``
  (``torch._int_mm``, then the scales in eager torch; it needs M > 16).

Every kernel's ``torch`` row is the bf16 product ``x @ w.T`` (cuBLAS) of the same shape, timed
before and after the W4A16 kernels of a case, the faster kept. Operands are quantized before
timing (activations too: the timed FP8 and INT8 calls take codes and scales). Each provider is
checked against a float32 product of its own operands before it is timed, and every time is a
CUDA-graph replay over rotating inputs. A row's bytes are the weight with its scales, the input
activations with theirs, and the output.

Then the model: decode steps of the Llama-3.2-1B shape (kernel ``decode``, case
``model=llama-3.2-1b,B=<b>,T=<t>``), provider ``llmnote-<weights>-kv-<cache>``: bf16 or W4A16
weights, a bf16, INT8 or FP8 KV cache, each a CUDA-graph replay.

The byte counts and roofline times that the W4A16 pages derive live here too, so the pages and
the tests share one copy: :func:`bf16_bytes`, :func:`w4a16_bytes`, :func:`predicted_ms`,
:func:`crossing` and :func:`dequant_pass_ms`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial

import torch
from tqdm.auto import tqdm

from .. import kernels, runtime
from ..layers import Linear
from ..models import random_model
from ..quant.apply import WeightOnly, swap_methods
from ..quant.formats import quantize_scaled, quantize_weight
from ..records import Record
from .decode import SHAPES as DECODE_SHAPES
from .decode import filled_cache
from .timing import check_before_timing, cuda_time_ms, rotating_inputs

__all__ = [
    "run_quant",
    "quant_cases",
    "parse_case",
    "SHAPES",
    "SHAPE_NAMES",
    "BATCHES",
    "GROUP_SIZE",
    "PARTS",
    "bf16_bytes",
    "w4a16_bytes",
    "predicted_ms",
    "crossing",
    "dequant_pass_ms",
]

SHAPES = ((28672, 4096), (4096, 14336))  # (N, K): Llama-3-8B's gate_up_proj and down_proj
SHAPE_NAMES = {(28672, 4096): "gate_up_proj", (4096, 14336): "down_proj"}  # {(N, K): the projection's name}
BATCHES = (1, 16, 64, 256, 4096)
GROUP_SIZE = 128
PARTS = ("w4a16", "fp8", "int8", "decode")  # what run_quant can time on its own
_CASE = re.compile(r"M=(\d+),N=(\d+),K=(\d+)")


def quant_cases() -> list[tuple[str, int, int, int]]:
    """``(case, M, N, K)`` for every shape and batch size, the case written ``M=<m>,N=<n>,K=<k>``."""
    return [(f"M={m},N={n},K={k}", m, n, k) for n, k in SHAPES for m in BATCHES]


def parse_case(case: str) -> tuple[int, int, int]:
    """``(M, N, K)`` from a case string ``M=<m>,N=<n>,K=<k>``."""
    match = _CASE.fullmatch(case)
    if match is None:
        raise ValueError(f"a case must read M=<m>,N=<n>,K=<k>, got {case!r}")
    return tuple(int(v) for v in match.groups())


def bf16_bytes(m: int, n: int, k: int) -> int:
    """Fewest bytes a 16-bit product ``x @ w.T`` moves, x ``(M, K)`` and w ``(N, K)``: the weight,
    x and the ``(M, N)`` output, each once, 2 bytes an element."""
    return 2 * (n * k + m * k + m * n)


def w4a16_bytes(m: int, n: int, k: int, group_size: int = GROUP_SIZE) -> int:
    """Fewest bytes of the same product with the weight in W4A16: 4-bit codes plus a 16-bit scale
    and a 16-bit zero point per group of ``group_size`` along K (what
    :class:`~llmnote.quant.QuantizedWeight` stores: ``m = 0`` counts its ``nbytes``), x and the
    output in 16 bits."""
    if k % group_size:
        raise ValueError(f"k must be a multiple of group_size, got k={k}, group_size={group_size}")
    return n * k // 2 + 2 * 2 * (k // group_size) * n + 2 * (m * k + m * n)  # codes, scales and zeros; x and y


def predicted_ms(nbytes: float, flops: float, tbps: float, tflops: float) -> float:
    """Roofline time in ms: the larger of the memory time at ``tbps`` (TB/s) and the compute time
    at ``tflops`` (TFLOP/s)."""
    return max(nbytes / (tbps * 1e12), flops / (tflops * 1e12)) * 1e3


def crossing(n: int, k: int, ridge: float) -> float:
    """M* at which the 16-bit product of an ``(N, K)`` weight reaches the ridge point ``ridge``
    (FLOP/byte), from ``2MNK / bf16_bytes(M, N, K) = ridge``; from there on it is compute-bound."""
    slack = 1 - ridge * (1 / n + 1 / k)
    if slack <= 0:
        raise ValueError(f"an ({n}, {k}) product never reaches the ridge point {ridge} FLOP/B")
    return ridge / slack


def dequant_pass_ms(n: int, k: int, tbps: float, group_size: int = GROUP_SIZE) -> float:
    """Roofline time of ``w4a16_dequant_kernel`` at ``tbps`` (TB/s): read the codes with their
    scales and zero points, write the 16-bit ``(N, K)`` weight."""
    return (w4a16_bytes(0, n, k, group_size) + 2 * n * k) / (tbps * 1e12) * 1e3


def _skip(provider: str, case: str, err: Exception) -> None:
    first = str(err).splitlines()[0][:160] if str(err) else ""
    tqdm.write(f"note: {provider} skipped for {case}: {type(err).__name__}: {first}")


def _checked_ms(label: str, provider: str, case: str, fn: Callable, sets: list[tuple], expected) -> float | None:
    """Check ``fn`` on the first input set, then its median time over all of them; ``None`` (reported)
    for a provider that fails its check or its launch, so one failure does not lose the run."""
    try:
        check_before_timing(f"{label} {case} {provider}", fn(*sets[0]), expected, 1e-2)
        return cuda_time_ms(fn, sets, warmup=5, rep=20, graph_calls=10)
    except Exception as err:
        _skip(provider, case, err)
        return None


def _measure(rec: Record, kernel: str, case: str, provider: str, fn: Callable, sets: list[tuple], expected, nbytes: int,
             earlier_ms: float | None = None):  # fmt: skip
    """Check and time ``fn`` (:func:`_checked_ms`) and add its row, or return ``None``;
    ``earlier_ms``: an earlier time of the same call, the row keeping the faster of the two."""
    m, n, k = parse_case(case)
    ms = _checked_ms(kernel, provider, case, fn, sets, expected)
    if ms is None:
        return None
    return rec.add(kernel, case, "bf16", provider, min(ms, earlier_ms or ms), flops=2 * m * n * k, nbytes=nbytes)


def _int4pack(qweight) -> tuple[torch.Tensor, torch.Tensor]:
    """The same codes in tinygemm's layout: two codes a byte (even k in the high nibble), tiled
    by ``torch._convert_weight_to_int4pack``; it reads ``w = (q - 8) * s + zero``, so its zero
    is ``(8 - z) * s`` for ours ``w = (q - z) * s``. Returns (packed weight, (K/G, N, 2) scales and zeros)."""
    codes = qweight.codes()
    packed = torch._convert_weight_to_int4pack((codes[:, ::2] << 4 | codes[:, 1::2]).contiguous(), 8)
    s, z = qweight.scales.float(), qweight.zeros.float()
    return packed, torch.stack([s, (8 - z) * s], dim=-1).to(torch.bfloat16).contiguous()


def _w4a16_set(m: int, n: int, k: int) -> tuple:
    qweight = quantize_weight(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), bits=4, group_size=GROUP_SIZE)
    return torch.randn(m, k, device="cuda", dtype=torch.bfloat16), qweight, qweight.dequantize()


def _time_w4a16(rec: Record, case: str, m: int, n: int, k: int, bf16_only: bool = False) -> float:
    """The W4A16 rows of one case (with ``bf16_only``, its bf16 cuBLAS row alone); returns the bf16
    cuBLAS time, shared by the three kernels. cuBLAS is timed first and again after the 4-bit
    kernels, and its row keeps the faster: between runs its time on one row of ``gate_up_proj``
    moved by 9% on an H200, which would move every ratio against it as much."""
    sets = rotating_inputs(partial(_w4a16_set, m, n, k), n * k // 2 + 2 * m * k)
    x, qweight, w = sets[0]
    expected = x.float() @ w.float().t()  # x @ dequantize().T, what every provider here computes
    act = 2 * m * k + 2 * m * n

    def bf16_fn(x, q, w):
        return x @ w.t()

    if bf16_only:
        return _measure(rec, "w4a16_linear", case, "torch", bf16_fn, sets, expected, 2 * n * k + act)["median_ms"]
    first = _checked_ms("w4a16_linear", "torch", case, bf16_fn, sets, expected)
    _measure(rec, "w4a16_linear", case, "llmnote", lambda x, q, w: kernels.w4a16_linear(x, q), sets, expected,
             qweight.nbytes + act)  # fmt: skip
    try:
        int4_sets = [(s[0], *_int4pack(s[1])) for s in sets]
    except Exception as err:  # a peer that is missing or refuses the shape is skipped, not fatal
        _skip("torch-int4", case, err)
    else:
        _measure(rec, "w4a16_linear", case, "torch-int4", lambda x, p, sz: torch._weight_int4pack_mm(x, p, GROUP_SIZE, sz),
                 int4_sets, expected, qweight.nbytes + act)  # fmt: skip
    bf16 = _measure(rec, "w4a16_linear", case, "torch", bf16_fn, sets, expected, 2 * n * k + act, earlier_ms=first)
    return bf16["median_ms"]


def _scaled_set(m: int, n: int, k: int, kind: str) -> tuple:
    xq = quantize_scaled(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), kind, "row")
    wq = quantize_scaled(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), kind, "row")
    return xq.data, xq.scale, wq.data, wq.scale


def _torch_int_mm(a, a_scale, b, b_scale):
    return (torch._int_mm(a, b.t()).float() * a_scale[:, None] * b_scale[None, :]).to(torch.bfloat16)


def _torch_scaled_mm(a, a_scale, b, b_scale):
    return torch._scaled_mm(a, b.t(), scale_a=a_scale[:, None], scale_b=b_scale[None, :], out_dtype=torch.bfloat16)


def _time_scaled(rec: Record, kind: str, case: str, m: int, n: int, k: int, bf16_ms: float) -> None:
    """The FP8 or INT8 rows of one case, and the bf16 cuBLAS row measured for the W4A16 ones."""
    kernel = f"{kind}_linear"
    nbytes = m * k + n * k + 4 * (m + n) + 2 * m * n
    rec.add(kernel, case, "bf16", "torch", bf16_ms, flops=2 * m * n * k, nbytes=2 * (m * k + n * k + m * n))
    sets = rotating_inputs(partial(_scaled_set, m, n, k, kind), m * k + n * k)
    a, a_scale, b, b_scale = sets[0]
    expected = (a.float() * a_scale[:, None]) @ (b.float() * b_scale[:, None]).t()
    ours = getattr(kernels, f"{kind}_gemm", None)
    if ours is None:
        tqdm.write(f"note: llmnote.kernels.{kind}_gemm is missing: no llmnote row for {kernel} {case}")
    else:
        _measure(rec, kernel, case, "llmnote", lambda *s: ours(*s, torch.bfloat16), sets, expected, nbytes)
    peer, fn = ("torch-scaled-mm", _torch_scaled_mm) if kind == "fp8" else ("torch-int-mm", _torch_int_mm)
    if kind == "int8" and m <= 16:
        tqdm.write(f"note: torch-int-mm skipped for {case}: torch._int_mm needs M > 16")
        return
    _measure(rec, kernel, case, peer, fn, sets, expected, nbytes)


def _stored_bytes(model: torch.nn.Module, batch: int, context: int, kv_dtype: torch.dtype | None) -> int:
    """Bytes a decode step reads: every projection's stored weight (codes and scales when
    quantized), the LM head, and the KV cache of ``context + 1`` tokens (with its scales)."""
    weights = sum(t.numel() * t.element_size() for m in model.modules() if isinstance(m, Linear)
                  for t in (*m.parameters(recurse=False), *m.buffers(recurse=False)))  # fmt: skip
    weights += model.lm_head.weight.numel() * model.lm_head.weight.element_size()
    c = model.config
    per_token = 2 * c.num_layers * c.num_kv_heads * (c.head_dim * (1 if kv_dtype else 2) + (4 if kv_dtype else 0))
    return weights + per_token * batch * (context + 1)


def _time_model_decode(rec: Record) -> None:
    """Decode steps of the Llama-3.2-1B-shaped model (random weights, paged cache, CUDA graph):
    bf16 weights against W4A16 weights at batch 1 and 16, and a bf16 KV cache against INT8 and
    FP8 ones at batch 64 with 4096 tokens of context, where the cache outweighs the weights."""
    name = "llama-3.2-1b"
    model = random_model(DECODE_SHAPES[name])
    token = torch.randint(0, model.config.vocab_size, (64,), device="cuda")
    kv_cases = [(None, "bf16")] + [(d, n) for d, n in ((torch.int8, "int8"), (torch.float8_e4m3fn, "fp8"))
                                    if d != torch.float8_e4m3fn or (runtime.capability() or (0, 0)) >= (8, 9)]  # fmt: skip
    for weights in ("bf16", "w4a16"):
        if weights == "w4a16":
            swap_methods(model, lambda n, layer: WeightOnly(4, GROUP_SIZE))
        for b, t, kv_dtype, kv in [(1, 1024, None, "bf16"), (16, 1024, None, "bf16"), *((64, 4096, d, n) for d, n in kv_cases)]:
            try:
                cache = filled_cache(model, b, t, kv_dtype)
                ms = cuda_time_ms(model.decode, [(token[:b], cache)], warmup=3, rep=30, graph_calls=1)
            except Exception as err:
                _skip(f"llmnote-{weights}-kv-{kv}", f"B={b},T={t}", err)
                continue
            rec.add("decode", f"model={name},B={b},T={t}", "bf16", f"llmnote-{weights}-kv-{kv}", ms,
                    nbytes=_stored_bytes(model, b, t, kv_dtype))  # fmt: skip
            del cache
    del model
    torch.cuda.empty_cache()


def run_quant(command: str | None = None, parts: tuple[str, ...] = PARTS) -> Record:
    """Time every quantized-linear case on the current GPU, then the model's decode steps with
    quantized weights and KV caches; return the record, not yet saved. ``parts`` (of :data:`PARTS`:
    the W4A16, FP8 and INT8 linears and the decode steps) picks what to time, for a record made in
    several runs (``python -m llmnote.bench quant --parts w4a16 --merge``)."""
    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ValueError(f"unknown parts {sorted(unknown)}; the parts are {', '.join(PARTS)}")
    rec = Record() if command is None else Record(command=command)
    scaled = [kind for kind in ("fp8", "int8") if kind in parts]
    if "w4a16" in parts or scaled:
        for case, m, n, k in tqdm(quant_cases(), desc="quant"):  # the bf16 row of the W4A16 case is the scaled ones' too
            bf16_ms = _time_w4a16(rec if "w4a16" in parts else Record(), case, m, n, k, bf16_only="w4a16" not in parts)
            torch.cuda.empty_cache()
            for kind in scaled:
                _time_scaled(rec, kind, case, m, n, k, bf16_ms)
                torch.cuda.empty_cache()
    if "decode" in parts:
        with torch.no_grad():
            _time_model_decode(rec)
    return rec
