"""Tensor parallelism in the engine: rank 0 runs the engine, the other ranks follow its steps.

With ``tensor_parallel_size=N`` the model is split over ``N`` processes (:mod:`llmnote.parallel`),
but only rank 0 is an engine: it holds the requests, the scheduler and block manager, the
tokenizer, and it samples. Every other rank is a :class:`Worker`: its shard of the model and a
:class:`~llmnote.engine.model_runner.ModelRunner` with the same number of KV blocks (its share of
the KV heads in each), running whatever forward pass rank 0 asks for. The two kinds of traffic
travel on two groups:

- **control**, on a CPU (gloo) group: one message per step, built by :func:`step_message`, with
  what a forward pass needs and nothing about requests: for each sequence the token ids this
  step consumes (not its history), its block table, its start position, its token count and
  whether it samples, plus a flag saying the ids are already on the device (a step launched
  ahead of the host, fed the tokens the step before sampled);
- **tensors**, on the model's group (NCCL on GPUs): the all-reduces and the LM head's all-gather
  inside the forward pass, then the tokens rank 0 sampled, broadcast as a device tensor (no
  host synchronisation on a GPU), which a worker keeps for a step launched ahead.

Both sides issue their collectives in one order: the step message, the forward pass, the
sampled tokens (skipped by both when no sequence samples). A worker never needs the requests:
the block tables say where every key and value goes and comes from, and the block manager that
chose them lives on rank 0 alone.

Two ways to start. Under ``torchrun`` every process runs the same script: rank 0's ``LLMEngine``
is the engine and the others' are workers, which follow inside ``LLM.generate`` until rank 0's
call returns and then return its outputs. In a plain process (a notebook, ``python -m llmnote
serve``), the engine starts the ``N - 1`` workers itself (:func:`start_workers`), which follow
until :meth:`Driver.close` stops them; they are fresh interpreters (the "spawn" start method), so
a script that builds such an engine needs an ``if __name__ == "__main__":`` guard.

Rank 0 notices a worker that died rather than wait for it: before each step it checks that the
processes it started are alive, and a dead peer's closed socket fails the next gloo collective
at once. A worker that hangs, or a collective on NCCL that waits for a dead peer, is given
:data:`STEP_TIMEOUT`.
"""

from __future__ import annotations

import datetime
import os
import pickle
import signal
import threading
import time
from collections import deque
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from .. import runtime
from ..layers import TensorParallel
from ..parallel import init_tensor_parallel
from ..parallel.launch import disable_multicast
from .model_runner import Launched, ModelRunner, Work

__all__ = ["Channel", "Driver", "Worker", "step_message", "join_group", "start_workers", "stop_on_error", "STEP_TIMEOUT"]

STEP_TIMEOUT = datetime.timedelta(minutes=10)  # rank 0's longest wait for a worker
_IDLE_TIMEOUT = datetime.timedelta(days=365)  # a worker waits for the next step as long as the engine is idle
STEP, RESULT, STOP = "step", "result", "stop"


def step_message(work: list[Work], ids_on_device: bool) -> tuple:
    """What a worker needs to run ``work``: ``("step", ids_on_device, items)``, an item per
    sequence ``(input ids or None, block table, start, n, sample)``."""
    return STEP, ids_on_device, [(None if ids_on_device else w.input_ids(), w.blocks, w.start, w.n, w.sample) for w in work]


