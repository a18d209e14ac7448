"""A tensor-parallel forward pass you can look inside: what each process holds, what it
computes, and every collective it calls.

:func:`split_forward` is meant to run under :func:`llmnote.parallel.launch.spawn`: each process
of the group loads its slice of a checkpoint, runs one forward pass and returns its local weight
shapes, the hidden state after every decoder layer, the logits, and the log of the collectives
the pass called. :func:`expected_collectives` predicts that log from the model's shape alone
(Megatron-LM's split, Shoeybi et al., 2019): per forward pass one all-reduce after the
embedding, two per decoder layer (after attention and after the MLP), and one all-gather of the
logits.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from ..layers import TensorParallel
from ..models import Transformer, load_model
from ..models.config import ModelConfig
from ..paths import models_dir

__all__ = ["Collective", "count_collectives", "local_shapes", "layer_states", "split_forward", "expected_collectives"]


@dataclass(frozen=True)
class Collective:
    """One collective call: ``op`` (``"all_reduce"`` or ``"all_gather"``) and the bytes of the
    tensor this process contributed (for an all-gather: its own slice, not the gathered whole)."""

    op: str
    nbytes: int


@dataclass
class CollectiveLog:
    """The collectives called inside a :func:`count_collectives` block, in order."""

    calls: list[Collective] = field(default_factory=list)

    def count(self, op: str) -> int:
        return sum(c.op == op for c in self.calls)

    def bytes(self, op: str) -> int:
        return sum(c.nbytes for c in self.calls if c.op == op)


@contextmanager
def count_collectives():
    """Log every ``torch.distributed.all_reduce`` and ``all_gather`` called in the block (and
    still perform it); the original functions are back when the block ends, even on an error.

    The layers call ``torch.distributed.all_reduce`` through the module, at call time, so
    replacing the module's attribute is enough to see every call."""
    log = CollectiveLog()
    all_reduce, all_gather = dist.all_reduce, dist.all_gather

    def logged_all_reduce(tensor, *args, **kwargs):
        log.calls.append(Collective("all_reduce", tensor.numel() * tensor.element_size()))
        return all_reduce(tensor, *args, **kwargs)

    def logged_all_gather(tensor_list, tensor, *args, **kwargs):
        log.calls.append(Collective("all_gather", tensor.numel() * tensor.element_size()))
        return all_gather(tensor_list, tensor, *args, **kwargs)

    dist.all_reduce, dist.all_gather = logged_all_reduce, logged_all_gather
    try:
        yield log
    finally:
        dist.all_reduce, dist.all_gather = all_reduce, all_gather


def local_shapes(model: Transformer) -> dict[str, tuple[int, ...]]:
    """The shapes of the weights this process holds for the first decoder layer's projections,
    the embedding and the LM head, and its number of query and KV heads (as 1-tuples)."""
    layer = model.model.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    return {
        "embed_tokens": tuple(model.model.embed_tokens.weight.shape),
        "qkv_proj": tuple(attn.qkv_proj.weight.shape),
        "o_proj": tuple(attn.o_proj.weight.shape),
        "gate_up_proj": tuple(mlp.gate_up_proj.weight.shape),
        "down_proj": tuple(mlp.down_proj.weight.shape),
        "lm_head": tuple(model.lm_head.weight.shape),
        "query heads": (attn.heads,),
        "KV heads": (attn.kv_heads,),
    }


def layer_states(model: Transformer, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The hidden state after every decoder layer, ``(batch * seq, hidden)`` each, and the
    logits ``(batch, seq, vocab)`` for token ids ``(batch, seq)``.

    A decoder layer returns its output and the residual stream apart; the hidden state after
    the layer is their sum. Forward hooks record it without changing the model's code."""
    states: list[torch.Tensor] = []

    def record(module, args, out):
        states.append((out[0] + out[1]).detach().clone())

    hooks = [layer.register_forward_hook(record) for layer in model.model.layers]
    try:
        with torch.no_grad():
            logits = model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return states, logits


def split_forward(rank: int, world_size: int, ids: torch.Tensor, path: str | Path | None = None) -> dict:
    """Load ``path`` (default: the book's tiny model) in float32 on the CPU as process ``rank``
    of ``world_size``, run token ids ``(batch, seq)`` through it and return a dict:
    ``shapes`` (:func:`local_shapes`), ``states`` and ``logits`` (:func:`layer_states`) and
    ``collectives`` (the :class:`Collective` calls of the forward pass, in order).

    Run it in every process of a group, e.g. ``spawn(split_forward, 2, ids)``."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        raise ValueError("ids must be a (batch, seq) tensor of token ids")
    tp = TensorParallel(rank, world_size)
    model = load_model(path or models_dir() / "llmnote-tiny", device="cpu", dtype=torch.float32, tp=tp)
    with count_collectives() as log:
        states, logits = layer_states(model, ids)
    return {"shapes": local_shapes(model), "states": states, "logits": logits, "collectives": list(log.calls)}


def expected_collectives(config: ModelConfig, tokens: int, world_size: int, dtype_bytes: int) -> list[Collective]:
    """The collectives one process calls in a forward pass over ``tokens`` tokens, from the
    model's shape: an all-reduce of the embeddings ``(tokens, hidden)``, two per decoder layer
    of the same size, and an all-gather of this process's logits ``(tokens, vocab / N)``.
    Nothing is communicated when ``world_size`` is 1."""
    if world_size < 1 or tokens < 1 or dtype_bytes < 1:
        raise ValueError(f"world_size, tokens and dtype_bytes must be >= 1, got {world_size}, {tokens}, {dtype_bytes}")
    if world_size == 1:
        return []
    hidden = Collective("all_reduce", tokens * config.hidden_size * dtype_bytes)
    logits = Collective("all_gather", tokens * config.vocab_size // world_size * dtype_bytes)
    return [hidden] * (1 + 2 * config.num_layers) + [logits]
