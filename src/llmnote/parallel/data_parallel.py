"""Data parallelism and ZeRO: the same model on every rank, a different slice of the batch on each.

**Data parallelism.** ``N`` ranks each hold a whole copy of the model and its optimizer. A
training step splits the global batch into ``N`` equal shards; each rank runs forward and
backward on its own shard, and then the ranks **all-reduce** their gradients and divide by ``N``.
With equal shards and a loss that is a mean over examples, the averaged gradient is exactly the
gradient of the whole batch, so every rank takes the same optimizer step and the copies never
drift apart. The price is one all-reduce of every gradient per step, and a full copy of weights,
gradients and optimizer state on every rank.

**The memory of mixed-precision Adam.** Per parameter: 2 bytes of bf16 weights, 2 bytes of bf16
gradients, and 12 bytes of fp32 optimizer state (a master copy of the weight, Adam's first and
second moments): 16 bytes. Activations come on top and are left out here.

**ZeRO** (Rajbhandari et al., 2020, *ZeRO: Memory optimizations toward training trillion
parameter models*) removes the redundancy of those copies by giving each rank ``1/N`` of them:

- stage 1 partitions the optimizer state: ``2 + 2 + 12/N`` bytes per parameter;
- stage 2 also partitions the gradients: ``2 + 14/N``;
- stage 3 also partitions the parameters: ``16/N``.

Stages 1 and 2 communicate what data parallelism does, because a ring all-reduce *is* a
reduce-scatter followed by an all-gather: the gradients are reduce-scattered (each rank receives
the summed gradient of its shard, all it needs to update its shard), and the updated parameters
are all-gathered. Stage 3 gathers every layer's parameters before using them, once in the forward
pass and once again in the backward pass, and reduce-scatters gradients: 1.5 times the traffic.
PyTorch's Fully Sharded Data Parallel (Zhao et al., 2023) is stage 3.

:func:`train_single` is the reference, one process with the whole batch. :func:`train_data_parallel`
and :func:`train_zero1` run in every process of a group (start them with
:func:`llmnote.parallel.launch.spawn`) and must end with the reference's parameters.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = [
    "BYTES_PER_PARAM",
    "training_memory_per_gpu",
    "communication_per_gpu",
    "make_model",
    "make_batches",
    "adam_update",
    "train_single",
    "train_data_parallel",
    "train_zero1",
]

# Mixed-precision Adam: bytes per parameter of each kind of state.
BYTES_PER_PARAM = {"weights": 2, "gradients": 2, "optimizer": 12}


def _check_stage(n: int, stage: int) -> None:
    if not (isinstance(n, int) and n >= 1):
        raise ValueError(f"n must be an integer >= 1 (the number of data-parallel ranks), got {n!r}")
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (plain data parallelism), 1, 2 or 3, got {stage!r}")


def training_memory_per_gpu(params: float, n: int, stage: int) -> dict[str, float]:
    """Bytes of model state on each of ``n`` ranks for ``params`` parameters trained with
    mixed-precision Adam, by kind (``weights``, ``gradients``, ``optimizer``) and ``total``.
    ``stage`` 0 is plain data parallelism (everything replicated); ZeRO stage ``s`` divides the
    first ``s`` of optimizer state, gradients and weights by ``n``. Activations are not counted."""
    _check_stage(n, stage)
    if params < 0:
        raise ValueError(f"params must be >= 0, got {params}")
    sharded = {"optimizer": stage >= 1, "gradients": stage >= 2, "weights": stage >= 3}
    out = {kind: params * b / (n if sharded[kind] else 1) for kind, b in BYTES_PER_PARAM.items()}
    out["total"] = sum(out.values())
    return out


def communication_per_gpu(params: float, n: int, stage: int, grad_bytes: int = 2) -> float:
    """Bytes each rank sends per training step with ring collectives, on ``grad_bytes``-byte
    gradients and weights. Stages 0-2: one all-reduce, or equally a reduce-scatter plus an
    all-gather, ``2 (n-1)/n`` of the model. Stage 3: all-gather the weights in forward and again
    in backward, reduce-scatter the gradients, ``3 (n-1)/n``."""
    _check_stage(n, stage)
    passes = 3 if stage == 3 else 2
    return passes * (n - 1) / n * params * grad_bytes


# ----------------------------------------------------------------------------- a tiny model to train


def make_model(d_in: int = 8, d_hidden: int = 16, d_out: int = 4, seed: int = 0) -> nn.Module:
    """A two-layer MLP (Linear, tanh, Linear) in float64, the same on every rank for one seed."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.Tanh(), nn.Linear(d_hidden, d_out)).double()


