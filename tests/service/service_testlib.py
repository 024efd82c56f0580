"""Helpers for the service tests: an app on a temporary home, and a real uvicorn server."""

from __future__ import annotations

TOKEN = "test-token-0123456789abcdef"


def make_client(home, url: str):
    from fastapi.testclient import TestClient

    from tunix_rt.service.app import create_app
    from tunix_rt.service.settings import Settings

    settings = Settings(home=home.root, database_url=url, token=TOKEN, sse_poll_s=0.05, max_upload_bytes=64 * 1024)
    return TestClient(create_app(settings), headers={"Authorization": f"Bearer {TOKEN}"})


def models_of(app):
    """The app's loaded models: /v1's model cache, made on first use (a test that looks at it
    before any request, or a teardown after none, gets the cache, not an AttributeError)."""
    from tunix_rt.service.routers.openai import model_cache

    return model_cache(app)


class LiveServer:
    """The app served by a real uvicorn in a thread (what `tunix-rt serve` runs)."""

    def __init__(self, app) -> None:
        import socket
        import threading

        import uvicorn

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "LiveServer":
        import time

        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def live_app(home, url: str, **overrides):
    from tunix_rt.service.app import create_app
    from tunix_rt.service.settings import Settings

    values = dict(home=home.root, database_url=url, token=TOKEN, sse_poll_s=0.1)
    values.update(overrides)
    return create_app(Settings(**values))
