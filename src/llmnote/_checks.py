"""Input checks shared by ``llmnote.ref`` and ``llmnote.kernels``: clear errors that name
the argument and say what was expected, instead of silently computing garbage."""

from __future__ import annotations

import torch

__all__ = [
    "FLOAT_DTYPES",
    "check_tensor",
    "check_same",
    "check_last_dim",
    "check_pair",
    "check_matmul_inputs",
    "check_rms_norm",
    "check_rope",
    "check_qkv",
    "check_paged",
    "check_varlen",
    "check_cu_seqlens",
    "check_add_rms_norm",
    "check_rotary",
    "check_store_kv",
    "check_kv_scales",
    "KV_QUANT_MAX",
]

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _names(dtypes) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


def check_tensor(name: str, t: object, dtypes=FLOAT_DTYPES, ndim: int | None = None, min_ndim: int = 1) -> torch.Tensor:
    """``t`` must be a tensor of one of ``dtypes`` with ``ndim`` (or at least ``min_ndim``) dims."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {_names(dtypes)}; got {str(t.dtype).removeprefix('torch.')}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dim() < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} dimension(s), got shape {tuple(t.shape)}")
    return t


def check_same(a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor, shape: bool = True) -> None:
    """``a`` and ``b`` must share device and dtype (and shape, unless ``shape=False``)."""
    if a.device != b.device:
        raise ValueError(f"{a_name} and {b_name} must be on the same device, got {a.device} and {b.device}")
    if a.dtype != b.dtype:
        raise TypeError(f"{a_name} and {b_name} must have the same dtype, got {a.dtype} and {b.dtype}")
    if shape and a.shape != b.shape:
        raise ValueError(f"{a_name} and {b_name} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")


def check_last_dim(name: str, t: torch.Tensor, size: int, what: str) -> None:
    if t.shape[-1] != size:
        raise ValueError(f"{name} must have last dimension {size} ({what}), got shape {tuple(t.shape)}")


def check_pair(a_name: str, a: object, b_name: str, b: object) -> None:
    """Two float tensors of the same shape, dtype and device (elementwise binary ops)."""
    check_tensor(a_name, a)
    check_tensor(b_name, b)
    check_same(a_name, a, b_name, b)


def check_matmul_inputs(a: object, b: object) -> None:
    """``a`` (M, K) and ``b`` (K, N), one float dtype and device, M, N, K >= 1."""
    check_tensor("a", a, ndim=2)
    check_tensor("b", b, ndim=2)
    check_same("a", a, "b", b, shape=False)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions must match: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if a.numel() == 0 or b.numel() == 0:
        raise ValueError(f"M, N and K must be >= 1, got a {tuple(a.shape)} and b {tuple(b.shape)}")


def check_rms_norm(x: object, weight: object, eps: float) -> None:
    """``x`` (..., D), ``weight`` (D,) of x's dtype and device, ``eps >= 0``."""
    check_tensor("x", x)
    check_tensor("weight", weight, ndim=1)
    check_same("x", x, "weight", weight, shape=False)
    check_last_dim("weight", weight, x.shape[-1], "the size of x's last dimension")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")


