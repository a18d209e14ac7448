"""Prefill and decode measured with the book's own :class:`~llmnote.models.Transformer`.

Three models: the project's trained ``llmnote-tiny`` and two random-weight models with
the shapes of Llama-3.2-1B (untied head) and Llama-3-8B (random weights time exactly like
trained ones). For each:

- **copy**: the GPU's copy bandwidth, measured in the same run: the bound below divides by it;
- **prefill**: one forward pass over a prompt of ``S`` tokens into an empty paged KV cache,
  the work before the first token (TTFT); FLOPs = 2 x matmul parameters x tokens plus the
  causal attention;
- **decode**: one token for each of ``B`` sequences holding ``T`` cached tokens (paged, blocks of
  16), the inter-token latency (ITL); bytes = every weight once plus the KV cache read. Timed as
  PyTorch runs it (eager: one kernel launch after another from Python) and replayed from a
  CUDA graph (what serving engines do), which removes the launch overhead. The step is
  planned on the device, so one captured graph serves every step. The peer is Hugging Face
  transformers on the same shape, ``generate`` with its static cache (provider
  ``hf-transformers``): the time of 32 more new tokens divided by 32;
- **recompute**: the next token without a cache, i.e. a forward pass over all ``T + 1``
  tokens (CUDA graph), the per-token cost that the KV cache saves;
- **generate**: 256 new tokens after a 256-token prompt, greedy, eager, with the KV cache
  against recomputing the whole sequence for every token.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models import ModelConfig, Transformer, load_model, random_model
from ..paths import assets_dir
from ..records import Record
from .timing import cuda_time_ms

__all__ = ["SHAPES", "PLAN", "attention_flops", "kv_bytes", "decode_bound_ms", "filled_cache", "run_decode"]

_LLAMA = dict(model_type="llama", vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5, dtype="bfloat16")
SHAPES = {
    "llama-3.2-1b": ModelConfig(
        **_LLAMA, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64,
        max_position_embeddings=131072,
    ),
    "llama-3-8b": ModelConfig(
        **_LLAMA, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128,
        max_position_embeddings=8192,
    ),
}
# (prefill lengths, decode batches, decode contexts, peer batches) per model
PLAN = {
    "llmnote-tiny": ([32, 128, 511], [1, 16, 64], [128, 384], []),
    "llama-3.2-1b": ([128, 512, 2048, 8192], [1, 16, 64], [512, 1024, 4096], [1, 64]),
    "llama-3-8b": ([128, 512, 2048, 8192], [1, 16, 64], [512, 4096], []),
}
PEER_CONTEXT = 1024
GENERATE = (256, 256)  # prompt tokens, new tokens (within the tiny model's 512 positions)
DECODE_ROOM = 64  # cache slots reserved past T: warm-up, capture and timed steps each add a token (about 45)
BLOCK_SIZE = 16


def _ends(contexts: list[int]) -> list[int]:
    """The shortest and the longest context: where recompute is timed."""
    return sorted({contexts[0], contexts[-1]})


def attention_flops(config: ModelConfig, batch: int, s: int, t: int) -> int:
    """FLOPs of causal attention for ``s`` queries ending a sequence of ``t`` tokens:
    query ``i`` sees ``t - s + i + 1`` keys, and each (query, key) pair costs ``2 x head_dim``
    in QK^T and again in PV, in every head and layer."""
    pairs = s * (t - s) + s * (s + 1) // 2
    return 4 * batch * config.num_layers * config.num_heads * config.head_dim * pairs


def kv_bytes(config: ModelConfig, batch: int, tokens: int, elem_bytes: int = 2) -> int:
    """Bytes of keys and values for ``tokens`` tokens of ``batch`` sequences."""
    return 2 * config.num_layers * batch * config.num_kv_heads * config.head_dim * tokens * elem_bytes


def decode_bound_ms(config: ModelConfig, batch: int, context: int, copy_tbps: float, elem_bytes: int = 2) -> float:
    """The fastest a decode step can be: every weight of a matrix product and the KV cache read
    once, at the measured copy bandwidth (the embedding reads one row per token: not counted)."""
    nbytes = elem_bytes * config.num_matmul_params + kv_bytes(config, batch, context + 1, elem_bytes)
    return nbytes / (copy_tbps * 1e9)


def _copy_tbps(rec: Record) -> float:
    """Device-to-device copy bandwidth (bytes read plus bytes written per second), 1 GiB."""
    src = torch.empty(512 << 20, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    ms = cuda_time_ms(torch.Tensor.copy_, [(dst, src)], warmup=5, rep=30)
    rec.add("copy", "bytes=1024 MiB", "bf16", "torch", ms, nbytes=2 * (1 << 30))
    return 2 * (1 << 30) / (ms * 1e9)


def _generate_ms(model: Transformer, prompt: torch.Tensor, new: int, cached: bool, reps: int = 3) -> float:
    """Wall-clock milliseconds to produce ``new`` greedy tokens (median of ``reps`` runs)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        if cached:
            batch = prompt.shape[0]
            cache = model.new_cache(batch, prompt.shape[1] + new, block_size=BLOCK_SIZE)
            token = model(prompt, cache)[:, -1].argmax(-1)
            cache.reserve_decode(batch, new - 1)
            for _ in range(new - 1):
                token = model.decode(token, cache).argmax(-1)
            cache.advance(batch, new - 1)
        else:
            ids = prompt
            for _ in range(new):
                ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=1)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def filled_cache(model: Transformer, batch: int, context: int, kv_dtype: torch.dtype | None = None):
    """A paged cache whose ``batch`` sequences already hold ``context`` tokens (random keys and
    values: decoding reads them the same whatever they are), with room to decode further."""
    cache = model.new_cache(batch, context + DECODE_ROOM, block_size=BLOCK_SIZE, kv_dtype=kv_dtype)
    if cache.k_scale is None:
        cache.k.normal_()
        cache.v.normal_()
    else:  # 8-bit codes and their scales
        for t in (cache.k, cache.v):
            t.view(torch.uint8).random_(0, 127)
        cache.k_scale.fill_(0.01)
        cache.v_scale.fill_(0.01)
    for s in range(batch):
        cache.reserve(s, context + DECODE_ROOM)
    cache.lens = [context] * batch
    cache.seq_lens.fill_(context)
    return cache


