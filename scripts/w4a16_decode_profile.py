"""The W4A16 decode paths on one GPU, outside the quant record: ``w4a16_linear`` (autotuned),
bf16 cuBLAS and torch's int4 kernel on Llama-3-8B's two shapes at the given batches, timed as the
record times them (``llmnote.bench.quant._time_w4a16``: CUDA-graph replays over rotating inputs,
each result checked first), with the tile the autotuner chose for each case in the record's meta.
With ``--sweep``, every candidate tile of the tensor-core decode kernel is also timed on its own
(provider ``llmnote:<tile>``), to see how far the autotuner's choice is from the rest, and the
decode kernel it replaces, autotuned; ``--fma`` and ``--wide`` add, at one row, the FMA tiles
alone and the wide one-row tiles, which are not candidates; ``--regs`` and ``--tile`` add
tensor-core tiles that the plan does not hold (other register targets, tiles given by hand), and
``--deq`` each tensor-core tile without ``DEQ`` also with it (its codes scaled before the MMAs; the
plan holds both from 8 rows on)::

    python scripts/w4a16_decode_profile.py assets/benchmarks/profiles/w4a16_decode_h200.json --batches 1 16 64

With ``--profile`` nothing is timed or written: each case is autotuned, then launched once more
between ``cudaProfilerStart`` and ``cudaProfilerStop``, one launch per case for Nsight Compute
(the tiles the autotuner chose are printed at the end)::

    ncu --clock-control none --profile-from-start off -k regex:w4a16 --section WarpStateStats \\
        --section SourceCounters --page source --print-source sass --csv \\
        python scripts/w4a16_decode_profile.py - --profile --batches 1 16 > w4a16.ncu.csv
"""

from __future__ import annotations

import argparse
import sys
from unittest import mock

import torch
import triton

from llmnote.bench.quant import SHAPES, _measure, _time_w4a16, _w4a16_set
from llmnote.bench.timing import rotating_inputs
from llmnote.kernels import w4a16_linear
from llmnote.kernels.gemm import w4a16, w4a16_plan, w4a16_swap_ab
from llmnote.records import Record


def tile_name(config) -> str:
    kw = config.kwargs
    if "V" in kw:  # w4a16_swap_ab_kernel: 32-column blocks, warps, split of K, loads one group ahead
        deq = "-deq" if kw.get("DEQ") else ""  # the codes scaled before the MMAs
        return f"swap-v{kw['V']}w{kw['WARPS']}s{kw['SPLIT_K']}{'-pre' if kw['PREFETCH'] else ''}{deq}" + (
            f"r{config.maxnreg}" if config.maxnreg else "")
    regs = f"r{config.maxnreg}" if config.maxnreg else ""  # a register target, where the tile sets one
    wide = "-wide" if kw.get("WIDE") else ""  # every word row of a tile in each thread
    return f"m{kw['BLOCK_M']}n{kw['BLOCK_N']}k{kw['BLOCK_K']}s{kw['SPLIT_K']}w{config.num_warps}p{config.num_stages}{regs}{wide}"


