"""Calibration: the activations a quantizer looks at before it rounds a weight.

RTN rounds each weight on its own. The methods of this chapter look at what the weights are
*multiplied by*. For a Linear ``y = x W^T`` quantized to ``Ŵ``, the error of its outputs over
calibration tokens ``X`` (one row per token) is

    ||X W^T - X Ŵ^T||_F^2 = trace((W - Ŵ) X^T X (W - Ŵ)^T),

so everything a quantizer needs to know about its inputs fits in a few per-layer statistics,
gathered in one pass over a few thousand tokens of text:

- ``X^T X`` (``K x K``): the (unnormalised) Hessian of that squared error with respect to each
  row of ``W``, which GPTQ (Frantar et al. 2022) inverts and AWQ (Lin et al. 2023) scores with;
- the mean ``|x_k|`` of every input channel, AWQ's measure of which weights matter;
- the max ``|x_k|`` of every input channel: the outlier channels that SmoothQuant (Xiao et al.
  2022) moves into the weights, and the book's outlier heatmap.

Statistics come from forward *pre-hooks* on the model's Linears, which see each layer's input.
:class:`HiddenStates` runs a model one decoder layer at a time instead, for the methods that
quantize layer ``i`` and then feed its quantized outputs to layer ``i + 1``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn as nn
from tqdm.auto import tqdm

from ..corpus import EOS, load_split
from ..layers import AttentionContext, Dense, Linear
from .formats import check_group

__all__ = [
    "calibration_ids",
    "linear_names",
    "layer_linears",
    "check_quantizable",
    "InputStats",
    "recording",
    "input_stats",
    "activation_absmax",
    "capture_inputs",
    "HiddenStates",
]

CHARS_PER_WINDOW_TOKEN = 16  # characters cut for each wanted token: far more than English text needs


def calibration_ids(tokenizer, num_tokens: int = 16384, seq_len: int = 256, split: str = "train", seed: int = 0) -> torch.Tensor:
    """``ceil(num_tokens / seq_len)`` windows of ``seq_len`` tokens, ``(n, seq_len)`` int64, taken
    at random (seeded) places in the corpus split ``split``.

    Each window is cut from a slice of the split's text (documents joined by ``EOS``, as
    :func:`~llmnote.corpus.encode_documents` joins them) that starts at a random character and is
    encoded on its own; its first token is dropped, since the slice may begin inside a word.
    ``tokenizer`` is a ``tokenizers.Tokenizer`` (as :func:`~llmnote.models.load_tokenizer` returns).
    """
    if not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens must be a positive int, got {num_tokens!r}")
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    text = "".join(doc.text + EOS for doc in load_split(split))
    span = seq_len * CHARS_PER_WINDOW_TOKEN
    if len(text) <= span:
        raise ValueError(f"the {split} split ({len(text)} characters) is too short for windows of {seq_len} tokens")
    n = math.ceil(num_tokens / seq_len)
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(text) - span, (n,), generator=generator).tolist()
    rows = []
    for start, enc in zip(starts, tokenizer.encode_batch([text[s : s + span] for s in starts])):
        ids = enc.ids[1 : seq_len + 1]
        if len(ids) < seq_len:
            raise ValueError(f"{span} characters at offset {start} of the {split} split gave fewer than {seq_len + 1} tokens")
        rows.append(ids)
    return torch.tensor(rows, dtype=torch.int64)


def linear_names(model: nn.Module) -> list[str]:
    """The names of the model's quantizable Linears (every :class:`~llmnote.layers.Linear`;
    not the LM head), in the order the forward pass runs them."""
    return [name for name, module in model.named_modules() if isinstance(module, Linear)]


def layer_linears(model: nn.Module, index: int) -> dict[str, Linear]:
    """The Linears of decoder layer ``index``, ``{full name: module}`` in forward order."""
    prefix = f"model.layers.{index}."
    return {name: module for name, module in model.named_modules() if name.startswith(prefix) and isinstance(module, Linear)}


def check_quantizable(model: nn.Module, bits: int, group_size: int) -> None:
    """Clear errors, before any work, when a model's Linears cannot take ``bits``-bit codes in
    groups of ``group_size``, or are not plain dense layers on one process."""
    if not isinstance(bits, int) or not 2 <= bits <= 8:
        raise ValueError(f"bits must be an int in [2, 8], got {bits!r}")
    names = linear_names(model)
    if not names:
        raise ValueError("the model has no Linear layers to quantize")
    for name in names:
        module = model.get_submodule(name)
        if not isinstance(module.method, Dense) or module.tp.size != 1:
            raise TypeError(f"{name} must be a dense Linear on one process, got {module.extra_repr()}")
        try:
            check_group(tuple(module.weight.shape), bits, group_size)
        except ValueError as e:
            raise ValueError(f"{name}: {e}") from None


@dataclass
class InputStats:
    """Running statistics of one Linear's inputs ``x`` (rows of ``in_features``)."""

    absmax: torch.Tensor  # (K,) float32: max |x_k| over tokens
    abs_sum: torch.Tensor  # (K,) float64: sum |x_k| over tokens
    xtx: torch.Tensor | None  # (K, K) float64: sum over tokens of x x^T (None when not gathered)
    tokens: int = 0

    @classmethod
    def empty(cls, in_features: int, device, hessian: bool = True) -> InputStats:
        xtx = torch.zeros(in_features, in_features, dtype=torch.float64, device=device) if hessian else None
        return cls(
            torch.zeros(in_features, device=device),
            torch.zeros(in_features, dtype=torch.float64, device=device),
            xtx,
        )

    def add(self, x: torch.Tensor) -> None:
        """Fold a batch of inputs ``(..., K)`` into the statistics."""
        x = x.detach().reshape(-1, x.shape[-1]).float()
        self.absmax = torch.maximum(self.absmax, x.abs().amax(dim=0))
        self.abs_sum += x.abs().sum(dim=0, dtype=torch.float64)
        if self.xtx is not None:
            self.xtx += (x.t() @ x).double()
        self.tokens += x.shape[0]

    @property
    def mean_abs(self) -> torch.Tensor:
        """Mean ``|x_k|`` of each input channel, ``(K,)`` float32."""
        return (self.abs_sum / max(self.tokens, 1)).float()

    def hessian(self) -> torch.Tensor:
        """``X^T X / tokens``, ``(K, K)`` float32: the squared output error of a weight change
        ``D`` is ``trace(D H D^T)`` per token."""
        if self.xtx is None:
            raise ValueError("these statistics were gathered without X^T X (hessian=False)")
        return (self.xtx / max(self.tokens, 1)).float()

    def divided(self, s: torch.Tensor) -> InputStats:
        """The statistics of the inputs ``x / s`` (``s`` (K,) > 0): what the Linear sees after a
        per-channel scale ``s`` is folded into the op before it."""
        s = s.to(self.absmax.device, torch.float64)
        xtx = None if self.xtx is None else self.xtx / (s[:, None] * s[None, :])
        return InputStats((self.absmax / s).float(), self.abs_sum / s, xtx, self.tokens)


