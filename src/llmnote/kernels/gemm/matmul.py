"""Tiled matrix multiplication: ``(M, K) @ (K, N)`` with float32 accumulation.

Each program computes one ``BLOCK_M x BLOCK_N`` tile of C, walking along K in steps of
``BLOCK_K``; ``tl.dot`` maps the tile products onto the tensor cores (``wgmma`` on
Hopper, with the loads software-pipelined over ``num_stages`` buffers). Programs are
launched in *grouped* order: ``GROUP_M`` rows of tiles are visited column by column, so
the programs running at the same time share panels of A and B through the L2 cache.
On a GPU the tile shape is autotuned per (M, N, K); in the interpreter one small tile
shape is used.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ... import runtime
from ..._checks import check_matmul_inputs
from ..common import check_device

__all__ = ["matmul", "matmul_kernel", "matmul_configs", "prune_configs", "MATMUL_HEURISTICS"]


def _config(bm: int, bn: int, bk: int, stages: int, warps: int, group: int = 8) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": group}, num_stages=stages, num_warps=warps)


def matmul_configs(capability: tuple[int, int] | None = None) -> list[triton.Config]:
    """Autotuning candidates: large tiles for Hopper (228 KB of shared memory per SM),
    smaller ones elsewhere, plus narrow-M tiles for decode-shaped products (M <= 64).

    ``capability`` is a compute capability such as ``(9, 0)``; by default, the one
    :func:`llmnote.runtime.capability` reports (or none, on a machine without a GPU).
    """
    if capability is None:
        capability = runtime.capability() or (0, 0)
    major = capability[0]
    if major >= 9:
        big = [
            _config(128, 256, 64, 3, 8),
            _config(256, 128, 64, 3, 8),
            _config(128, 128, 64, 4, 4),
            _config(128, 128, 64, 4, 8),
            _config(128, 256, 64, 4, 8),
            _config(64, 256, 64, 4, 4),
            _config(128, 64, 64, 4, 4),
        ]
    else:
        big = [_config(128, 128, 32, 4, 4), _config(128, 256, 32, 3, 8), _config(64, 128, 32, 4, 4), _config(128, 64, 32, 4, 4)]
    narrow = [
        _config(16, 64, 128, 4, 4, 1),
        _config(16, 128, 128, 4, 4, 1),
        _config(32, 64, 128, 4, 4, 1),
        _config(64, 64, 64, 4, 4),
    ]
    return big + narrow


# Shared memory one block may opt into, in KiB, by compute capability (CUDA programming guide,
# "Technical specifications per compute capability").
_SMEM_PER_BLOCK_KIB = {(7, 5): 64, (8, 0): 163, (8, 6): 99, (8, 7): 163, (8, 9): 99, (9, 0): 227, (10, 0): 227, (12, 0): 99}


def _smem_per_block(capability: tuple[int, int]) -> int:
    known = [c for c in _SMEM_PER_BLOCK_KIB if c <= capability]
    return _SMEM_PER_BLOCK_KIB[max(known)] * 1024 if known else 48 * 1024


def _next_pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def prune_configs(
    configs: list[triton.Config], M: int, N: int, K: int, element_size: int, capability: tuple[int, int] | None = None
) -> list[triton.Config]:
    """The candidates worth timing for one product, so that autotuning stays short.

    Drops a configuration whose pipeline buffers overflow the shared memory a block may use
    (it could not compile): a loop pipelined over ``num_stages`` stages keeps at least
    ``num_stages - 1`` slabs of ``BLOCK_M*BLOCK_K + BLOCK_K*BLOCK_N`` elements in flight.
    Drops also one whose tile is larger than the problem rounded up to a power of two
    in some dimension (it only multiplies padding), unless every candidate is. Returns at
    least one configuration: the smallest tile, if nothing else survives.
    """
    if capability is None:
        capability = runtime.capability() or (0, 0)
    limit = _smem_per_block(capability)

    def fits(c: triton.Config) -> bool:
        bm, bn, bk = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
        return (bm * bk + bk * bn) * element_size * max(c.num_stages - 1, 1) <= limit

    def volume(c: triton.Config) -> int:
        return c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"]

    candidates = [c for c in configs if fits(c)] or [min(configs, key=volume)]
    caps = {}
    for key, size in (("BLOCK_M", M), ("BLOCK_N", N), ("BLOCK_K", K)):
        caps[key] = max(_next_pow2(size), min(c.kwargs[key] for c in candidates))
    kept = [c for c in candidates if all(c.kwargs[key] <= cap for key, cap in caps.items())]
    return kept or [min(candidates, key=volume)]


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    return prune_configs(configs, named_args["M"], named_args["N"], named_args["K"], named_args["a_ptr"].element_size())


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)`` of program ``pid`` in grouped order, as in :func:`matmul_kernel`:
    consecutive programs walk down ``GROUP_M`` rows of tiles, then move right, so the panels
    they share stay in L2 (the other GEMMs of the package call this)."""
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    UPCAST: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # Grouped ordering: consecutive program ids walk down GROUP_M rows of tiles, then move right.
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    # Rows and columns wrap around (% M, % N) instead of being masked: loads stay in bounds
    # and unmasked; the duplicate rows/columns are never stored.
    rm = tl.max_contiguous(tl.multiple_of((pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M, BLOCK_M), BLOCK_M)
    rn = tl.max_contiguous(tl.multiple_of((pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N, BLOCK_N), BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None].to(tl.int64) * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :].to(tl.int64) * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        if UPCAST:  # Triton's interpreter cannot multiply bf16: do it in fp32 there
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + cm[:, None].to(tl.int64) * stride_cm + cn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))


# EVEN_K is computed from the arguments, not tuned: the K loop needs no mask when BLOCK_K divides K.
MATMUL_HEURISTICS = {"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0}
_tuned_kernel = triton.autotune(
    configs=matmul_configs(), key=["M", "N", "K", "stride_am", "stride_bk"], prune_configs_by={"early_config_prune": _prune}
)(triton.heuristics(MATMUL_HEURISTICS)(matmul_kernel))
_plain_kernel = triton.heuristics(MATMUL_HEURISTICS)(matmul_kernel)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for ``a`` (M, K) and ``b`` (K, N) of one dtype (fp32, fp16, bf16), any strides.

    Accumulates in float32 and returns ``a.dtype``. fp32 inputs are multiplied in full
    precision (``ieee``), not TF32, to match ``torch.matmul``'s default.
    """
    check_matmul_inputs(a, b)
    (M, K), N = a.shape, b.shape[1]
    check_device(a=a, b=b)
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    args = (a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
    precision = "ieee" if a.dtype == torch.float32 else "tf32"
    if runtime.interpreting():
        _plain_kernel[(triton.cdiv(M, 32) * triton.cdiv(N, 32),)](
            *args, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4, UPCAST=a.dtype == torch.bfloat16, PRECISION=precision
        )
    else:

        def grid(meta):
            return (triton.cdiv(M, meta["BLOCK_M"]) * triton.cdiv(N, meta["BLOCK_N"]),)

        _tuned_kernel[grid](*args, UPCAST=False, PRECISION=precision)
    return c
