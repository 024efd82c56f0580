"""`tunix-rt ARGS` in the test's own process, through the real entry point (its exit codes and
what it prints), for the tests of every stage's CLI."""

from __future__ import annotations

import sys


def cli_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """`tunix-rt ARGS` through the real entry point in this process: (exit code, stdout, stderr)."""
    from tunix_rt.cli import main

    monkeypatch.setattr(sys, "argv", ["tunix-rt", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err
