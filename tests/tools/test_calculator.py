"""The calculator tool: an exact evaluator checked against Python's fractions on thousands of
random expressions, its result text, and every bad, huge or undefined input as an error
result (never an exception)."""

from __future__ import annotations

import json
import random
import re
import time
from fractions import Fraction
from importlib import resources

import pytest

from tunix_rt.tools import calculator
from tunix_rt.tools.calculator import CalcError, calculate, evaluate, format_value


def _random_expr(rng: random.Random, depth: int = 0) -> tuple[str, Fraction]:
    """A random expression and its exact value, built alongside (the oracle is Fraction
    arithmetic on the tree, never the parser under test)."""
    if depth > 3 or rng.random() < 0.3:
        kind = rng.randrange(3)
        if kind == 0:
            n = rng.randrange(0, 10**rng.randrange(1, 7))
            return str(n), Fraction(n)
        if kind == 1:
            whole, places = rng.randrange(0, 1000), rng.randrange(1, 4)
            frac = rng.randrange(0, 10**places)
            text = f"{whole}.{frac:0{places}d}" if rng.random() < 0.8 else f".{frac:0{places}d}"
            return text, Fraction(text)
        n = rng.randrange(1000, 10**7)
        return f"{n:,}", Fraction(n)
    if rng.random() < 0.1:
        text, v = _random_expr(rng, depth + 1)
        return f"-({text})", -v
    if rng.random() < 0.15:
        text, v = _random_expr(rng, depth + 1)
        return f"({text})", v
    op = rng.choice("+-*/")
    (a, va), (b, vb) = _random_expr(rng, depth + 1), _random_expr(rng, depth + 1)
    if op == "/" and vb == 0:
        op = "+"
    # parenthesise both sides: the oracle's tree is then exactly what the parser must read
    space = " " if rng.random() < 0.3 else ""
    expr = f"({a}){space}{op}{space}({b})"
    return expr, {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else va}[op]


@pytest.mark.serial
def test_fuzz_thousands_of_random_expressions_against_fractions():
    rng = random.Random(24)
    start, checked = time.perf_counter(), 0
    for _ in range(5000):
        expr, value = _random_expr(rng)
        if len(expr) > calculator.MAX_CHARS or abs(value) >= calculator.MAX_RESULT:
            assert calculate(expr)[1]  # an error, not a crash
            continue
        assert evaluate(expr) == value, expr
        checked += 1
    assert checked > 3000
    assert time.perf_counter() - start < 3.0


def test_precedence_and_associativity_without_parentheses():
    rng = random.Random(7)
    for _ in range(2000):
        nums = [rng.randrange(1, 50) for _ in range(rng.randrange(2, 7))]
        ops = [rng.choice(["+", "-", "*", "/"]) for _ in nums[1:]]
        expr = str(nums[0]) + "".join(f"{o}{n}" for o, n in zip(ops, nums[1:]))
        # the oracle: * and / bind first, left to right; then + and -, left to right
        total, sign, product = Fraction(0), 1, Fraction(nums[0])
        for o, n in zip(ops, nums[1:]):
            if o in "*/":
                product = product * n if o == "*" else product / n
            else:
                total, sign, product = total + sign * product, 1 if o == "+" else -1, Fraction(n)
        assert evaluate(expr) == total + sign * product, expr


def test_unary_signs_percent_dollars_and_unicode_operators():
    assert evaluate("-3*-2") == 6
    assert evaluate("--3") == 3
    assert evaluate("+4-+1") == 3
    assert evaluate("20%*50") == 10
    assert evaluate("(1+1)%") == Fraction(1, 50)
    assert evaluate("$5*2") == 10
    assert evaluate("1,200*3") == 3600
    assert evaluate("−4×2÷8") == -1
    assert evaluate("560//10") == 56 and evaluate("7//2") == 3 and evaluate("-7//2") == -4
    assert evaluate(".5+5.") == Fraction(11, 2)
    assert evaluate(" 0.1 + 0.2 ") == Fraction(3, 10)  # exact, unlike floats


