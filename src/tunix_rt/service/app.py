"""The FastAPI app factory. `create_app(settings)` builds everything from one Settings, so
tests point it at a temporary home and database; `tunix-rt serve` runs it with uvicorn."""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
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
    app.add_middleware(_BodyLimit, limit=settings.max_upload_bytes + 64 * 1024)
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


class _BodyLimit:
    """Refuse (413) a request whose declared Content-Length is over the upload limit before
    its body is read; the upload route also counts the bytes it actually receives."""

    def __init__(self, app, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            for key, value in scope.get("headers", []):
                if key == b"content-length" and value.isdigit() and int(value) > self.limit:
                    body = b'{"detail": "request body over the upload limit"}'
                    await send({"type": "http.response.start", "status": 413,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(body)).encode())]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)
