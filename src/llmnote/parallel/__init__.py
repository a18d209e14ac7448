"""Running one model across processes with ``torch.distributed``: tensor parallelism.

A tensor-parallel group of ``N`` processes holds one model between them, as Megatron-LM
(Shoeybi et al., 2019) splits it: each process keeps ``1/N`` of every attention layer's query
and KV heads (column-parallel QKV projection, row-parallel output projection) and ``1/N`` of
every MLP's hidden units (column-parallel gate and up, row-parallel down), so that each layer
needs one all-reduce after attention and one after the MLP. The split itself lives in
:mod:`llmnote.layers.linear` (:class:`~llmnote.layers.TensorParallel`); this module starts the
processes' group and hands each model its place in it.

Processes are started by ``torchrun``, which sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
the rendezvous address in each one's environment (the serving engine can also start its own:
:mod:`llmnote.engine.workers`). The backend is gloo on CPUs and NCCL on GPUs
(each process on the GPU of its local rank), with NVLink multicast (NVLS) off
(:func:`llmnote.parallel.launch.disable_multicast`).
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from .. import runtime
from ..layers import TensorParallel
from .launch import disable_multicast

__all__ = ["init_tensor_parallel", "shared_seed", "is_first", "finish"]


def init_tensor_parallel(size: int, device: str | None = None) -> tuple[TensorParallel, torch.device]:
    """Join the process group torchrun started and return this process's place in a
    tensor-parallel group of all ``size`` processes, and its device: ``device`` if given (``cuda``
    without an index meaning ``cuda:LOCAL_RANK``), else ``cuda:LOCAL_RANK`` where the runtime uses
    a GPU, else the CPU."""
    if size < 1:
        raise ValueError(f"the tensor-parallel degree must be >= 1, got {size}")
    if size == 1:
        return TensorParallel(), torch.device(device) if device else runtime.device()
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise ValueError(f"--tensor-parallel {size} needs {size} processes: start them with "
                         f"torchrun --nproc-per-node {size} -m llmnote ...")  # fmt: skip
    world = int(os.environ["WORLD_SIZE"])
    if world != size:
        raise ValueError(f"--tensor-parallel {size}, but torchrun started {world} processes")
    local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
    where = torch.device(device) if device else _default_device(local)
    if where.type == "cuda" and where.index is None:  # "cuda": each process its own GPU
        where = torch.device("cuda", local)
    if where.type == "cuda":
        disable_multicast()
        torch.cuda.set_device(where)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if where.type == "cuda" else "gloo")
    return TensorParallel(rank=dist.get_rank(), size=dist.get_world_size()), where


def _default_device(local_rank: int) -> torch.device:
    """The runtime's device (which ``LLMNOTE_DEVICE`` may set), on a GPU the local rank's one."""
    return torch.device("cuda", local_rank) if runtime.device().type == "cuda" else torch.device("cpu")


def shared_seed(seed: int | None, tp: TensorParallel) -> int | None:
    """A sampling seed every process of the group agrees on: the given one, or (when sampling
    without one) rank 0's draw, broadcast. Every rank computes the same logits, so with one
    seed every rank samples the same tokens and feeds the same input to the next step."""
    if tp.size == 1:
        return seed
    value = torch.tensor([seed if seed is not None else int(torch.randint(0, 2**31 - 1, ()))], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        value = value.cuda()
    dist.broadcast(value, src=0)
    return int(value.item())


def is_first(tp: TensorParallel) -> bool:
    """Whether this process speaks for the group (prints, writes files): rank 0."""
    return tp.rank == 0


def finish(tp: TensorParallel) -> None:
    """Leave the process group (after the last collective)."""
    if tp.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