def make_batches(steps: int, batch: int, d_in: int = 8, d_out: int = 4, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` regression batches ``(x, y)`` of shapes ``(batch, d_in)`` and ``(batch, d_out)``,
    float64, the same in every process for one seed."""
    g = torch.Generator().manual_seed(seed)
    return [(_randn(batch, d_in, g), _randn(batch, d_out, g)) for _ in range(steps)]


def _randn(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, cols, generator=g, dtype=torch.float64)


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def adam_update(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, t: int, lr: float,
                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:  # fmt: skip
    """One Adam step (Kingma and Ba, 2015) in place on 1-D tensors of one length: update the
    moments ``m`` and ``v`` with gradient ``g``, then parameter ``p``; ``t`` counts steps from 1.
    Elementwise, so it can run on any slice of the parameters with the same slice of the state."""
    b1, b2 = betas
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    p.sub_(lr * m_hat / (v_hat.sqrt() + eps))


def train_single(steps: int = 5, batch: int = 8, lr: float = 1e-2) -> torch.Tensor:
    """The reference: one process, the whole batch, ``torch.optim.Adam``. Returns the trained
    parameters as one flat float64 vector."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in make_batches(steps, batch):
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
    return _flat(p.detach() for p in model.parameters())


def _my_shard(x: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    if x.shape[0] % world_size:
        raise ValueError(f"the batch of {x.shape[0]} must split evenly over {world_size} ranks")
    return x.chunk(world_size)[rank]


def train_data_parallel(rank: int, world_size: int, steps: int = 5, batch: int = 8, lr: float = 1e-2) -> dict:
    """Plain data parallelism, in every rank of a group: forward and backward on this rank's
    ``batch / world_size`` examples, all-reduce the gradients and divide by ``world_size``, then a
    full ``torch.optim.Adam`` step on the full replica. Returns ``{"params": flat parameters,
    "optimizer_state_bytes": bytes of Adam's moments on this rank}``."""
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for x, y in make_batches(steps, batch):
        opt.zero_grad()
        F.mse_loss(model(_my_shard(x, rank, world_size)), _my_shard(y, rank, world_size)).backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)  # the sum over ranks of each shard's mean gradient ...
            p.grad.div_(world_size)  # ... divided by N: the whole batch's mean gradient
        opt.step()
    state = [t for s in opt.state.values() for k, t in s.items() if k in ("exp_avg", "exp_avg_sq")]
    return {"params": _flat(p.detach() for p in model.parameters()),
            "optimizer_state_bytes": sum(t.numel() * t.element_size() for t in state)}  # fmt: skip


def train_zero1(rank: int, world_size: int, steps: int = 5, batch: int = 8, lr: float = 1e-2) -> dict:
    """ZeRO stage 1, in every rank of a group. Parameters are viewed as one flat vector, padded
    to a multiple of ``world_size`` and cut into equal shards; this rank owns shard ``rank`` and
    keeps Adam's moments for it alone. Each step: forward and backward on this rank's slice of the
    batch; **reduce-scatter** the flat gradient, so this rank receives the summed gradient of its
    own shard; an Adam update of its shard with its state; **all-gather** the updated shards so
    every rank has the whole model again. Returns ``{"params", "optimizer_state_bytes",
    "shard": (start, stop)}``."""
    model = make_model()
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    shard_len = -(-numel // world_size)  # ceil
    start, stop = rank * shard_len, min((rank + 1) * shard_len, numel)
    m = torch.zeros(shard_len, dtype=torch.float64)  # Adam's moments, for this rank's shard only
    v = torch.zeros(shard_len, dtype=torch.float64)
    for t, (x, y) in enumerate(make_batches(steps, batch), start=1):
        model.zero_grad()
        F.mse_loss(model(_my_shard(x, rank, world_size)), _my_shard(y, rank, world_size)).backward()
        grads = torch.zeros(shard_len * world_size, dtype=torch.float64)
        grads[:numel] = _flat(p.grad for p in params)
        my_grad = torch.empty(shard_len, dtype=torch.float64)
        dist.reduce_scatter(my_grad, list(grads.chunk(world_size)))  # summed gradient of my shard only
        my_grad.div_(world_size)
        flat = torch.zeros(shard_len * world_size, dtype=torch.float64)
        flat[:numel] = _flat(p.detach() for p in params)
        mine = flat[rank * shard_len : (rank + 1) * shard_len].clone()
        adam_update(mine, my_grad, m, v, t, lr)  # the padding's gradient is 0, so it stays 0
        gathered = [torch.empty(shard_len, dtype=torch.float64) for _ in range(world_size)]
        dist.all_gather(gathered, mine)  # every rank gets every updated shard
        new = torch.cat(gathered)[:numel]
        with torch.no_grad():
            offset = 0
            for p in params:
                p.copy_(new[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
    return {"params": _flat(p.detach() for p in params), "optimizer_state_bytes": (m.numel() + v.numel()) * m.element_size(),
            "shard": (start, stop)}  # fmt: skip
