"""Sweep fixtures: the registry and service helpers (registry_testlib, service_testlib) and fresh engines
per test (each test's database is its own)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

for _lib in ("registry", "service"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / _lib))


@pytest.fixture(autouse=True)
def _fresh_engines():
    yield
    from tunix_rt.registry import db

    db.dispose_all()
