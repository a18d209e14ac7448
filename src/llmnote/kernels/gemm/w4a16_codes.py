"""How the W4A16 kernels turn packed 4-bit codes into numbers they can multiply.

Four ways, one per kernel path (see :mod:`llmnote.kernels.gemm.w4a16`):

- :func:`_code_minus_zero`: ``q - z`` in float32 by the 2**23 trick (the fused GEMM and the
  dequantize pass);
- :func:`_gemv_row_tile`: for one row of x, the code read in place as a subnormal float32;
- :func:`_unpack_pairs`: for up to 16 rows on the tensor cores, two codes at a time as the 16-bit
  pair an MMA operand register holds, with the x slices of :func:`_strided_slices`;
- :func:`_swap_ab_step`: for one row with the weight as the MMA's A operand, two codes of one word
  as a 16-bit pair offset by m = 128 (bf16) or 1024 (fp16), one shift and one LOP3 a pair, the
  offset removed once per group through the sum of x that an MMA with A = ones forms.
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


# ---- one row on the tensor cores, the weight as the A operand (w4a16_swap_ab_kernel) ----
_LOAD_WORDS = tl.constexpr("ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$4];")  # streamed once
_LOAD_X = tl.constexpr("ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];")  # read by every column block: kept in L1
_CONS_LOAD = tl.constexpr("=r,=r,=r,=r,l")


def _swap_ab_x_asm(half: str) -> str:
    """PTX: a lane's eight x entries (four 32-bit words ``$5..$8``) as the B pairs ``(x_j, x_{j+4})``,
    j < 4 (``$0..$3``), and the running sum of x (``$9`` in, ``$4`` out) by two MMAs with A = ones."""
    one = "0x3F803F80" if half == "bf16" else "0x3C003C00"
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{half}.{half}.f32"
    return "\n".join([
        "{", ".reg .b32 one;", ".reg .f32 d0, d1, d2, d3, e1, e2, e3;", f"mov.b32 one, {one};",
        "prmt.b32 $0, $5, $7, 0x5410;", "prmt.b32 $1, $5, $7, 0x7632;",
        "prmt.b32 $2, $6, $8, 0x5410;", "prmt.b32 $3, $6, $8, 0x7632;",
        f"{mma} {{d0, d1, d2, d3}}, {{one, one, one, one}}, {{$0, $1}}, {{$9, $9, $9, $9}};",
        f"{mma} {{$4, e1, e2, e3}}, {{one, one, one, one}}, {{$2, $3}}, {{d0, d1, d2, d3}};", "}",
    ])  # fmt: skip


def _swap_ab_unit_asm(half: str) -> str:
    """PTX: four words (``$4..$7``: columns c..c+3 of one word row) times the B pairs ``$8..$11``,
    added to the four accumulators ``$12..$15`` (out: ``$0..$3``). Words 0 and 1 are the A rows g
    and g + 8 of one MMA pair, words 2 and 3 of another. One shift and one LOP3 per pair of codes:
    ``magic | (word >> 4j) & 0x000F000F`` is the 16-bit pair ``(m + q_j, m + q_{j+4})``, m = 128 in
    bf16 (1024 in fp16), exact."""
    magic = "0x43004300" if half == "bf16" else "0x64006400"
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{half}.{half}.f32"
    lines = ["{", ".reg .b32 pa0, pa1, pa2, pa3, pb0, pb1, pb2, pb3, t;", ".reg .f32 d0, d1, d2, d3, e1, e3;"]
    for s in range(2):
        for p, w in (("pa", 4 + 2 * s), ("pb", 5 + 2 * s)):
            for j in range(4):
                if j:
                    lines.append(f"shr.u32 t, ${w}, {4 * j};")
                lines.append(f"lop3.b32 {p}{j}, {'t' if j else f'${w}'}, 0x000F000F, {magic}, 0xEA;")  # (a & b) | c
        cg, cg8 = 12 + 2 * s, 13 + 2 * s  # C rows g and g + 8; B's eight columns are all x, so n = 2t and 2t + 1 agree
        lines.append(f"{mma} {{d0, d1, d2, d3}}, {{pa0, pb0, pa1, pb1}}, {{$8, $9}}, {{${cg}, ${cg}, ${cg8}, ${cg8}}};")
        lines.append(f"{mma} {{${2 * s}, e1, ${2 * s + 1}, e3}}, {{pa2, pb2, pa3, pb3}}, {{$10, $11}}, {{d0, d1, d2, d3}};")
    return "\n".join(lines + ["}"])


_SAB_X_BF16, _SAB_X_F16 = tl.constexpr(_swap_ab_x_asm("bf16")), tl.constexpr(_swap_ab_x_asm("f16"))
_SAB_UNIT_BF16, _SAB_UNIT_F16 = tl.constexpr(_swap_ab_unit_asm("bf16")), tl.constexpr(_swap_ab_unit_asm("f16"))
_CONS_X = tl.constexpr("=r,=r,=r,=r,=f,r,r,r,r,f")
_CONS_UNIT = tl.constexpr("=f,=f,=f,=f,r,r,r,r,r,r,r,r,f,f,f,f")


@triton.jit
def _lane_sum(v, WARPS: tl.constexpr):
    """What an MMA sums across a quad: for a ``(32 * WARPS,)`` tensor with one entry per thread,
    each entry replaced by the sum over the four lanes ``4g .. 4g + 3`` it shares g with."""
    quads = tl.reshape(v, (WARPS * 8, 4))
    return tl.reshape(tl.broadcast_to(tl.sum(quads, axis=1, keep_dims=True), (WARPS * 8, 4)), (WARPS * 32,))


@triton.jit
def _swap_ab_load(ptr, X: tl.constexpr, ASM: tl.constexpr):
    """Four 32-bit words at ``ptr`` (16 bytes a thread, one vector load on a GPU)."""
    if ASM:
        if X:
            return tl.inline_asm_elementwise(_LOAD_X, _CONS_LOAD, [ptr.to(tl.int64)], (tl.int32,) * 4, False, 1)
        else:
            return tl.inline_asm_elementwise(_LOAD_WORDS, _CONS_LOAD, [ptr.to(tl.int64)], (tl.int32,) * 4, False, 1)
    else:
        return tl.load(ptr), tl.load(ptr + 1), tl.load(ptr + 2), tl.load(ptr + 3)


@triton.jit
def _swap_ab_step(words, OFF: tl.constexpr, x_ptr, c, xs, WARPS: tl.constexpr, V: tl.constexpr, HALF: tl.constexpr,
                  ASM: tl.constexpr):
    """One 32-deep step: the lane's words (``words[OFF:OFF + 4 V]``, of one word row) and its eight x entries at
    ``x_ptr`` into the accumulators ``c`` (``4 V``: rows g and g + 8 of ``2 V`` MMA pairs) and the
    sum of x ``xs``. Without ``ASM`` (the interpreter) the same sums, with the MMA's reduction over
    the quad written out (:func:`_lane_sum`)."""
    new = ()
    if ASM:
        xw = _swap_ab_load(x_ptr, True, True)
        if HALF == "bf16":
            b = tl.inline_asm_elementwise(_SAB_X_BF16, _CONS_X, xw + (xs,), (tl.int32,) * 4 + (tl.float32,), False, 1)
        else:
            b = tl.inline_asm_elementwise(_SAB_X_F16, _CONS_X, xw + (xs,), (tl.int32,) * 4 + (tl.float32,), False, 1)
        for v in tl.static_range(V):
            args = (words[OFF + 4 * v], words[OFF + 4 * v + 1], words[OFF + 4 * v + 2], words[OFF + 4 * v + 3],
                    b[0], b[1], b[2], b[3], c[4 * v], c[4 * v + 1], c[4 * v + 2], c[4 * v + 3])  # fmt: skip
            if HALF == "bf16":
                new = new + tl.inline_asm_elementwise(_SAB_UNIT_BF16, _CONS_UNIT, args, (tl.float32,) * 4, False, 1)
            else:
                new = new + tl.inline_asm_elementwise(_SAB_UNIT_F16, _CONS_UNIT, args, (tl.float32,) * 4, False, 1)
        xs = b[4]
    else:
        magic = 128.0 if HALF == "bf16" else 1024.0
        xsum = tl.zeros_like(xs)
        for j in tl.static_range(8):
            xsum += tl.load(x_ptr + j).to(tl.float32)
        xs = xs + _lane_sum(xsum, WARPS)
        for i in tl.static_range(4 * V):
            part = tl.zeros_like(xs)
            for j in tl.static_range(8):
                part += (magic + ((words[OFF + i] >> (4 * j)) & 15).to(tl.float32)) * tl.load(x_ptr + j).to(tl.float32)
            new = new + (c[i] + _lane_sum(part, WARPS),)
    return new, xs


@triton.jit
def _swap_ab_group(qw_ptr, s_ptr, z_ptr, gi, t, col, stride_qk, stride_g, GROUP: tl.constexpr, V: tl.constexpr,
                   ASM: tl.constexpr):
    """Everything of group ``gi`` a lane holds: its words (``GROUP // 32`` steps of ``4 V``: word row
    ``GROUP // 8 * gi + 4 * step + t``, columns ``col + 32 v .. + 3``) and the scale and zero point of
    each of its ``4 V`` columns."""
    rows = qw_ptr + (gi * (GROUP // 8) + t).to(tl.int64) * stride_qk + col
    words = ()
    for st in tl.static_range(GROUP // 32):
        for v in tl.static_range(V):
            words = words + _swap_ab_load(rows + (4 * st) * stride_qk + 32 * v, False, ASM)
    sz = ()
    for j in tl.static_range(4 * V):
        offs = gi * stride_g + col + 32 * (j // 4) + j % 4
        sz = sz + (tl.load(s_ptr + offs), tl.load(z_ptr + offs))
    return words, sz
