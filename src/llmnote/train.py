"""``python -m llmnote.train``: train the project's tiny Llama-architecture models.

The model is :class:`llmnote.models.Transformer`, the same code the book reads and runs,
trained from scratch on the public-domain corpus of :mod:`llmnote.corpus` with a
byte-level BPE tokenizer. The recipe is the usual one for small GPT-style models
(nanoGPT, the Chinchilla-era papers): AdamW with betas (0.9, 0.95), weight decay on the
matrices only, linear warm-up then cosine decay to a tenth of the peak learning rate,
gradient clipping at 1, bf16 autocast on a GPU, residual dropout. Every ``eval_every``
steps the loss on the validation split is measured; the weights with the lowest one are
exported in Hugging Face format (:mod:`llmnote.hf_export`: ``config.json``,
``model.safetensors``, ``tokenizer.json``), with ``training.json`` (loss curves, held-out
perplexity against a unigram baseline, throughput) beside them.

Training is seeded and resumable: ``--resume`` continues from ``train_state.pt`` in the
output folder and gives the same weights as an uninterrupted run.

    python -m llmnote.train --preset tiny --out assets/models/llmnote-tiny
    python -m llmnote.train --preset draft --out assets/models/llmnote-draft \\
        --tokenizer assets/models/llmnote-tiny/tokenizer.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from tqdm.auto import tqdm

from . import corpus
from .hf_export import export_hf
from .models import ModelConfig, Transformer

__all__ = ["TrainConfig", "PRESETS", "train", "evaluate"]

STATE_FILE = "train_state.pt"


@dataclass(frozen=True)
class TrainConfig:
    # the model (Llama architecture, tied embeddings)
    vocab_size: int = 4096
    hidden_size: int = 384
    intermediate_size: int = 1024
    num_layers: int = 6
    num_heads: int = 6
    num_kv_heads: int = 2
    rope_theta: float = 10000.0
    # the optimisation
    seq_len: int = 512
    batch_size: int = 64
    steps: int = 2000
    lr: float = 2e-3
    warmup: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    dropout: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    # bookkeeping
    eval_every: int = 100
    log_every: int = 10
    save_every: int = 500
    max_chars: int = 0  # > 0: use only this many characters of training text (smoke runs)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "num_layers", "seq_len", "batch_size", "steps", "eval_every", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_heads ({self.num_heads})")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    def model_config(self) -> ModelConfig:
        return ModelConfig(
            model_type="llama",
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.hidden_size // self.num_heads,
            rms_norm_eps=1e-5,
            rope_theta=self.rope_theta,
            tie_word_embeddings=True,
            max_position_embeddings=self.seq_len,
            dtype="bfloat16",
        )


PRESETS = {
    # ~11M parameters: 6 layers, d=384, GQA with 6 query and 2 KV heads of 64. Of the two
    # runs made (dropout 0.1 for 2000 steps, 0.2 for 3000), this one had the lower
    # validation loss; it stops improving after ~1100 steps (~13 passes over the text).
    "tiny": TrainConfig(steps=3000, dropout=0.2),
    # ~0.9M parameters, same tokenizer: a draft model for speculative decoding.
    "draft": TrainConfig(hidden_size=128, intermediate_size=384, num_layers=2, num_heads=2, num_kv_heads=1, lr=3e-3, dropout=0.0),
    # seconds on a CPU: what the unit tests run
    "smoke": TrainConfig(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seq_len=32,
        batch_size=4,
        steps=20,
        warmup=4,
        lr=3e-3,
        eval_every=10,
        log_every=2,
        save_every=10,
        max_chars=60_000,
    ),
}


def _lr(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def _init_weights(model: Transformer, std: float = 0.02) -> None:
    """GPT-2's initialisation: N(0, 0.02) for every matrix, the residual-branch outputs
    (o_proj, down_proj) scaled by 1/sqrt(2 * layers) so the residual stream does not grow
    with depth; RMSNorm weights start at one."""
    depth_scale = 1 / math.sqrt(2 * model.config.num_layers)
    for name, p in model.named_parameters():
        if p.dim() == 2:
            residual = name.endswith(("o_proj.weight", "down_proj.weight"))
            nn.init.normal_(p, 0.0, std * (depth_scale if residual else 1.0))


def _add_residual_dropout(model: Transformer, p: float) -> None:
    """Dropout on each attention and MLP output before it joins the residual stream, added
    with hooks so that the inference code stays free of training-only branches."""
    if p <= 0:
        return
    for layer in model.model.layers:
        for block in (layer.self_attn, layer.mlp):
            block.register_forward_hook(lambda module, args, out: F.dropout(out, p, module.training))


def _windows(ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping ``(n, seq_len + 1)`` windows covering ``ids`` (inputs and shifted targets)."""
    n = (ids.numel() - 1) // seq_len
    if n < 1:
        raise ValueError(f"{ids.numel()} tokens do not fill one window of {seq_len}")
    idx = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)
    return ids[idx]


