"""Service fixtures: an app built by create_app() on a temporary home, over SQLite and over
PostgreSQL (a schema of its own; requires.missing() when 127.0.0.1:5432 is down: skipped with the
reason, failed under CI)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "registry"))

from registry_testlib import pg_database, seed_home  # noqa: E402
from service_testlib import make_client  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_engines():
    yield
    from tunix_rt.registry import db

    db.dispose_all()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db(request, home, monkeypatch) -> str:
    if request.param == "sqlite":
        yield home.database_url
        return
    with pg_database(monkeypatch) as url:
        yield url


@pytest.fixture
def seeded(home, any_db):
    """(client, ids): a home with runs, evaluations and a dataset, indexed by registry sync."""
    from tunix_rt.registry.record import sync_home

    ids = seed_home(home)
    sync_home(home)
    with make_client(home, any_db) as client:
        yield client, ids


@pytest.fixture
def sqlite_seeded(home):
    from tunix_rt.registry.record import sync_home

    ids = seed_home(home)
    sync_home(home)
    with make_client(home, home.database_url) as client:
        yield client, ids
