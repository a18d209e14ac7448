"""The engine behind a server: one thread steps the engine, request handlers await their tokens.

An HTTP server answers many clients on one asyncio event loop, while an engine step blocks for
the whole forward pass. So the engine runs in a thread of its own and never shares its state:
handlers validate and tokenize a request on the event loop, then hand it over through a
queue; the engine thread adds it before its next step, and after every step it posts each
request's new output to that request's ``asyncio.Queue``: one ``call_soon_threadsafe`` a step
carries them all, since every such call wakes the event loop (a write to its self-pipe), and a
step of 256 sequences would otherwise wake it 256 times. A handler whose client went away asks
for an abort the same way; the request's blocks return before the next step.
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import traceback
from collections.abc import AsyncIterator

from .llm import LLMEngine
from .outputs import RequestOutput
from .sequence import SamplingParams, Sequence

__all__ = ["AsyncEngine"]


class AsyncEngine:
    def __init__(self, engine: LLMEngine):
        self.engine = engine
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # ("add", id, ids, params, sink) | ("abort", id)
        self._sinks: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._ids = itertools.count()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llmnote-engine", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._inbox.put(("wake",))
        self._thread.join(timeout=30)

    # -- the event loop's side --------------------------------------------------------------

    def validate(self, prompt: str | list[int], params: SamplingParams) -> list[int]:
        """Token ids of ``prompt``; ``ValueError``/``TypeError`` if the request could never run."""
        ids = self.engine.tokenize(prompt)
        self.engine.scheduler.check(Sequence(ids, params))
        return ids

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[tuple[RequestOutput, str]]:
        """Stream ``(output so far, new text)`` until the request finishes. Leaving the loop
        early (the client disconnected, the task was cancelled) aborts the request."""
        request_id = f"cmpl-{next(self._ids)}"
        sink: asyncio.Queue = asyncio.Queue()
        self._inbox.put(("add", request_id, prompt_ids, params, (asyncio.get_running_loop(), sink)))
        finished = False
        try:
            while not finished:
                item = await sink.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item[0].finished
                yield item
        finally:
            if not finished:
                self._inbox.put(("abort", request_id))

    # -- the engine thread ------------------------------------------------------------------

    def _post(self, request_id: str, item) -> None:
        self._post_all([(request_id, item)])

    def _post_all(self, items: list[tuple[str, object]]) -> None:
        """Hand each ``(request_id, item)`` to its request's queue: one wake-up per event loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for request_id, item in items:
            loop, sink = self._sinks[request_id]
            by_loop.setdefault(loop, []).append((sink, item))
        for loop, pairs in by_loop.items():
            loop.call_soon_threadsafe(_deliver, pairs)

    def _drain(self, block: bool) -> None:
        """Apply the handlers' adds and aborts (waiting for one if ``block``)."""
        while True:
            try:
                msg = self._inbox.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            block = False
            if msg[0] == "add":
                _, request_id, ids, params, sink = msg
                self._sinks[request_id] = sink
                try:
                    self.engine.add_request(ids, params, request_id=request_id)
                except (ValueError, TypeError) as err:
                    self._post(request_id, err)
                    del self._sinks[request_id]
            elif msg[0] == "abort" and msg[1] in self._sinks:
                self.engine.abort(msg[1])
                del self._sinks[msg[1]]

    def _run(self) -> None:
        while not self._stop.is_set():
            self._drain(block=not self.engine.has_unfinished())
            if not self.engine.has_unfinished():
                continue
            try:
                results = self.engine.step()
            except Exception as err:  # a failed step fails its requests, not the server
                traceback.print_exc()
                for request_id in list(self._sinks):
                    self.engine.abort(request_id)
                    self._post(request_id, RuntimeError(f"the engine failed: {err}"))
                self._sinks.clear()
                continue
            ready = [(out.request_id, (out, delta)) for out, delta in results if out.request_id in self._sinks]
            self._post_all(ready)
            for request_id, (out, _) in ready:
                if out.finished:
                    del self._sinks[request_id]


def _deliver(pairs: list[tuple[asyncio.Queue, object]]) -> None:
    for sink, item in pairs:
        sink.put_nowait(item)
