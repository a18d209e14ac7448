"""How a lane of the tensor-core decode kernel (:func:`llmnote.kernels.gemm.w4a16_swap_ab.w4a16_swap_ab_kernel`)
turns its words into MMA operands, with the weight as the MMA's A operand: two codes of one word as
a 16-bit pair offset by m = 128 (bf16) or 1024 (fp16), one shift and one LOP3 a pair. Exact by
default, the offset removed once per group through the sum of x that an MMA with A = ones forms
(:func:`_swap_ab_step`); with ``deq`` each pair scaled in 16 bits before the MMAs. Also the
loads of a lane's words, scales and zero points (:func:`_swap_ab_group`) and each warp's run of
groups (:func:`_warp_run`)."""

from __future__ import annotations

import triton
import triton.language as tl

_LOAD_WORDS = tl.constexpr("ld.global.nc.L1::no_allocate.v4.u32 {$0, $1, $2, $3}, [$4];")  # streamed once
_LOAD_X = tl.constexpr("ld.global.nc.v4.u32 {$0, $1, $2, $3}, [$4];")  # read by every column block: kept in L1
_CONS_LOAD = tl.constexpr("=r,=r,=r,=r,l")


def _swap_ab_x_asm(half: str, rows: int = 1) -> str:
    """PTX: a lane's eight x entries (four 32-bit words) as the B pairs ``(x_j, x_{j+4})``, j < 4
    (``$0..$3``), and the running sums of x by two MMAs with A = ones. One row (``rows = 1``): x
    words ``$5..$8``, the sum ``$9`` in and ``$4`` out. Eight or sixteen rows (B column n is x row
    n of an 8-row block): x words ``$6..$9``, the sums of rows 2t and 2t + 1 of the block
    ``$10, $11`` in and ``$4, $5`` out."""
    one = "0x3F803F80" if half == "bf16" else "0x3C003C00"
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{half}.{half}.f32"
    xw, c, d = (5, "$9, $9", "$4, e1") if rows == 1 else (6, "$10, $11", "$4, $5")
    return "\n".join([
        "{", ".reg .b32 one;", ".reg .f32 d0, d1, d2, d3, e1, e2, e3;", f"mov.b32 one, {one};",
        f"prmt.b32 $0, ${xw}, ${xw + 2}, 0x5410;", f"prmt.b32 $1, ${xw}, ${xw + 2}, 0x7632;",
        f"prmt.b32 $2, ${xw + 1}, ${xw + 3}, 0x5410;", f"prmt.b32 $3, ${xw + 1}, ${xw + 3}, 0x7632;",
        f"{mma} {{d0, d1, d2, d3}}, {{one, one, one, one}}, {{$0, $1}}, {{{c}, {c}}};",
        f"{mma} {{{d}, e2, e3}}, {{one, one, one, one}}, {{$2, $3}}, {{d0, d1, d2, d3}};", "}",
    ])  # fmt: skip


