"""Quantize a checkpoint with one method and measure its perplexity on held-out text.

``python -m llmnote.quant eval MODEL_DIR --method {none,rtn,awq,gptq,smoothquant,fp8}``: the
model is loaded, quantized (calibrating on the corpus's training split where the method
needs it: AWQ, GPTQ, SmoothQuant), and evaluated on the held-out split. Weight-only methods
(RTN, AWQ, GPTQ) store ``bits``-bit codes in groups of ``group_size``; SmoothQuant is W8A8
(INT8 weights per row, INT8 activations per token, after smoothing); FP8 is W8A8 in E4M3 with
per-row weight scales and per-token activation scales.
"""

from __future__ import annotations

import math
from itertools import accumulate
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import corpus
from ..models import load_model, load_tokenizer
from .apply import Scaled, WeightOnly, quantizable_linears, set_quantized, swap_methods
from .calibrate import check_quantizable

__all__ = ["METHODS", "WEIGHT_ONLY", "perplexity", "heldout_ids", "check_method", "quantize", "run_eval"]

METHODS = ("none", "rtn", "awq", "gptq", "smoothquant", "fp8")
WEIGHT_ONLY = ("rtn", "awq", "gptq")  # the methods that take --bits and --group-size


def heldout_ids(tokenizer, max_tokens: int | None = None, split: str = "heldout") -> torch.Tensor:
    """The split's documents as one 1-D tensor of token ids (the first ``max_tokens``)."""
    docs = corpus.load_split(split)
    if max_tokens:  # encode only the first documents: a token is at most a few characters
        chars = accumulate(len(d.text) for d in docs)
        docs = docs[: next((i + 1 for i, c in enumerate(chars) if c > 8 * max_tokens), len(docs))]
    ids = corpus.encode_documents(tokenizer, docs)
    return ids[:max_tokens] if max_tokens else ids


@torch.no_grad()
def perplexity(
    model: torch.nn.Module, ids: torch.Tensor, seq_len: int = 256, batch_size: int = 16, progress: bool = True
) -> float:
    """exp(mean next-token cross-entropy) over non-overlapping windows of ``seq_len`` tokens."""
    n = (ids.numel() - 1) // seq_len
    if n < 1:
        raise ValueError(f"{ids.numel()} tokens do not fill one window of {seq_len}")
    device = next(model.parameters()).device
    windows = ids[: n * seq_len + 1].unfold(0, seq_len + 1, seq_len)  # (n, seq_len + 1), overlapping by one
    total, count = 0.0, 0
    for chunk in tqdm(windows.split(batch_size), desc="perplexity", disable=not progress, leave=False):
        chunk = chunk.to(device)
        logits = model(chunk[:, :-1]).float()
        total += float(torch.nn.functional.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum"))
        count += chunk[:, 1:].numel()
    return math.exp(total / count)


def check_method(model: torch.nn.Module, method: str, bits: int, group_size: int) -> None:
    """Clear errors, before any work, for a method, bit width or group size this model cannot take."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}; got {method!r}")
    if method in WEIGHT_ONLY:
        check_quantizable(model, bits, group_size)


def quantize(model: torch.nn.Module, method: str, bits: int = 4, group_size: int = 128, calib: torch.Tensor | None = None,
             progress: bool = True) -> torch.nn.Module:
    """Quantize ``model`` in place with ``method``; ``calib`` (n, seq_len) are the calibration
    windows that AWQ, GPTQ and SmoothQuant need."""
    check_method(model, method, bits, group_size)
    if method in ("awq", "gptq", "smoothquant") and calib is None:
        raise ValueError(f"{method} needs calibration ids")
    if method == "rtn":
        swap_methods(model, lambda name, layer: WeightOnly(bits, group_size))
    elif method in ("awq", "gptq"):
        if method == "gptq":
            from .gptq import gptq_model

            found = gptq_model(model, calib, bits, group_size, progress=progress)
        else:
            from .awq import awq_model

            found = awq_model(model, calib, bits, group_size, progress=progress)  # folds its scales into the model
        swap_methods(model, lambda name, layer: WeightOnly(bits, group_size) if name in found else None)
        for name, layer in quantizable_linears(model).items():
            if name in found:
                set_quantized(layer, found[name].to(layer.qweight.device))
    elif method == "smoothquant":
        from .smoothquant import smooth_model

        smooth_model(model, calib, progress=progress)
        swap_methods(model, lambda name, layer: Scaled("int8", "row"))
    elif method == "fp8":
        swap_methods(model, lambda name, layer: Scaled("fp8", "row"))
    return model


def run_eval(model_dir: str | Path, method: str = "none", bits: int = 4, group_size: int = 128,
             max_eval_tokens: int | None = 32768, calib_tokens: int = 16384, seq_len: int = 256,
             device: str | None = None, progress: bool = True) -> dict:
    """Load, quantize and evaluate: ``{"method", "bits", "group_size", "perplexity"}``."""
    model = load_model(model_dir, device=device or "cpu", dtype=torch.float32)
    seq_len = min(seq_len, model.config.max_position_embeddings - 1)
    check_method(model, method, bits, group_size)
    tokenizer = load_tokenizer(model_dir)
    calib = None
    if method in ("awq", "gptq", "smoothquant"):
        from .calibrate import calibration_ids

        calib = calibration_ids(tokenizer, num_tokens=calib_tokens, seq_len=seq_len)
    quantize(model, method, bits, group_size, calib, progress=progress)
    ppl = perplexity(model, heldout_ids(tokenizer, max_eval_tokens), seq_len, progress=progress)
    weight_only = method in WEIGHT_ONLY
    return {
        "method": method,
        "bits": bits if weight_only else (8 if method in ("smoothquant", "fp8") else 32),
        "group_size": group_size if weight_only else None,
        "perplexity": ppl,
    }