def check_rope(x: object, cos: object, sin: object) -> None:
    """``x`` (..., S, D) with D even; ``cos``/``sin`` (S, D), or (B, S, D) for x (B, H, S, D)."""
    check_tensor("x", x, min_ndim=2)
    check_tensor("cos", cos, min_ndim=2)
    check_tensor("sin", sin, min_ndim=2)
    check_same("cos", cos, "sin", sin)
    if cos.device != x.device:
        raise ValueError(f"cos and x must be on the same device, got {cos.device} and {x.device}")
    if x.shape[-1] % 2:
        raise ValueError(f"x's last dimension (head_dim) must be even, got {x.shape[-1]}")
    if cos.shape[-2:] != x.shape[-2:]:
        raise ValueError(f"cos and sin must end in (seq_len, head_dim) = {tuple(x.shape[-2:])}, got {tuple(cos.shape)}")
    if cos.dim() == 3 and (x.dim() != 4 or cos.shape[0] != x.shape[0]):
        raise ValueError(f"3-D cos/sin (batch, seq, dim) need x of shape (batch, heads, seq, dim); got x {tuple(x.shape)}")
    if cos.dim() > 3:
        raise ValueError(f"cos and sin must be (seq_len, head_dim) or (batch, seq_len, head_dim), got {tuple(cos.shape)}")


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """The contract's shape, head-count, dtype and device rules for ``flash_attention``."""
    check_tensor("q", q, ndim=4)
    check_tensor("k", k, ndim=4)
    check_tensor("v", v, ndim=4)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q (B, Hq, Sq, D) and k (B, Hkv, Skv, D) must share B and D, got {tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise TypeError("q, k and v must share dtype and device")


def check_paged(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    check_values: bool = True,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """The contract's rules for ``paged_attention_decode``. ``check_values`` also reads
    ``seq_lens`` back (a host synchronisation) to check every length fits its table row.
    An int8 or float8_e4m3fn cache comes with its scales (see :func:`check_kv_scales`)."""
    check_tensor("q", q, ndim=3)
    check_tensor("k_cache", k_cache, dtypes=(*FLOAT_DTYPES, *KV_QUANT_MAX), ndim=4)
    check_tensor("v_cache", v_cache, dtypes=(*FLOAT_DTYPES, *KV_QUANT_MAX), ndim=4)
    check_kv_scales(k_cache, "k_scale", k_scale)
    check_kv_scales(v_cache, "v_scale", v_scale)
    check_tensor("block_tables", block_tables, dtypes=(torch.int32, torch.int64), ndim=2)
    check_tensor("seq_lens", seq_lens, dtypes=(torch.int32, torch.int64), ndim=1)
    if k_cache.shape != v_cache.shape or k_cache.shape[3] != q.shape[2]:
        raise ValueError(f"caches must be (num_blocks, block_size, Hkv, D) alike with D={q.shape[2]}")
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k_cache.shape[2]})")
    if block_tables.shape[0] != q.shape[0] or seq_lens.shape[0] != q.shape[0]:
        raise ValueError("block_tables and seq_lens need one row per sequence of q")
    if k_cache.dtype != v_cache.dtype or (k_cache.dtype not in KV_QUANT_MAX and q.dtype != k_cache.dtype):
        raise TypeError(f"q, k_cache and v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    if check_values and q.shape[0]:
        if int(seq_lens.min()) < 1 or int(seq_lens.max()) > block_tables.shape[1] * k_cache.shape[1]:
            raise ValueError("every seq_len must be >= 1 and fit in its row of block_tables")


def check_varlen(q: object, k: object, v: object, cu_seqlens_q: object, cu_seqlens_k: object) -> None:
    """Packed sequences (``flash_attention_varlen``): q ``(total_q, Hq, D)``, k and v
    ``(total_k, Hkv, D)`` with ``Hq % Hkv == 0``, one dtype and device; ``cu_seqlens_q`` and
    ``cu_seqlens_k`` int32 ``(B + 1,)`` on the same device. Shapes, dtypes and devices only:
    nothing is read back from the device (``check_cu_seqlens`` checks the offsets)."""
    check_tensor("q", q, ndim=3)
    check_tensor("k", k, ndim=3)
    check_tensor("v", v, ndim=3)
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q (total_q, Hq, D) and k (total_k, Hkv, D) must share D, got {tuple(q.shape)} and {tuple(k.shape)}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of key/value heads ({k.shape[1]})")
    if not (q.dtype == k.dtype == v.dtype) or not (q.device == k.device == v.device):
        raise TypeError("q, k and v must share dtype and device")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        check_tensor(name, cu, dtypes=(torch.int32,), ndim=1)
        if cu.shape[0] < 1:
            raise ValueError(f"{name} must hold B + 1 offsets starting with 0, got an empty tensor")
        if cu.device != q.device:
            raise ValueError(f"{name} must be on q's device ({q.device}), got {cu.device}")
    if cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must both hold B + 1 offsets, got {cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}"
        )
    if cu_seqlens_q.shape[0] == 1 and (q.shape[0] or k.shape[0]):
        raise ValueError("cu_seqlens_q and cu_seqlens_k hold no sequence (B = 0), but q or k holds tokens")


def check_cu_seqlens(
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, total_q: int, total_k: int, causal: bool
) -> tuple[list[int], list[int]]:
    """Read the offsets back (a host synchronisation on a GPU) and check them: each list starts
    at 0, never decreases and ends at its tensor's number of tokens; a sequence with queries has
    keys, and with ``causal`` at least as many keys as queries (otherwise its first queries would
    see no key). Returns the offsets as two lists of ints."""
    offsets = []
    for name, cu, total in (("cu_seqlens_q", cu_seqlens_q, total_q), ("cu_seqlens_k", cu_seqlens_k, total_k)):
        cu = cu.tolist()
        if cu[0] != 0 or cu[-1] != total:
            raise ValueError(f"{name} must start at 0 and end at the number of tokens ({total}), got {cu[0]} ... {cu[-1]}")
        for i, (start, end) in enumerate(zip(cu, cu[1:])):
            if end < start:
                raise ValueError(f"{name} must never decrease (sequence i owns rows cu[i]:cu[i+1]), got {start}, {end} at {i}")
        offsets.append(cu)
    cu_q, cu_k = offsets
    for i in range(len(cu_q) - 1):
        n_q, n_k = cu_q[i + 1] - cu_q[i], cu_k[i + 1] - cu_k[i]
        if n_q and (n_k == 0 or (causal and n_k < n_q)):
            need = f"at least {n_q} keys (causal, bottom-right aligned)" if causal else "at least one key"
            raise ValueError(f"sequence {i} has {n_q} queries and {n_k} keys; it needs {need}, or a query would see no key")
    return cu_q, cu_k


