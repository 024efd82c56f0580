"""Registry fixtures: `db_url` runs a test on SQLite and on PostgreSQL (its own schema,
dropped afterwards; requires.missing() when 127.0.0.1:5432 does not answer: skipped with the
reason, failed under CI)."""

from __future__ import annotations

import pytest

from registry_testlib import pg_database


@pytest.fixture(autouse=True)
def _fresh_engines():
    """Engines are cached per URL; each test's database is its own, so drop them after."""
    yield
    from tunix_rt.registry import db

    db.dispose_all()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, home, monkeypatch) -> str:
    if request.param == "sqlite":
        yield home.database_url
        return
    with pg_database(monkeypatch) as url:
        yield url
