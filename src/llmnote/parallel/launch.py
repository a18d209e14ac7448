"""Start a group of processes from Python (a notebook, a test, a benchmark) and collect what each returns.

``torchrun`` starts processes from a shell; a page that wants to *show* a collective or a split
model runs them itself. :func:`spawn` starts ``world_size`` fresh interpreters (the "spawn" start
method: no state inherited from the caller), joins them into one process group over TCP on this
machine, calls ``fn(rank, world_size, *args)`` in each, and returns the results in rank order.
``fn`` must be importable (defined in a module, not in a notebook cell). Tensors in a result
travel back as numpy arrays, by value.

The group is gloo on CPUs; with ``backend="nccl"`` process ``r`` runs on GPU ``r`` and the group is
NCCL's. NVLink multicast (NVLS: NVSwitch reductions, and the multicast memory of symmetric-memory
collectives) stays off in every process started here: :data:`MULTICAST_OFF` names the variables
that say so to NCCL, to PyTorch's symmetric memory and to NVSHMEM, and :func:`disable_multicast`
sets them, in the parent before it starts anything (children inherit the environment) and again
in each child.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["MULTICAST_OFF", "disable_multicast", "spawn", "free_port"]

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
BACKENDS = ("gloo", "nccl")


def disable_multicast() -> dict[str, str]:
    """Turn NVLink multicast off for this process and every process it starts afterwards (they
    inherit the environment); returns the variables set. Has effect only before the process
    group (or NVSHMEM) starts."""
    os.environ.update(MULTICAST_OFF)
    return dict(MULTICAST_OFF)


def free_port() -> int:
    """A TCP port nobody listens on now, for a rendezvous on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _by_value(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: _by_value(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_by_value(v) for v in obj)
    return obj


def _child(fn: Callable, rank: int, world_size: int, port: int, args: tuple, queue, backend: str = "gloo") -> None:
    torch.set_num_threads(1)
    disable_multicast()
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world_size)
        queue.put((rank, True, _by_value(fn(rank, world_size, *args))))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn: Callable, world_size: int, *args, timeout: float = 300.0, backend: str = "gloo") -> list:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, world_size, *args)]``, each run in its
    own process of one group: gloo, or with ``backend="nccl"`` NCCL with process ``r`` on
    ``cuda:r``. A process that raises makes this raise ``RuntimeError`` with its traceback;
    ``timeout``: seconds to wait for the results."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"an NCCL group of {world_size} processes needs {world_size} GPUs, "
                         f"this machine has {torch.cuda.device_count()}")  # fmt: skip
    disable_multicast()
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, port, args, queue, backend), daemon=True)
             for r in range(world_size)]  # fmt: skip
    for p in procs:
        p.start()
    try:
        results = dict((rank, (ok, value)) for rank, ok, value in (queue.get(timeout=timeout) for _ in procs))
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    failed = [f"rank {r}:\n{v}" for r, (ok, v) in sorted(results.items()) if not ok]
    if failed:
        raise RuntimeError("a process failed:\n" + "\n".join(failed))
    return [results[r][1] for r in range(world_size)]