def check_add_rms_norm(x: object, residual: object, weight: object, eps: float) -> None:
    """``x`` and ``residual`` of one shape (..., D), ``weight`` (D,), one dtype and device."""
    check_rms_norm(x, weight, eps)
    check_tensor("residual", residual)
    check_same("x", x, "residual", residual)


def check_rotary(q: object, k: object, positions: object, cos: object, sin: object) -> None:
    """``q`` (T, Hq, D) and ``k`` (T, Hk, D) of one dtype, ``positions`` (T,) integers,
    ``cos``/``sin`` float32 tables (max_position, D)."""
    check_tensor("q", q, ndim=3)
    check_tensor("k", k, ndim=3)
    check_same("q", q, "k", k, shape=False)
    check_tensor("positions", positions, dtypes=(torch.int32, torch.int64), ndim=1)
    check_tensor("cos", cos, dtypes=(torch.float32,), ndim=2)
    check_tensor("sin", sin, dtypes=(torch.float32,), ndim=2)
    check_same("cos", cos, "sin", sin)
    T, _, D = q.shape
    if k.shape[0] != T or k.shape[2] != D or positions.shape[0] != T:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)} and positions {tuple(positions.shape)} must agree on T and D")
    if D % 2 or cos.shape[1] != D:
        raise ValueError(f"head_dim must be even and equal to the tables' width; got q {tuple(q.shape)}, cos {tuple(cos.shape)}")
    for name, t in (("k", k), ("positions", positions), ("cos", cos)):
        if t.device != q.device:
            raise ValueError(f"{name} and q must be on the same device, got {t.device} and {q.device}")


KV_QUANT_MAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}  # the 8-bit KV-cache dtypes and their largest value


def check_kv_scales(cache: torch.Tensor, name: str, scale: object) -> None:
    """An INT8/FP8 cache needs its float32 scales (num_blocks, block_size, Hkv); another, none."""
    if cache.dtype in KV_QUANT_MAX:
        check_tensor(name, scale, dtypes=(torch.float32,), ndim=3)
        if tuple(scale.shape) != tuple(cache.shape[:3]) or scale.device != cache.device or not scale.is_contiguous():
            raise ValueError(f"{name} must be contiguous float32 {tuple(cache.shape[:3])} on {cache.device}")
    elif scale is not None:
        raise ValueError(f"{name} applies to an int8 or float8_e4m3fn cache only, not {cache.dtype}")


def check_store_kv(
    k: object, v: object, k_cache: object, v_cache: object, slot_mapping: object, k_scale: object = None, v_scale: object = None
) -> None:
    """``k``/``v`` (T, Hkv, D); caches (num_blocks, block_size, Hkv, D) of their dtype, or int8 /
    float8_e4m3fn with scales (num_blocks, block_size, Hkv) float32; ``slot_mapping`` (T,)
    int64: ``block * block_size + offset``, or -1 to skip a token."""
    check_tensor("k", k, ndim=3)
    check_tensor("v", v, ndim=3)
    check_same("k", k, "v", v)
    check_tensor("k_cache", k_cache, dtypes=(*FLOAT_DTYPES, *KV_QUANT_MAX), ndim=4)
    check_tensor("v_cache", v_cache, dtypes=(*FLOAT_DTYPES, *KV_QUANT_MAX), ndim=4)
    check_same("k_cache", k_cache, "v_cache", v_cache)
    if k_cache.dtype not in KV_QUANT_MAX:
        check_same("k", k, "k_cache", k_cache, shape=False)
    check_kv_scales(k_cache, "k_scale", k_scale)
    check_kv_scales(v_cache, "v_scale", v_scale)
    check_tensor("slot_mapping", slot_mapping, dtypes=(torch.int64,), ndim=1)
    if k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"k {tuple(k.shape)} does not fit a cache of (num_blocks, block_size, Hkv, D) = {tuple(k_cache.shape)}")
    if slot_mapping.shape[0] != k.shape[0] or slot_mapping.device != k.device:
        got = f"{tuple(slot_mapping.shape)} on {slot_mapping.device}"
        raise ValueError(f"slot_mapping must be ({k.shape[0]},) on {k.device}, got {got}")


