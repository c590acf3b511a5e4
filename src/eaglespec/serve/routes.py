"""The server's endpoints, as routers: the service's own (/health, /metrics, the page at /) and
OpenAI's (/v1/models, /v1/completions, /v1/chat/completions).

Responses carry OpenAI's fields, plus `eaglespec`: tau, accepted tokens by origin (the drafter's
or "target", the target's own token of each round), draft / verify / prefill seconds; streamed
chunks also carry `eaglespec.spans`, the chunk's text in (text, origin) pieces.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from importlib.resources import files

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from eaglespec.decoding.generate import chat_ids, prompt_ids
from eaglespec.decoding.loop import Request as DecodeRequest
from eaglespec.decoding.model import Model
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.errors import EaglespecError
from eaglespec.serve.engine import Engine, Job, QueueFull
from eaglespec.serve.openai_schema import SEED_LIMIT, ApiError, ChatRequest, CompletionRequest, Sampling, parse

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}  # ours -> OpenAI's


@dataclass(frozen=True)
class Settings:
    method: str = "eagle"  # requests that name none decode with this
    api_key: str | None = None
    max_batch: int = 4  # rows decoded together
    max_queue: int = 64  # requests waiting beyond those; more are answered 429
    max_tokens: int = 2048  # the most one request may ask for
    cache_tokens: int = 0  # the batch's KV cache in tokens (0: max_batch x min(context, 4096))
    max_body_bytes: int = 1 << 20
    timeout_s: float = 600.0  # per request, queueing included


def service_routes(engine: Engine) -> APIRouter:
    """/health (no key needed), /metrics (Prometheus) and the page at /."""
    router = APIRouter()

    @router.get("/health")
    async def health():
        return {"status": "ok"}

    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine))

    @router.get("/metrics")
    async def metrics():
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @router.get("/")
    async def page():
        return HTMLResponse((files("eaglespec.serve") / "page.html").read_text())

    return router


def openai_routes(model: Model, settings: Settings, engine: Engine) -> APIRouter:
    """OpenAI's endpoints over the engine."""
    router = APIRouter()
    target = model.target
    context = target.model.config.max_position_embeddings
    created = int(time.time())

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": target.name, "object": "model", "created": created,
                                            "owned_by": "eaglespec", "max_model_len": context,
                                            "methods": model.available_methods(), "default_method": settings.method}]}

    @router.post("/v1/completions")
    async def completions(request: Request):
        body = parse(CompletionRequest, await _json(request, settings.max_body_bytes))
        prompt = body.prompt[0] if isinstance(body.prompt, list) and isinstance(body.prompt[0], str) else body.prompt
        if isinstance(prompt, str):
            ids = prompt_ids(target, prompt, chat=False)
        else:
            if not all(0 <= i < target.model.config.vocab_size for i in prompt):
                raise ApiError(400, f"prompt: token ids must be in [0, {target.model.config.vocab_size})", "prompt")
            ids = prompt
        return await _answer(request, body, ids, "text_completion")

    @router.post("/v1/chat/completions")
    async def chat(request: Request):
        body = parse(ChatRequest, await _json(request, settings.max_body_bytes))
        try:
            ids = chat_ids(target, [m.as_template_input() for m in body.messages])
        except EaglespecError as error:
            raise ApiError(400, str(error), "messages") from None
        except Exception as error:  # the template refused the conversation (e.g. roles out of order)
            raise ApiError(400, f"the chat template refused these messages: {error}", "messages") from None
        if body.max_completion_tokens is not None:
            body.max_tokens = body.max_completion_tokens
        return await _answer(request, body, ids, "chat.completion")

    async def _answer(request: Request, body: Sampling, ids: list[int], kind: str) -> Response:
        if body.model != target.name:
            raise ApiError(404, f"the model '{body.model}' does not exist here; this server serves '{target.name}'",
                           "model", "model_not_found")
        if not ids:
            raise ApiError(400, "the prompt is empty; send at least one token of text", "prompt")
        max_tokens = body.max_tokens if body.max_tokens is not None else max(min(settings.max_tokens, context - len(ids)), 1)
        if max_tokens > settings.max_tokens:
            raise ApiError(400, f"max_tokens is {max_tokens}; this server allows at most {settings.max_tokens}",
                           "max_tokens")
        name = body.method or settings.method
        try:
            method = model.method(name)
            params = SamplingParams(1.0 if body.temperature is None else body.temperature,
                                    1.0 if body.top_p is None else body.top_p, body.top_k or 0,
                                    None if body.seed is None else body.seed % SEED_LIMIT)
            proposer = method.bind(target, params) if method is not None else None
        except EaglespecError as error:
            raise ApiError(400, str(error), "method" if body.method else None) from None
        source = (method.source or method.name) if method is not None else "target"
        job = Job(DecodeRequest(ids, params, max_tokens, target.eos_token_ids, proposer), body.stops(), source,
                  asyncio.get_running_loop(), time.monotonic() + settings.timeout_s)
        try:
            engine.submit(job)
        except QueueFull:
            raise ApiError(429, f"the server is busy ({settings.max_queue} requests are waiting); retry shortly",
                           code="queue_full", headers={"Retry-After": "1"}) from None
        events = _events(request, job, engine)
        first = await anext(events)
        if first[0] == "error":
            raise ApiError(first[1], first[2])
        reply = Reply(kind, target.name, name, len(ids))
        if body.stream:
            usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(reply.stream(events, usage), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        return JSONResponse(await reply.whole(events))

    return router


async def _events(request: Request, job: Job, engine: Engine) -> AsyncIterator[tuple]:
    """A job's events; its row is cancelled if the client goes away or the reader stops early."""
    ended, checked = False, time.monotonic()
    try:
        while True:
            try:
                event = await asyncio.wait_for(job.events.get(), 1.0)
            except TimeoutError:
                event = None
            if time.monotonic() - checked >= 1.0:  # has the client gone away?
                checked = time.monotonic()
                if await request.is_disconnected():
                    return
            if event is None:
                continue
            ended = event[0] in ("done", "error")
            yield event
            if ended:
                return
    finally:
        if not ended:
            engine.cancel(job)


class Reply:
    """One request's answer in OpenAI's shapes, whole or as server-sent events."""

    def __init__(self, kind: str, model: str, method: str, prompt_tokens: int):
        self.kind, self.model, self.method, self.prompt_tokens = kind, model, method, prompt_tokens
        self.id = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + secrets.token_hex(12)
        self.created = int(time.time())

    def _choice(self, text: str | None, finish: str | None, whole: bool) -> dict:
        if self.kind == "text_completion":
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        if whole:
            return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                    "finish_reason": finish}
        delta = {} if text is None else {"content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def _envelope(self, choices: list, chunk: bool) -> dict:
        kind = self.kind + (".chunk" if chunk and self.kind == "chat.completion" else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model, "choices": choices}

    def _usage(self, figures: dict) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": figures["tokens"],
                "total_tokens": self.prompt_tokens + figures["tokens"]}

    async def whole(self, events: AsyncIterator[tuple]) -> dict:
        text = []
        async for event in events:
            if event[0] == "text":
                text += [piece for piece, _ in event[1]]
            elif event[0] == "error":
                raise ApiError(event[1], event[2])
            elif event[0] == "done":
                _, finish, figures = event
                return self._envelope([self._choice("".join(text), FINISH.get(finish, "stop"), True)], False) | {
                    "usage": self._usage(figures), "eaglespec": {"method": self.method, **figures}}
        raise ApiError(500, "the request ended without an answer")

    async def stream(self, events: AsyncIterator[tuple], usage: bool) -> AsyncIterator[str]:
        if self.kind == "chat.completion":
            first = self._envelope([self._choice(None, None, False)], True)
            first["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            yield _sse(first)
        async for event in events:
            if event[0] == "text":
                _, pieces, figures = event
                chunk = self._envelope([self._choice("".join(p for p, _ in pieces), None, False)], True)
                yield _sse(chunk | {"eaglespec": {"spans": pieces, **figures}})
            elif event[0] == "error":
                yield _sse(ApiError(event[1], event[2]).body())
            elif event[0] == "done":
                _, finish, figures = event
                last = self._envelope([self._choice(None, FINISH.get(finish, "stop"), False)], True)
                yield _sse(last | {"eaglespec": {"method": self.method, **figures}})
                if usage:
                    yield _sse(self._envelope([], True) | {"usage": self._usage(figures)})
        yield "data: [DONE]\n\n"


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


async def _json(request: Request, limit: int) -> object:
    """The body as JSON, read no further than `limit` bytes."""
    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError:
        raise ApiError(400, "the Content-Length header is not a number") from None
    if declared > limit:
        raise ApiError(413, f"the request body is {declared} bytes; this server takes at most {limit}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"the request body is over {limit} bytes; this server takes at most {limit}")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise ApiError(400, "the request body is not valid JSON") from None


class EngineCollector:
    """Prometheus metrics read from the engine when /metrics is scraped."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self):
        m, engine = self.engine.metrics, self.engine

        def counter(name: str, text: str, by: str | None = None, values: dict | int = 0):
            family = CounterMetricFamily(name, text, labels=[by] if by else None)
            for key, value in (sorted(values.items()) if by else [(None, values)]):
                family.add_metric([key] if by else [], value)
            return family

        yield counter("eaglespec_requests", "Requests by outcome.", "outcome", dict(m.requests))
        yield GaugeMetricFamily("eaglespec_queue_depth", "Requests waiting to be decoded.", engine.waiting())
        yield GaugeMetricFamily("eaglespec_active_rows", "Requests being decoded.", len(engine.scheduler.active))
        yield counter("eaglespec_prompt_tokens", "Prompt tokens of requests taken.", values=m.prompt_tokens)
        yield counter("eaglespec_generated_tokens", "Tokens generated.", values=m.generated_tokens)
        yield counter("eaglespec_target_forwards", "Rounds of rows (a row's share of a target forward).",
                      values=m.target_forwards)
        yield GaugeMetricFamily("eaglespec_tau", "Tokens per row round since start.",
                                m.generated_tokens / m.target_forwards if m.target_forwards else 0.0)
        yield GaugeMetricFamily("eaglespec_tokens_per_second", "Tokens generated per second, last 10 s.",
                                m.tokens_per_s())
        yield counter("eaglespec_accepted_tokens", "Generated tokens by origin.", "origin", dict(m.accepted))