def _swap_ab_unit_asm(half: str, rows: int = 1, deq: bool = False) -> str:
    """PTX: four words (columns c..c+3 of one word row) times the B pairs of each 8-row block of x,
    added to the accumulators. Words 0 and 1 are the A rows g and g + 8 of one MMA pair, words 2
    and 3 of another. One shift and one LOP3 per pair of codes: ``magic | (word >> 4j) &
    0x000F000F`` is the 16-bit pair ``(m + q_j, m + q_{j+4})``, m = 128 in bf16 (1024 in fp16),
    exact; the unpacked words serve every block of x.

    One row (``rows = 1``, all eight B columns x): out ``$0..$3`` (word w's column), words
    ``$4..$7``, B pairs ``$8..$11``, accumulators in ``$12..$15``. ``rows`` = 8 or 16 (B column n is
    x row 8b + n of block b): out 8 a block, for MMA pair s and block b the four ``(word 2s, rows
    8b + 2t, 8b + 2t + 1), (word 2s + 1, the same rows)`` from ``$(8(s NB + b))``; then the four
    words, four B pairs a block and the accumulators in, in the order of the outputs.

    ``deq``: after the four words come each word's scale and each word's ``-(m + z)``, each a
    16-bit value twice in 32 bits, and every unpacked pair becomes ``((m + q) - (m + z)) s``: the
    sum exact, the product rounded once. The MMAs then take scaled weights."""
    magic = "0x43004300" if half == "bf16" else "0x64006400"
    one = "0x3F803F80" if half == "bf16" else "0x3C003C00"
    mma = f"mma.sync.aligned.m16n8k16.row.col.f32.{half}.{half}.f32"
    blocks = max(rows // 8, 1)
    per = 2 if rows == 1 else 4  # accumulators a block and MMA pair
    n_out = 2 * blocks * per
    words = n_out
    bx = words + (12 if deq else 4)
    cin = bx + 4 * blocks
    lines = ["{", ".reg .b32 pa0, pa1, pa2, pa3, pb0, pb1, pb2, pb3, t;", ".reg .f32 d0, d1, d2, d3, e1, e3;"]
    if deq:
        lines += [".reg .b32 one, zr;", f"mov.b32 one, {one};", "mov.b32 zr, 0;"]
    for s in range(2):
        for p, w in (("pa", 2 * s), ("pb", 2 * s + 1)):
            for j in range(4):
                if j:
                    lines.append(f"shr.u32 t, ${words + w}, {4 * j};")
                lines.append(f"lop3.b32 {p}{j}, {'t' if j else f'${words + w}'}, 0x000F000F, {magic}, 0xEA;")  # (a & b) | c
                if deq:  # (m + q) - (m + z), exact, then times the scale, rounded once
                    lines.append(f"fma.rn.{half}x2 {p}{j}, {p}{j}, one, ${words + 8 + w};")
                    lines.append(f"fma.rn.{half}x2 {p}{j}, {p}{j}, ${words + 4 + w}, zr;")
        for b in range(blocks):
            o = (s * blocks + b) * per
            b0, b1, b2, b3 = (f"${bx + 4 * b + i}" for i in range(4))
            if rows == 1:  # B's eight columns are all x, so n = 2t and 2t + 1 agree: C rows g and g + 8 twice each
                c = f"${cin + o}, ${cin + o}, ${cin + o + 1}, ${cin + o + 1}"
                d = f"${o}, e1, ${o + 1}, e3"
            else:
                c = ", ".join(f"${cin + o + i}" for i in range(4))
                d = ", ".join(f"${o + i}" for i in range(4))
            lines.append(f"{mma} {{d0, d1, d2, d3}}, {{pa0, pb0, pa1, pb1}}, {{{b0}, {b1}}}, {{{c}}};")
            lines.append(f"{mma} {{{d}}}, {{pa2, pb2, pa3, pb3}}, {{{b2}, {b3}}}, {{d0, d1, d2, d3}};")
    return "\n".join(lines + ["}"])


def _unit_cons(rows: int, deq: bool = False) -> str:
    outs, blocks = (4, 1) if rows == 1 else (rows, rows // 8)
    return "=f," * outs + "r," * ((12 if deq else 4) + 4 * blocks) + ",".join("f" * outs)


_SAB_XB = tl.constexpr("\n".join(["prmt.b32 $0, $4, $6, 0x5410;", "prmt.b32 $1, $4, $6, 0x7632;",
                                    "prmt.b32 $2, $5, $7, 0x5410;", "prmt.b32 $3, $5, $7, 0x7632;"]))  # fmt: skip
_CONS_XB = tl.constexpr("=r,=r,=r,=r,r,r,r,r")
_DEQ_BF16, _DEQ_F16 = tl.constexpr(_swap_ab_unit_asm("bf16", 1, True)), tl.constexpr(_swap_ab_unit_asm("f16", 1, True))
_DEQ16_BF16, _DEQ16_F16 = tl.constexpr(_swap_ab_unit_asm("bf16", 16, True)), tl.constexpr(_swap_ab_unit_asm("f16", 16, True))
_DEQ8_BF16, _DEQ8_F16 = tl.constexpr(_swap_ab_unit_asm("bf16", 8, True)), tl.constexpr(_swap_ab_unit_asm("f16", 8, True))
_CONS_DEQ, _CONS_DEQ8 = tl.constexpr(_unit_cons(1, True)), tl.constexpr(_unit_cons(8, True))
_CONS_DEQ16 = tl.constexpr(_unit_cons(16, True))


@triton.jit
def _deq_unit(args, ROWS: tl.constexpr, HALF: tl.constexpr):
    """:func:`_swap_ab_unit_asm` with ``deq`` for ``ROWS`` and ``HALF``."""
    if ROWS == 1:
        if HALF == "bf16":
            return tl.inline_asm_elementwise(_DEQ_BF16, _CONS_DEQ, args, (tl.float32,) * 4, False, 1)
        else:
            return tl.inline_asm_elementwise(_DEQ_F16, _CONS_DEQ, args, (tl.float32,) * 4, False, 1)
    elif ROWS == 8:
        if HALF == "bf16":
            return tl.inline_asm_elementwise(_DEQ8_BF16, _CONS_DEQ8, args, (tl.float32,) * 8, False, 1)
        else:
            return tl.inline_asm_elementwise(_DEQ8_F16, _CONS_DEQ8, args, (tl.float32,) * 8, False, 1)
    else:
        if HALF == "bf16":
            return tl.inline_asm_elementwise(_DEQ16_BF16, _CONS_DEQ16, args, (tl.float32,) * 16, False, 1)
        else:
            return tl.inline_asm_elementwise(_DEQ16_F16, _CONS_DEQ16, args, (tl.float32,) * 16, False, 1)


@triton.jit
def _pair(v):
    """A 16-bit value in both halves of a 32-bit register."""
    u = v.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return u | (u << 16)


_SAB_X_BF16, _SAB_X_F16 = tl.constexpr(_swap_ab_x_asm("bf16")), tl.constexpr(_swap_ab_x_asm("f16"))
_SAB_XR_BF16, _SAB_XR_F16 = tl.constexpr(_swap_ab_x_asm("bf16", 8)), tl.constexpr(_swap_ab_x_asm("f16", 8))
_SAB_UNIT_BF16, _SAB_UNIT_F16 = tl.constexpr(_swap_ab_unit_asm("bf16")), tl.constexpr(_swap_ab_unit_asm("f16"))
_SAB_UNIT8_BF16, _SAB_UNIT8_F16 = tl.constexpr(_swap_ab_unit_asm("bf16", 8)), tl.constexpr(_swap_ab_unit_asm("f16", 8))
_SAB_UNIT16_BF16, _SAB_UNIT16_F16 = tl.constexpr(_swap_ab_unit_asm("bf16", 16)), tl.constexpr(_swap_ab_unit_asm("f16", 16))
_CONS_X = tl.constexpr("=r,=r,=r,=r,=f,r,r,r,r,f")
_CONS_XR = tl.constexpr("=r,=r,=r,=r,=f,=f,r,r,r,r,f,f")
_CONS_UNIT, _CONS_UNIT8, _CONS_UNIT16 = tl.constexpr(_unit_cons(1)), tl.constexpr(_unit_cons(8)), tl.constexpr(_unit_cons(16))


@triton.jit
def _swap_ab_unit(args, ROWS: tl.constexpr, HALF: tl.constexpr):
    """:func:`_swap_ab_unit_asm` for ``ROWS`` and ``HALF``: its ``4`` (one row) or ``ROWS`` accumulators."""
    if ROWS == 1:
        if HALF == "bf16":
            return tl.inline_asm_elementwise(_SAB_UNIT_BF16, _CONS_UNIT, args, (tl.float32,) * 4, False, 1)
        else:
            return tl.inline_asm_elementwise(_SAB_UNIT_F16, _CONS_UNIT, args, (tl.float32,) * 4, False, 1)
    elif ROWS == 8:
        if HALF == "bf16":
            return tl.inline_asm_elementwise(_SAB_UNIT8_BF16, _CONS_UNIT8, args, (tl.float32,) * 8, False, 1)
        else:
            return tl.inline_asm_elementwise(_SAB_UNIT8_F16, _CONS_UNIT8, args, (tl.float32,) * 8, False, 1)
    else:
        if HALF == "bf16":
            return tl.inline_asm_elementwise(_SAB_UNIT16_BF16, _CONS_UNIT16, args, (tl.float32,) * 16, False, 1)
        else:
            return tl.inline_asm_elementwise(_SAB_UNIT16_F16, _CONS_UNIT16, args, (tl.float32,) * 16, False, 1)


@triton.jit
def _quad_sum(v, WARPS: tl.constexpr):
    """What an MMA sums across a quad: for a ``(32 * WARPS, 8)`` tensor with one row per thread,
    each row replaced by the sum over the four lanes ``4g .. 4g + 3`` it shares g with."""
    quads = tl.reshape(v, (WARPS * 8, 4, 8))
    return tl.reshape(tl.broadcast_to(tl.sum(quads, axis=1, keep_dims=True), (WARPS * 8, 4, 8)), (WARPS * 32, 8))


@triton.jit
def _pick(v, n):
    """Column ``n[i]`` of row i of ``v`` ``(T, 8)``: the entry of the MMA's output a lane holds."""
    return tl.sum(tl.where(tl.arange(0, 8)[None, :] == n[:, None], v, 0.0), axis=1)


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
def _swap_ab_x(x_ptr, xs, ROWS: tl.constexpr, HALF: tl.constexpr):
    """The B pairs of one 8-row block of x at ``x_ptr`` (this lane's row and K slice) and its
    running sums ``xs`` (one, or rows 2t and 2t + 1 of the block), on a GPU."""
    xw = _swap_ab_load(x_ptr, True, True)
    if ROWS == 1:
        if HALF == "bf16":
            b = tl.inline_asm_elementwise(_SAB_X_BF16, _CONS_X, xw + xs, (tl.int32,) * 4 + (tl.float32,), False, 1)
        else:
            b = tl.inline_asm_elementwise(_SAB_X_F16, _CONS_X, xw + xs, (tl.int32,) * 4 + (tl.float32,), False, 1)
        return (b[0], b[1], b[2], b[3]), (b[4],)
    else:
        if HALF == "bf16":
            b = tl.inline_asm_elementwise(_SAB_XR_BF16, _CONS_XR, xw + xs, (tl.int32,) * 4 + (tl.float32,) * 2, False, 1)
        else:
            b = tl.inline_asm_elementwise(_SAB_XR_F16, _CONS_XR, xw + xs, (tl.int32,) * 4 + (tl.float32,) * 2, False, 1)
        return (b[0], b[1], b[2], b[3]), (b[4], b[5])


@triton.jit
def _swap_ab_step(words, OFF: tl.constexpr, xk, M, stride_xm, c, xs, WARPS: tl.constexpr, V: tl.constexpr,
                  ROWS: tl.constexpr, HALF: tl.constexpr, ASM: tl.constexpr, DEQ: tl.constexpr = False, sw=None):
    """One 32-deep step: the lane's words (``words[OFF:OFF + 4 V]``, of one word row) against x's
    eight entries at ``xk`` (row 0, this lane's K slice) into the accumulators ``c`` and the sums
    of x ``xs``.

    ``ROWS = 1``: all eight B columns hold x; ``4 V`` accumulators, rows g and g + 8 of ``2 V`` MMA
    pairs, and one sum. ``ROWS`` = 8 or 16: B column n of block b is x row ``8b + n`` (rows past
    ``M`` repeat row ``M - 1``: computed, never stored), and lane (g, t) loads row ``8b + g``. Per
    MMA pair and block four accumulators (its two columns, rows ``8b + 2t`` and ``8b + 2t + 1``),
    index ``((2v + s) NB + b) * 4 + r``, and per block two sums. Without ``ASM`` (the interpreter)
    the same sums, with the MMA's gather over the warp written out (:func:`_quad_sum`, :func:`_pick`).
    ``DEQ``: each code enters as ``(q - z) s`` (``sw``: the lane's scales and zero points from
    ``_deq_operands``; in the interpreter unrounded), ``c`` are the output accumulators, and ``xs``
    passes through."""
    NB: tl.constexpr = 2 if ROWS == 16 else 1
    PER_V: tl.constexpr = 4 if ROWS == 1 else ROWS  # accumulators a 32-column block
    RP: tl.constexpr = 2 if ROWS == 1 else 4  # of them, a pair of words and a block
    lane = tl.arange(0, 32 * WARPS) % 32
    new = ()
    if ASM and DEQ:  # the weights scaled in 16 bits before the MMAs: no sums of x, the accumulators are the output
        bx = ()
        for b in tl.static_range(NB):
            if ROWS == 1:
                xw = _swap_ab_load(xk, True, True)
            else:
                xw = _swap_ab_load(xk + tl.minimum(8 * b + lane // 4, M - 1) * stride_xm, True, True)
            bx = bx + tl.inline_asm_elementwise(_SAB_XB, _CONS_XB, xw, (tl.int32,) * 4, False, 1)
        for v in tl.static_range(V):
            args = (words[OFF + 4 * v], words[OFF + 4 * v + 1], words[OFF + 4 * v + 2], words[OFF + 4 * v + 3])
            args = args + (sw[8 * v], sw[8 * v + 1], sw[8 * v + 2], sw[8 * v + 3])
            args = args + (sw[8 * v + 4], sw[8 * v + 5], sw[8 * v + 6], sw[8 * v + 7]) + bx
            for i in tl.static_range(PER_V):
                args = args + (c[v * PER_V + i],)
            new = new + _deq_unit(args, ROWS, HALF)
    elif ASM:
        bx = ()
        sums = ()
        for b in tl.static_range(NB):
            if ROWS == 1:
                pb, sb = _swap_ab_x(xk, xs, ROWS, HALF)
            else:
                row = tl.minimum(8 * b + lane // 4, M - 1)
                pb, sb = _swap_ab_x(xk + row * stride_xm, (xs[2 * b], xs[2 * b + 1]), ROWS, HALF)
            bx = bx + pb
            sums = sums + sb
        xs = sums
        for v in tl.static_range(V):
            args = (words[OFF + 4 * v], words[OFF + 4 * v + 1], words[OFF + 4 * v + 2], words[OFF + 4 * v + 3]) + bx
            for i in tl.static_range(PER_V):
                args = args + (c[v * PER_V + i],)
            new = new + _swap_ab_unit(args, ROWS, HALF)
    else:
        magic = 128.0 if HALF == "bf16" else 1024.0
        n8 = tl.arange(0, 8)
        t = lane % 4
        sums = ()
        for b in tl.static_range(0 if DEQ else NB):  # x row of B column n: 8b + n (every column row 0 for one row)
            xp = xk[:, None] + (tl.minimum(8 * b + n8, M - 1) * stride_xm)[None, :]
            total = _quad_sum(tl.load(xp).to(tl.float32), WARPS)
            for j in tl.static_range(1, 8):
                total += _quad_sum(tl.load(xp + j).to(tl.float32), WARPS)
            if ROWS == 1:
                sums = sums + (xs[0] + _pick(total, 2 * t),)
            else:
                sums = sums + (xs[2 * b] + _pick(total, 2 * t), xs[2 * b + 1] + _pick(total, 2 * t + 1))
        if DEQ:
            sums = xs
        for v in tl.static_range(V):
            for s in tl.static_range(2):
                for b in tl.static_range(NB):
                    xp = xk[:, None] + (tl.minimum(8 * b + n8, M - 1) * stride_xm)[None, :]
                    for w in tl.static_range(2):
                        word = words[OFF + 4 * v + 2 * s + w]
                        part = tl.zeros((32 * WARPS, 8), tl.float32)
                        for j in tl.static_range(8):
                            if DEQ:  # (q - z) s, unrounded here
                                q = ((word >> (4 * j)) & 15).to(tl.float32)
                                code = ((q - sw[8 * v + 4 + 2 * s + w]) * sw[8 * v + 2 * s + w])[:, None]
                            else:
                                code = (magic + ((word >> (4 * j)) & 15).to(tl.float32))[:, None]
                            part += code * tl.load(xp + j).to(tl.float32)
                        part = _quad_sum(part, WARPS)
                        i = v * PER_V + (s * NB + b) * RP + w * (RP // 2)
                        if ROWS == 1:
                            new = new + (c[i] + _pick(part, 2 * t),)
                        else:
                            new = new + (c[i] + _pick(part, 2 * t), c[i + 1] + _pick(part, 2 * t + 1))
        xs = sums
    return new, xs


@triton.jit
def _warp_run(pid_k, K, GROUP: tl.constexpr, SPLIT_K: tl.constexpr, WARPS: tl.constexpr):
    """The groups of K each warp of a program takes: the ``SPLIT_K`` programs of a column block
    share K's groups, and a program's ``WARPS`` warps split its share into runs of whole groups.
    Returns, per thread, the run's first group and the group after its last, and the longest run."""
    warp = tl.arange(0, 32 * WARPS) // 32
    groups = K // GROUP
    per_prog = tl.cdiv(groups, SPLIT_K)
    per_warp = tl.cdiv(per_prog, WARPS)
    g_first = pid_k * per_prog + warp * per_warp
    return g_first, tl.minimum(g_first + per_warp, tl.minimum((pid_k + 1) * per_prog, groups)), per_warp


@triton.jit
def _swap_ab_group(qw_ptr, s_ptr, z_ptr, gi, t, col, stride_qk, stride_g, GROUP: tl.constexpr, V: tl.constexpr,
                   ASM: tl.constexpr):  # fmt: skip
    """Everything of group ``gi`` a lane holds: its words (``GROUP // 32`` steps of ``4 V``: word row
    ``GROUP // 8 * gi + 4 * step + t``, columns ``col + 32 v .. + 3``) and the scale and zero point of
    each of its ``4 V`` columns."""
    words = ()
    rows = qw_ptr + (gi * (GROUP // 8) + t).to(tl.int64) * stride_qk + col
    for st in tl.static_range(GROUP // 32):
        for v in tl.static_range(V):
            words = words + _swap_ab_load(rows + (4 * st) * stride_qk + 32 * v, False, ASM)
    sz = ()
    for v in tl.static_range(V):  # the 4 scales and the 4 zero points of a lane's columns: one 8-byte load each
        offs = (gi * stride_g + col + 32 * v)[:, None] + tl.arange(0, 4)[None, :]
        sz = sz + _interleave(_four(tl.load(s_ptr + offs)), _four(tl.load(z_ptr + offs)))
    return words, sz


@triton.jit
def _four(quad):
    """The four columns of a ``(lanes, 4)`` tile, each a ``(lanes,)`` tensor (no data moves)."""
    lo, hi = tl.split(tl.reshape(quad, (quad.shape[0], 2, 2)))  # columns 0, 2 and 1, 3
    a, c = tl.split(lo)
    b, d = tl.split(hi)
    return a, b, c, d


@triton.jit
def _interleave(s, z):
    return s[0], z[0], s[1], z[1], s[2], z[2], s[3], z[3]