# --- FP8 / INT8 scaled matrix products (Chapter 5) ---

SCALED_DTYPES = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
SCALE_BLOCK = 128  # the side of a block scale's tile (DeepSeek-V3's 128-channel blocks)

__all__ += ["SCALED_DTYPES", "SCALE_BLOCK", "check_scaled_gemm", "check_quantize_rows", "check_scaled_linear"]


def _scaled_kind(kind: object) -> torch.dtype:
    if kind not in SCALED_DTYPES:
        raise ValueError(f"kind must be 'fp8' or 'int8', got {kind!r}")
    return SCALED_DTYPES[kind]


def check_scaled_gemm(a: object, a_scale: object, b: object, b_scale: object, kind: str, out_dtype: object) -> bool:
    """``a`` (M, K) and ``b`` (N, K) of ``kind``'s dtype (float8_e4m3fn or int8), float32 scales on
    their device, ``out_dtype`` float32/float16/bfloat16. Each scale is per tensor (``()`` or
    ``(1,)``) or per row (``(M,)`` for a, ``(N,)`` for b), independently; or both are block scales
    (fp8 only): a_scale ``(M, ceil(K/128))``, b_scale ``(ceil(N/128), ceil(K/128))``.
    Returns True for block scales."""
    dtype = _scaled_kind(kind)
    check_tensor("a", a, dtypes=(dtype,), ndim=2)
    check_tensor("b", b, dtypes=(dtype,), ndim=2)
    check_tensor("a_scale", a_scale, dtypes=(torch.float32,), min_ndim=0)
    check_tensor("b_scale", b_scale, dtypes=(torch.float32,), min_ndim=0)
    for name, t in (("b", b), ("a_scale", a_scale), ("b_scale", b_scale)):
        if t.device != a.device:
            raise ValueError(f"{name} and a must be on the same device, got {t.device} and {a.device}")
    if out_dtype not in FLOAT_DTYPES:
        raise TypeError(f"out_dtype must be one of {_names(FLOAT_DTYPES)}, got {out_dtype}")
    (M, K), N = a.shape, b.shape[0]
    if b.shape[1] != K:
        raise ValueError(f"a (M, K) and b (N, K) must share K: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    if N == 0 or K == 0:
        raise ValueError(f"N and K must be >= 1, got a {tuple(a.shape)} and b {tuple(b.shape)}")
    kb = -(-K // SCALE_BLOCK)
    if a_scale.dim() == 2 or b_scale.dim() == 2:
        if kind == "int8":
            raise ValueError("int8_gemm takes per-tensor or per-row scales; block scales are for fp8_gemm")
        want_a, want_b = (M, kb), (-(-N // SCALE_BLOCK), kb)
        if tuple(a_scale.shape) != want_a or tuple(b_scale.shape) != want_b:
            raise ValueError(
                f"block scales must be a_scale {want_a} (row, 128-column block) and b_scale {want_b} "
                f"(128 x 128 blocks), got {tuple(a_scale.shape)} and {tuple(b_scale.shape)}"
            )
        return True
    for name, t, rows, what in (("a_scale", a_scale, M, "M"), ("b_scale", b_scale, N, "N")):
        if tuple(t.shape) not in ((), (1,), (rows,)):
            raise ValueError(
                f"{name} must be () or (1,) (per tensor), ({rows},) (per row, {what}) or a block scale, "
                f"got shape {tuple(t.shape)}"
            )
    return False


def check_quantize_rows(x: object, kind: str, block: int | None) -> None:
    """``x`` (M, K) floating point; ``kind`` 'fp8' or 'int8'; ``block`` None (one scale a row)
    or 128 (one scale per row and 128-column block, fp8 only)."""
    _scaled_kind(kind)
    check_tensor("x", x, ndim=2)
    if block not in (None, SCALE_BLOCK):
        raise ValueError(f"block must be None (per row) or {SCALE_BLOCK}, got {block!r}")
    if block is not None and kind == "int8":
        raise ValueError("block scales are for fp8; quantize int8 activations per row (block=None)")


def check_scaled_linear(x: object, w: object, kind: str) -> None:
    """``x`` (..., K) floating point; ``w`` a ScaledWeight-like object of ``kind``: ``.data`` (N, K)
    of kind's dtype on x's device, ``.scale`` float32 matching ``.granularity``."""
    dtype = _scaled_kind(kind)
    check_tensor("x", x)
    if not all(hasattr(w, attr) for attr in ("data", "scale", "granularity")):
        raise TypeError(f"w must be a ScaledWeight (with .data, .scale and .granularity), got {type(w).__name__}")
    check_tensor("w.data", w.data, dtypes=(dtype,), ndim=2)
    check_tensor("w.scale", w.scale, dtypes=(torch.float32,), min_ndim=0)
    N, K = w.data.shape
    if x.shape[-1] != K:
        raise ValueError(f"x's last dimension must be K = {K} (w.data is {tuple(w.data.shape)}), got shape {tuple(x.shape)}")
    if w.data.device != x.device:
        raise ValueError(f"w and x must be on the same device, got {w.data.device} and {x.device}")
    blocks = (-(-N // SCALE_BLOCK), -(-K // SCALE_BLOCK))
    want = {"tensor": ((), (1,)), "row": ((N,),), "block": (blocks,)}
    if w.granularity not in want:
        raise ValueError(f"w.granularity must be 'tensor', 'row' or 'block', got {w.granularity!r}")
    if w.granularity == "block" and kind == "int8":
        raise ValueError("int8_linear takes per-tensor or per-row weight scales, not block scales")
    if tuple(w.scale.shape) not in want[w.granularity]:
        raise ValueError(
            f"a {w.granularity!r} scale of an ({N}, {K}) weight must have shape {want[w.granularity][0]}, "
            f"got {tuple(w.scale.shape)}"
        )


__all__ += ["check_quantized_weight", "check_w4a16_linear"]


def check_quantized_weight(qweight: object, four_bit_only: bool = True) -> None:
    """``qweight`` a QuantizedWeight of an ``(N, K)`` weight (duck-typed): ``qweight.qweight``
    ``(K // per_word, N)`` int32 packed codes, ``scales`` and ``zeros`` ``(K // group_size, N)``
    floats on its device, ``group_size`` a multiple of ``per_word`` dividing K. ``four_bit_only``:
    the codes must sit in 4-bit containers (2 to 4 bits), as the W4A16 kernels read them."""
    fields = ("qweight", "scales", "zeros", "bits", "group_size", "shape")
    missing = [f for f in fields if not hasattr(qweight, f)]
    if missing:
        raise TypeError(
            f"qweight must be a QuantizedWeight (llmnote.quant.quantize_weight); {type(qweight).__name__} lacks {missing}"
        )
    bits, group = qweight.bits, qweight.group_size
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"qweight.bits must be an int in [2, 8], got {bits!r}")
    width = 4 if bits <= 4 else 8
    if four_bit_only and width != 4:
        raise ValueError(
            f"the W4A16 kernels read 2- to 4-bit codes (4-bit containers); qweight holds {bits}-bit codes in 8-bit containers"
        )
    per_word = 32 // width
    n, k = qweight.shape
    if not isinstance(group, int) or group < 1 or k % group or group % per_word:
        raise ValueError(f"qweight.group_size must divide K = {k} and be a multiple of {per_word}, got {group!r}")
    check_tensor("qweight.qweight", qweight.qweight, dtypes=(torch.int32,), ndim=2)
    if tuple(qweight.qweight.shape) != (k // per_word, n):
        want = (k // per_word, n)
        raise ValueError(f"qweight.qweight must be (K // {per_word}, N) = {want}, got {tuple(qweight.qweight.shape)}")
    for name in ("scales", "zeros"):
        t = check_tensor(f"qweight.{name}", getattr(qweight, name), ndim=2)
        if tuple(t.shape) != (k // group, n):
            raise ValueError(f"qweight.{name} must be (K // group_size, N) = {(k // group, n)}, got {tuple(t.shape)}")
        if t.device != qweight.qweight.device:
            raise ValueError(f"qweight.{name} and qweight.qweight must be on the same device, got {t.device}")


def check_w4a16_linear(x: object, qweight: object, four_bit_only: bool = True) -> None:
    """``x`` (..., K) floating point on the device of ``qweight``, a QuantizedWeight of an
    ``(N, K)`` weight (see :func:`check_quantized_weight`)."""
    check_quantized_weight(qweight, four_bit_only)
    check_tensor("x", x)
    n, k = qweight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x's last dimension must be K = {k} (the weight is (N, K) = ({n}, {k})), got shape {tuple(x.shape)}")
    if qweight.qweight.device != x.device:
        raise ValueError(f"qweight and x must be on the same device, got {qweight.qweight.device} and {x.device}")
