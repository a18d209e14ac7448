"""How the W4A16 kernels turn packed 4-bit codes into numbers they can multiply.

Four ways, one per kernel path (see :mod:`llmnote.kernels.gemm.w4a16`):

- :func:`_code_minus_zero`: ``q - z`` in float32 by the 2**23 trick (the fused GEMM and the
  dequantize pass);
- :func:`_gemv_row_tile`: for one row of x, the code read in place as a subnormal float32;
- :func:`_unpack_pairs`: for up to 16 rows on the tensor cores, two codes at a time as the 16-bit
  pair an MMA operand register holds, with the x slices of :func:`_strided_slices`;
- for up to 16 rows with the weight as the MMA's A operand, two codes of one word as a 16-bit
  pair offset by m = 128 (bf16) or 1024 (fp16): :mod:`llmnote.kernels.gemm.w4a16_swap_ab_codes`.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["SUB_SHIFT", "CODE_BIT"]

_MAGIC_BITS = tl.constexpr(0x4B000000)  # the bits of the float32 2**23
_MAGIC = tl.constexpr(8388608.0)  # 2**23
SUB_SHIFT = 61  # the one-row kernel forms x * q * 2**-SUB_SHIFT: see _gemv_row_tile
CODE_BIT = (0, 4, 8, 12, 16, 20, 16, 20)  # the bit at which it reads code j: in place, or after a shift by 8 (j >= 6)
_CODE_BIT = tl.constexpr(CODE_BIT)
_PRESCALE = tl.constexpr(tuple(2.0 ** (149 - b - SUB_SHIFT) for b in CODE_BIT))
_UNSHIFT = tl.constexpr(2.0**SUB_SHIFT)


@triton.jit
def _code_minus_zero(low, high, z, j: tl.constexpr):
    """``q - z`` in float32 for code ``j`` of each word, given ``low = word | bits(2**23)`` and
    ``high = (word >> 16) | bits(2**23)``. Masking keeps the code's nibble J = j % 4 in place in
    the mantissa of 2**23: the float 2**23 + q * 16**J, in one logical operation. Scaling by
    16**-J and subtracting 2**(23 - 4J) + z are exact (integers below 2**24, powers of two)."""
    J: tl.constexpr = j % 4
    if j < 4:
        bits = low & (_MAGIC_BITS | (15 << (4 * J)))
    else:
        bits = high & (_MAGIC_BITS | (15 << (4 * J)))
    return bits.to(tl.float32, bitcast=True) * (1.0 / (1 << (4 * J))) - (z + _MAGIC / (1 << (4 * J)))


@triton.jit
def _gemv_row_tile(acc, words, s, z, x_ptr, kw, K, stride_xk, EVEN_K: tl.constexpr, WIDE: tl.constexpr = False):
    """``acc + s * sum_k x_k q_k - s * z * sum_k x_k`` for each word, for one row of x: the
    codes of the words ``(BLOCK_KW, BLOCK_N)`` against x's entries ``kw + j``, j < 8 (``kw``:
    each word row's first K index).

    A float32 whose bits, read as an integer, are some ``b < 2**24`` is ``b * 2**-149``: a
    subnormal below ``2**23`` and, with exponent field 1, the same line up to ``2**24``. So one
    AND that keeps code j where it sits, at bit ``p_j = CODE_BIT[j]`` (4j for codes 0 to 5; codes
    6 and 7, at bits 24 to 31, after one shift of the word by 8), leaves exactly the float
    ``q * 2**(p_j - 149)``. Times x prescaled once per entry by ``2**(149 - p_j - SUB_SHIFT)`` (a
    power of two: exact while ``|x| < 2**40``) it is ``x q 2**-SUB_SHIFT``, a normal float while
    ``|x q| >= 2**-65``: one AND and one FMA a code, no conversion, no subtraction. The zero point
    comes off once per word as ``z * sum x``, and ``2**SUB_SHIFT`` rides on the scale.

    ``WIDE``: the tile lies in one group (``s`` and ``z`` are ``(1, BLOCK_N)``) and ``acc`` is
    ``(1, BLOCK_N)``: the products are summed over the word rows first, and the scale and zero point
    apply once per column. When each thread holds every word row of its columns (tiles
    ``4 * 32 * num_warps`` or more columns wide), that sum stays inside the thread, and the
    per-word work of the scale and zero point is gone."""
    upper = words >> 8  # codes 6 and 7 at bits 16 and 20 (the sign bits copied in lie above 23)
    part = tl.zeros_like(acc)
    xsum = tl.zeros((acc.shape[0], 1), dtype=tl.float32)
    for j in tl.static_range(8):
        if j < 6:
            bits = words & (15 << _CODE_BIT[j])
        else:
            bits = upper & (15 << _CODE_BIT[j])
        if EVEN_K:
            xj = tl.load(x_ptr + (kw + j) * stride_xk).to(tl.float32)[:, None]
        else:
            xj = tl.load(x_ptr + (kw + j) * stride_xk, mask=kw + j < K, other=0.0).to(tl.float32)[:, None]
        xsum += xj
        part += (xj * _PRESCALE[j]) * bits.to(tl.float32, bitcast=True)
    if WIDE:
        part = tl.sum(part, axis=0, keep_dims=True)
        xsum = tl.sum(xsum, axis=0, keep_dims=True)
    return acc + (s * _UNSHIFT) * part - (s * z) * xsum


def _pairs_asm(half: str, scaled: bool) -> str:
    """PTX for :func:`_unpack_pairs`: two words in, code j of both as one 16-bit pair out, j < 8."""
    magic, one = ("0x43004300", "0x3F803F80") if half == "bf16" else ("0x64006400", "0x3C003C00")
    # u: the low halves of the two words (codes 0-3 of both); v: the high halves (codes 4-7)
    lines = ["{", ".reg .b32 u, v, s, t, one, zero;", f"mov.b32 one, {one};", "mov.b32 zero, 0;",
             "prmt.b32 u, $8, $9, 0x5410;", "prmt.b32 v, $8, $9, 0x7632;"]  # fmt: skip
    for j in range(8):
        src, shift = "uv"[j // 4], 4 * (j % 4)
        if shift:
            lines.append(f"shr.u32 s, {src}, {shift};")
        lines.append(f"lop3.b32 t, {'s' if shift else src}, 0x000F000F, {magic}, 0xEA;")  # (a & b) | c
        if scaled:
            lines += [f"fma.rn.{half}x2 t, t, one, $10;", f"fma.rn.{half}x2 ${j}, t, $11, zero;"]
        else:
            lines.append(f"fma.rn.{half}x2 ${j}, t, one, $10;")
    return "\n".join(lines + ["}"])


_OUT8 = tl.constexpr("=r," * 8)  # eight 32-bit outputs: (code j of word a, code j of word b)
_PAIRS_BF16, _PAIRS_BF16_SCALED = tl.constexpr(_pairs_asm("bf16", False)), tl.constexpr(_pairs_asm("bf16", True))
_PAIRS_F16, _PAIRS_F16_SCALED = tl.constexpr(_pairs_asm("f16", False)), tl.constexpr(_pairs_asm("f16", True))


@triton.jit
def _unpack_pairs(words, s, z, SCALED: tl.constexpr, ASM: tl.constexpr, dtype: tl.constexpr):
    """The eight codes of each word as ``q - z`` (times ``s`` if ``SCALED``) in ``dtype``, one
    tensor per code position j, each shaped like ``words``.

    With ``ASM`` (fp16 or bf16 on a GPU) the codes go two at a time: ``0x4300 | q`` is the bf16
    ``128 + q`` and ``0x6400 | q`` the fp16 ``1024 + q``, so one PRMT pairs the low (or high)
    halves of two words, a shift brings code j's nibble down, one LOP3 masks it into both
    mantissas and one packed FMA subtracts ``magic + z``: exact, since ``q - z`` is a small
    integer. Two words and a code position make one 32-bit pair, the two 16-bit values the
    tensor cores read together. Without ``ASM`` (the interpreter, float32) shifts and masks."""
    if ASM:
        if dtype == tl.bfloat16:
            zb = tl.broadcast_to((-(z + 128.0)).to(dtype), words.shape)
        else:
            zb = tl.broadcast_to((-(z + 1024.0)).to(dtype), words.shape)
        if SCALED:
            sb = tl.broadcast_to(s.to(dtype), words.shape)
            if dtype == tl.bfloat16:
                w = tl.inline_asm_elementwise(_PAIRS_BF16_SCALED, _OUT8 + "r,r,r,r", [words, zb, sb], (tl.bfloat16,) * 8, True, 2)
            else:
                w = tl.inline_asm_elementwise(_PAIRS_F16_SCALED, _OUT8 + "r,r,r,r", [words, zb, sb], (tl.float16,) * 8, True, 2)
        else:
            if dtype == tl.bfloat16:
                w = tl.inline_asm_elementwise(_PAIRS_BF16, _OUT8 + "r,r,r", [words, zb], (tl.bfloat16,) * 8, True, 2)
            else:
                w = tl.inline_asm_elementwise(_PAIRS_F16, _OUT8 + "r,r,r", [words, zb], (tl.float16,) * 8, True, 2)
        return w
    else:
        w0 = (words & 15).to(tl.float32) - z
        w1 = ((words >> 4) & 15).to(tl.float32) - z
        w2 = ((words >> 8) & 15).to(tl.float32) - z
        w3 = ((words >> 12) & 15).to(tl.float32) - z
        w4 = ((words >> 16) & 15).to(tl.float32) - z
        w5 = ((words >> 20) & 15).to(tl.float32) - z
        w6 = ((words >> 24) & 15).to(tl.float32) - z
        w7 = ((words >> 28) & 15).to(tl.float32) - z
        if SCALED:
            w0, w1, w2, w3, w4, w5, w6, w7 = w0 * s, w1 * s, w2 * s, w3 * s, w4 * s, w5 * s, w6 * s, w7 * s
        return (w0.to(dtype), w1.to(dtype), w2.to(dtype), w3.to(dtype), w4.to(dtype), w5.to(dtype), w6.to(dtype),
                w7.to(dtype))  # fmt: skip


@triton.jit
def _strided_slices(xt, BLOCK_M: tl.constexpr, BLOCK_KW: tl.constexpr):
    """The eight ``(BLOCK_M, BLOCK_KW)`` slices ``x[:, 8i + j]`` of an x tile ``(BLOCK_M, 8 * BLOCK_KW)``,
    by three splits of the index ``8i + 4a + 2b + c``."""
    c0, c1 = tl.split(tl.reshape(xt, (BLOCK_M, BLOCK_KW, 2, 2, 2)))
    b00, b01 = tl.split(c0)
    b10, b11 = tl.split(c1)
    x0, x4 = tl.split(b00)
    x2, x6 = tl.split(b01)
    x1, x5 = tl.split(b10)
    x3, x7 = tl.split(b11)
    return x0, x1, x2, x3, x4, x5, x6, x7
