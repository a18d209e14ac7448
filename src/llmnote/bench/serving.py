"""The serving benchmark (``run_serving``; it joins ``python -m llmnote.bench`` with its first record).

- **throughput**: nano-vllm's published offline workload, a Qwen3-0.6B-shaped model with random
  weights, 256 requests of random tokens, prompts of 100 to 1024 tokens, 100 to 1024 new tokens
  each (``ignore_eos``), seed 0. ``median_ms`` is the whole run's wall time. Providers:
  ``llmnote`` (``LLM.generate``) and ``hf-transformers`` (transformers' continuous batching with
  paged attention, the same prompts and per-request lengths). The llmnote row's bytes are what
  every step had to read (every weight once, plus each sequence's keys and values), so its rate
  against the copy bandwidth is the fraction of the run's memory-traffic bound.
- **decode**: batch-1 ``LLM.generate`` on a Llama-3.2-1B shape (untied head): 128-token prompt,
  512 new tokens; time per output token, against transformers' static-cache ``generate``.
- **speculative**: ``llmnote-draft`` proposing for ``llmnote-tiny``, batch 1, greedy, on held-out
  text: time per output token without speculation and with ``k`` drafts a round for each ``k``
  of ``SPECULATIVE_KS``, and the acceptance rate of each.
- **http**: the server under load (:mod:`llmnote.bench.serving_http`), on the throughput model.

Both models of a comparison load the same checkpoint, written once into a temporary directory
(transformers' own model classes, random weights, a synthetic word-level tokenizer).
"""

from __future__ import annotations

import gc
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..models import ModelConfig
from ..paths import models_dir
from ..records import Record
from .decode import SHAPES, kv_bytes

__all__ = ["PARTS", "QWEN3_0_6B", "THROUGHPUT", "random_checkpoint", "run_serving", "throughput_workload"]

QWEN3_0_6B = ModelConfig(
    model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
    num_kv_heads=8, head_dim=128, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, qk_norm=True,
    max_position_embeddings=40960, dtype="bfloat16",
)  # fmt: skip
THROUGHPUT = dict(num=256, prompt=(100, 1024), output=(100, 1024), seed=0)
THROUGHPUT_CASE = "Qwen3-0.6B,256 requests,in 100-1024,out 100-1024"
DECODE = dict(prompt=128, new=512)
PARTS = ("throughput", "decode", "speculative", "http")
SPECULATIVE_KS = (1, 2, 3, 4)


def _hf_config(config: ModelConfig):
    import transformers

    common = dict(vocab_size=config.vocab_size, hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                  num_hidden_layers=config.num_layers, num_attention_heads=config.num_heads,
                  num_key_value_heads=config.num_kv_heads, head_dim=config.head_dim, rope_theta=config.rope_theta,
                  rms_norm_eps=config.rms_norm_eps, max_position_embeddings=config.max_position_embeddings,
                  tie_word_embeddings=config.tie_word_embeddings, bos_token_id=0, eos_token_id=1)  # fmt: skip
    cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[config.model_type]
    return cls(**common)


