"""An OpenAI-compatible HTTP server on the engine (FastAPI on uvicorn).

``GET /health``, ``GET /v1/models``, ``POST /v1/completions`` and ``/v1/chat/completions``
(``"stream": true`` answers with server-sent events, ``data: {...}`` per delta and
``data: [DONE]`` at the end), ``GET /metrics`` in Prometheus' text format. Requests are
validated before they reach the engine: a malformed body, a wrong type, a bad sampling value,
a prompt that cannot fit, an unknown model all get a 4xx with OpenAI's error object
``{"error": {"message", "type", "code"}}``, and the server goes on serving. A client that
disconnects aborts its request, whose KV blocks return before the next step.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import asynccontextmanager
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from .async_engine import AsyncEngine
from .llm import LLMEngine
from .sequence import SamplingParams

__all__ = ["build_app", "serve"]


# -- requests -------------------------------------------------------------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields this server does not use

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=1)

    def params(self, max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
                              max_tokens=max_tokens, ignore_eos=self.ignore_eos,
                              stop=self.stop, seed=self.seed)  # fmt: skip


class CompletionRequest(_Sampling):
    prompt: str | list[int] = Field(min_length=1)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)


def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code or str(status)}}, status_code=status)


def chat_prompt(tokenizer_config: dict, messages: list[ChatMessage]) -> str:
    """The conversation as the model's chat template writes it (Jinja, from
    ``tokenizer_config.json``), or as plain ``role: content`` lines for a model without one."""
    template = tokenizer_config.get("chat_template")
    msgs = [m.model_dump() for m in messages]
    if template:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        special = {k: v for k, v in tokenizer_config.items() if k.endswith("_token") and isinstance(v, str)}
        return env.from_string(template).render(messages=msgs, add_generation_prompt=True, **special)
    return "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"


# -- the app --------------------------------------------------------------------------------


def build_app(engine: LLMEngine, served_model_name: str | None = None, api_key: str | None = None,
              default_max_tokens: int = 16) -> FastAPI:  # fmt: skip
    """The FastAPI application serving ``engine`` (its engine thread starts with the app)."""
    name = served_model_name or engine.model_name
    tok_config_file = engine.model_path / "tokenizer_config.json"
    tok_config = json.loads(tok_config_file.read_text()) if tok_config_file.exists() else {}
    state: dict[str, AsyncEngine] = {}

    @asynccontextmanager
    async def lifespan(app):
        state["engine"] = AsyncEngine(engine)
        yield
        state["engine"].shutdown()

    app = FastAPI(title="llmnote", lifespan=lifespan)

    @app.exception_handler(RequestValidationError)
    async def invalid(request, exc: RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"{where + ': ' if where else ''}{first.get('msg', 'invalid request')}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):
        return _error(exc.status_code, str(exc.detail), "not_found_error" if exc.status_code == 404 else "invalid_request_error")

    @app.exception_handler(Exception)
    async def internal(request, exc: Exception):
        return _error(500, f"internal error: {exc}", "server_error")

    @app.middleware("http")
    async def authenticate(request: Request, call_next):
        if api_key and request.url.path.startswith("/v1/"):
            if request.headers.get("authorization") != f"Bearer {api_key}":
                return _error(401, "missing or wrong API key (Authorization: Bearer KEY)", "authentication_error")
        return await call_next(request)

    @app.get("/health")
    async def health():  # 503 once the engine cannot run (a tensor-parallel worker died): time to restart
        reason = engine.failure()
        return _error(503, reason, "server_error") if reason else Response(status_code=200)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "llmnote",
                                            "max_model_len": engine.scheduler.config.max_model_len}]}  # fmt: skip

    @app.get("/metrics")
    async def metrics():
        engine.metrics.refresh(engine)
        return Response(engine.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def run(request: Request, body: _Sampling, prompt, chat: bool):
        if body.model is not None and body.model != name:
            return _error(404, f"the model {body.model!r} does not exist; this server serves {name!r}", "not_found_error",
                          "model_not_found")  # fmt: skip
        max_tokens = getattr(body, "max_completion_tokens", None) or body.max_tokens or default_max_tokens
        try:
            params = body.params(max_tokens)
            ids = state["engine"].validate(prompt, params)
        except (ValueError, TypeError) as err:
            return _error(400, str(err))
        rid, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        stream = state["engine"].generate(ids, params)
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(_sse(stream, rid, created, name, chat, usage), media_type="text/event-stream")
        out = None
        try:
            async for item in stream:
                out = item[0]
                if await request.is_disconnected():
                    break  # leaving the loop aborts the request
        finally:
            await stream.aclose()
        if out is None or not out.finished:
            return _error(499, "client closed the request")
        choice = {"index": 0, "finish_reason": out.finish_reason, "logprobs": None}
        choice |= {"message": {"role": "assistant", "content": out.text}} if chat else {"text": out.text}
        return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": name, "choices": [choice], "usage": _usage(out)}  # fmt: skip

    @app.post("/v1/completions")
    async def completions(request: Request, body: CompletionRequest):
        return await run(request, body, body.prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request, body: ChatRequest):
        return await run(request, body, chat_prompt(tok_config, body.messages), chat=True)

    return app


def _usage(out) -> dict:
    return {"prompt_tokens": len(out.prompt_token_ids), "completion_tokens": len(out.token_ids),
            "total_tokens": len(out.prompt_token_ids) + len(out.token_ids)}  # fmt: skip


async def _sse(stream, rid: str, created: int, model: str, chat: bool, include_usage: bool):
    """Server-sent events: one ``data:`` line per text delta, the finish reason on the last,
    then (with ``include_usage``) a chunk with no choices and the token counts."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def event(text: str | None, finish: str | None, first: bool = False) -> str:
        if chat:
            delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        body = {"id": rid, "object": kind, "created": created, "model": model, "choices": [choice]}
        return f"data: {json.dumps(body)}\n\n"

    try:
        if chat:
            yield event(None, None, first=True)
        out = None
        async for out, delta in stream:
            if delta or out.finished:
                yield event(delta, out.finish_reason if out.finished else None)
        if include_usage and out is not None:
            body = {"id": rid, "object": kind, "created": created, "model": model, "choices": [], "usage": _usage(out)}
            yield f"data: {json.dumps(body)}\n\n"
        yield "data: [DONE]\n\n"
    finally:  # a dropped connection cancels this generator: the request is aborted
        await stream.aclose()


def serve(engine: LLMEngine, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
          served_model_name: str | None = None, log_level: str = "info") -> None:  # fmt: skip
    """Serve until interrupted."""
    import uvicorn

    app = build_app(engine, served_model_name, api_key)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=5)
