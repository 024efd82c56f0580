"""Allowed intervals of numeric settings, and the one check of a setting against one.

Ground floor (imports nothing of tunix_rt): the training config (`train.config.RANGES`) and
the decoding settings (`eval.generate.DecodeConfig`, which also checks a training config's
rollout_* settings) share the rule "a finite number of its type, inside its interval".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Range:
    """An interval of allowed values (high None: unbounded above)."""

    low: float
    high: float | None = None
    low_open: bool = False
    """low itself is excluded (> low rather than >= low)."""
    high_open: bool = False

    def holds(self, value: float) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        if self.high is None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        return f"in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"


AT_LEAST_0, AT_LEAST_1, ABOVE_0 = Range(0), Range(1), Range(0, low_open=True)


def is_number(value: Any) -> bool:
    """A finite int or float; a bool is not a number here (`lr: true` is a mistake)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def number_problem(name: str, value: Any, rng: Range, integer: bool, note: str = "") -> str | None:
    """What is wrong with setting `name` (None: nothing): not a finite number, not an integer
    where one is needed, or outside `rng` (`note` follows the range, e.g. what null means)."""
    if not is_number(value):
        return f"{name} must be a finite number, got {value!r}"
    if integer and not is_int(value):
        return f"{name} must be an integer, got {value!r}"
    if not rng.holds(value):
        return f"{name} must be {rng}{note}, got {value!r}"
    return None