def synthetic_tokenizer(vocab_size: int):
    """A word-level tokenizer whose token ``i`` is the word ``t{i}``: enough to detokenize
    random token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return tok


def random_checkpoint(config: ModelConfig, path: str | Path, seed: int = 0) -> Path:
    """Write a Hugging Face checkpoint of this shape with N(0, 0.02) weights into ``path``."""
    import transformers

    path = Path(path)
    torch.manual_seed(seed)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(_hf_config(config))
    hf = hf.to_empty(device="cpu").to(torch.bfloat16)
    hf.tie_weights()  # to_empty gives the head its own storage: tie it to the embedding again
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.02) if p.dim() >= 2 else p.fill_(1.0)
    hf.save_pretrained(path)
    synthetic_tokenizer(config.vocab_size).save(str(path / "tokenizer.json"))
    return path


def throughput_workload(num: int, prompt: tuple[int, int], output: tuple[int, int], seed: int,
                        vocab: int = 10000) -> tuple[list[list[int]], list[int]]:  # fmt: skip
    """Random prompts (token ids below ``vocab``) and output lengths, as nano-vllm's benchmark draws them."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*prompt))] for _ in range(num)]
    return prompts, [rng.randint(*output) for _ in range(num)]


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _release() -> None:
    """Give a deleted model's memory back before the next one loads."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _traffic(engine, config: ModelConfig, elem: int = 2) -> int:
    """Bytes the run's steps had to read: every matrix weight once a step, and the keys and
    values of every sequence in the step up to its last token."""
    weights = elem * config.num_matmul_params
    return sum(weights + kv_bytes(config, 1, s["context_tokens"], elem) for s in engine.step_log)


def _phases(step_log) -> str:
    """Where a run's steps spent their time, from the engine's step log (host clocks; the model
    phase ends when the sampled tokens reach the host, so it holds the GPU's work)."""
    log = list(step_log)
    mean = lambda a, b: sum(s[b] - s[a] for s in log) / len(log) * 1e3  # noqa: E731
    decode = sum(s["decode_only"] for s in log)
    return (f"  {len(log)} steps ({decode} decode-only), {sum(s['seqs'] for s in log) / len(log):.0f} sequences a step; "
            f"ms a step: scheduling {mean('start', 'scheduled'):.2f}, model and sampling {mean('scheduled', 'ran'):.2f}, "
            f"outputs {mean('ran', 'end'):.2f}")  # fmt: skip


def engine_run(ckpt: Path, config: ModelConfig, prompts, lengths, device, dtype: torch.dtype = torch.bfloat16,
               tp: int = 1) -> tuple[float, list[list[int]], int, list[dict]]:  # fmt: skip
    """One timed offline run of the engine on ``prompts`` with ``lengths`` new tokens each (greedy,
    ``ignore_eos``), split over ``tp`` processes: ``(seconds, each output's token ids, bytes the
    steps had to read, the step log)``, after a short warm-up (graph capture, first kernels)."""
    from ..engine import LLM, SamplingParams

    longest = max(len(p) for p in prompts) + max(lengths)
    with LLM(ckpt, device=device, dtype=dtype, tensor_parallel_size=tp,
             max_model_len=min(4096, config.max_position_embeddings, longest + 64)) as llm:  # fmt: skip
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
        llm.generate(prompts[:4], [SamplingParams(max_tokens=8, ignore_eos=True)] * 4, use_tqdm=False)  # warm-up
        llm.engine.step_log.clear()
        _sync()
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        _sync()
        seconds = time.perf_counter() - start
        traffic = _traffic(llm.engine, config, torch.empty((), dtype=dtype).element_size())
        log = list(llm.engine.step_log)
    del llm  # its KV pool goes back before the next engine sizes its own from the free memory
    _release()
    return seconds, [o.token_ids for o in outs], traffic, log


def _llmnote_throughput(rec: Record, ckpt: Path, config: ModelConfig, prompts, lengths, device, copy_tbps) -> None:
    wall, token_ids, nbytes, log = engine_run(ckpt, config, prompts, lengths, device)
    assert [len(t) for t in token_ids] == lengths
    tokens = sum(len(p) for p in prompts) + sum(lengths)
    row = rec.add("serving", THROUGHPUT_CASE if len(prompts) == THROUGHPUT["num"] else f"{len(prompts)} requests", "bf16",
                  "llmnote", wall * 1e3, 2 * config.num_matmul_params * tokens, nbytes)  # fmt: skip
    print(f"llmnote: {sum(lengths) / wall:.0f} output tok/s, {len(log)} steps"
          + (f", {row['tbps'] / copy_tbps:.0%} of the memory-traffic bound" if copy_tbps else ""))
    print(_phases(log))


def _hf_continuous(rec: Record, ckpt: Path, config: ModelConfig, prompts, lengths, device, case: str) -> None:
    """transformers' continuous batching (paged attention) on the same requests."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, attn_implementation="paged|sdpa")
    hf = hf.to(device).eval()
    gen = transformers.GenerationConfig(max_new_tokens=max(lengths), do_sample=False, eos_token_id=None, pad_token_id=0)
    manager = hf.init_continuous_batching(generation_config=gen)
    manager.start()
    try:
        _sync()
        start = time.perf_counter()
        ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(prompts, lengths)]
        got = {}
        while len(got) < len(ids):
            out = manager.get_result(timeout=600)
            if out is not None and out.request_id in ids:
                got[out.request_id] = out
        _sync()
        wall = time.perf_counter() - start
    finally:
        manager.stop(block=True)
    assert sorted(len(o.generated_tokens) for o in got.values()) == sorted(lengths)
    tokens = sum(len(p) for p in prompts) + sum(lengths)
    rec.add("serving", case, "bf16", "hf-transformers", wall * 1e3, 2 * config.num_matmul_params * tokens)
    print(f"hf-transformers: {sum(lengths) / wall:.0f} output tok/s")
    del hf, manager
    _release()


def _decode_batch1(rec: Record, ckpt: Path, config: ModelConfig, device, prompt_len: int, new: int) -> None:
    """Time per output token of one request through ``LLM.generate``, and through transformers'
    static-cache ``generate`` (both include the prefill; it is 1/new of the time)."""
    import transformers

    from ..engine import LLM, SamplingParams

    rng = random.Random(1)
    prompt = [rng.randrange(min(10000, config.vocab_size)) for _ in range(prompt_len)]
    llm = LLM(ckpt, device=device, dtype=torch.bfloat16, max_num_seqs=8, max_model_len=prompt_len + new + 16)
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    llm.generate([prompt], params, use_tqdm=False)
    times = []
    for _ in range(3):
        _sync()
        start = time.perf_counter()
        llm.generate([prompt], params, use_tqdm=False)
        _sync()
        times.append((time.perf_counter() - start) / new * 1e3)
    case = f"{'Llama-3.2-1B' if config.num_layers == 16 else 'model'},batch=1"
    nbytes = 2 * config.num_matmul_params + kv_bytes(config, 1, prompt_len + new // 2)
    rec.add("decode", case, "bf16", "llmnote", statistics.median(times), 2 * config.num_matmul_params, nbytes)
    del llm
    _release()
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16).to(device).eval()
    ids = torch.tensor([prompt], device=device)
    times = []
    for i in range(4):
        _sync()
        start = time.perf_counter()
        hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, cache_implementation="static", pad_token_id=0)
        _sync()
        if i:  # the first call compiles and warms up
            times.append((time.perf_counter() - start) / new * 1e3)
    rec.add("decode", case, "bf16", "hf-transformers", statistics.median(times), 2 * config.num_matmul_params, nbytes)
    del hf
    _release()


def _speculative(rec: Record, device, ks: tuple[int, ...], prompts: int, new: int) -> None:
    """Batch-1 greedy decoding of llmnote-tiny without speculation, then with llmnote-draft
    proposing ``k`` tokens a round for each ``k`` in ``ks``."""
    from ..engine import LLM, SamplingParams
    from ..models import load_tokenizer
    from ..quant.eval import heldout_ids

    held = heldout_ids(load_tokenizer(models_dir() / "llmnote-tiny"), max_tokens=prompts * 64)
    texts = [held[i * 64 : i * 64 + 48].tolist() for i in range(prompts)]
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
    outputs, ms = {}, {}
    runs = [("llmnote", 0)] + [(f"llmnote-spec-k{k}", k) for k in ks]
    for provider, k in runs:
        extra = {"speculative_model": models_dir() / "llmnote-draft", "num_speculative_tokens": k} if k else {}
        llm = LLM(models_dir() / "llmnote-tiny", device=device, dtype=torch.bfloat16, max_num_seqs=4, **extra)
        llm.generate([texts[0]], params, use_tqdm=False)  # warm-up
        if k:
            llm.engine.spec.proposed = llm.engine.spec.accepted = 0
        _sync()
        start = time.perf_counter()
        outputs[provider] = [llm.generate([t], params, use_tqdm=False)[0].token_ids for t in texts]
        _sync()
        ms[provider] = (time.perf_counter() - start) / (prompts * new) * 1e3
        case = f"llmnote-tiny,batch=1,k={k},acceptance={llm.engine.spec.acceptance_rate:.3f}" if k else "llmnote-tiny,batch=1"
        rec.add("speculative", case, "bf16", provider, ms[provider])
        del llm
        _release()
    # Exactly equal in float32 (tests/test_engine.py). In bf16 the verifying pass (k + 1 tokens in
    # one pass) rounds differently from one-token decode steps, so a near-tie between two tokens
    # can fall the other way and the two texts part from there.
    for provider, k in runs[1:]:
        pairs = zip(outputs["llmnote"], outputs[provider])
        same = [next((i for i, (a, b) in enumerate(zip(p, q)) if a != b), len(p)) for p, q in pairs]
        print(f"speculative k={k}: {ms['llmnote'] / ms[provider]:.2f}x; identical outputs {sum(n == new for n in same)}"
              f" of {len(same)}, first difference after {statistics.mean(same):.0f} of {new} tokens on average")


def run_serving(smoke: bool = False, parts: tuple[str, ...] = PARTS, out_dir: Path | None = None) -> Record:
    """The serving suite on the GPU, the ``parts`` of :data:`PARTS` named; ``smoke`` runs every
    part at toy sizes (a CPU will do) to check the harness. ``out_dir``: where the HTTP runs'
    reports and plots go (default: none kept)."""
    from .decode import _copy_tbps
    from .serving_http import run_http

    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts {sorted(unknown)}; the parts are {', '.join(PARTS)}")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if not smoke and device != "cuda":
        raise RuntimeError("the serving benchmark needs a CUDA GPU (smoke=True runs it at toy sizes)")
    rec = Record()
    copy_tbps = _copy_tbps(rec) if device == "cuda" else None
    small = ModelConfig(model_type="qwen3", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=16, qk_norm=True, tie_word_embeddings=True, max_position_embeddings=256,
                        dtype="bfloat16")  # fmt: skip
    big, decode_shape = (small, small) if smoke else (QWEN3_0_6B, SHAPES["llama-3.2-1b"])
    work = dict(num=6, prompt=(5, 40), output=(3, 20), seed=0) if smoke else THROUGHPUT
    with tempfile.TemporaryDirectory() as tmp, tqdm(total=len(parts), desc="serving") as bar:
        ckpt = random_checkpoint(big, Path(tmp) / "throughput")
        if "throughput" in parts:
            prompts, lengths = throughput_workload(**work, vocab=min(10000, big.vocab_size))
            _llmnote_throughput(rec, ckpt, big, prompts, lengths, device, copy_tbps)
            case = THROUGHPUT_CASE if not smoke else f"{len(prompts)} requests"
            _hf_continuous(rec, ckpt, big, prompts, lengths, device, case)
            bar.update()
        if "decode" in parts:
            path = ckpt if smoke else random_checkpoint(decode_shape, Path(tmp) / "decode")
            _decode_batch1(rec, path, decode_shape, device, *((16, 12) if smoke else (DECODE["prompt"], DECODE["new"])))
            bar.update()
        if "speculative" in parts:
            _speculative(rec, device, ks=(2,) if smoke else SPECULATIVE_KS, prompts=2 if smoke else 8, new=8 if smoke else 96)
            bar.update()
        if "http" in parts:
            run_http(rec, ckpt, out_dir, smoke=smoke, vocab=min(10000, big.vocab_size))
            bar.update()
    return rec
