"""/v1/models and /v1/chat/completions, following the OpenAI schema, so the tools a user
already has (the openai client, chat UIs, eval harnesses) talk to a trained model.

Behind the same bearer token as the rest of the API (the middleware denies by default).
A model is a catalog name or a run id (tunix_rt.serving.models); messages render with our
chat template (tunix_rt.serving.template), the system prompt defaulting to the run's; the
decoding defaults are DecodeConfig's (greedy unless a temperature is given), max_tokens is
capped by Settings.serve_max_tokens. A run trained with tools decodes with them (its
config.yaml `tools`: each call answered by the tool, the result in the reply's text as it was
forced); `"use_tools": false` in a request (not OpenAI's field) turns them off for it, and
/v1/models lists each model's tools. Errors use OpenAI's body: {"error": {"message",
"type", "param", "code"}}.

The body is strict: numbers and flags of the wrong JSON type are refused (never coerced
from strings), every message carries content, and every string must be real Unicode. A
prompt is refused by its length in characters before it is tokenized (when no tokenization
could fit it in the context), and tokenized on a worker thread, so one huge message never
holds up the event loop. A request holds its model from lookup to submission, and the
scheduler counts it after that: loading another model never unloads one under a request.
"""

from __future__ import annotations

import asyncio
import functools
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

import anyio
import anyio.to_thread

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from tunix_rt.errors import BadInput
from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.serving.models import RETRY_AFTER_S, ModelCache, ModelNotFound, ModelsBusy, ServeConfig, ServedModel, available
from tunix_rt.serving.scheduler import Event, QueueFull, Request as GenRequest, Unloaded
from tunix_rt.serving.template import Message, chat_prompt_ids
from tunix_rt.service.deps import SettingsDep
from tunix_rt.service.schemas import RealUnicode, validation_422
from tunix_rt.service.settings import Settings

router = APIRouter(prefix="/v1", tags=["openai"])
DEFAULTS = DecodeConfig()
MAX_STOP = 4
DISCONNECT_POLL_S = 0.1
SERVE_THREADS = 8
"""Worker threads /v1 requests may occupy at once (the rest wait their turn on the loop)."""
UNSUPPORTED = ("tools", "tool_choice", "functions", "function_call", "logit_bias", "top_logprobs")


class OpenAIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.code, self.param = status, kind, code, param
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        headers = {"Retry-After": str(self.retry_after_s)} if self.retry_after_s else None
        return JSONResponse({"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}},
                            status_code=self.status, headers=headers)


def retry_later(message: str, code: str, retry_after_s: int = RETRY_AFTER_S) -> OpenAIError:
    """503 with Retry-After: the server cannot take the request now, through no fault of it."""
    return OpenAIError(503, message, kind="server_error", code=code, retry_after_s=retry_after_s)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    role: str
    content: str | list[TextPart]
    """Required, for every role: without tools there is no message without text."""

    def message(self) -> Message:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return Message(self.role, text)


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class ChatCompletionRequest(RealUnicode):
    """The OpenAI request body; fields we cannot honour are refused, never ignored."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(None, ge=1)
    max_completion_tokens: StrictInt | None = Field(None, ge=1)
    """The newer name of max_tokens; either is capped by the server's serve_max_tokens."""
    temperature: StrictFloat | None = Field(None, ge=0, le=2)
    top_p: StrictFloat | None = Field(None, gt=0, le=1)
    top_k: StrictInt | None = Field(None, ge=0)
    """Not in OpenAI's schema; DecodeConfig's top-k."""
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    n: StrictInt = Field(1, ge=1)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    logprobs: StrictBool | None = None
    presence_penalty: StrictFloat | None = None
    frequency_penalty: StrictFloat | None = None
    response_format: dict[str, Any] | None = None
    use_tools: StrictBool = True
    """Not in OpenAI's schema: decode with the model's tools (a run's config.yaml `tools`)."""

    @model_validator(mode="after")
    def _supported(self) -> "ChatCompletionRequest":
        extra = self.model_extra or {}
        given = [k for k in UNSUPPORTED if extra.get(k) not in (None, [], {})]
        if self.logprobs:
            given.append("logprobs")
        given += [k for k in ("presence_penalty", "frequency_penalty") if getattr(self, k) not in (None, 0)]
        if self.response_format and self.response_format.get("type") != "text":
            given.append("response_format")
        if given:
            raise ValueError(f"not supported by this server: {', '.join(given)}")
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOP:
            raise ValueError(f"stop holds at most {MAX_STOP} strings")
        return self

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def decode_config(self, cap: int) -> DecodeConfig:
        """DecodeConfig's defaults for anything the request leaves out; max tokens capped."""
        asked = self.max_completion_tokens or self.max_tokens or DEFAULTS.max_new_tokens
        given = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}
        return DecodeConfig(max_new_tokens=min(asked, cap), **{k: v for k, v in given.items() if v is not None})


