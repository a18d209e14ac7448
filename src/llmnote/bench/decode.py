"""Prefill and decode measured with the book's own :class:`~llmnote.models.Transformer`.

Three models: the project's trained ``llmnote-tiny`` and two random-weight models with
the shapes of Llama-3.2-1B and Llama-3-8B (random weights time exactly like trained
ones). For each:

- **prefill**: one forward pass over a prompt of ``S`` tokens into an empty KV cache,
  the work before the first token (TTFT); FLOPs = 2 x matmul parameters x tokens plus the
  causal attention.
- **decode**: one token for each of ``B`` sequences against ``T`` cached tokens, the
  inter-token latency (ITL); bytes = every weight once plus the KV cache read. Timed as
  PyTorch runs it (eager: one kernel launch after another from Python) and replayed
  from a CUDA graph (what serving engines do), which removes the launch overhead.
- **recompute**: the next token without a cache, i.e. a forward pass over all ``T + 1``
  tokens (CUDA graph), the per-token cost that the KV cache saves.
- **generate**: 256 new tokens after a 256-token prompt, greedy, eager, with the KV cache
  against recomputing the whole sequence for every token.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models import ModelConfig, Transformer, load_model, rope_inv_freq
from ..paths import assets_dir
from .record import Record
from .timing import cuda_time_ms

__all__ = ["SHAPES", "random_model", "attention_flops", "kv_bytes", "run_decode"]

_LLAMA = dict(model_type="llama", vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5, dtype="bfloat16")
SHAPES = {
    "llama-3.2-1b": ModelConfig(
        **_LLAMA, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64
    ),
    "llama-3-8b": ModelConfig(
        **_LLAMA, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128
    ),
}
# (prefill lengths, decode batches, decode contexts) per model
PLAN = {
    "llmnote-tiny": ([32, 128, 511], [1, 16, 64], [128, 511]),
    "llama-3.2-1b": ([128, 512, 2048, 8192], [1, 16, 64], [512, 4096]),
    "llama-3-8b": ([128, 512, 2048, 8192], [1, 16, 64], [512, 4096]),
}
GENERATE = (256, 256)  # prompt tokens, new tokens (within the tiny model's 512 positions)


def random_model(config: ModelConfig, device="cuda", dtype=torch.bfloat16) -> Transformer:
    """A model of this shape with N(0, 0.02) weights, built directly on ``device``."""
    with torch.device("meta"):
        model = Transformer(config)
    model.to_empty(device=device).to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02) if p.dim() >= 2 else p.fill_(1.0)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.inv_freq = rope_inv_freq(config).to(device)
    return model.eval()


def attention_flops(config: ModelConfig, batch: int, s: int, t: int) -> int:
    """FLOPs of causal attention for ``s`` queries ending a sequence of ``t`` tokens:
    query ``i`` sees ``t - s + i + 1`` keys, and each (query, key) pair costs ``2 x head_dim``
    in QK^T and again in PV, in every head and layer."""
    pairs = s * (t - s) + s * (s + 1) // 2
    return 4 * batch * config.num_layers * config.num_heads * config.head_dim * pairs


def kv_bytes(config: ModelConfig, batch: int, tokens: int, elem_bytes: int = 2) -> int:
    """Bytes of keys and values for ``tokens`` tokens of ``batch`` sequences."""
    return 2 * config.num_layers * batch * config.num_kv_heads * config.head_dim * tokens * elem_bytes


def _generate_ms(model: Transformer, prompt: torch.Tensor, new: int, cached: bool, reps: int = 3) -> float:
    """Wall-clock milliseconds to produce ``new`` greedy tokens (median of ``reps`` runs)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            if cached:
                cache = model.new_cache(prompt.shape[0], prompt.shape[1] + new)
                token = model(prompt, cache)[:, -1:].argmax(-1)
                for _ in range(new - 1):
                    token = model(token, cache)[:, -1:].argmax(-1)
            else:
                ids = prompt
                for _ in range(new):
                    ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _measure(rec: Record, name: str, model: Transformer, bar) -> None:
    c = model.config
    linear = c.num_matmul_params
    weight_bytes = 2 * linear
    prefills, batches, contexts = PLAN[name]
    for s in prefills:
        ids = torch.randint(0, c.vocab_size, (1, s), device="cuda")
        cache = model.new_cache(1, s)

        def prefill(ids=ids, cache=cache):
            cache.length = 0
            model(ids, cache)

        ms = cuda_time_ms(prefill, [()], warmup=3, rep=10)
        flops = 2 * linear * s + attention_flops(c, 1, s, s)
        rec.add("prefill", f"model={name},B=1,S={s}", "bf16", "llmnote", ms, flops, weight_bytes + kv_bytes(c, 1, s))
        bar.update()
    for b in batches:
        for t in contexts:
            cache = model.new_cache(b, t + 1)
            token = torch.randint(0, c.vocab_size, (b, 1), device="cuda")

            def step(token=token, cache=cache, t=t):
                cache.length = t
                model(token, cache)

            flops = 2 * linear * b + attention_flops(c, b, 1, t + 1)
            nbytes = weight_bytes + kv_bytes(c, b, t + 1)
            for provider, graph_calls in (("llmnote-eager", 0), ("llmnote-cudagraph", 1)):
                ms = cuda_time_ms(step, [()], warmup=3, rep=30, graph_calls=graph_calls)
                rec.add("decode", f"model={name},B={b},T={t}", "bf16", provider, ms, flops, nbytes)
                bar.update()
            del cache
    for t in contexts:  # the next token without a cache: the whole sequence again
        ids = torch.randint(0, c.vocab_size, (1, t + 1), device="cuda")
        ms = cuda_time_ms(model, [(ids,)], warmup=3, rep=10, graph_calls=1)
        flops = 2 * linear * (t + 1) + attention_flops(c, 1, t + 1, t + 1)
        rec.add("decode", f"model={name},B=1,T={t}", "bf16", "recompute-cudagraph", ms, flops, weight_bytes)
        bar.update()
    prompt = torch.randint(0, c.vocab_size, (1, GENERATE[0]), device="cuda")
    for provider, cached in (("kv-cache", True), ("recompute", False)):
        ms = _generate_ms(model, prompt, GENERATE[1], cached)
        rec.add("generate", f"model={name},B=1,prompt={GENERATE[0]},new={GENERATE[1]}", "bf16", provider, ms)
        bar.update()


def run_decode(tiny_dir: str | Path | None = None, models: list[str] | None = None) -> Record:
    if not torch.cuda.is_available():
        raise RuntimeError("the decode benchmark needs a CUDA GPU")
    rec = Record()
    names = models or list(PLAN)
    total = sum(len(p[0]) + (2 * len(p[1]) + 1) * len(p[2]) + 2 for n, p in PLAN.items() if n in names)
    with tqdm(total=total, desc="decode") as bar, torch.no_grad():
        for name in names:
            if name == "llmnote-tiny":
                path = tiny_dir or assets_dir() / "models" / "llmnote-tiny"
                model = load_model(path, device="cuda", dtype=torch.bfloat16)
            else:
                model = random_model(SHAPES[name])
            _measure(rec, name, model, bar)
            del model
            torch.cuda.empty_cache()
    return rec
