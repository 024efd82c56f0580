"""The FastAPI app factory. `create_app(settings)` builds everything from one Settings, so
tests point it at a temporary home and database; `tunix-rt serve` runs it with uvicorn."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from tunix_rt import __version__
from tunix_rt.errors import BadInput, TunixRtError
from tunix_rt.registry import db
from tunix_rt.registry.queries import NotFound
from tunix_rt.service.auth import TokenAuth
from tunix_rt.service.routers import datasets, evaluations, health, jobs, models, openai, runs, sweeps
from tunix_rt.service.settings import Settings

STATIC = Path(__file__).resolve().parent / "static"
UPLOAD_PATH = datasets.router.prefix
UPLOAD_ENVELOPE = 64 * 1024
"""Room for the multipart headers and boundaries around an upload's file bytes."""
SECURITY_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY")]


def create_app(settings: Settings) -> FastAPI:
    """The API under /api (token required except /api/health), the OpenAI-compatible
    /v1 (token required), the UI at / and /static/."""
    db.get_engine(settings.database_url)  # migrate now, not on the first request
    app = FastAPI(title="tunix-rt", version=__version__, docs_url=None, redoc_url=None, openapi_url=None,
                  description="Registry, jobs and evaluations of tunix-rt. Send `Authorization: Bearer <token>`.",
                  lifespan=_lifespan)
    app.state.settings = settings
    for r in (health, datasets, runs, jobs, evaluations, models, sweeps):
        app.include_router(r.router)
    openai.install(app)
    _errors(app)
    _ui(app)

    @app.get("/api/openapi.json", include_in_schema=False)
    def openapi() -> dict:
        return app.openapi()

    app.add_middleware(_SecurityHeaders)
    app.add_middleware(_BodyLimit, limit_for=lambda method, path: body_limit(settings, method, path))
    app.add_middleware(TokenAuth, token=settings.token)
    return app


@asynccontextmanager
async def _lifespan(app: FastAPI):
    yield
    if getattr(app.state, "models", None) is not None:  # stop the decode threads
        app.state.models.close()


def _errors(app: FastAPI) -> None:
    @app.exception_handler(NotFound)
    async def _not_found(_req: Request, e: NotFound) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=404)

    @app.exception_handler(BadInput)
    async def _bad_input(_req: Request, e: BadInput) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=400)

    @app.exception_handler(TunixRtError)
    async def _failure(_req: Request, e: TunixRtError) -> JSONResponse:
        return JSONResponse({"detail": str(e)}, status_code=500)


def _ui(app: FastAPI) -> None:
    """One page of our own HTML/JS/CSS; it holds no data and asks for the token itself."""
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})


class _SecurityHeaders:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        async def _send(message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + SECURITY_HEADERS
            await send(message)
        await self.app(scope, receive, _send if scope["type"] == "http" else send)


def body_limit(settings: Settings, method: str, path: str) -> int:
    """The one rule for request bodies: a dataset upload carries up to max_upload_bytes of
    file plus its multipart envelope; every other body (JSON) at most max_body_bytes."""
    if method == "POST" and path == UPLOAD_PATH:
        return settings.max_upload_bytes + UPLOAD_ENVELOPE
    return settings.max_body_bytes


class _BodyLimit:
    """Refuse (413) a request body over its limit before any route parses or stores it: at
    once when Content-Length declares too much, else as soon as the bytes received pass the
    limit (a chunked body declares nothing). The server then closes the connection, so the
    client stops sending."""

    def __init__(self, app, limit_for) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["method"], scope["path"])
        if _declared_length(scope) > limit:
            await _send_too_large(send, limit)
            return
        received = 0

        async def counted():
            nonlocal received
            if received > limit:  # refused already: read on as if the client had left
                return {"type": "http.disconnect"}
            message = await receive()
            received += len(message.get("body", b"")) if message["type"] == "http.request" else 0
            if received > limit:  # raised inside the route's body read: FastAPI answers it as is
                raise HTTPException(413, _too_large(limit))
            return message

        await self.app(scope, counted, send)


def _declared_length(scope) -> int:
    for key, value in scope.get("headers", []):
        if key == b"content-length" and value.isdigit():
            return int(value)
    return 0


def _too_large(limit: int) -> str:
    return f"request body over the limit of {limit:,} bytes"


async def _send_too_large(send, limit: int) -> None:
    body = json.dumps({"detail": _too_large(limit)}).encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
