"""What a test needs from outside the repository: PostgreSQL, Debian chromium, bubblewrap, an
optional package (jax, torch, transformers, playwright). The one place that decides what happens
when it is missing: the test skips, with the reason, on a developer's machine; under CI (`CI=true`,
set by GitHub Actions and by .ci/run, which installs all of them) it fails, so a CI run
whose environment lost a service cannot turn green by skipping what it was meant to test.

Every test reaches its services through these functions, never through `pytest.skip` or
`pytest.importorskip` (tests/test_requires.py checks both, the behaviour and that rule)."""

from __future__ import annotations

import importlib
import os
import shutil
from types import ModuleType
from typing import NoReturn

import pytest

CHROMIUM = "/usr/bin/chromium"
"""Debian's chromium, driven by Playwright (never a downloaded browser)."""


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def missing(reason: str) -> NoReturn:
    """Skip the calling test (or module) for `reason`; fail it under CI."""
    if under_ci():
        pytest.fail(f"{reason} (CI=true: a missing service or package fails the test; .ci/run installs them)",
                    pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str) -> ModuleType:
    """The imported module, or missing() naming the import error."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(f"needs the {name} package (pip install -e '.[torch,jax,service,dev]'): {e}")


def require_chromium() -> str:
    """The chromium executable Playwright drives (and Playwright itself)."""
    require_module("playwright")
    path = CHROMIUM if os.path.exists(CHROMIUM) else shutil.which("chromium")
    if path is None:
        missing("Debian chromium is not installed (apt-get install chromium; .ci/run does)")
    return path


def require_bwrap() -> str:
    """Debian's bubblewrap, the sandbox of the python tool (tunix_rt.tools.python)."""
    path = shutil.which("bwrap")
    if path is None:
        missing("bubblewrap is not installed (apt-get install bubblewrap; .ci/run does)")
    return path


def require_jemalloc() -> str:
    """Debian's jemalloc, which the compute commands preload (tunix_rt.heap)."""
    from tunix_rt.heap import jemalloc_path

    path = jemalloc_path()
    if path is None:
        missing("jemalloc is not installed (apt-get install libjemalloc2; .ci/run does)")
    return path
