"""A load generator for an OpenAI-compatible server: ``python -m llmnote.bench load --url URL``.

Requests arrive as a Poisson process at ``--rate`` requests per second (exponential gaps;
``inf`` sends them all at once), each a streamed completion whose prompt and output lengths
come from a dataset: ``random`` (random token ids, lengths uniform in the given ranges, the
output forced to its length with ``ignore_eos``) or ``shared-prefix`` (one system prompt of
``--prefix-len`` tokens before every random prompt, the case prefix caching is for). For every
request it measures, from the client's side, the time to first token (TTFT), the gaps between
streamed chunks (inter-token latency, ITL), the time per output token after the first (TPOT)
and the end-to-end latency; the report gives throughput and percentiles of each, as JSON, and a
plot of their distributions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["RequestSpec", "Result", "make_dataset", "poisson_arrivals", "report", "run_load"]


@dataclass(frozen=True)
class RequestSpec:
    prompt: list[int]
    max_tokens: int


@dataclass
class Result:
    ok: bool
    prompt_tokens: int
    output_tokens: int = 0
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def make_dataset(kind: str, num: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab: int,
                 seed: int = 0, prefix_len: int = 0) -> list[RequestSpec]:  # fmt: skip
    """``num`` requests with prompt lengths uniform in ``input_len`` and outputs in ``output_len``
    (inclusive ranges), token ids drawn from ``[1, vocab)``; ``shared-prefix`` puts one common
    prompt of ``prefix_len`` tokens in front of every prompt."""
    if kind not in ("random", "shared-prefix"):
        raise ValueError(f"dataset must be 'random' or 'shared-prefix', got {kind!r}")
    for name, (lo, hi) in (("input_len", input_len), ("output_len", output_len)):
        if not 1 <= lo <= hi:
            raise ValueError(f"{name} must be a range 1 <= lo <= hi, got {lo}-{hi}")
    rng = random.Random(seed)
    prefix = [rng.randrange(1, vocab) for _ in range(prefix_len)] if kind == "shared-prefix" else []
    return [RequestSpec(prefix + [rng.randrange(1, vocab) for _ in range(rng.randint(*input_len))], rng.randint(*output_len))
            for _ in range(num)]  # fmt: skip


def poisson_arrivals(num: int, rate: float, seed: int = 0) -> list[float]:
    """Arrival times (seconds from the start) of a Poisson process of ``rate`` per second."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 (inf: all at once), got {rate}")
    if math.isinf(rate):
        return [0.0] * num
    rng, t, out = random.Random(seed + 1), 0.0, []
    for _ in range(num):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def _one(client, spec: RequestSpec, model: str | None, headers: dict) -> Result:
    body = {"prompt": spec.prompt, "max_tokens": spec.max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0.0, "stream_options": {"include_usage": True}}  # fmt: skip
    if model:
        body["model"] = model
    res = Result(ok=False, prompt_tokens=len(spec.prompt))
    start = last = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                res.error = f"HTTP {r.status_code}: {(await r.aread()).decode()[:200]}"
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    res.output_tokens = chunk["usage"]["completion_tokens"]
                if not any(c.get("text") for c in chunk.get("choices", [])):
                    continue
                now = time.perf_counter()
                if res.ttft is None:
                    res.ttft = now - start
                else:
                    res.itl.append(now - last)
                last = now
        res.e2e, res.ok = time.perf_counter() - start, res.ttft is not None
    except Exception as err:  # a refused connection, a dropped stream: counted, not fatal
        res.error = f"{type(err).__name__}: {err}"
    return res


