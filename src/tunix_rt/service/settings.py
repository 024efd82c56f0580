"""Service settings, resolved once: from the home and the environment, never re-read later."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pydantic import BaseModel, Field

from tunix_rt.eval.generate import DecodeConfig
from tunix_rt.home import Home

TOKEN_FILE = "service_token"


class Settings(BaseModel):
    """Everything the app reads; tests build one pointing at a temporary home and database."""

    home: Path
    """TUNIX_RT_HOME: runs, datasets, uploads live under it."""
    database_url: str
    """SQLite in the home by default; DATABASE_URL selects PostgreSQL."""
    token: str = Field(min_length=16)
    """The bearer token every route except /api/health and the UI shell requires."""
    max_upload_bytes: int = 32 * 1024 * 1024
    """Largest dataset upload accepted (413 above)."""
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1)
    """Largest body of any other request (JSON: /v1 messages, job parameters); 413 above,
    counted as it arrives."""
    sse_poll_s: float = 0.5
    """How often a log stream looks for new chunks."""
    sse_max_s: float = 3600.0
    """A log stream closes after this long (the client reconnects with Last-Event-ID)."""
    max_attempts: int = 3
    """Attempts a submitted job gets before it is marked dead."""
    serve_device: str = Field("auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    """Where served models run (/v1/chat/completions, the playground)."""
    serve_max_models: int = Field(2, ge=1)
    """Models kept loaded at once; loading another unloads the least recently used idle one
    (a model with requests in flight never is)."""
    serve_max_batch: int = Field(DecodeConfig().batch_size, ge=1)
    """Completions (rows) one model decodes together; later requests wait in the queue."""
    serve_max_queue: int = Field(64, ge=0)
    """Requests allowed to wait for a free row per model; past this a request gets 429."""
    serve_max_tokens: int = Field(1024, ge=1)
    """Cap on max_tokens: a request asking for more gets at most this many."""
    serve_load_wait_s: float = Field(30.0, ge=0)
    """How long a request for a model that is not loaded waits for a loaded one to finish its
    requests (a model in use is never unloaded) before a 503 with Retry-After."""
    serve_tools: bool = True
    """Served runs decode with their tools (config.yaml `tools`); False: no model uses tools."""
    serve_weights: str = Field("fp32", pattern=r"^(fp32|int8|int4)$")
    """fp32 | int8 | int4: served models decode on weight-only int8 or int4 weights (tunix_rt.eval.int8_weights)."""

    @classmethod
    def from_home(cls, home: Home | None = None, **overrides) -> "Settings":
        home = (home or Home.resolve()).ensure()
        values = {"home": home.root, "database_url": home.database_url, "token": load_or_create_token(home)[0]}
        values.update(overrides)
        return cls(**values)

    @property
    def home_obj(self) -> Home:
        return Home(self.home)


def load_or_create_token(home: Home) -> tuple[str, bool]:
    """The service token from <home>/service_token (mode 0600), created on first use.
    Returns (token, created)."""
    path = home.root / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        token = path.read_text(encoding="utf-8").strip()
        if len(token) >= 16:
            return token, False
        path.unlink()
        return load_or_create_token(home)
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    return token, True
