"""Deny by default: every route of the app refuses a request without the token (401), except
/api/health and the UI shell (HTML/JS/CSS, no data). Plus the token file and `tunix-rt serve`."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
import time

import httpx
from fastapi.routing import APIRoute
from starlette.routing import Mount, Route

from service_testlib import TOKEN, make_client
from tunix_rt.service.auth import is_public
from tunix_rt.service.settings import load_or_create_token

PUBLIC = {("GET", "/api/health"), ("GET", "/"), ("GET", "/static/app.js")}


def _concrete(path: str) -> str:
    return re.sub(r"\{(\w+)(:path)?\}", lambda m: "1" if m.group(1) == "job_id" else "x/y" if m.group(1) == "path" else "x", path)


def _flatten(routes) -> list:
    """app.routes with included routers expanded (FastAPI keeps them as one entry each)."""
    out = []
    for r in routes:
        inner = getattr(r, "original_router", None)
        out.extend(_flatten(inner.routes) if inner is not None else [r])
    return out


def _cases(app) -> list[tuple[str, str]]:
    cases: list[tuple[str, str]] = []
    for route in _flatten(app.routes):
        if isinstance(route, Mount):
            cases += [("GET", route.path + "/app.js"), ("GET", route.path + "/style.css")]
        elif isinstance(route, (APIRoute, Route)):
            cases += [(m, _concrete(route.path)) for m in sorted(route.methods or ["GET"]) if m != "HEAD"]
    from_openapi = {(m.upper(), _concrete(p)) for p, ops in app.openapi()["paths"].items() for m in ops}
    assert from_openapi <= set(cases), from_openapi - set(cases)  # the walk misses nothing documented
    return cases


def test_every_route_refuses_without_a_token(home):
    client = make_client(home, home.database_url)
    client.headers.pop("Authorization")
    walked, public = 0, set()
    for method, path in _cases(client.app):
        walked += 1
        for headers in ({}, {"Authorization": "Bearer wrong-token-wrong-token"}, {"Authorization": f"Basic {TOKEN}"},
                        {"X-Tunix-Token": "nope"}):
            r = client.request(method, path, headers=headers)
            if (method, path) in PUBLIC or path == "/static/style.css":
                public.add((method, path))
                assert r.status_code == 200, (method, path)
            else:
                assert r.status_code == 401, (method, path, headers, r.status_code)
        if (method, path) not in public:
            r = client.request(method, path + f"?token={TOKEN}")  # tokens in URLs are not accepted
            assert r.status_code == 401, (method, path)
    assert walked >= 20
    assert public == PUBLIC | {("GET", "/static/style.css")}
    for path in ("/api/nope", "/static/../api/runs", "/static/..%2fapi/runs", "/api/openapi.json", "/docs"):
        assert client.get(path).status_code == 401, path
    assert not is_public("/static/%2e%2e/x") and not is_public("/static/a\\b")


def test_token_headers_accepted(home):
    client = make_client(home, home.database_url)
    client.headers.pop("Authorization")
    assert client.get("/api/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    assert client.get("/api/runs", headers={"X-Tunix-Token": TOKEN}).status_code == 200


def test_token_file_is_created_once_with_mode_0600(home):
    token, created = load_or_create_token(home)
    assert created and len(token) >= 32
    assert stat.S_IMODE(os.stat(home.root / "service_token").st_mode) == 0o600
    assert load_or_create_token(home) == (token, False)


def test_serve_binds_localhost_prints_the_token_and_refuses_without_it(home, tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, TUNIX_RT_HOME=str(home.root), PYTHONUNBUFFERED="1")
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tunix_rt.cli", "serve", "--port", str(port)],
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        token = (home.root / "service_token").read_text().strip()
        assert f"#token={token}" in log.read_text()
        assert httpx.get(base + "/api/runs", timeout=5).status_code == 401
        assert httpx.get(base + "/api/runs", headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code == 200
        listening = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True).stdout
        local = {line.split()[3] for line in listening.splitlines() if line.strip()}
        if local:  # `ss` present: the only listening address is loopback
            assert local == {f"127.0.0.1:{port}"}, listening
    finally:
        proc.terminate()
        proc.wait(timeout=20)