async def run_load(url: str, specs: list[RequestSpec], arrivals: list[float], model: str | None = None,
                   api_key: str | None = None, progress: bool = True) -> tuple[list[Result], float]:  # fmt: skip
    """Send every request at its arrival time; returns the results and the wall time."""
    import httpx
    from tqdm.auto import tqdm

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=None, limits=limits) as client:
        bar = tqdm(total=len(specs), desc="requests", unit="req", disable=not progress)
        start = time.perf_counter()

        async def timed(spec, at):
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - start)))
            res = await _one(client, spec, model, headers)
            bar.update(1)
            return res

        results = await asyncio.gather(*(timed(s, a) for s, a in zip(specs, arrivals)))
        wall = time.perf_counter() - start
        bar.close()
    return list(results), wall


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else [values[0]] * 99
    return {"mean": statistics.fmean(values), "p50": q[49], "p90": q[89], "p99": q[98]}


def report(results: list[Result], wall: float, config: dict) -> dict:
    """Throughput and latency percentiles (milliseconds) of a run."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    ms = lambda xs: [x * 1e3 for x in xs]  # noqa: E731
    return {
        "config": config,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": wall,
        "request_throughput": len(ok) / wall,
        "output_throughput": out_tokens / wall,
        "total_token_throughput": (out_tokens + sum(r.prompt_tokens for r in ok)) / wall,
        "ttft_ms": _percentiles(ms([r.ttft for r in ok])),
        "tpot_ms": _percentiles(ms([r.tpot for r in ok if r.tpot is not None])),
        "itl_ms": _percentiles(ms([g for r in ok for g in r.itl])),
        "e2e_ms": _percentiles(ms([r.e2e for r in ok])),
    }


def plot(results: list[Result], title: str, path: Path) -> None:
    """Distributions (empirical CDFs) of TTFT, TPOT and ITL, saved as an image."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in results if r.ok]
    series = {"TTFT": [r.ttft for r in ok], "TPOT": [r.tpot for r in ok if r.tpot is not None],
              "ITL": [g for r in ok for g in r.itl]}  # fmt: skip
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for ax, (name, values) in zip(axes, series.items()):
        values = sorted(v * 1e3 for v in values)
        if values:
            ax.plot(values, [(i + 1) / len(values) for i in range(len(values))])
            for q, style in ((0.5, "--"), (0.99, ":")):
                ax.axvline(values[min(len(values) - 1, int(q * len(values)))], color="gray", ls=style, label=f"p{int(q * 100)}")
            ax.legend(loc="lower right")
        ax.set(title=name, xlabel="milliseconds", ylabel="fraction of samples", ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    return int(lo), int(hi or lo)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llmnote.bench load", description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="the model name to send (default: the server's)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--rate", type=float, default=math.inf, help="requests per second (default inf: all at once)")
    p.add_argument("--num-prompts", type=int, default=100)
    p.add_argument("--dataset", choices=["random", "shared-prefix"], default="random")
    p.add_argument("--input-len", type=_range, default=(100, 1024), help="prompt tokens, LO-HI")
    p.add_argument("--output-len", type=_range, default=(100, 1024), help="output tokens, LO-HI")
    p.add_argument("--prefix-len", type=int, default=512, help="shared-prefix: tokens of the common prompt")
    p.add_argument("--vocab", type=int, default=1000, help="token ids are drawn from 1 to this (every tokenizer has 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="JSON report (default: print only)")
    p.add_argument("--plot", type=Path, default=None, help="a PNG of the latency distributions")
    args = p.parse_args(argv)
    try:
        specs = make_dataset(args.dataset, args.num_prompts, args.input_len, args.output_len, args.vocab, args.seed,
                             args.prefix_len)  # fmt: skip
        arrivals = poisson_arrivals(args.num_prompts, args.rate, args.seed)
    except ValueError as err:
        p.error(str(err))
    results, wall = asyncio.run(run_load(args.url, specs, arrivals, args.model, args.api_key))
    config = {k: v for k, v in vars(args).items() if k not in ("api_key", "out", "plot")}
    config |= {"input_len": list(args.input_len), "output_len": list(args.output_len), "rate": str(args.rate)}
    rep = report(results, wall, config)
    text = json.dumps(rep, indent=1, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.plot:
        plot(results, f"{args.num_prompts} requests at {args.rate} req/s ({args.dataset})", args.plot)
    return 0 if rep["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
