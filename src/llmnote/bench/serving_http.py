"""The serving benchmark through HTTP: ``python -m llmnote serve`` in a subprocess, driven by the
load generator (:mod:`llmnote.bench.load`), as a client would see it.

- **rates**: random prompts of 256-2048 tokens and 64-256 output tokens arriving as a Poisson
  process at three rates, once with chunked prefill (a 2048-token budget a step) and once
  without (a step holds whole prompts, up to 8192 tokens);
- **prefix**: a 1024-token system prompt shared by every request, before a question of 32-128
  tokens and a 32-token answer, with prefix caching on and off.

Each run adds rows of kernel ``http-<statistic>`` (``ttft-p50``, ``ttft-p99``, ``tpot-p50``,
``tpot-p99``, ``itl-p99``; ``median_ms`` holds that statistic in milliseconds) and case
``<dataset>,rate=<r>/s,chunked=<on|off>,prefix-cache=<on|off>``; the load generator's whole
report goes to ``<out_dir>/<case>.json`` with a plot of the distributions. Every server first
answers an unmeasured burst of requests, so that compiling kernels for new shapes is not timed.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from ..records import Record
from .load import make_dataset, plot, poisson_arrivals, report, run_load

__all__ = ["HTTP_RUNS", "free_port", "run_http", "running_server"]

RATES = (2.0, 8.0, 16.0)  # requests per second: light load, near the knee, overload (about 11/s saturated an H200 here)
RANDOM = dict(input_len=(256, 2048), output_len=(64, 256))
SHARED = dict(input_len=(32, 128), output_len=(32, 32), prefix_len=1024, rate=8.0, num=120)
# (chunked prefill, prefix caching, the runs on that server). The shared-prefix trace runs on a
# fresh server both times, so that with caching on it starts from an empty pool as it does off.
HTTP_RUNS = ((True, True, ("rates",)), (False, True, ("rates",)), (True, True, ("prefix",)), (True, False, ("prefix",)))
STATS = (("ttft", "p50"), ("ttft", "p99"), ("tpot", "p50"), ("tpot", "p99"), ("itl", "p99"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(args: list[str], timeout: float = 300.0, env: dict | None = None):
    """``python -m llmnote serve ARGS --port P`` on a free port; yields its URL once ``/health``
    answers, and stops it on leaving."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "llmnote", "serve", *args, "--port", str(port)]
    log = tempfile.TemporaryFile()  # a file, not a pipe: a pipe nobody reads stalls a chatty server when it fills
    proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    try:
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the server exited: {log.read().decode(errors='replace')[-3000:]}")
            if time.time() > deadline:
                raise RuntimeError(f"the server did not answer within {timeout:.0f} s")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _load(rec: Record, url: str, case: str, specs, rate: float, out_dir: Path | None, progress: bool) -> dict:
    results, wall = asyncio.run(run_load(url, specs, poisson_arrivals(len(specs), rate), progress=progress))
    rep = report(results, wall, {"case": case, "requests": len(specs), "rate": rate})
    if rep["failed"]:
        raise RuntimeError(f"{case}: {rep['failed']} requests failed: {rep['errors']}")
    for stat, q in STATS:
        value = rep[f"{stat}_ms"][q]
        if value:
            rec.add(f"http-{stat}-{q}", case, "bf16", "llmnote", value)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        name = case.replace("/", "per").replace(",", "_").replace("=", "-")
        (out_dir / f"{name}.json").write_text(json.dumps(rep, indent=1) + "\n")
        plot(results, case, out_dir / f"{name}.png")
    print(f"{case}: {rep['output_throughput']:.0f} output tok/s, TTFT p50 {rep['ttft_ms']['p50']:.1f} ms, "
          f"p99 {rep['ttft_ms']['p99']:.1f} ms; TPOT p50 {rep['tpot_ms']['p50'] or 0:.2f} ms")  # fmt: skip
    return rep


def _warm_up(url: str, scale: float, vocab: int) -> None:
    """A burst of unmeasured requests of every prompt length the runs send: the first step of
    each new shape compiles (and autotunes) kernels, which must not land in a measured TTFT."""
    lo, hi = RANDOM["input_len"]
    specs = make_dataset("random", 16, (max(1, round(lo * scale)), max(1, round(hi * scale))), (4, 4), vocab, seed=99)
    results, _ = asyncio.run(run_load(url, specs, poisson_arrivals(len(specs), math.inf), progress=False))
    failed = [r.error for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"warm-up requests failed: {failed[:3]}")


def run_http(rec: Record, ckpt: Path, out_dir: Path | None = None, smoke: bool = False, vocab: int = 10000) -> None:
    """Every server of :data:`HTTP_RUNS`, and every run on it; ``smoke``: a handful of short
    requests on the CPU."""
    scale = 0.02 if smoke else 1.0
    common = [str(ckpt), "--max-model-len", "256" if smoke else "4096", "--log-level", "warning"]
    if smoke:
        common += ["--device", "cpu", "--dtype", "float32", "--max-num-seqs", "8"]
    for chunked, caching, runs in HTTP_RUNS:
        flags = ["--max-num-batched-tokens", "64" if smoke else "2048"] if chunked else ["--no-enable-chunked-prefill"]
        flags += [] if caching else ["--no-enable-prefix-caching"]
        tag = f"chunked={'on' if chunked else 'off'},prefix-cache={'on' if caching else 'off'}"
        with running_server(common + flags, env={"OMP_NUM_THREADS": "1"} if smoke else None) as url:
            _warm_up(url, scale, vocab)
            for kind in runs:
                if kind == "rates":
                    for rate in RATES:
                        num = max(4, round(scale * max(40, 12 * rate)))  # about 12 s of arrivals, at least 40 requests
                        lens = {k: (max(1, round(lo * scale)), max(1, round(hi * scale))) for k, (lo, hi) in RANDOM.items()}
                        specs = make_dataset("random", num, lens["input_len"], lens["output_len"], vocab, seed=int(rate))
                        _load(rec, url, f"random,rate={rate:g}/s,{tag}", specs, rate, out_dir, not smoke)
                else:
                    s = SHARED
                    specs = make_dataset("shared-prefix", max(4, round(scale * s["num"])), s["input_len"], s["output_len"],
                                         vocab, seed=0, prefix_len=round(s["prefix_len"] * (0.05 if smoke else 1)))  # fmt: skip
                    _load(rec, url, f"shared-prefix,rate={s['rate']:g}/s,{tag}", specs, s["rate"], out_dir, not smoke)