def wide_tiles(n: int, k: int) -> list:
    """Wide one-row tiles (``WIDE``: every word row of a K tile in each thread, 4 or 8 columns a
    thread; the scale and zero point once per column and tile), not among the package's candidates:
    ``--wide`` times them beside those. K is split so that the tiles make 448 to 3584 programs."""
    tiles = [(128, 64, 1), (256, 64, 1), (512, 64, 2), (256, 32, 1)]
    return [
        triton.Config({"BLOCK_M": 1, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "WIDE": True}, num_warps=warps, num_stages=1)
        for bn, bk, warps in tiles
        for split in (4, 8, 16, 32, 64)
        if 448 <= -(-n // bn) * split <= 3584 and split <= k // bk
    ]


def sweep(
    rec: Record, case: str, m: int, n: int, k: int, wide=False, fma=False, band=False, regs=(), tiles=(), deq=False
) -> dict[str, str]:
    """Each decode candidate for this case, forced alone (the autotuner has nothing to choose): the
    tensor-core decode kernel's candidates (with ``band``, every split in its band; with ``regs``,
    the prefetching ones also at each of these register targets; ``tiles``: more tiles given by
    hand as (V, WARPS, SPLIT_K, PREFETCH 0 or 1, maxnreg or 0); ``deq``: each of these without
    ``DEQ`` also with it), then the
    decode kernel it replaces, autotuned (provider ``llmnote:fma-autotuned`` at one row,
    ``llmnote:dot-autotuned`` beyond); at one row, with ``fma`` each FMA tile alone as well, and
    with ``wide`` the tiles of :func:`wide_tiles`. Returns the tiles the replaced kernel's
    autotuner chose."""
    sets = rotating_inputs(lambda: _w4a16_set(m, n, k), n * k // 2 + 2 * m * k)
    x, qweight, w = sets[0]
    expected = x.float() @ w.float().t()
    bucket = 1 if m == 1 else w4a16.SMALL_M
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    configs = list(w4a16.plan_configs(True, bucket, n, k, x.element_size(), sms, torch.cuda.get_device_capability()))
    measure = lambda name: _measure(rec, "w4a16_linear", case, name, lambda x, q, w: w4a16_linear(x, q), sets,  # noqa: E731
                                    expected, qweight.nbytes + 2 * m * k + 2 * m * n)
    rows = w4a16_swap_ab._rows(m)
    candidates = list(w4a16.plan_swap_ab(n, k, qweight.group_size, sms, every=band, rows=rows))
    candidates += [  # the prefetching tiles at other register targets (more warps an SM, or fewer)
        triton.Config(c.kwargs, num_warps=c.num_warps, num_stages=1, maxnreg=r)
        for c in list(candidates)
        for r in regs
        if c.kwargs["PREFETCH"] and r != c.maxnreg
    ]
    for v, warps, split, pre, target in tiles:  # tiles given by hand, whatever the plan
        kwargs = {"V": v, "WARPS": warps, "SPLIT_K": split, "PREFETCH": bool(pre)}
        candidates.append(triton.Config(kwargs, num_warps=warps, num_stages=1, maxnreg=target or None))
    if deq:  # the codes scaled before the MMAs, each tile
        candidates += [triton.Config({**c.kwargs, "DEQ": True}, num_warps=c.num_warps, num_stages=1, maxnreg=c.maxnreg)
                       for c in list(candidates) if not c.kwargs.get("DEQ")]  # fmt: skip

    for config in candidates:
        with (  # both: the launcher sizes the split-K workspace from one, the autotuner's pruning calls the other
            mock.patch.object(w4a16_swap_ab, "plan_swap_ab", lambda *a, c=config, **kw: (c,)),
            mock.patch.object(w4a16_plan, "plan_swap_ab", lambda *a, c=config, **kw: (c,)),
            mock.patch.object(w4a16, "_swap_ab_wins", lambda *a: True),  # 9 to 16 rows: this kernel, whatever was measured
        ):
            w4a16_swap_ab._tuned_swap_ab.cache.clear()
            measure(f"llmnote:{tile_name(config)}")
    w4a16_swap_ab._tuned_swap_ab.cache.clear()
    with mock.patch.object(w4a16, "_swap_ab_fits", lambda *a: False):
        w4a16._tuned_gemv.cache.clear()
        measure(f"llmnote:{'fma' if m == 1 else 'dot'}-autotuned")
        chosen = autotuned()
    configs = (configs if fma else []) + (wide_tiles(n, k) if wide else []) if m == 1 else []
    for config in configs:
        with (
            mock.patch.object(w4a16, "_swap_ab_fits", lambda *a: False),
            mock.patch.object(w4a16, "plan_configs", lambda *a, c=config: (c,)),
            mock.patch.object(w4a16_plan, "plan_configs", lambda *a, c=config: (c,)),
        ):
            w4a16._tuned_gemv.cache.clear()
            measure(f"llmnote:{tile_name(config)}")
    w4a16._tuned_gemv.cache.clear()
    return {f"replaced {key}": tile for key, tile in chosen.items()}


def profile_launches(batches: list[int]) -> dict[str, str]:
    """Each case autotuned first, then one launch bracketed for a profiler. Returns the tile the
    autotuner chose for each of its keys."""
    for n, k in SHAPES:
        x_all, qweight, _ = _w4a16_set(max(batches), n, k)
        for m in batches:
            x = x_all[:m].contiguous()
            w4a16_linear(x, qweight)  # autotuning and compilation stay outside the profiled range
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            w4a16_linear(x, qweight)
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
    return autotuned()


def autotuned() -> dict[str, str]:
    """The tile each autotuner chose for each of its keys, and at 9 to 16 rows which decode kernel
    the dispatcher measured to be faster."""
    tiles = {
        str(key): tile_name(config)
        for tuned in (w4a16_swap_ab._tuned_swap_ab, w4a16._tuned_gemv, w4a16._tuned_gemm)
        for key, config in tuned.cache.items()
    }
    kernels = {f"9 to 16 rows {key[1:]}": "swap" if won else "dot" for key, won in w4a16._SWAP_AB_CHOICE.items()}
    return tiles | kernels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="where to write the record (JSON)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16], help="rows of x (default: 1 16)")
    parser.add_argument("--sweep", action="store_true", help="also time every decode candidate tile alone")
    parser.add_argument("--band", action="store_true", help="with --sweep: every split in the tensor-core decode band")
    parser.add_argument("--regs", nargs="+", type=int, default=[], help="with --sweep: also each prefetching tensor-core "
                        "tile at these register targets (maxnreg)")  # fmt: skip
    parser.add_argument("--tile", nargs=5, type=int, action="append", default=[], metavar=("V", "WARPS", "SPLIT", "PRE", "REGS"),
                        help="with --sweep: also this tensor-core tile (PRE: 1 to load a group ahead; REGS: maxnreg, "
                        "0 for none)")  # fmt: skip
    parser.add_argument("--deq", action="store_true", help="with --sweep: also each tensor-core tile with its codes "
                        "scaled before the MMAs (DEQ)")  # fmt: skip
    parser.add_argument("--fma", action="store_true", help="with --sweep: at one row, also each FMA tile alone")
    parser.add_argument("--wide", action="store_true", help="with --sweep: also the wide one-row tiles (not candidates)")
    parser.add_argument("--profile", action="store_true", help="time nothing: launch each case once between "
                        "cudaProfilerStart and cudaProfilerStop, for ncu --profile-from-start off (out is ignored)")  # fmt: skip
    args = parser.parse_args(argv)
    if (args.wide or args.fma or args.band or args.regs or args.tile or args.deq) and not args.sweep:
        parser.error("--band, --deq, --fma, --regs, --tile and --wide time tiles in the sweep: give --sweep too")
    if any(v < 1 or w < 1 or s < 1 or p not in (0, 1) or r < 0 for v, w, s, p, r in args.tile):
        parser.error("--tile takes V, WARPS and SPLIT of 1 or more, PRE 0 or 1 and REGS 0 or more")
    if not torch.cuda.is_available():
        print("error: this profile needs an NVIDIA GPU; none is visible to torch", file=sys.stderr)
        return 2
    if any(m < 1 for m in args.batches):
        parser.error("batches must be positive")
    if args.profile:
        for key, tile in profile_launches(args.batches).items():
            print(key, tile)
        return 0
    rec = Record(command="python scripts/w4a16_decode_profile.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    chosen = {}
    for n, k in SHAPES:
        for m in args.batches:
            case = f"M={m},N={n},K={k}"
            _time_w4a16(rec, case, m, n, k)
            chosen.update(autotuned())  # before a sweep empties the cache
            if args.sweep and m <= w4a16.SMALL_M:
                tiles = tuple(map(tuple, args.tile))
                extra = (args.wide, args.fma, args.band, tuple(args.regs), tiles, args.deq)
                chosen.update(sweep(rec, case, m, n, k, *extra))
            torch.cuda.empty_cache()
            rec.extra_meta["autotuned"] = chosen
            rec.save(args.out)  # after each case: a run cut short keeps what it timed
    for row in rec.rows:
        print(f"{row['case']:22s} {row['provider']:30s} {row['median_ms'] * 1e3:8.1f} µs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
