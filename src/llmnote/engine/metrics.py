"""Serving metrics: per request and per engine step, exported in Prometheus' text format.

Per request (observed when it finishes): queue time (arrival to first scheduling), time to
first token (TTFT, arrival to first token), time per output token (TPOT, the mean gap after the
first token), every inter-token latency (ITL), end-to-end latency. Per step: the number of
sequences and tokens in the batch, the step's duration; and as gauges, requests running and
waiting, KV blocks in use, the KV cache's usage and the prefix cache's hit rate.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .outputs import RequestOutput

__all__ = ["EngineMetrics", "request_latencies"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def request_latencies(out: RequestOutput, end: float) -> dict[str, float | list[float] | None]:
    """Queue time, TTFT, TPOT, inter-token latencies and end-to-end latency of a finished
    request, in seconds, from the timestamps in ``out.metrics``."""
    m = out.metrics
    times, arrival = m.get("token_times") or [], m["arrival_time"]
    itl = [b - a for a, b in zip(times, times[1:])]
    return {
        "queue": None if m.get("first_scheduled_time") is None else m["first_scheduled_time"] - arrival,
        "ttft": None if m.get("first_token_time") is None else m["first_token_time"] - arrival,
        "tpot": sum(itl) / len(itl) if itl else None,
        "itl": itl,
        "e2e": end - arrival,
    }


class EngineMetrics:
    """Prometheus collectors in a registry of their own (several engines can live in one process)."""

    def __init__(self, model_name: str):
        self.registry = r = CollectorRegistry()
        labels, self.model = ["model_name"], model_name

        def hist(name, doc, buckets=_LATENCY_BUCKETS):
            return Histogram(f"llmnote_{name}", doc, labels, registry=r, buckets=buckets).labels(model_name)

        self.queue = hist("request_queue_time_seconds", "Arrival to first scheduling.")
        self.ttft = hist("time_to_first_token_seconds", "Arrival to first generated token.")
        self.tpot = hist("time_per_output_token_seconds", "Mean time between output tokens of a request.")
        self.itl = hist("inter_token_latency_seconds", "Time between consecutive output tokens.")
        self.e2e = hist("e2e_request_latency_seconds", "Arrival to finish.")
        self.step_time = hist("step_duration_seconds", "Duration of one engine step.")
        self.batch_seqs = hist("batch_num_sequences", "Sequences per engine step.", _SIZE_BUCKETS)
        self.batch_tokens = hist("batch_num_tokens", "Tokens per engine step.", _SIZE_BUCKETS)
        def counter(name, doc):
            return Counter(f"llmnote_{name}", doc, labels, registry=r).labels(model_name)

        def gauge(name, doc):
            return Gauge(f"llmnote_{name}", doc, labels, registry=r).labels(model_name)

        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens computed (prefix-cache hits excluded).")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.preemptions = counter("num_preemptions", "Sequences preempted.")
        self.finished = Counter("llmnote_request_success", "Finished requests.", ["model_name", "finished_reason"], registry=r)
        self.running = gauge("num_requests_running", "Requests in the running batch.")
        self.waiting = gauge("num_requests_waiting", "Requests queued.")
        self.blocks_in_use = gauge("kv_blocks_in_use", "KV blocks held by requests.")
        self.kv_usage = gauge("kv_cache_usage_perc", "Fraction of KV blocks in use.")
        self.hit_rate = gauge("prefix_cache_hit_rate", "Prefix-cache hits over lookups, in blocks.")

    def observe_step(self, engine, num_seqs: int, num_tokens: int, seconds: float, preempted: int) -> None:
        self.step_time.observe(seconds)
        self.batch_seqs.observe(num_seqs)
        self.batch_tokens.observe(num_tokens)
        if preempted:
            self.preemptions.inc(preempted)
        self.refresh(engine)

    def refresh(self, engine) -> None:
        """Update the gauges from the engine's current state."""
        sched, blocks = engine.scheduler, engine.blocks
        self.running.set(len(sched.running))
        self.waiting.set(len(sched.waiting))
        self.blocks_in_use.set(blocks.blocks_in_use())
        self.kv_usage.set(blocks.blocks_in_use() / blocks.num_blocks)
        self.hit_rate.set(blocks.hit_rate)

    def observe_finished(self, out: RequestOutput, end: float) -> None:
        lat = request_latencies(out, end)
        for hist, key in ((self.queue, "queue"), (self.ttft, "ttft"), (self.tpot, "tpot"), (self.e2e, "e2e")):
            if lat[key] is not None:
                hist.observe(lat[key])
        for gap in lat["itl"]:
            self.itl.observe(gap)
        self.prompt_tokens.inc(len(out.prompt_token_ids) - out.num_cached_tokens)
        self.generation_tokens.inc(len(out.token_ids))
        self.finished.labels(self.model, out.finish_reason).inc()

    def exposition(self) -> bytes:
        """The metrics in Prometheus' text exposition format."""
        return generate_latest(self.registry)
