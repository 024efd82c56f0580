"""Registry fixtures: `db_url` runs a test on SQLite and on PostgreSQL (its own schema,
dropped afterwards; skipped, with the reason, when 127.0.0.1:5432 does not answer)."""

from __future__ import annotations

import pytest

from registry_testlib import pg_admin_url, pg_drop_schema, pg_reachable, pg_schema_url


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
    if not pg_reachable():
        pytest.skip("PostgreSQL not reachable on 127.0.0.1:5432")
    admin = pg_admin_url()
    if admin is None:
        pytest.skip("PostgreSQL on 127.0.0.1:5432 accepts neither user postgres nor root (trust auth)")
    url, schema = pg_schema_url(admin)
    monkeypatch.setenv("DATABASE_URL", url)
    yield url
    from tunix_rt.registry import db

    db.dispose_all()
    pg_drop_schema(admin, schema)
