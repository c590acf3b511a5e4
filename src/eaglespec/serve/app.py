"""`eaglespec serve`: an OpenAI-compatible server (FastAPI) over the batched scheduler, and a page
at / that shows which tokens the draft produced.

    GET  /health                 no key needed
    GET  /metrics                Prometheus text
    GET  /v1/models
    POST /v1/completions         prompt: text, a list of one text, or token ids
    POST /v1/chat/completions    messages rendered with the model's chat template
    GET  /                       the page

The endpoints and the server's settings are in `routes.py`, the API key in `auth.py`.
"""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from eaglespec.decoding.model import Model
from eaglespec.decoding.sampling import SamplingParams
from eaglespec.serve.auth import ApiKey
from eaglespec.serve.engine import Engine
from eaglespec.serve.openai_schema import ApiError
from eaglespec.serve.routes import Settings, openai_routes, service_routes

log = logging.getLogger("eaglespec.serve")


def create_app(model: Model, settings: Settings = Settings(), engine_thread: bool = True) -> FastAPI:
    """The server's app for a loaded model. Its engine (`app.state.engine`) starts on a thread of
    its own when the app starts, or with `engine_thread=False` runs where the caller runs
    `engine.run()` (the thread that warmed the model up here: see `Engine`). It stops at shutdown."""
    target = model.target
    context = target.model.config.max_position_embeddings
    for name in dict.fromkeys((settings.method, "vanilla")):  # a bad --method fails here, before serving
        method = model.method(name)
        if method is not None:
            method.bind(target, SamplingParams())  # measures what `auto` sizes trees by, once, now
    cache_tokens = settings.cache_tokens or settings.max_batch * min(context, 4096)
    engine = Engine(target, settings.max_batch, settings.max_queue, cache_tokens, settings.timeout_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if engine_thread:
            engine.start()
        yield
        engine.close()

    authorize = ApiKey(settings.api_key)
    app = FastAPI(title="eaglespec", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan,
                  dependencies=[Depends(authorize)])
    app.state.engine = engine

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, error: ApiError):
        return JSONResponse(error.body(), error.status, headers=error.headers)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, error: HTTPException):  # unknown paths, wrong methods
        try:
            await authorize(request)  # which no route's dependency checked: they need the key too
        except ApiError as refused:
            return await _api_error(request, refused)
        return JSONResponse(ApiError(error.status_code, str(error.detail)).body(), error.status_code)

    @app.exception_handler(Exception)
    async def _server_error(request: Request, error: Exception):
        log.exception("request failed")
        return JSONResponse(ApiError(500, "internal server error").body(), 500)

    app.include_router(service_routes(engine))
    app.include_router(openai_routes(model, settings, engine))
    return app