def _hf_model(config: ModelConfig):
    """Hugging Face's Llama of this shape (random weights), or None without transformers."""
    try:
        import transformers
    except ImportError:
        return None
    hf_config = transformers.LlamaConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads, num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim, rope_theta=config.rope_theta, rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=PEER_CONTEXT + 64, tie_word_embeddings=config.tie_word_embeddings,
    )
    with torch.device("cuda"):
        hf = transformers.LlamaForCausalLM(hf_config).to(torch.bfloat16)
    return hf.eval()


def _hf_decode_ms(hf, batch: int, context: int, vocab: int, extra: int = 32) -> float:
    """Per-token time of transformers' static-cache generate: (time for 1 + extra new tokens
    minus time for 1) / extra, so the prefill cancels."""
    ids = torch.randint(0, vocab, (batch, context), device="cuda")

    def run(new: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, cache_implementation="static", pad_token_id=0)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    run(1 + extra)  # warm-up
    return statistics.median(run(1 + extra) - run(1) for _ in range(3)) / extra


def _measure(rec: Record, name: str, model: Transformer, bar) -> None:
    c = model.config
    linear = c.num_matmul_params
    weight_bytes = 2 * linear
    prefills, batches, contexts, peers = PLAN[name]
    for s in prefills:
        ids = torch.randint(0, c.vocab_size, (s,), device="cuda")
        cache = model.new_cache(1, s, block_size=BLOCK_SIZE)

        def prefill(ids=ids, cache=cache):
            cache.length = 0
            model.prefill([ids], cache)

        ms = cuda_time_ms(prefill, [()], warmup=3, rep=10)
        flops = 2 * linear * s + attention_flops(c, 1, s, s)
        rec.add("prefill", f"model={name},B=1,S={s}", "bf16", "llmnote", ms, flops, weight_bytes + kv_bytes(c, 1, s))
        bar.update()
        del cache
    for b in batches:
        for t in contexts:
            cache = filled_cache(model, b, t)
            token = torch.randint(0, c.vocab_size, (b,), device="cuda")
            flops = 2 * linear * b + attention_flops(c, b, 1, t + 1)
            nbytes = weight_bytes + kv_bytes(c, b, t + 1)
            for provider, graph_calls in (("llmnote-eager", 0), ("llmnote-cudagraph", 1)):
                ms = cuda_time_ms(model.decode, [(token, cache)], warmup=3, rep=30, graph_calls=graph_calls)
                rec.add("decode", f"model={name},B={b},T={t}", "bf16", provider, ms, flops, nbytes)
                bar.update()
            del cache
    if peers:
        hf = _hf_model(c)
        for b in peers if hf is not None else []:
            t = PEER_CONTEXT
            ms = _hf_decode_ms(hf, b, t, c.vocab_size)
            rec.add("decode", f"model={name},B={b},T={t}", "bf16", "hf-transformers", ms,
                    2 * linear * b + attention_flops(c, b, 1, t + 1), weight_bytes + kv_bytes(c, b, t + 1))
            bar.update()
        del hf
        torch.cuda.empty_cache()
    for t in _ends(contexts):  # the next token without a cache: the whole sequence again
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
    names = models or list(PLAN)
    unknown = sorted(set(names) - set(PLAN))
    if unknown:
        raise ValueError(f"unknown models {unknown}; choose from {sorted(PLAN)}")
    rec = Record()
    total = sum(len(p[0]) + 2 * len(p[1]) * len(p[2]) + len(p[3]) + len(_ends(p[2])) + 2 for n, p in PLAN.items() if n in names)
    with tqdm(total=total, desc="decode") as bar, torch.no_grad():
        _copy_tbps(rec)
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
