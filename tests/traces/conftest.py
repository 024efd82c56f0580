"""Fixtures for the trace tests: run the real `tunix-rt` entry point in-process."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest


@dataclass
class Result:
    code: int
    out: str
    err: str


@pytest.fixture
def cli(home, capsys, monkeypatch):
    """Run `tunix-rt ARGS…` through tunix_rt.cli.main (the console script's function), so
    exit codes and messages are exactly what a user sees."""
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