class Channel:
    """Rank 0's control messages, any picklable object, broadcast over a CPU (gloo) group of
    every rank: the length, then the bytes."""

    def __init__(self, rank: int):
        self.group = dist.new_group(backend="gloo", timeout=STEP_TIMEOUT if rank == 0 else _IDLE_TIMEOUT)

    def send(self, message) -> int:
        """Broadcast ``message`` from rank 0; returns its size in bytes."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        dist.broadcast(torch.tensor([len(data)], dtype=torch.int64), src=0, group=self.group)
        dist.broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8), src=0, group=self.group)
        return len(data)

    def receive(self):
        """The next message from rank 0 (waits for it)."""
        size = torch.empty(1, dtype=torch.int64)
        dist.broadcast(size, src=0, group=self.group)
        data = torch.empty(int(size), dtype=torch.uint8)
        dist.broadcast(data, src=0, group=self.group)
        return pickle.loads(data.numpy().tobytes())

    def smallest(self, value: int) -> int:
        """The smallest ``value`` over the ranks (every rank calls it)."""
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.group)
        return int(t)


class Driver:
    """Rank 0's side of the group: each step goes to the workers before rank 0 runs its own
    share, and the sampled tokens follow. ``procs``: the worker processes this engine started
    (``None`` under torchrun, where the workers follow only inside ``LLM.generate``)."""

    def __init__(self, tp: TensorParallel, channel: Channel, procs: list | None = None):
        self.tp, self.channel, self.procs = tp, channel, procs
        self.messages: deque[dict] = deque(maxlen=100_000)  # every step message sent: bytes, sequences, tokens
        self.failure: str | None = None
        self.closed = False
        self._lock = threading.Lock()  # close() may come from another thread than the steps

    def launch(self, runner: ModelRunner, work: list[Work], params: list, generators: list,
               ids: torch.Tensor | None = None) -> Launched:  # fmt: skip
        """:meth:`ModelRunner.launch` on every rank: the step message, the forward pass (the
        workers run theirs at the same time), the sampled tokens shared over the model's group."""
        with self._lock:
            self._check()
            try:
                size = self.channel.send(step_message(work, ids is not None))
                self.messages.append({"bytes": size, "seqs": len(work), "tokens": sum(w.n for w in work),
                                      "ids_on_device": ids is not None})  # fmt: skip
                launched = runner.launch(work, params, generators, ids)
                if launched.device is not None:
                    with torch.inference_mode():
                        dist.broadcast(launched.device, src=0, group=self.tp.group)
            except RuntimeError as err:  # gloo's and NCCL's errors are RuntimeErrors
                raise self._fail(err) from err
            except BaseException as err:  # stopped halfway (Ctrl-C): the workers may wait inside a collective
                self.failure = f"a step stopped halfway ({type(err).__name__}): the ranks are out of step; close() this engine"
                raise
            return launched

    def share(self, ok: bool, value) -> None:
        """Under torchrun, end the workers' ``LLM.generate`` with rank 0's outputs (``ok``) or its
        exception, which they raise in turn."""
        if self.procs is not None or self.failure is not None:
            return
        with self._lock:
            try:
                self.channel.send((RESULT, ok, value))
            except (pickle.PicklingError, TypeError, AttributeError):  # an exception that does not pickle
                self.channel.send((RESULT, False, RuntimeError(f"rank 0 failed: {value!r}")))
            except RuntimeError as err:
                raise self._fail(err) from err

    def close(self) -> None:
        """Stop and join the workers this engine started, then leave the process group."""
        with self._lock:
            if self.closed or self.procs is None:
                self.closed = True
                return
            self.closed = True
            if self.failure is None and all(p.is_alive() for p in self.procs):
                try:
                    self.channel.send((STOP,))
                    for p in self.procs:
                        p.join(timeout=30)
                except RuntimeError:
                    pass  # a worker is gone
            for p in self.procs:  # those that did not stop (after a failure, none was asked to)
                if p.is_alive():
                    p.kill()
                p.join()
            if dist.is_initialized():
                dist.destroy_process_group()

    def dead_workers(self) -> str | None:
        """Which of the workers this engine started have exited (and with which code), or ``None``."""
        dead = [f"tensor-parallel worker {rank} exited with code {p.exitcode}"
                for rank, p in enumerate(self.procs or (), start=1) if not p.is_alive()]  # fmt: skip
        return "; ".join(dead) or None

    def _check(self) -> None:
        if self.closed:
            raise RuntimeError("the engine is closed")
        if self.failure is not None:
            raise RuntimeError(self.failure)
        if self.procs is not None and not all(p.is_alive() for p in self.procs):
            raise self._fail(None)

    def _fail(self, err: Exception | None) -> RuntimeError:
        """Mark the group broken (its collectives are out of step for good) and say why."""
        dead = []
        for rank, p in enumerate(self.procs or (), start=1):
            p.join(timeout=1)  # a worker whose socket closed is exiting: let it finish
            if not p.is_alive():
                dead.append(f"tensor-parallel worker {rank} exited with code {p.exitcode}")
        reason = "; ".join(dead) or f"a tensor-parallel step failed: {err}"
        self.failure = f"{reason}; the engine cannot run without every rank"
        return RuntimeError(self.failure)


class Worker:
    """A rank other than 0: runs the forward pass of each step rank 0 sends, on its shard."""

    def __init__(self, tp: TensorParallel, channel: Channel, runner: ModelRunner):
        self.tp, self.channel, self.runner = tp, channel, runner
        self.sampled: torch.Tensor | None = None  # the last tokens rank 0 sampled, on the device
        self.steps = 0

    def follow(self):
        """Run rank 0's steps until it sends a result (returned, or raised if an exception) or
        the order to stop (returns ``None``)."""
        while True:
            message = self.channel.receive()
            if message[0] == STEP:
                self._step(*message[1:])
            elif message[0] == RESULT:
                _, ok, value = message
                if not ok:
                    raise value
                return value
            else:
                return None

    @torch.inference_mode()
    def _step(self, ids_on_device: bool, items: list[tuple]) -> None:
        work = [Work(ids or [], blocks, start, n, sample, offset=start) for ids, blocks, start, n, sample in items]
        self.runner.logits(work, self.sampled if ids_on_device else None)
        drawn = sum(1 for item in items if item[4])
        if drawn:
            self.sampled = torch.empty(drawn, dtype=torch.int64, device=self.runner.device)
            dist.broadcast(self.sampled, src=0, group=self.tp.group)
        self.steps += 1