@pytest.mark.parametrize("value,text", [
    (Fraction(24), "24"), (Fraction(-3), "-3"), (Fraction(0), "0"), (Fraction(5, 2), "2.5"),
    (Fraction(1, 8), "0.125"), (Fraction(-2, 5), "-0.4"), (Fraction(1, 64), "0.015625"),
    (Fraction(10, 3), "3.3333"), (Fraction(2, 3), "0.6667"), (Fraction(-1, 3), "-0.3333"),
    (Fraction(1, 1024), "0.001"),  # terminates, but past 6 places: rounded to 4
    (Fraction(1, 30_000_000), "0"), (Fraction(-1, 30_000_000), "0"), (Fraction(1, 2) * 10**17, "50000000000000000"),
])
def test_result_text(value, text):
    assert format_value(value) == text


def test_results_are_exact_whatever_the_threads_decimal_context():
    """The result text never depends on the process's decimal context, which a library may have
    lowered (reasoning-gym's decimal_arithmetic sets its precision to 12)."""
    import decimal

    cases = {"123456789.5 / 3": "41152263.1667", "1234567.125 + 0": "1234567.125",
             "99999999999999999 / 7": "14285714285714285.5714", "10 / 4": "2.5"}
    for prec in (28, 6, 1):
        with decimal.localcontext(decimal.Context(prec=prec, traps=[decimal.Inexact])):
            assert {e: calculate(e)[0] for e in cases} == cases


@pytest.mark.parametrize("expr,reason", [
    ("", "empty"), ("   ", "empty"), ("5/0", "division by zero"), ("1/(2-2)", "division by zero"),
    ("3//0", "division by zero"), ("2**3", "syntax"), ("2^3", "syntax"), ("2x3", "syntax"),
    ("2(3)", "syntax"), ("(1+2", "syntax"), ("1+2)", "syntax"), ("1+", "syntax"), ("*2", "syntax"),
    ("1e5", "syntax"), ("..5", "syntax"), ("1.2.3", "syntax"), ("1,2", "syntax"), ("12,34", "syntax"),
    ("$", "syntax"), ("5$", "syntax"), ("%", "syntax"), ("²", "syntax"), ("٣", "syntax"),
    ("import os", "syntax"), ("__import__('os')", "syntax"), ("a=1", "syntax"), ("1;2", "syntax"),
    ("9" * 31, "too large"), ("99999999999999*99999999", "too large"), ("1" + "0" * 18, "too large"),
    ("1" * 201, "too long"), ("(" * 21 + "1" + ")" * 21, "too deep"),
])
def test_bad_expressions_are_error_results(expr, reason):
    assert calculate(expr) == (f"error: {reason}", True)
    assert reason in calculator.ERRORS
    with pytest.raises(CalcError):
        evaluate(expr)


@pytest.mark.serial
def test_huge_intermediates_are_refused_quickly():
    """No operation may grow a number without bound: every intermediate is checked."""
    big = "*".join(["999999999999999999999999999999"] * 6)  # 180 digits, 598 bits: still fine
    assert calculate(big)[1]  # the result is too large to write
    start = time.perf_counter()
    huge = "/".join(["999999999999999999999999999997"] * 6) + "*0"
    assert calculate(huge) == ("0", False)
    many = "1/" + "/".join(["999999999999999999999999999989"] * 5)
    assert calculate(many) == ("0", False)
    assert calculate("1" + "%" * 190) == ("error: too large", True)  # 1/10**380: past MAX_BITS
    assert time.perf_counter() - start < 0.5


def test_random_garbage_never_raises():
    rng = random.Random(3)
    alphabet = "0123456789+-*/().,%$ x^=e<>\n−×÷_a"
    for _ in range(3000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        out, error = calculate(text)
        assert isinstance(out, str) and (out.startswith("error: ") == error)


def test_gsm8k_notes_agree_with_their_results():
    """Every note of the vendored GSM8K train split evaluates to the value GSM8K wrote
    (23,716 notes; the text may differ: GSM8K writes 4.80 and .4, we write 4.8 and 0.4)."""
    path = resources.files("tunix_rt") / "assets" / "gsm8k" / "train.jsonl"
    notes = [n for line in path.read_text(encoding="utf-8").splitlines()
             for n in re.findall(r"<<(.*?)>>", json.loads(line)["answer"])]
    assert len(notes) > 20_000
    wrong = []
    for note in notes:
        expr, _, written = note.partition("=")
        text, error = calculate(expr)
        if error or Fraction(text) != Fraction(written):
            wrong.append(note)
    assert wrong == []
