"""Deny by default: an ASGI middleware refuses every request without the bearer token,
except the few paths that hold no data (health, the UI's static shell). New routes are
therefore protected without anyone remembering to add a dependency."""

from __future__ import annotations

import hmac
import json

PUBLIC_EXACT = {"/api/health", "/", "/favicon.ico"}
PUBLIC_PREFIX = ("/static/",)


def is_public(path: str) -> bool:
    """Exact public paths, or a static asset whose path cannot climb out of /static/."""
    if path in PUBLIC_EXACT:
        return True
    return path.startswith(PUBLIC_PREFIX) and not any(bad in path for bad in ("..", "\\", "%", "\x00", "//"))


def token_from_headers(headers: list[tuple[bytes, bytes]]) -> str | None:
    """`Authorization: Bearer T` or `X-Tunix-Token: T`."""
    for key, value in headers:
        k = key.lower()
        if k == b"authorization":
            scheme, _, cred = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return cred.strip()
        elif k == b"x-tunix-token":
            return value.decode("latin-1").strip()
    return None


class TokenAuth:
    def __init__(self, app, token: str) -> None:
        self.app = app
        self.token = token.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or is_public(scope["path"]):
            await self.app(scope, receive, send)
            return
        given = token_from_headers(scope.get("headers", []))
        if given is not None and hmac.compare_digest(given.encode(), self.token):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"detail": "missing or invalid token (Authorization: Bearer <token>)"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
