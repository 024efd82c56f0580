"""tests/requires.py, run by pytest inside pytest: a test whose service or package is missing
skips on a developer's machine and fails under CI=true, whether it finds out in the test or at
import, while other tests are untouched; and no test skips any other way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

IN_TEST = '''
from requires import missing, require_module


def test_needs_a_package():
    require_module("tunix_rt_no_such_package")


def test_needs_a_service():
    missing("the frobnicator is not running")


def test_has_what_it_needs():
    assert require_module("json").dumps(1) == "1"
'''

AT_IMPORT = '''
from requires import require_module

require_module("tunix_rt_no_such_package")


def test_never_runs():
    pass
'''


@pytest.fixture
def inner(pytester, monkeypatch):
    """run(ci, source) → the inner pytest's result, with CI set to `ci` (None: unset)."""
    pytester.syspathinsert(TESTS)

    def run(ci: str | None, source: str):
        if ci is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", ci)
        return pytester.runpytest(pytester.makepyfile(test_inner=source), "-p", "no:cacheprovider", "-rsf")

    return run


@pytest.mark.parametrize("ci", [None, "false", ""])
def test_missing_skips_outside_ci(inner, ci):
    r = inner(ci, IN_TEST)
    r.assert_outcomes(passed=1, skipped=2)
    r.stdout.fnmatch_lines(["*SKIPPED*needs the tunix_rt_no_such_package package*",
                            "*SKIPPED*the frobnicator is not running*"])
    inner(ci, AT_IMPORT).assert_outcomes(skipped=1)


@pytest.mark.parametrize("ci", ["true", "TRUE", "1"])
def test_missing_fails_under_ci(inner, ci):
    r = inner(ci, IN_TEST)
    r.assert_outcomes(passed=1, failed=2)
    r.stdout.fnmatch_lines(["FAILED*test_needs_a_package*needs the tunix_rt_no_such_package package*CI=true*",
                            "FAILED*test_needs_a_service*the frobnicator is not running*CI=true*"])
    r = inner(ci, AT_IMPORT)
    r.assert_outcomes(errors=1)
    r.stdout.fnmatch_lines(["*needs the tunix_rt_no_such_package package*CI=true*"])


SKIPS = re.compile(r"\bpytest\s*\.\s*(skip|importorskip)\s*\(|\bmark\s*\.\s*skip(if)?\b|\bskip\.Exception\b")


def test_no_test_skips_around_requires():
    """A plain skip would pass CI silently; requires.py is the one place that may skip."""
    mine = {TESTS / "requires.py", Path(__file__).resolve()}
    found = [f"{p.relative_to(TESTS)}:{n}" for p in sorted(TESTS.rglob("*.py")) if p not in mine
             for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if SKIPS.search(line)]
    assert not found, f"skip through tests/requires.py (missing/require_*), not directly: {found}"
