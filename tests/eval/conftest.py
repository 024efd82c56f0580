"""Tiny models built once per test session (seconds), shared read-only by the eval tests."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest

from tunix_rt.home import Home


@pytest.fixture(scope="session")
def tiny_home(tmp_path_factory) -> Home:
    """A home holding tiny-gemma3 and tiny-gemma2 (built on first use by ensure_model)."""
    return Home.resolve(tmp_path_factory.mktemp("eval-tiny-home")).ensure()


@pytest.fixture(scope="session")
def tiny_dirs(tiny_home):
    from tunix_rt.models.store import ensure_model

    return {name: ensure_model(name, tiny_home) for name in ("tiny-gemma3", "tiny-gemma2")}


@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a shared, oversubscribed CPU
    the OpenMP threads of one process spin waiting for each other (measured: 5x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(home, capsys, monkeypatch):
    """Run `tunix-rt ARGS…` through tunix_rt.cli.main, as the console script does."""
    from tunix_rt.cli import main

    def run(*args: str) -> Result:
        monkeypatch.setattr(sys, "argv", ["tunix-rt", *map(str, args)])
        capsys.readouterr()
        try:
            main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run