@torch.no_grad()
def evaluate(model: Transformer, ids: torch.Tensor, seq_len: int, batch_size: int = 64) -> float:
    """Mean next-token cross-entropy (nats) over ``ids``, cut into windows of ``seq_len``."""
    was_training = model.training
    model.eval()
    device = model.lm_head.weight.device
    windows = _windows(ids, seq_len)
    total, count = 0.0, 0
    for chunk in windows.split(batch_size):
        chunk = chunk.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(chunk[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
        total += float(loss)
        count += chunk[:, 1:].numel()
    model.train(was_training)
    return total / count


def _load_text(cfg: TrainConfig) -> dict[str, list[corpus.Document]]:
    splits = {name: corpus.load_split(name) for name in corpus.SPLITS}
    if cfg.max_chars:  # the first works only, each split in proportion
        for name, docs in splits.items():
            budget = cfg.max_chars if name == "train" else max(cfg.max_chars // 10, 4 * cfg.seq_len * 8)
            kept = []
            for doc in docs:
                kept.append(corpus.Document(doc.title, doc.source, doc.text[:budget]))
                budget -= len(kept[-1].text)
                if budget <= 0:
                    break
            splits[name] = kept
    return splits


def _rng_state() -> dict:
    state = {"cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def train(
    cfg: TrainConfig,
    out: str | Path,
    tokenizer_file: str | Path | None = None,
    device: str | torch.device | None = None,
    resume: bool = False,
    progress: bool = True,
    stop_after: int | None = None,
) -> dict:
    """Train, export the best-validation weights to ``out`` and return the training record.

    ``stop_after=n`` stops after ``n`` steps of this call (a time-boxed job), leaving the
    state to ``resume`` from, and returns ``{"stopped_at": step}``."""
    from tokenizers import Tokenizer

    from . import runtime

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(device) if device is not None else runtime.device()
    state_path = out / STATE_FILE
    saved = None
    if resume:
        if not state_path.exists():
            raise FileNotFoundError(f"--resume: no {STATE_FILE} in {out}")
        saved = torch.load(state_path, map_location="cpu", weights_only=False)
        if saved["config"] != asdict(cfg):
            changed = sorted(k for k in saved["config"] if saved["config"][k] != asdict(cfg).get(k))
            raise ValueError(f"--resume with a different configuration (changed: {', '.join(changed)})")

    torch.manual_seed(cfg.seed)
    text = _load_text(cfg)
    if saved is not None:
        tokenizer = Tokenizer.from_str(saved["tokenizer"])
    elif tokenizer_file is not None:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    else:
        tokenizer = corpus.train_tokenizer((d.text for d in text["train"]), cfg.vocab_size)
    if tokenizer.get_vocab_size() != cfg.vocab_size:
        raise ValueError(f"the tokenizer has {tokenizer.get_vocab_size()} tokens, the configuration {cfg.vocab_size}")
    ids = {name: corpus.encode_documents(tokenizer, docs) for name, docs in text.items()}

    model = Transformer(cfg.model_config()).to(device)
    _init_weights(model)
    _add_residual_dropout(model, cfg.dropout)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": cfg.weight_decay}, {"params": vectors, "weight_decay": 0.0}],
        lr=cfg.lr,
        betas=(0.9, 0.95),
        fused=device.type == "cuda",
    )
    batches = torch.Generator().manual_seed(cfg.seed)
    log = {"train_loss": [], "valid_loss": []}
    best = {"valid_loss": math.inf, "step": 0, "weights": None}
    start, elapsed = 0, 0.0
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        batches.set_state(saved["batches"])
        torch.random.set_rng_state(saved["rng"]["cpu"])
        if "cuda" in saved["rng"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(saved["rng"]["cuda"])
        log, best, start, elapsed = saved["log"], saved["best"], saved["step"], saved["elapsed_s"]

    def save_state(step: int) -> None:
        state = {
            "config": asdict(cfg),
            "tokenizer": tokenizer.to_str(),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "batches": batches.get_state(),
            "rng": _rng_state(),
            "log": log,
            "best": best,
            "step": step,
            "elapsed_s": elapsed,
        }
        torch.save(state, state_path.with_suffix(".tmp"))
        state_path.with_suffix(".tmp").replace(state_path)  # never leave a half-written state

    train_ids, n = ids["train"], ids["train"].numel() - cfg.seq_len - 1
    if n < 1:
        raise ValueError(f"the training text ({train_ids.numel()} tokens) is shorter than one sequence of {cfg.seq_len}")
    offsets = torch.arange(cfg.seq_len + 1)
    model.train()
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc="train", disable=not progress)
    tic = time.perf_counter()
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = _lr(cfg, step)
        starts = torch.randint(0, n, (cfg.batch_size,), generator=batches)
        batch = train_ids[starts[:, None] + offsets].to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done = step + 1
        if done % cfg.log_every == 0 or done == cfg.steps:
            log["train_loss"].append([done, loss.item()])
            bar.set_postfix(loss=f"{log['train_loss'][-1][1]:.3f}")
        if done % cfg.eval_every == 0 or done == cfg.steps:
            valid = evaluate(model, ids["valid"], cfg.seq_len)
            log["valid_loss"].append([done, valid])
            if valid < best["valid_loss"]:
                best = {
                    "valid_loss": valid,
                    "step": done,
                    "weights": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                }
        stop = stop_after is not None and done - start >= stop_after
        if done % cfg.save_every == 0 or done == cfg.steps or stop:
            elapsed += time.perf_counter() - tic
            tic = time.perf_counter()
            save_state(done)
        if stop and done < cfg.steps:
            bar.close()
            return {"stopped_at": done}
    bar.close()

    model.load_state_dict(best["weights"])
    export_hf(model, tokenizer, out)
    heldout_loss = evaluate(model, ids["heldout"], cfg.seq_len)
    heldout_bytes = sum(len(d.text.encode()) for d in text["heldout"])
    scored = _windows(ids["heldout"], cfg.seq_len)[:, 1:].numel()
    record = {
        "config": asdict(cfg),
        "parameters": model.config.num_params,
        "corpus": {name: {"documents": len(text[name]), "tokens": ids[name].numel()} for name in text},
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "train_seconds": round(elapsed, 1),
        "tokens_per_second": round(cfg.steps * cfg.batch_size * cfg.seq_len / max(elapsed, 1e-9)),
        "best_step": best["step"],
        "valid_loss": best["valid_loss"],
        "heldout_loss": heldout_loss,
        "heldout_perplexity": math.exp(heldout_loss),
        # nats/token -> bits per UTF-8 byte, comparable across tokenizers (approximately:
        # the windows score all but the last few tokens of the held-out stream)
        "heldout_bits_per_byte": heldout_loss * ids["heldout"].numel() / (heldout_bytes * math.log(2)),
        "heldout_tokens_scored": scored,
        "unigram_heldout_perplexity": corpus.unigram_perplexity(ids["train"], ids["heldout"], cfg.vocab_size),
        "curves": log,
    }
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m llmnote.train", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--out", type=Path, required=True, help="output folder (the Hugging Face checkpoint)")
    parser.add_argument("--tokenizer", type=Path, default=None, help="reuse this tokenizer.json instead of training one")
    parser.add_argument("--device", default=None)
    parser.add_argument("--resume", action="store_true", help=f"continue from OUT/{STATE_FILE}")
    parser.add_argument("--stop-after", type=int, default=None, help="stop after this many steps, resumable")
    for f in fields(TrainConfig):
        parser.add_argument(
            f"--{f.name.replace('_', '-')}", type=type(f.default), default=None, help=f"override the preset's {f.name}"
        )
    args = parser.parse_args(argv)
    overrides = {f.name: getattr(args, f.name) for f in fields(TrainConfig) if getattr(args, f.name) is not None}
    try:
        cfg = replace(PRESETS[args.preset], **overrides)
        record = train(cfg, args.out, args.tokenizer, args.device, args.resume, stop_after=args.stop_after)
    except (ValueError, FileNotFoundError) as err:
        parser.exit(2, f"error: {err}\n")
    if "stopped_at" in record:
        print(f"stopped at step {record['stopped_at']} of {cfg.steps}; continue with --resume")
        return 0
    print(
        f"{record['parameters'] / 1e6:.2f}M parameters, best step {record['best_step']}: held-out perplexity "
        f"{record['heldout_perplexity']:.1f} (unigram {record['unigram_heldout_perplexity']:.1f}), "
        f"{record['heldout_bits_per_byte']:.3f} bits/byte; {record['tokens_per_second']:,} tokens/s; wrote {args.out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
