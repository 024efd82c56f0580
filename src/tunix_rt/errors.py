"""Errors with a meaning for the CLI: BadInput exits 2, TunixRtError exits 1."""


class TunixRtError(Exception):
    """A failure the user should read (exit code 1)."""

    exit_code = 1


class BadInput(TunixRtError):
    """Bad input or bad usage: a malformed file, an unknown name, a wrong flag (exit code 2)."""

    exit_code = 2
