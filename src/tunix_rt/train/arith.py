"""Arithmetic claims in free text, checked exactly: the `arith` process reward's checker.

A *claim* is `expression = number` written in running text, as GSM8K-style reasoning
writes it: `Natalia sold 48/2 = 24 clips`, `3 * 4 + 2 = 14`, `6*24 = 144 and 144-128 = 16`,
`$12 x 3 = $36`, `20% * 50 = 10`, `2*3 = 6*2 = 12`. The left side is evaluated with
`fractions.Fraction` (no floating point), with the usual precedence and parentheses.

What is read:
- numbers: integers, thousands commas (`1,250`), decimals (`0.5`, `.5`), a currency sign
  before (`$`, `€`, `£`), a percent sign after;
- operators `+ - * / x X × ÷` and the minus signs `− –`; a unary minus glued to its
  number (`-3`, `5 * -2`); a fraction written without spaces is one number among spaced
  operators (`25 / 1/3 = 75`, as people read it), and `2 1/2` is a mixed number;
- one claim per `=`: the left side is the run of numbers, operators and parentheses that
  ends right at the `=` (words end it, so `she sold 48/2 = 24 clips` reads `48/2`); the
  right side starts with a number.

What holds:
- the left side equals the right side's first number (`2*3 = 6*2 = 12` is two true claims,
  the running-total style), or the right side's whole expression (`1/2 + 1/4 = 3/4`);
- a right-hand number written with k decimals may be the exact value rounded to k
  decimals (`10/3 = 3.33`, `2/3 = 0.67`): the claim carries its own precision. An integer
  result is exact (`7/2 = 3` is false);
- percent has two honest readings, `20% * 50 = 10` (20% is 0.2) and `25/100*100 = 25%`
  (the number of percent): a claim with a `%` holds when either reading holds;
- a division by zero makes the claim false, never an error.

What is not a claim (neither true nor false), so that prose is never scored as wrong
arithmetic:
- a left side without a binary operator (`x = 5`, `Total = 18`, `12 = 12`);
- a word between the expression and `=` (`1/2 cup = 8 tablespoons`), or a word as an
  operand (`21 consonants * 1/7 = 3`, `2 liters * 20% = .4`, `3*30 = 30 + M trees`);
- an expression glued on its left to a word, a decimal point or a time (`v2 + 1 = 3`,
  `10:30 + 2 = 12:30`); a right side that is a time (`= 12:30`) or a number times a
  one-letter variable (`= 4S`, `= 5A/5`; units and ordinals such as `25kg`, `6th` stay);
- a number with a leading zero (`0900-0130 = 0730`: a time or a code);
- an expression that does not parse (`2x + 3 = 7`, `560//10 = 56`);
- a range written `a-b` with a < b and a non-negative result (`1990-1995 = 5 years`,
  `pages 3-7 = 5`).
Dates and ranges without an `=` (`3-4 apples`, `12/25/2020`) are never read at all.

With tools (tunix_rt.tools), a completion holds text a tool wrote: the calculator's result in
`<<48/2=24>>` (the model wrote `<<48/2=`, the tool `24>>`), a python `<output>` block. A claim
counts only when the model wrote all of it: `find_claims(text, observed=spans)` skips every
claim that overlaps a tool-written span, so `48/2=24` above is not the model's claim (it
earns nothing and costs nothing), while `24 * 3 = 72` written after it is.

Measured on the vendored GSM8K train split: all 23,356 calculator notes with an operator
(`<<48/2=24>>`) hold, and each with its result changed is false; of the 20,230 claims in
its reasoning lines (notes removed), 37 are false, each a real slip in the data
(`100 * 0.75 = $0.75`, `70 + 40 = 100`) or a notation read literally (`17/3 = 5 and 2/3`,
`13 / 6 = 2 full cycles`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from typing import NamedTuple, Sequence

_TOKEN = re.compile(
    r"""
     (?P<num>(?:[$€£]\s?)?(?:(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+)%?)
    |(?P<op>[+\-*/×÷−–]|(?<![A-Za-z])[xX](?=\s?[\d$€£(.]))
    |(?P<lp>\()
    |(?P<rp>\))
    |(?P<eq>(?<![<>!=])=(?![=>]))
    |(?P<ws>\s+)
    |(?P<other>[A-Za-z_]+|.)
    """,
    re.X,
)
_OPS = {"+": "+", "-": "-", "−": "-", "–": "-", "*": "*", "x": "*", "X": "*", "×": "*",
        "/": "/", "÷": "/"}
_RUN = ("num", "op", "lp", "rp")
_MAX_DEPTH = 32  # parentheses deeper than this are not arithmetic anyone writes


class _Tok(NamedTuple):
    kind: str
    text: str
    start: int
    end: int


@dataclass(frozen=True)
class _Num:
    value: Fraction  # the number as written, percent sign ignored
    pct: bool
    decimals: int


@dataclass(frozen=True)
class Claim:
    """One `expression = number` found in a text."""

    text: str
    """The claim as written (left side, `=`, right side)."""
    holds: bool
    start: int = 0
    """Where the claim starts in the text find_claims read (text[start:end] == self.text)."""
    end: int = 0


class _NotExpr(Exception):
    """The tokens do not form an arithmetic expression."""


def find_claims(text: str, observed: Sequence[tuple[int, int]] = ()) -> list[Claim]:
    """Every arithmetic claim in `text`, in order, each checked. Never raises on any input.
    `observed`: [start, end) character spans of `text` a tool wrote; a claim that overlaps
    one is not the model's and is left out."""
    claims: list[Claim] = []
    at = 0
    for line in text.splitlines(keepends=True):
        toks = [t for t in _tokens(line) if t.kind != "ws"]
        for i, tok in enumerate(toks):
            if tok.kind == "eq":
                claim = _claim_at(line, toks, i, at)
                if claim is not None and not any(a < claim.end and claim.start < b for a, b in observed):
                    claims.append(claim)
        at += len(line)
    return claims


def _tokens(line: str) -> list[_Tok]:
    return [_Tok(m.lastgroup, m.group(), m.start(), m.end()) for m in _TOKEN.finditer(line)]


def _claim_at(line: str, toks: list[_Tok], eq: int, at: int) -> Claim | None:
    lhs = _left_run(line, toks, eq)
    rhs = _right_run(toks, eq)
    if not lhs or not rhs or _is_range(lhs, rhs) or _is_time(line, rhs) or _has_code(lhs + rhs):
        return None
    try:
        left, n_ops = _parse(lhs)
    except _NotExpr:
        return None
    if n_ops == 0:
        return None
    try:
        right, _ = _parse(rhs)
    except _NotExpr:
        right = None
    negate = rhs[0].kind == "op"
    first = _number(rhs[1 if negate else 0].text)  # the right side's first number
    has_pct = any(t.kind == "num" and t.text.endswith("%") for t in lhs + rhs)
    modes = (True, False) if has_pct else (True,)
    holds = any(_holds(left, right, first, negate, pct) for pct in modes)
    start, end = lhs[0].start, rhs[-1].end
    return Claim(line[start:end], holds, at + start, at + end)


def _left_run(line: str, toks: list[_Tok], eq: int) -> list[_Tok]:
    """The numbers, operators and parentheses that end right at toks[eq]; [] when none
    or when they are glued to something on their left."""
    j = eq
    while j > 0 and toks[j - 1].kind in _RUN:
        j -= 1
    run = toks[j:eq]
    if run and run[0].kind == "op" and not _unary_glued(run) and j > 0 and toks[j - 1].text.isalnum():
        return []  # "21 consonants * 1/7 = 3": the left operand is words, not a number
    while run and (run[0].kind == "op" and not _unary_glued(run) or run[0].kind == "lp" and _open(run) > 0):
        run = run[1:]  # a dash, a bullet, markdown or an unclosed "(" before the expression
    if not run or run[-1].kind not in ("num", "rp") or _glued_left(line, run[0].start):
        return []
    return run


def _right_run(toks: list[_Tok], eq: int) -> list[_Tok]:
    """The expression after toks[eq], starting with a number (a minus allowed), up to the
    next word or `=`; [] when it goes on in words."""
    j = eq + 1
    while j < len(toks) and toks[j].kind in _RUN:
        j += 1
    run = toks[eq + 1:j]
    if run and run[0].text in _OPS and _OPS[run[0].text] == "-":
        if len(run) < 2 or run[1].kind != "num":
            return []
    elif not run or run[0].kind != "num":
        return []
    if run[-1].kind == "op" and j < len(toks) and toks[j].text[:1].isalnum():
        return []  # "3*30 = 30 + M trees": the right side goes on in words
    while run[-1].kind == "op":
        run = run[:-1]  # "**3 + 5 = 8**": markdown, not an operator
    while run[-1].kind == "rp" and _open(run) < 0:
        run = run[:-1]  # "(so 3 * 2 = 6)": the ")" closes text, not the number
    return run


def _open(run: list[_Tok]) -> int:
    """Opening minus closing parentheses in the run."""
    return sum(t.kind == "lp" for t in run) - sum(t.kind == "rp" for t in run)


def _unary_glued(run: list[_Tok]) -> bool:
    """A leading minus glued to the number after it (`-3`), not a dash (`- 3`)."""
    return (_OPS.get(run[0].text) == "-" and len(run) > 1 and run[1].kind in ("num", "lp")
            and run[0].end == run[1].start)


def _glued_left(line: str, start: int) -> bool:
    """The expression starts inside something else: a word (`v2`), a decimal (`1.2.3`), a
    time or a list of digits (`10:30`, `3,4`)."""
    if start == 0:
        return False
    c = line[start - 1]
    if c.isalnum() or c in "._":
        return True
    return c in ":,;/" and start >= 2 and line[start - 2].isdigit()


def _is_time(line: str, rhs: list[_Tok]) -> bool:
    """`= 12:30`: the right side is a clock time; `= 4S`, `= 5A/5`: a number times a
    one-letter variable (`= 25kg`, `= 6th` are units and ordinals, and stay claims)."""
    first = rhs[1] if rhs[0].kind == "op" else rhs[0]
    after = line[first.end:]
    return bool(re.match(r":\d|[A-Za-z](?![A-Za-z\d])", after))


def _has_code(run: list[_Tok]) -> bool:
    """A number with a leading zero (`0900`, `007`) is a time or a code, not a quantity."""
    return any(t.kind == "num" and re.match(r"[$€£]?\s?0\d", t.text) for t in run)


def _is_range(lhs: list[_Tok], rhs: list[_Tok]) -> bool:
    """`1990-1995 = 5`, `pages 3-7 = 5`: a glued a-b with a < b read as a span."""
    if len(lhs) != 3 or lhs[0].kind != "num" or lhs[2].kind != "num":
        return False
    a, op, b = lhs
    if _OPS.get(op.text) != "-" or a.end != op.start or op.end != b.start:
        return False
    negative = rhs[0].kind == "op"
    return _number(a.text).value < _number(b.text).value and not negative


@lru_cache(maxsize=4096)
def _number(text: str) -> _Num:
    pct = text.endswith("%")
    body = text.rstrip("%").lstrip("$€£").strip().replace(",", "")
    whole, _, decimals = body.partition(".")
    return _Num(Fraction(int(whole + decimals), 10 ** len(decimals)), pct, len(decimals))


def _holds(left, right, first: _Num, negate: bool, pct: bool) -> bool:
    """left == right's whole expression, or left == its first number up to that number's
    written precision (half a unit in its last decimal; exact for an integer)."""
    try:
        value = _eval(left, pct)
        if right is not None and value == _eval(right, pct):
            return True
    except ZeroDivisionError:
        return False
    claimed = -_scaled(first, pct) if negate else _scaled(first, pct)
    if first.decimals == 0:
        return value == claimed
    half_unit = _scaled(_Num(Fraction(1, 2 * 10 ** first.decimals), first.pct, 0), pct)
    return abs(value - claimed) <= half_unit


def _scaled(num: _Num, pct: bool) -> Fraction:
    return num.value / 100 if pct and num.pct else num.value


# --- a recursive-descent parser over the run's tokens ------------------------------------
# expr := term (('+'|'-') term)* ; term := unary (('*'|'/') unary)* ;
# unary := '-' unary | num | '(' expr ')'.  The tree is nested tuples; evaluation is apart
# so the two percent readings share one parse.


def _parse(run: list[_Tok]):
    """(tree, number of binary operators) of the whole run; _NotExpr if it is not one."""
    parser = _Parser(run)
    tree = parser.expr(0)
    if parser.i != len(run):
        raise _NotExpr
    return tree, parser.binary


class _Parser:
    def __init__(self, run: list[_Tok]):
        self.run, self.i, self.binary = run, 0, 0

    def _peek(self) -> _Tok | None:
        return self.run[self.i] if self.i < len(self.run) else None

    def _op(self, accepted: str) -> str | None:
        tok = self._peek()
        if tok is not None and tok.kind == "op" and _OPS[tok.text] in accepted:
            self.i += 1
            return _OPS[tok.text]
        return None

    def expr(self, depth: int):
        tree = self.term(depth)
        while (op := self._op("+-")) is not None:
            self.binary += 1
            tree = (op, tree, self.term(depth))
        return tree

    def term(self, depth: int):
        tree = self.unary(depth)
        while (op := self._op("*/")) is not None:
            self.binary += 1
            tree = (op, tree, self.unary(depth))
        return tree

    def unary(self, depth: int):
        if depth > _MAX_DEPTH:
            raise _NotExpr
        if self._op("-") is not None:
            return ("neg", self.unary(depth + 1))
        tok = self._peek()
        if tok is None:
            raise _NotExpr
        if tok.kind == "num":
            return self.number()
        if tok.kind != "lp":
            raise _NotExpr
        self.i += 1
        tree = self.expr(depth + 1)
        closing = self._peek()
        if closing is None or closing.kind != "rp":
            raise _NotExpr
        self.i += 1
        return tree

    def number(self):
        """A number; a glued fraction `1/3` (one division, binding tighter than spaced
        operators: `25 / 1/3` is 75); a mixed number `2 1/2`."""
        whole = self.run[self.i]
        self.i += 1
        if self._fraction_at(self.i - 1):
            self.binary += 1
            return self._fraction()
        if _plain_int(whole) and self._fraction_at(self.i) and whole.end < self.run[self.i].start:
            return ("+", ("num", _number(whole.text)), self._fraction_from_next())
        return ("num", _number(whole.text))

    def _fraction_at(self, k: int) -> bool:
        """run[k:k+3] is an integer, a `/` and an integer, with no space between."""
        a, slash, b = (self.run[k:k + 3] + [None, None, None])[:3]
        return (a is not None and b is not None and _plain_int(a) and slash.text == "/"
                and _plain_int(b) and a.end == slash.start and slash.end == b.start)

    def _fraction(self):
        """The rest of a glued fraction whose numerator was just read."""
        num, den = self.run[self.i - 1], self.run[self.i + 1]
        self.i += 2
        return ("/", ("num", _number(num.text)), ("num", _number(den.text)))

    def _fraction_from_next(self):
        self.i += 1
        return self._fraction()


def _plain_int(tok: _Tok | None) -> bool:
    return tok is not None and tok.kind == "num" and tok.text.isdigit()


def _eval(tree, pct: bool) -> Fraction:
    kind = tree[0]
    if kind == "num":
        return _scaled(tree[1], pct)
    if kind == "neg":
        return -_eval(tree[1], pct)
    a, b = _eval(tree[1], pct), _eval(tree[2], pct)
    if kind == "+":
        return a + b
    if kind == "-":
        return a - b
    if kind == "*":
        return a * b
    return a / b  # ZeroDivisionError is the caller's: the claim is false