@contextmanager
def recording(modules: dict[str, nn.Module], hessian: bool = True) -> Iterator[dict[str, InputStats]]:
    """Gather :class:`InputStats` of each module's input while the ``with`` block runs forward
    passes; the dict it yields fills up as they run, and the hooks go when the block ends."""
    stats: dict[str, InputStats] = {}

    def hook_for(name: str):
        def hook(module, args):
            x = args[0]
            if name not in stats:
                stats[name] = InputStats.empty(x.shape[-1], x.device, hessian)
            stats[name].add(x)

        return hook

    handles = [module.register_forward_pre_hook(hook_for(name)) for name, module in modules.items()]
    try:
        yield stats
    finally:
        for handle in handles:
            handle.remove()


def _check_ids(ids: torch.Tensor) -> None:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"ids must be an integer tensor of shape (n, seq_len), got {getattr(ids, 'shape', type(ids).__name__)}")


def _modules(model: nn.Module, names: list[str] | None) -> dict[str, nn.Module]:
    names = linear_names(model) if names is None else list(names)
    found = dict(model.named_modules())
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"the model has no modules named {missing}")
    return {n: found[n] for n in names}


def _run(model: nn.Module, ids: torch.Tensor, batch_size: int, progress: bool, desc: str) -> None:
    _check_ids(ids)
    device = next(model.parameters()).device
    for batch in tqdm(ids.split(batch_size), desc=desc, disable=not progress):
        model(batch.to(device))


