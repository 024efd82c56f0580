"""GSM8K's calculator: an exact evaluator of + - * / and parentheses, without `eval`.

The model writes `<<48/2=`, this module computes what follows: `24` (tools.respond adds `>>`).

Accepted: integers, decimals (`2.5`, `.5`, `5.`), thousands commas in groups of three
(`1,200`), a `$` before a number (ignored), `%` after a number or a closing parenthesis
(divides by 100), `+ - * /`, `//` (floor division, as in 2 of GSM8K's notes), `×` `÷` `−`
(the Unicode signs), unary minus and plus, parentheses, spaces. Refused: anything else, among them `x` (a variable as often as a
product), `^` and `**` (no power: its size is unbounded), implicit products like `2(3+4)`.
Every value is a Fraction, so `0.1+0.2` is exactly `0.3`.

The result text:
- an integer as itself: `24`, `-3`, `0`;
- a decimal that terminates within 6 places, exactly and without trailing zeros: `2.5`, `0.125`
  (GSM8K writes `4.80` and `.4`; we write `4.8` and `0.4`);
- any other value rounded half away from zero to 4 places, trailing zeros dropped:
  `10/3` → `3.3333`, `2/3` → `0.6667` (GSM8K's own notes round too); a nonzero value that
  rounds to nothing is written `0`.

Limits (each breach is an error result, never an exception): the expression at most
MAX_CHARS characters and MAX_DEPTH nested parentheses, a number at most MAX_DIGITS digits,
every intermediate numerator and denominator at most MAX_BITS bits, the result's magnitude
below MAX_RESULT. These bound the time too: no operation can grow a number past MAX_BITS.

An error is the text `error: <reason>` with one of the reasons in ERRORS, e.g.
`error: division by zero`.
"""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Context, Decimal
from fractions import Fraction

MAX_CHARS = 200
MAX_DEPTH = 20
MAX_DIGITS = 30
MAX_BITS = 1024
MAX_RESULT = 10**18
EXACT_PLACES = 6
ROUND_PLACES = 4

#: the decimal arithmetic of the result text, never the thread's context: a library in the same
#: process may lower that one's precision (reasoning-gym's decimal_arithmetic sets it to 12 when it
#: draws an item), and quantize then fails or a division rounds. Wide enough for any value below
#: MAX_RESULT with EXACT_PLACES places.
_DECIMAL = Context(prec=64, rounding=ROUND_HALF_UP)

ERRORS = ("empty", "too long", "syntax", "division by zero", "too large", "too deep")

_MINUS = {"−": "-", "–": "-", "×": "*", "÷": "/"}


class CalcError(ValueError):
    """A bad, huge or undefined expression; str(err) is the reason (one of ERRORS)."""


def calculate(expr: str) -> tuple[str, bool]:
    """(result text, error?) for one expression; never raises for any string."""
    try:
        return format_value(evaluate(expr)), False
    except CalcError as err:
        return f"error: {err}", True


def evaluate(expr: str) -> Fraction:
    """The exact value of `expr`, or CalcError."""
    if len(expr) > MAX_CHARS:
        raise CalcError("too long")
    tokens = _tokens(expr)
    if not tokens:
        raise CalcError("empty")
    parser = _Parser(tokens)
    value = parser.expr(0)
    if parser.pos != len(tokens):
        raise CalcError("syntax")
    if abs(value) >= MAX_RESULT:
        raise CalcError("too large")
    return value


def format_value(v: Fraction) -> str:
    """The result text of a value (module docstring)."""
    if v.denominator == 1:
        return str(v.numerator)
    d = v.denominator
    twos = fives = 0
    while d % 2 == 0:
        d, twos = d // 2, twos + 1
    while d % 5 == 0:
        d, fives = d // 5, fives + 1
    places = max(twos, fives)
    exact = _DECIMAL.divide(Decimal(v.numerator), Decimal(v.denominator))
    if d == 1 and places <= EXACT_PLACES:
        return _fixed(exact, places)
    return _fixed(exact.quantize(Decimal(1).scaleb(-ROUND_PLACES), ROUND_HALF_UP, _DECIMAL), ROUND_PLACES)


