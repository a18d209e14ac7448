"""A streaming generation loop: prefill the prompt, then decode token by token with the
sampling filters of :mod:`llmnote.layers.sampler`."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ..layers.sampler import SamplingParams, sample_next
from .transformer import Transformer

__all__ = ["generate", "complete"]


@torch.no_grad()
def generate(
    model: Transformer, input_ids: torch.Tensor, params: SamplingParams | None = None, eos_token_id: int | None = None
) -> Iterator[torch.Tensor]:
    """Stream new tokens: prefill the prompt into a paged KV cache, then decode one token at a time.

    Yields a ``(batch,)`` tensor per step; stops after ``max_new_tokens`` or when every
    sequence has produced ``eos_token_id``. The same ``seed`` gives the same tokens.
    """
    params = params or SamplingParams()
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be (batch, prompt_len >= 1), got shape {tuple(input_ids.shape)}")
    device = model.lm_head.weight.device
    generator = None
    if params.seed is not None:
        generator = torch.Generator(device=device).manual_seed(params.seed)
    ids = input_ids.to(device)
    batch = ids.shape[0]
    cache = model.new_cache(batch, ids.shape[1] + params.max_new_tokens, block_size=16)
    logits = model(ids, cache)[:, -1]
    cache.reserve_decode(batch, params.max_new_tokens)  # every block the answer can need, up front
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=device)
    for _ in range(params.max_new_tokens):
        token = sample_next(logits, params, ids, generator)
        if eos_token_id is not None:
            token = torch.where(done, torch.full_like(token, eos_token_id), token)
            done |= token == eos_token_id
        yield token
        if bool(done.all()):
            return
        ids = torch.cat([ids, token[:, None]], dim=1)
        logits = model.decode(token, cache)  # planned on the device: no host work per step
        cache.advance(batch)


def complete(
    model: Transformer, tokenizer, prompt: str, params: SamplingParams | None = None, eos: str | None = None
) -> str:
    """The prompt's continuation as text (``tokenizer`` is a ``tokenizers.Tokenizer``);
    generation stops early at the ``eos`` token, which is not included."""
    params = params or SamplingParams()
    ids = tokenizer.encode(prompt).ids
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    eos_id = tokenizer.token_to_id(eos) if eos is not None else None
    if eos is not None and eos_id is None:
        raise ValueError(f"the tokenizer has no token {eos!r}")
    new = [int(t[0]) for t in generate(model, torch.tensor([ids]), params, eos_token_id=eos_id)]
    if eos_id is not None and eos_id in new:
        new = new[: new.index(eos_id)]
    return tokenizer.decode(new)
