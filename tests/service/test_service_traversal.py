"""Artifact downloads stay inside the run directory: 200+ traversal payloads, sent as raw
HTTP request lines to a real uvicorn (no client-side normalisation), all answered 4xx,
and a canary file outside the run directory is never opened (a Python audit hook watches
every open() in the server's process)."""

from __future__ import annotations

import os
import socket
import sys
import threading
from urllib.parse import quote

import pytest

from service_testlib import TOKEN, LiveServer, live_app
from registry_testlib import write_run
from tunix_rt.registry.record import record_run

SECRET = "CANARY-7f3a9c-do-not-serve"
_opened: list[str] = []
_watch: set[str] = set()
_hook_lock = threading.Lock()


def _audit(event: str, args: tuple) -> None:
    if event == "open" and _watch and args and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0]) if not isinstance(args[0], str) else args[0]
        if any(w in path for w in _watch):
            with _hook_lock:
                _opened.append(path)


sys.addaudithook(_audit)


def raw_get(port: int, target: bytes, token: str | None = TOKEN) -> tuple[int, bytes]:
    """Send one request line exactly as given; return (status, body)."""
    head = b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    if token:
        head += b"Authorization: Bearer " + token.encode() + b"\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + b"\r\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status_line, _, rest = data.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def payloads(canary_abs: str) -> list[str]:
    """Traversal attempts in raw and encoded forms (deduplicated)."""
    bases = [f"{'../' * k}canary.txt" for k in range(1, 7)]
    bases += ["..\\" * k + "canary.txt" for k in range(1, 5)]
    bases += [f"eval/{'../' * k}canary.txt" for k in range(1, 6)]
    bases += [f"./{'../' * k}canary.txt" for k in range(1, 4)]
    bases += [canary_abs, "/etc/passwd", "//etc/passwd", "~/canary.txt", "C:\\canary.txt", "c:/canary.txt",
              "file:///etc/passwd", "....//canary.txt", "..../canary.txt", "..;/canary.txt", ".../canary.txt",
              "..%2fcanary.txt", "..%5ccanary.txt", "%2e%2e/canary.txt", "%2e%2e%2fcanary.txt", ".%2e/canary.txt",
              "%252e%252e%252fcanary.txt", "%c0%ae%c0%ae/canary.txt", "..%c0%afcanary.txt", "..%e0%80%afcanary.txt",
              "\uff0e\uff0e/canary.txt", "..\u2215canary.txt", "canary.txt\x00.png", "..\x00/canary.txt",
              "config.yaml\x00/../../canary.txt", "link-canary", "link-out/canary.txt", "eval/link-up/canary.txt",
              "link-abs", "eval/link-up/home-canary.txt", "checkpoints/../../canary.txt", "eval/dev/../../../canary.txt"]
    out: list[str] = []
    for b in bases:
        forms = [b, quote(b, safe="/"), quote(b, safe=""), quote(quote(b, safe=""), safe=""),
                 b.replace("/", "%2f"), b.replace("/", "%252f"), b.replace(".", "%2e"), b.replace(".", "%252e"),
                 b.replace("/", "\\")]
        for f in forms:
            if f not in out and f not in ("config.yaml", "metrics.jsonl"):
                out.append(f)
    return out


def _target(p: str) -> bytes:
    """The payload's bytes as sent: raw, except bytes that would end the request line."""
    return b"".join(b"%%%02X" % c if c in b" \r\n" else bytes([c]) for c in p.encode("utf-8"))


@pytest.fixture
def server(home, tmp_path):
    run = write_run(home, "victim-run")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text(SECRET)
    (home.root / "canary.txt").write_text(SECRET)
    (home.runs / "canary.txt").write_text(SECRET)
    (run / "link-canary").symlink_to(outside / "canary.txt")
    (run / "link-abs").symlink_to("/etc/passwd")
    (run / "link-out").symlink_to(outside, target_is_directory=True)
    (run / "eval").mkdir(exist_ok=True)
    (run / "eval" / "link-up").symlink_to("../../..", target_is_directory=True)
    record_run(run, strict=True)
    with LiveServer(live_app(home, home.database_url)) as srv:
        yield srv, outside / "canary.txt"


def test_traversal_payloads_are_refused_and_the_canary_never_opened(server):
    srv, canary = server
    cases = payloads(str(canary))
    assert len(cases) >= 200, len(cases)
    prefix = b"/api/runs/victim-run/artifacts/"
    _watch.add("canary.txt")
    _watch.add("/etc/passwd")
    try:
        results = []
        for p in cases:
            status, body = raw_get(srv.port, prefix + _target(p))
            results.append((p, status))
            assert SECRET.encode() not in body, p
            assert b"root:" not in body, p
        # The run id is a path segment too.
        for rid in ("..", "..%2f..", "%2e%2e", "..%252f..", "victim-run%2f..%2f.."):
            status, body = raw_get(srv.port, f"/api/runs/{rid}/artifacts/canary.txt".encode())
            results.append((rid, status))
            assert SECRET.encode() not in body
    finally:
        _watch.clear()
    from collections import Counter

    print("traversal:", len(results), "requests;", dict(Counter(s for _, s in results)))
    bad = [(p, s) for p, s in results if not 400 <= s < 500]
    assert not bad, bad
    assert _opened == [], _opened
    # Control: the same server serves a real file, and the audit hook sees it opened
    # (so the two checks above are not vacuous).
    _watch.add("victim-run/config.yaml")
    try:
        status, body = raw_get(srv.port, prefix + b"config.yaml")
    finally:
        _watch.clear()
    assert status == 200 and b"tiny-gemma3" in body
    assert any(p.endswith("victim-run/config.yaml") for p in _opened)
    status, body = raw_get(srv.port, prefix + b"eval/../config.yaml")
    assert 400 <= status < 500


def test_listing_skips_symlinks_that_leave(server, home):
    from fastapi.testclient import TestClient

    from tunix_rt.service.app import create_app
    from tunix_rt.service.settings import Settings

    client = TestClient(create_app(Settings(home=home.root, database_url=home.database_url, token=TOKEN)),
                        headers={"Authorization": f"Bearer {TOKEN}"})
    listed = [a["path"] for a in client.get("/api/runs/victim-run/artifacts").json()]
    assert "config.yaml" in listed
    assert not any(p.startswith(("link-", "eval/link-up")) for p in listed), listed
