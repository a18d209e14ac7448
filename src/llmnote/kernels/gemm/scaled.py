"""FP8 and INT8 matrix products with scales: ``(a * a_scale) @ (b * b_scale).T``.

W8A8 inference keeps the weights ``b`` (N, K) in 8 bits with float32 scales and quantizes the
activations ``a`` (M, K) on the fly, one scale a token (Xiao et al., 2022, SmoothQuant;
Dettmers et al., 2022, LLM.int8(); Micikevicius et al., 2022, FP8 formats). The tensor cores
multiply the 8-bit codes at twice the 16-bit rate and the scales are applied afterwards:

- per-tensor and per-row scales factor out of the sum over K, so they are applied once, in the
  epilogue, to the float32 (fp8) or exact int32 (int8) accumulator;
- block scales (DeepSeek-AI, 2024, DeepSeek-V3: one scale per token and 128-channel block of
  ``a``, one per 128 x 128 block of ``b``) change along K: with ``BLOCK_K = 128`` every K step
  multiplies its partial product by one scale pair before adding it to the accumulator.

The tile loop is the grouped GEMM of :mod:`llmnote.kernels.gemm.matmul`. ``b`` is read
K-major, the layout the FP8 tensor-core instructions want. On Hopper and newer GPUs the tiles
arrive through TMA descriptors (the copy engine fills shared memory, masking the edges); elsewhere
through pointer loads. Tile shapes are autotuned per (bucket of M, N, K): small-M tiles for
decode, 128- to 256-wide tiles for prefill.

On Hopper, ``tl.dot`` on fp8 by default sums the whole K loop in the tensor cores' reduced-precision
accumulator ("fast accumulation"); ``fast_accum=False`` adds each 128-wide K step into a float32
accumulator instead, as DeepSeek-V3's promotion does, at some cost in speed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..._checks import SCALE_BLOCK, check_quantize_rows, check_scaled_gemm, check_scaled_linear
from ..common import as_rows, check_device, num_warps_for
from .matmul import MATMUL_HEURISTICS, grouped_tile, prune_configs

__all__ = [
    "fp8_gemm",
    "int8_gemm",
    "quantize_rows",
    "fp8_linear",
    "int8_linear",
    "scaled_gemm_launch",
    "scaled_gemm_kernel",
    "scaled_gemm_configs",
    "quantize_rows_kernel",
]

FP8_MAX = 448.0  # the largest finite float8_e4m3fn
INT8_MAX = 127.0  # symmetric codes: -127 .. 127


def _config(bm: int, bn: int, stages: int, warps: int, group: int, tma: bool) -> triton.Config:
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": SCALE_BLOCK, "GROUP_M": group},
        num_stages=stages,
        num_warps=warps,
        pre_hook=_set_tma_blocks if tma else None,
    )


def scaled_gemm_configs(tma: bool = False) -> list[triton.Config]:
    """Autotuning candidates, all with ``BLOCK_K = 128`` (128 bytes of an 8-bit row: one TMA
    line, and the side of a block scale). Prefill tiles of 64 to 256 rows and columns; decode
    tiles of 16 to 64 rows and 32 to 128 columns, where the product is bound by reading ``b`` and
    many narrow programs, deeply pipelined, keep every SM streaming it."""
    prefill = [(128, 256, 3, 8), (256, 128, 3, 8), (128, 256, 4, 8), (128, 128, 4, 8), (128, 128, 5, 4),
               (64, 256, 4, 4), (128, 64, 4, 4), (64, 128, 4, 4)]  # fmt: skip
    decode = [(16, 32, 6, 4), (16, 64, 4, 4), (16, 128, 5, 4), (32, 64, 4, 4), (32, 128, 4, 4), (64, 64, 5, 4)]
    return [_config(*shape, 8, tma) for shape in prefill] + [_config(*shape, 1, tma) for shape in decode]


def _set_tma_blocks(nargs: dict) -> None:
    """Give the TMA descriptors the tile shapes of the configuration being launched."""
    nargs["a"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["b"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """:func:`~llmnote.kernels.gemm.matmul.prune_configs` (shared memory, tiles no larger than
    the problem), keeping tiles of up to 64 rows for decode-sized M (64 rows is the smallest
    Hopper ``wgmma`` tile), and dropping tiles under 64 rows once M passes 256. Block scales and
    fp8 without fast accumulation hold two tile-sized float32 sums (the step's and the total):
    tiles of more than 64 of them per thread would spill registers."""
    M, N, K = named_args["M_BUCKET"], named_args["N"], named_args["K"]
    two_sums = kwargs.get("BLOCK_SCALES") or not kwargs.get("FAST_ACCUM", True)

    def fits(c: triton.Config) -> bool:
        bm, bn = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]
        return (M <= 256 or bm >= 64) and not (two_sums and bm * bn > 64 * 32 * c.num_warps)

    kept = prune_configs(configs, max(M, 64), N, K, element_size=1)
    return [c for c in kept if fits(c)] or kept


@triton.jit
def scaled_gemm_kernel(
    a, b, c_ptr, a_scale_ptr, b_scale_ptr,
    M, N, K, M_BUCKET,
    stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn,
    stride_asm, stride_ask, stride_bsn, stride_bsk,
    INT8: tl.constexpr, BLOCK_SCALES: tl.constexpr, FAST_ACCUM: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):  # fmt: skip
    """One ``BLOCK_M x BLOCK_N`` tile of ``c``. ``a``/``b`` are pointers, or TMA descriptors when
    ``TMA``. Row and tensor scales: ``stride_asm``/``stride_bsn`` step along M/N (0 for one
    scale). Block scales: ``(stride_asm, stride_ask)`` and ``(stride_bsn, stride_bsk)`` index
    a_scale[m, k // 128] and b_scale[n // 128, k // 128]."""
    # Grouped order: GROUP_M rows of tiles are visited column by column (shared panels stay in L2).
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)

    # Rows and columns past the edge wrap around (% M, % N): loads stay in bounds, and the
    # duplicates are never stored.
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    rk = tl.arange(0, BLOCK_K)
    if not TMA:
        a_ptrs = a + rm[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
        b_ptrs = b + rn[:, None].to(tl.int64) * stride_bn + rk[None, :] * stride_bk  # (BLOCK_N, BLOCK_K)

    if INT8:  # int8 x int8 products summed exactly in int32
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if TMA:  # out-of-bounds rows and columns arrive as zeros
            a_tile = a.load([pid_m * BLOCK_M, k * BLOCK_K])
            b_tile = b.load([pid_n * BLOCK_N, k * BLOCK_K])
        elif EVEN_K:
            a_tile = tl.load(a_ptrs)
            b_tile = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a_tile = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b_tile = tl.load(b_ptrs, mask=rk[None, :] < k_left, other=0.0)
        if BLOCK_SCALES:  # this K step's scales: one per row of a, one per 128 columns of b
            tl.static_assert(BLOCK_K == 128, "block scales need BLOCK_K == 128")
            a_s = tl.load(a_scale_ptr + rm * stride_asm + k * stride_ask)
            b_s = tl.load(b_scale_ptr + (rn // 128) * stride_bsn + k * stride_bsk)
            acc += tl.dot(a_tile, b_tile.T) * (a_s[:, None] * b_s[None, :])
        elif FAST_ACCUM:
            acc = tl.dot(a_tile, b_tile.T, acc, out_dtype=acc.dtype)
        else:  # promote the tensor cores' partial sum into float32 after every BLOCK_K products
            acc = tl.dot(a_tile, b_tile.T, acc, max_num_imprecise_acc=BLOCK_K)
        if not TMA:
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk

    out = acc.to(tl.float32)
    if not BLOCK_SCALES:  # row (or tensor, stride 0) scales factor out of the sum over K
        a_s = tl.load(a_scale_ptr + rm * stride_asm)
        b_s = tl.load(b_scale_ptr + rn * stride_bsn)
        out = out * a_s[:, None] * b_s[None, :]
    cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + cm[:, None].to(tl.int64) * stride_cm + cn[None, :] * stride_cn
    tl.store(c_ptrs, out.to(c_ptr.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))


_KEY = ["M_BUCKET", "N", "K", "INT8", "BLOCK_SCALES", "FAST_ACCUM"]
_plain_kernel = triton.heuristics(MATMUL_HEURISTICS)(scaled_gemm_kernel)
_TUNED = {
    tma: triton.autotune(configs=scaled_gemm_configs(tma), key=_KEY, prune_configs_by={"early_config_prune": _prune})(
        _plain_kernel
    )
    for tma in (False, True)
}


def _use_tma(a: torch.Tensor, b: torch.Tensor) -> bool:
    """TMA on Hopper and newer, for row-major operands whose rows start on 16-byte boundaries."""
    if runtime.interpreting() or not a.is_cuda or (runtime.capability() or (0, 0)) < (9, 0):
        return False
    return all(t.stride(1) == 1 and t.stride(0) % 16 == 0 and t.data_ptr() % 16 == 0 for t in (a, b))


def _scale_strides(scale: torch.Tensor, block: bool) -> tuple[int, int]:
    if block:
        return scale.stride(0), scale.stride(1)
    return (0 if scale.numel() == 1 else scale.stride(0)), 0


def scaled_gemm_launch(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    out: torch.Tensor,
    *,
    block_scales: bool,
    fast_accum: bool = True,
    tma: bool = False,
    config: triton.Config | None = None,
) -> torch.Tensor:
    """Run :func:`scaled_gemm_kernel` into ``out`` (M, N) on checked inputs: autotuned, or with
    exactly ``config``; through TMA descriptors when ``tma`` (Hopper and newer, or the interpreter)."""
    (M, K), N = a.shape, b.shape[0]
    if M == 0:
        return out
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        bm, bn = (config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]) if config else (64, 64)  # else set per config
        a_arg = TensorDescriptor.from_tensor(a, [bm, SCALE_BLOCK])
        b_arg = TensorDescriptor.from_tensor(b, [bn, SCALE_BLOCK])
    else:
        a_arg, b_arg = a, b
    args = (
        a_arg, b_arg, out, a_scale, b_scale, M, N, K, max(16, triton.next_power_of_2(M)),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        *_scale_strides(a_scale, block_scales), *_scale_strides(b_scale, block_scales),
    )  # fmt: skip
    consts = {"INT8": a.dtype == torch.int8, "BLOCK_SCALES": block_scales, "FAST_ACCUM": fast_accum, "TMA": tma}
    if config is not None:
        grid = (triton.cdiv(M, config.kwargs["BLOCK_M"]) * triton.cdiv(N, config.kwargs["BLOCK_N"]),)
        _plain_kernel[grid](*args, **consts, **config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
    else:

        def grid(meta):
            return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

        _TUNED[tma][grid](*args, **consts)
    return out


# In the interpreter: one small tile (BLOCK_K stays 128, the side of a block scale).
_INTERPRETER_CONFIG = triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": SCALE_BLOCK, "GROUP_M": 2})


def _gemm(a, a_scale, b, b_scale, out_dtype, kind: str, fast_accum: bool) -> torch.Tensor:
    block = check_scaled_gemm(a, a_scale, b, b_scale, kind, out_dtype)
    check_device(a=a, b=b, a_scale=a_scale, b_scale=b_scale)
    if a.is_cuda and kind == "fp8":
        runtime.require_capability((8, 9), "float8 matrix products (fp8_gemm)")
    out = torch.empty((a.shape[0], b.shape[0]), dtype=out_dtype, device=a.device)
    config = _INTERPRETER_CONFIG if runtime.interpreting() else None
    return scaled_gemm_launch(
        a, a_scale, b, b_scale, out, block_scales=block, fast_accum=fast_accum, tma=_use_tma(a, b), config=config
    )


def fp8_gemm(
    a: torch.Tensor,
    a_scale: torch.Tensor,
    b: torch.Tensor,
    b_scale: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    fast_accum: bool = True,
) -> torch.Tensor:
    """``(a * a_scale) @ (b * b_scale).T`` for float8_e4m3fn a ``(M, K)`` and b ``(N, K)``.

    Scales are float32: per tensor (``()``/``(1,)``) or per row (a ``(M,)``, b ``(N,)``), each
    independently, applied in the epilogue; or block scales, a ``(M, ceil(K/128))`` and b
    ``(ceil(N/128), ceil(K/128))``, applied at every 128-wide K step. Float32 accumulation
    (``fast_accum``: see the module docstring). Returns ``(M, N)`` in ``out_dtype``. Needs compute
    capability 8.9 or newer on a GPU.
    """
    return _gemm(a, a_scale, b, b_scale, out_dtype, "fp8", fast_accum)


def int8_gemm(
    a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor, out_dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """``(a * a_scale) @ (b * b_scale).T`` for int8 a ``(M, K)`` and b ``(N, K)``, with exact int32
    accumulation (exact while ``K * 127**2 < 2**31``, K below 133,000) and per-tensor or per-row
    float32 scales applied in the epilogue. Returns ``(M, N)`` in ``out_dtype``."""
    return _gemm(a, a_scale, b, b_scale, out_dtype, "int8", True)


@triton.jit
def _round_to_int(x):
    """Round float32 ``|x| < 2**22`` to the nearest integer, ties to even: past 1.5 * 2**23 the
    float32 numbers are one apart, so the addition itself does the rounding."""
    return (x + 12582912.0) - 12582912.0


@triton.jit
def _round_to_e4m3(x):
    """Round float32 ``|x| <= 448`` to the nearest E4M3 number (ties to even), still in float32,
    so that the cast to float8 is exact everywhere (the interpreter's own cast rounds badly).
    E4M3 numbers near ``x`` lie ``2**(e - 3)`` apart (``e`` the exponent of x, at least -6,
    below which they are subnormal); adding and removing ``1.5 * 2**(e + 20)``, a float32 whose
    neighbours lie exactly that far apart, rounds |x| to that grid; the sign (of zero too) is x's."""
    bits = x.to(tl.int32, bitcast=True)
    e = tl.maximum(((bits >> 23) & 0xFF) - 127, -6)
    magic = (((e + 147) << 23) | 0x400000).to(tl.float32, bitcast=True)  # 1.5 * 2**(e + 20)
    r = (tl.abs(x) + magic) - magic
    return tl.where(bits < 0, r * -1.0, r)  # not -r, which Triton computes as 0 - r (+0 for r = 0)


@triton.jit
def quantize_rows_kernel(
    x_ptr, q_ptr, s_ptr, M, K, GROUP, stride_xm, stride_qm, stride_sm,
    TOP: tl.constexpr, INT8: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """Program (i, g) quantizes rows ``[i * BLOCK_R, (i + 1) * BLOCK_R)`` in columns
    ``[g * GROUP, (g + 1) * GROUP)``, one absmax scale a row: a first pass over the columns finds
    the absmax, a second writes the codes."""
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    start = tl.program_id(1) * GROUP
    end = tl.minimum(start + GROUP, K)
    amax = tl.zeros((BLOCK_R, BLOCK), dtype=tl.float32)
    for i in range(0, tl.cdiv(end - start, BLOCK)):
        cols = start + i * BLOCK + tl.arange(0, BLOCK)
        mask = (rows[:, None] < M) & (cols[None, :] < end)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    scale = tl.math.div_rn(tl.max(amax, axis=1), TOP)
    scale = tl.where(scale > 0, scale, 1.0)
    for i in range(0, tl.cdiv(end - start, BLOCK)):
        cols = start + i * BLOCK + tl.arange(0, BLOCK)
        mask = (rows[:, None] < M) & (cols[None, :] < end)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
        v = tl.clamp(tl.math.div_rn(x.to(tl.float32), scale[:, None]), -TOP, TOP)
        if INT8:
            q = _round_to_int(v).to(tl.int8)
        else:
            q = _round_to_e4m3(v).to(tl.float8e4nv)
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q, mask=mask)
    tl.store(s_ptr + rows * stride_sm + tl.program_id(1), scale, mask=rows < M)


def quantize_rows(x: torch.Tensor, kind: str, block: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic absmax quantization of activations ``x`` (M, K) fp32/fp16/bf16 to ``kind`` ('fp8'
    or 'int8'): one scale a row, or with ``block=128`` (fp8 only) one per row and 128-column
    block. ``scale = absmax / 448`` (fp8) or ``/ 127`` (int8), 1 for an all-zero group; codes are
    ``x / scale`` rounded to nearest, ties to even. Returns ``(data, scale)``: data ``(M, K)``
    float8_e4m3fn or int8, scale float32 ``(M,)`` or ``(M, ceil(K/128))``."""
    check_quantize_rows(x, kind, block)
    check_device(x=x)
    if x.is_cuda and kind == "fp8":
        runtime.require_capability((8, 9), "float8 quantization (quantize_rows)")
    x = as_rows(x)
    M, K = x.shape
    data = torch.empty((M, K), dtype=torch.float8_e4m3fn if kind == "fp8" else torch.int8, device=x.device)
    group = K if block is None else block
    groups = triton.cdiv(K, group)
    scale = torch.empty((M, groups), dtype=torch.float32, device=x.device)
    if M:
        tile = min(triton.next_power_of_2(group), 8192)  # columns a step
        rows = min(triton.next_power_of_2(M), max(1, 4096 // tile))  # short rows: several a program
        quantize_rows_kernel[(triton.cdiv(M, rows), groups)](
            x, data, scale, M, K, group, x.stride(0), data.stride(0), scale.stride(0),
            TOP=FP8_MAX if kind == "fp8" else INT8_MAX, INT8=kind == "int8", BLOCK_R=rows, BLOCK=tile,
            num_warps=num_warps_for(rows * tile),
        )  # fmt: skip
    return data, (scale[:, 0] if block is None else scale)


def _linear(x: torch.Tensor, w, kind: str) -> torch.Tensor:
    check_scaled_linear(x, w, kind)
    N, K = w.data.shape
    xq, xs = quantize_rows(x.reshape(-1, K), kind, block=SCALE_BLOCK if w.granularity == "block" else None)
    gemm = fp8_gemm if kind == "fp8" else int8_gemm
    return gemm(xq, xs, w.data, w.scale, out_dtype=x.dtype).view(*x.shape[:-1], N)


def fp8_linear(x: torch.Tensor, w) -> torch.Tensor:
    """``x @ W^T`` for an FP8 weight ``w`` (a ScaledWeight: ``.data`` (N, K) float8_e4m3fn,
    ``.scale``, ``.granularity`` 'tensor', 'row' or 'block'). x ``(..., K)`` is quantized to FP8 per
    row (per row and 128-column block for a block-scaled w) by :func:`quantize_rows`, then
    multiplied by :func:`fp8_gemm`. Returns ``(..., N)`` in x's dtype."""
    return _linear(x, w, "fp8")


def int8_linear(x: torch.Tensor, w) -> torch.Tensor:
    """``x @ W^T`` for an INT8 weight ``w`` (a ScaledWeight with per-tensor or per-row scales):
    x ``(..., K)`` is quantized to INT8 per row, then multiplied by :func:`int8_gemm`. Returns
    ``(..., N)`` in x's dtype."""
    return _linear(x, w, "int8")
