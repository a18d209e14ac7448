"""Pipeline parallelism, forward only (inference): a model's layers cut into stages, one process
each, micro-batches flowing from stage to stage.

Stage ``r`` of ``P`` holds a contiguous run of layers (the first also the embedding, the last the
final norm and the head). A batch is cut into ``m`` micro-batches; stage ``r`` receives a
micro-batch's hidden states and residual stream from stage ``r - 1``, runs its layers and sends
them on, and can start on the next micro-batch as soon as it has sent. This is the forward half
of GPipe's schedule (Huang et al., 2019): the pipeline fills for ``P - 1`` micro-batch times,
runs full, and drains, so with equal stages the busy fraction is ``m / (m + P - 1)``. Training
interleaves backward passes (1F1B, PipeDream-Flush: Narayanan et al., 2021) to bound the memory
of stored activations; inference has no backward and needs only this forward pipeline.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..layers import AttentionContext
from ..models import load_model

__all__ = ["stage_layers", "pipeline_forward"]


def stage_layers(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """The layer range ``[start, stop)`` of each of ``stages`` stages, as even as possible (the
    first stages take one more where the layers do not divide)."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"{num_layers} layers cannot make {stages} stages of at least one layer each")
    base, extra = divmod(num_layers, stages)
    bounds = [0]
    for s in range(stages):
        bounds.append(bounds[-1] + base + (s < extra))
    return list(zip(bounds[:-1], bounds[1:]))


@torch.no_grad()
def pipeline_forward(rank: int, stages: int, model_path, ids: torch.Tensor, micro_batches: int) -> dict:
    """Run in each process of a group of ``stages`` (e.g. through :func:`llmnote.parallel.launch.spawn`):
    the logits ``(B, S, vocab)`` of ``ids`` ``(B, S)``, computed in ``micro_batches`` micro-batches of
    whole sequences (on the last stage; ``None`` elsewhere), and this stage's timeline: per
    micro-batch, when it began and ended (``time.time()``, comparable across the processes of
    one machine). (Each process loads
    the checkpoint and keeps the layers of its stage; a real deployment would read only those.)"""
    if ids.dim() != 2 or not 1 <= micro_batches <= ids.shape[0]:
        raise ValueError(f"ids must be (B, S) with B >= micro_batches >= 1, got {tuple(ids.shape)} and {micro_batches}")
    model = load_model(model_path, device="cpu", dtype=torch.float32)
    start, stop = stage_layers(model.config.num_layers, stages)[rank]
    first, last = rank == 0, rank == stages - 1
    hidden = model.config.hidden_size
    sends, logits, timeline = [], [], []
    for mb in ids.tensor_split(micro_batches):
        b, s = mb.shape
        ctx = AttentionContext.without_cache([s] * b, "cpu")
        if first:
            began = time.time()
            x, residual = model.model.embed_tokens(mb.reshape(-1)), None
        else:
            x, residual = torch.empty(b * s, hidden), torch.empty(b * s, hidden)
            dist.recv(x, src=rank - 1)
            dist.recv(residual, src=rank - 1)
            began = time.time()
        x, residual = model.forward_layers(x, residual, ctx, start, stop)
        if last:
            logits.append(model.compute_logits(model.final_norm(x, residual)).view(b, s, -1))
        timeline.append((began, time.time()))  # the end, taken before the send that lets the next stage begin
        if not last:  # on its way while this stage takes the next micro-batch
            sends += [dist.isend(x.contiguous(), dst=rank + 1), dist.isend(residual.contiguous(), dst=rank + 1)]
    for work in sends:
        work.wait()
    return {"logits": torch.cat(logits) if last else None, "timeline": timeline, "layers": (start, stop)}
