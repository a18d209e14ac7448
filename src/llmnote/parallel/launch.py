"""Start a group of CPU processes from Python (a notebook, a test) and collect what each returns.

``torchrun`` starts processes from a shell; a page that wants to *show* a collective or a split
model runs them itself. :func:`spawn` starts ``world_size`` fresh interpreters (the "spawn" start
method: no state inherited from the caller), joins them into one gloo process group over TCP
on this machine, calls ``fn(rank, world_size, *args)`` in each, and returns the results in rank
order. ``fn`` must be importable (defined in a module, not in a notebook cell). Tensors in a
result travel back as numpy arrays, by value.
"""

from __future__ import annotations

import os
import socket
import traceback
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["spawn", "free_port"]


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


def _child(fn: Callable, rank: int, world_size: int, port: int, args: tuple, queue) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))  # fmt: skip
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world_size)
        queue.put((rank, True, _by_value(fn(rank, world_size, *args))))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn: Callable, world_size: int, *args, timeout: float = 300.0) -> list:
    """``[fn(0, world_size, *args), ..., fn(world_size - 1, world_size, *args)]``, each run in its
    own process of one gloo group. A process that raises makes this raise ``RuntimeError`` with
    its traceback."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, port, args, queue), daemon=True) for r in range(world_size)]
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