def model_cache(app: FastAPI) -> ModelCache:
    """The app's loaded models, created on first use (no model loads at start-up), with the
    worker threads /v1 may occupy."""
    cache = getattr(app.state, "models", None)
    if cache is None:
        s: Settings = app.state.settings
        app.state.serve_threads = anyio.CapacityLimiter(SERVE_THREADS)
        cache = app.state.models = ModelCache(s.home_obj, ServeConfig(
            device=s.serve_device, max_models=s.serve_max_models, max_batch=s.serve_max_batch,
            max_queue=s.serve_max_queue, load_wait_s=s.serve_load_wait_s, tools=s.serve_tools,
            weights=s.serve_weights))
    return cache


async def _off_loop(app: FastAPI, fn: Callable, *args):
    """fn(*args) on a worker thread of /v1's own share (loads, waits for a model slot,
    tokenizing): however many /v1 requests wait, the /api routes keep their threads."""
    return await anyio.to_thread.run_sync(functools.partial(fn, *args), limiter=app.state.serve_threads)


def install(app: FastAPI) -> None:
    """The router, plus OpenAI-shaped errors for /v1 (400 for a malformed body)."""
    app.include_router(router)

    @app.exception_handler(OpenAIError)
    async def _openai_error(_req: Request, e: OpenAIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(req: Request, e: RequestValidationError):
        if not req.url.path.startswith("/v1/"):
            return validation_422(e)
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return OpenAIError(400, f"{where}: {first.get('msg', 'invalid request')}" if where else
                           first.get("msg", "invalid request"), param=where or None).response()


@router.get("/models")
def list_models(settings: SettingsDep) -> dict:
    return {"object": "list", "data": [_model_obj(m) for m in available(settings.home_obj)]}


@router.get("/models/{model_id}")
def show_model(model_id: str, settings: SettingsDep) -> dict:
    for m in available(settings.home_obj):
        if m["id"] == model_id:
            return _model_obj(m)
    raise OpenAIError(404, f"model {model_id!r} does not exist", code="model_not_found", param="model")


def _model_obj(m: dict) -> dict:
    return {"id": m["id"], "object": "model", "created": m["created"], "owned_by": "tunix-rt", "kind": m["kind"],
            "tools": m["tools"]}


@router.post("/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request, settings: SettingsDep):
    cache = model_cache(request.app)
    served = await hold_model(request.app, cache, body.model)
    try:  # held until submitted: from then on its scheduler keeps it loaded
        prompt, cfg = await _prompt(request.app, body, served, settings.serve_max_tokens)
        events: asyncio.Queue[Event] = asyncio.Queue()
        gen = GenRequest(prompt, cfg, _sink(events, asyncio.get_running_loop()), n=body.n, stop=body.stops())
        _submit(served, gen)
    finally:
        cache.release(served)
    meta = {"id": "chatcmpl-" + secrets.token_hex(12), "created": int(time.time()), "model": body.model}
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_stream(gen, events, meta, len(prompt), usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await _complete(gen, events, meta, len(prompt), request)


async def hold_model(app: FastAPI, cache: ModelCache, model_id: str) -> ServedModel:
    """The model, held (the caller releases it); a load, or a wait for a slot, runs on a
    worker thread."""
    try:
        return cache.acquire_loaded(model_id) or await _held_off_loop(app, cache, model_id)
    except ModelNotFound as e:
        raise OpenAIError(404, str(e), code="model_not_found", param="model") from None
    except ModelsBusy as e:
        raise retry_later(str(e), "model_busy", e.retry_after_s) from None


async def _held_off_loop(app: FastAPI, cache: ModelCache, model_id: str) -> ServedModel:
    """cache.acquire on a worker thread. Should this request be cancelled meanwhile, the
    thread still finishes, and what it acquired is released then: a hold nobody releases
    would keep that model loaded for good."""
    task = asyncio.ensure_future(_off_loop(app, cache.acquire, model_id))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda t: t.cancelled() or t.exception() or cache.release(t.result()))
        raise


async def _prompt(app: FastAPI, body: ChatCompletionRequest, served: ServedModel, cap: int) -> tuple[list[int], DecodeConfig]:
    """Prompt ids and decoding; a prompt that cannot fit the context is refused by its
    length in characters first, and tokenized off the event loop."""
    messages = [m.message() for m in body.messages]
    cfg = served.decoding(body.decode_config(cap), body.use_tools)
    chars = sum(len(m.content) for m in messages)
    if served.max_prompt_chars and chars > served.max_prompt_chars:
        raise _context_exceeded(f"{chars:,} characters of messages cannot fit the model's context of "
                                f"{served.max_context} tokens (at most {served.max_prompt_chars:,} characters)")
    try:
        prompt = await _off_loop(app, chat_prompt_ids, messages, served.tok, served.system_prompt)
    except BadInput as e:
        raise OpenAIError(400, str(e), param="messages") from None
    if served.max_context and len(prompt) + cfg.max_new_tokens > served.max_context:
        raise _context_exceeded(f"{len(prompt)} prompt tokens + max_tokens {cfg.max_new_tokens} exceed the model's "
                                f"context of {served.max_context}")
    return prompt, cfg


def _context_exceeded(message: str) -> OpenAIError:
    return OpenAIError(400, message, param="messages", code="context_length_exceeded")


def _submit(served: ServedModel, gen: GenRequest) -> None:
    try:
        served.scheduler.submit(gen)
    except QueueFull as e:
        raise OpenAIError(429, str(e), kind="rate_limit_error", code="queue_full") from None
    except Unloaded as e:
        raise retry_later(str(e), "model_unloaded") from None
    except BadInput as e:
        raise OpenAIError(400, str(e), param="n") from None


def _sink(events: asyncio.Queue, loop: asyncio.AbstractEventLoop):
    def put(ev: Event) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, ev)
        except RuntimeError:  # the loop is gone (server shutting down): nobody listens any more
            pass
    return put


async def _complete(gen: GenRequest, events: asyncio.Queue, meta: dict, n_prompt: int, request: Request):
    """Collect every choice; a client that disconnects meanwhile cancels the request."""
    texts, reasons, tokens = [""] * gen.n, [None] * gen.n, [0] * gen.n
    watcher = asyncio.create_task(_watch_disconnect(request, gen, events))
    try:
        while sum(r is not None for r in reasons) < gen.n:
            ev = await events.get()
            if ev.kind == "gone":
                return JSONResponse({"error": {"message": "client disconnected"}}, status_code=499)
            if ev.kind == "error" and ev.retryable:
                raise retry_later(f"generation stopped: {ev.error}", "model_unloaded")
            if ev.kind == "error":
                raise OpenAIError(500, f"generation failed: {ev.error}", kind="server_error")
            if ev.kind == "delta":
                texts[ev.index] += ev.text
            else:
                reasons[ev.index], tokens[ev.index] = ev.finish_reason, ev.n_tokens
    finally:
        watcher.cancel()
        if any(r is None for r in reasons):
            gen.cancel()
    choices = [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": r, "logprobs": None}
               for i, (t, r) in enumerate(zip(texts, reasons))]
    return {**meta, "object": "chat.completion", "choices": choices, "usage": _usage(n_prompt, sum(tokens))}


async def _watch_disconnect(request: Request, gen: GenRequest, events: asyncio.Queue) -> None:
    """Cancel the request (its rows leave the batch at the next step) once the client is gone."""
    while not await request.is_disconnected():
        await asyncio.sleep(DISCONNECT_POLL_S)
    gen.cancel()
    events.put_nowait(Event("gone"))


async def _stream(gen: GenRequest, events: asyncio.Queue, meta: dict, n_prompt: int, usage: bool) -> AsyncIterator[str]:
    """Server-sent chunks as OpenAI sends them; ends with `data: [DONE]`. When the client
    goes away Starlette cancels this generator, and `finally` frees the rows."""

    def chunk(choices: list, **extra) -> str:
        return "data: " + json.dumps({**meta, "object": "chat.completion.chunk", "choices": choices, **extra}) + "\n\n"

    left, total = gen.n, 0
    try:
        for i in range(gen.n):
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        while left:
            ev = await events.get()
            if ev.kind == "error":
                yield "data: " + json.dumps({"error": {"message": f"generation failed: {ev.error}", "type": "server_error"}}) + "\n\n"
                return
            if ev.kind == "delta":
                yield chunk([{"index": ev.index, "delta": {"content": ev.text}, "finish_reason": None}])
            else:
                left, total = left - 1, total + ev.n_tokens
                yield chunk([{"index": ev.index, "delta": {}, "finish_reason": ev.finish_reason}])
        if usage:
            yield chunk([], usage=_usage(n_prompt, total))
        yield "data: [DONE]\n\n"
    finally:
        if left:
            gen.cancel()


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