def join_group(size: int, device, model, shard_args: dict) -> tuple[TensorParallel, torch.device, list | None]:
    """This process's place in a tensor-parallel group of ``size``, its device, and the worker
    processes it started: under torchrun (``RANK`` set), the group torchrun started and no
    processes; in a plain process with ``size > 1``, rank 0 of a group whose other ranks it starts
    (:func:`start_workers`, with ``shard_args`` for their engines)."""
    if size > 1 and "RANK" not in os.environ:
        where = torch.device(device) if device is not None else runtime.device()
        where = torch.device("cuda", 0) if where.type == "cuda" else where
        return TensorParallel(rank=0, size=size), where, start_workers(size, where, model, shard_args)
    tp, where = init_tensor_parallel(size, device)
    return tp, where, None


def start_workers(size: int, device: torch.device, model, engine_args: dict) -> list:
    """Start ranks ``1 .. size-1`` as fresh processes (each builds ``LLMEngine(model,
    **engine_args)`` as a worker and follows until stopped) and join the group as rank 0. On
    GPUs rank ``r`` takes ``cuda:r`` and the group uses NCCL (NVLink multicast off); on CPUs gloo.
    The processes meet at a store on a free port of 127.0.0.1. Returns the processes."""
    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a process group: close() the engine that uses it "
                           "before starting another with tensor_parallel_size > 1")  # fmt: skip
    cuda = device.type == "cuda"
    if cuda:
        if torch.cuda.device_count() < size:
            raise ValueError(f"tensor_parallel_size={size} needs {size} GPUs, this machine has {torch.cuda.device_count()}")
        disable_multicast()  # before the workers start: they inherit it
    store = dist.TCPStore("127.0.0.1", 0, size, is_master=True, wait_for_workers=False, timeout=STEP_TIMEOUT)  # any free port
    ctx, procs = mp.get_context("spawn"), []
    for rank in range(1, size):
        args = dict(engine_args, device=f"cuda:{rank}" if cuda else "cpu", tensor_parallel_size=size)
        procs.append(ctx.Process(target=_worker_main, args=(rank, size, store.port, model, args), daemon=True,
                                 name=f"llmnote-tp-worker-{rank}"))  # fmt: skip
        procs[-1].start()
    with stop_on_error(procs):
        # each worker checks in before it joins the group: one that dies sooner (an import that
        # fails, a script without an ``if __name__ == "__main__"`` guard) is seen here
        while not store.check([f"worker-{rank}" for rank in range(1, size)]):
            for rank, p in enumerate(procs, start=1):
                if not p.is_alive():
                    raise RuntimeError(f"tensor-parallel worker {rank} exited with code {p.exitcode} while starting")
            time.sleep(0.01)
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=size, timeout=STEP_TIMEOUT)
    return procs


@contextmanager
def stop_on_error(procs: list | None):
    """While rank 0 builds its engine: if anything fails, kill the workers it started and leave
    their group; if a worker died first (its error is on stderr), say so."""
    try:
        yield
    except BaseException as err:
        if not procs:
            raise
        if isinstance(err, RuntimeError):  # a collective failed: did a worker die first?
            for p in procs:
                p.join(timeout=1)
        dead = [f"tensor-parallel worker {rank} exited with code {p.exitcode} while starting"
                for rank, p in enumerate(procs, start=1) if not p.is_alive()]  # fmt: skip
        for p in procs:
            p.kill()
            p.join()
        if dist.is_initialized():
            dist.destroy_process_group()
        if dead and isinstance(err, RuntimeError):
            raise RuntimeError("; ".join(dead)) from err
        raise


def _worker_main(rank: int, size: int, port: int, model, engine_args: dict) -> None:
    from .llm import LLMEngine

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in a terminal reaches rank 0, which stops the workers
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(size))  # as torchrun would
    device = torch.device(engine_args["device"])
    if device.type == "cuda":
        disable_multicast()  # inherited from rank 0 already; said again before NCCL starts here
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, size, is_master=False, timeout=STEP_TIMEOUT)
    store.set(f"worker-{rank}", "started")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=size,
                            timeout=STEP_TIMEOUT)  # fmt: skip
    try:
        LLMEngine(model, **engine_args).worker.follow()  # until rank 0 says stop
    finally:
        dist.destroy_process_group()