def _fixed(d: Decimal, places: int) -> str:
    s = f"{d:.{places}f}"
    if "." in s:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


# --------------------------------------------------------------------------- lexer

def _tokens(expr: str) -> list[str | Fraction]:
    """Numbers as Fractions, operators and parentheses as one-character strings."""
    out: list[str | Fraction] = []
    s = "".join(_MINUS.get(c, c) for c in expr)
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c in " \t":
            i += 1
        elif s.startswith("//", i):
            out.append("//")
            i += 2
        elif c in "+-*/()%":
            out.append(c)
            i += 1
        elif c == "$":
            if i + 1 >= n or s[i + 1] not in "0123456789.":
                raise CalcError("syntax")
            i += 1
        elif c in "0123456789.":
            j = i
            while j < n and (s[j] in "0123456789.,"):
                j += 1
            out.append(_number(s[i:j]))
            i = j
        else:
            raise CalcError("syntax")
    return out


def _number(text: str) -> Fraction:
    if "," in text:
        whole, _, frac = text.partition(".")
        groups = whole.split(",")
        if not (1 <= len(groups[0]) <= 3 and all(len(g) == 3 for g in groups[1:])):
            raise CalcError("syntax")
        text = "".join(groups) + ("." + frac if "." in text else "")
    if text.count(".") > 1 or text == "." or "," in text:
        raise CalcError("syntax")
    if sum(ch.isdigit() for ch in text) > MAX_DIGITS:
        raise CalcError("too large")
    whole, _, frac = text.partition(".")
    return Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))


# --------------------------------------------------------------------------- parser

class _Parser:
    """expr := term (('+'|'-') term)* ; term := unary (('*'|'/'|'//') unary)* ;
    unary := ('-'|'+') unary | atom '%'* ; atom := NUMBER | '(' expr ')'."""

    def __init__(self, tokens: list[str | Fraction]):
        self.toks = tokens
        self.pos = 0

    def peek(self) -> str | Fraction | None:
        return self.toks[self.pos] if self.pos < len(self.toks) else None

    def expr(self, depth: int) -> Fraction:
        v = self.term(depth)
        while self.peek() in ("+", "-"):
            op = self.toks[self.pos]
            self.pos += 1
            w = self.term(depth)
            v = _checked(v + w if op == "+" else v - w)
        return v

    def term(self, depth: int) -> Fraction:
        v = self.unary(depth)
        while self.peek() in ("*", "/", "//"):
            op = self.toks[self.pos]
            self.pos += 1
            w = self.unary(depth)
            if op != "*" and w == 0:
                raise CalcError("division by zero")
            v = _checked(v * w if op == "*" else v / w if op == "/" else Fraction(v // w))
        return v

    def unary(self, depth: int) -> Fraction:
        signs = 1
        while self.peek() in ("-", "+"):
            signs = -signs if self.toks[self.pos] == "-" else signs
            self.pos += 1
        v = self.atom(depth)
        while self.peek() == "%":
            self.pos += 1
            v = _checked(v / 100)
        return v * signs

    def atom(self, depth: int) -> Fraction:
        t = self.peek()
        if isinstance(t, Fraction):
            self.pos += 1
            return t
        if t == "(":
            if depth >= MAX_DEPTH:
                raise CalcError("too deep")
            self.pos += 1
            v = self.expr(depth + 1)
            if self.peek() != ")":
                raise CalcError("syntax")
            self.pos += 1
            return v
        raise CalcError("syntax")


def _checked(v: Fraction) -> Fraction:
    if v.numerator.bit_length() > MAX_BITS or v.denominator.bit_length() > MAX_BITS:
        raise CalcError("too large")
    return v