@torch.no_grad()
def input_stats(
    model: nn.Module,
    ids: torch.Tensor,
    names: list[str] | None = None,
    batch_size: int = 8,
    hessian: bool = True,
    progress: bool = True,
) -> dict[str, InputStats]:
    """:class:`InputStats` of the inputs of the Linears ``names`` (default: all of
    :func:`linear_names`) over the calibration windows ``ids`` ``(n, seq_len)``, in one pass."""
    modules = _modules(model, names)
    with recording(modules, hessian) as stats:
        _run(model, ids, batch_size, progress, "calibration")
    return stats


def activation_absmax(
    model: nn.Module, ids: torch.Tensor, names: list[str] | None = None, batch_size: int = 8, progress: bool = True
) -> dict[str, torch.Tensor]:
    """Max ``|x_k|`` of every input channel of every Linear, ``{name: (in_features,) float32}``."""
    stats = input_stats(model, ids, names, batch_size, hessian=False, progress=progress)
    return {name: s.absmax for name, s in stats.items()}


@torch.no_grad()
def capture_inputs(
    model: nn.Module, ids: torch.Tensor, names: list[str] | None = None, batch_size: int = 8, progress: bool = False
) -> dict[str, torch.Tensor]:
    """The inputs themselves: ``{name: (tokens, in_features)}``, every token of ``ids``."""
    modules = _modules(model, names)
    seen: dict[str, list[torch.Tensor]] = {name: [] for name in modules}

    def hook_for(name: str):
        return lambda module, args: seen[name].append(args[0].detach().reshape(-1, args[0].shape[-1]))

    handles = [module.register_forward_pre_hook(hook_for(name)) for name, module in modules.items()]
    try:
        _run(model, ids, batch_size, progress, "capture")
    finally:
        for handle in handles:
            handle.remove()
    return {name: torch.cat(xs) for name, xs in seen.items()}


@dataclass
class HiddenStates:
    """The inputs of one decoder layer for every calibration batch: ``hidden`` and ``residual``
    (the pair a layer takes and returns, their sum the residual stream) and each batch's
    attention context. :meth:`embed` gives layer 0's; :meth:`through` runs a layer on them."""

    hidden: list[torch.Tensor]  # (tokens of the batch, hidden_size)
    residual: list[torch.Tensor | None]
    contexts: list[AttentionContext]

    @classmethod
    @torch.no_grad()
    def embed(cls, model: nn.Module, ids: torch.Tensor, batch_size: int = 8) -> HiddenStates:
        """Layer 0's inputs for the windows ``ids`` ``(n, seq_len)``, ``batch_size`` windows a batch."""
        _check_ids(ids)
        device = model.lm_head.weight.device
        hidden, contexts = [], []
        for batch in ids.split(batch_size):
            batch = batch.to(device)
            hidden.append(model.model.embed_tokens(batch.reshape(-1)))
            contexts.append(AttentionContext.without_cache([batch.shape[1]] * batch.shape[0], device))
        return cls(hidden, [None] * len(hidden), contexts)

    @torch.no_grad()
    def through(self, layer: nn.Module) -> HiddenStates:
        """Run decoder ``layer`` on these inputs: the next layer's inputs."""
        outs = [layer(h, r, ctx) for h, r, ctx in zip(self.hidden, self.residual, self.contexts)]
        return HiddenStates([o[0] for o in outs], [o[1] for o in outs], self.contexts)
