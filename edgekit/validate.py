"""The checks of what a user asks for, written once: the CLI's options and the Python API run the
same checks and raise the same ``UsageError`` words, before any work starts.

Each bounded value is named by its API keyword (``max_drop``, ``iterations``...); the message names
the CLI's flag, the one spelling both kinds of user read in docs::

    >>> number("max_drop", 150)
    Traceback (most recent call last):
    edgekit.errors.UsageError: --max-drop must be a number from 0 to 100 (accuracy points), got 150
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

from edgekit.errors import UsageError

T = TypeVar("T")


@dataclass(frozen=True)
class Bound:
    """A numeric option: its CLI flag, inclusive bounds (None: open), integer or not, and a unit."""

    flag: str
    low: float | None
    high: float | None = None
    integer: bool = False
    unit: str = ""
    example: str = ""

    def words(self) -> str:
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            span = f" from {self.low:g} to {self.high:g}"
        elif self.low is not None:
            span = f" >= {self.low:g}"
        else:
            span = f" <= {self.high:g}" if self.high is not None else ""
        return kind + span + (f" ({self.unit})" if self.unit else "")


BOUNDS: dict[str, Bound] = {
    "max_drop": Bound("--max-drop", 0, 100, unit="accuracy points", example="1 (one point: 99 % -> at least 98 %)"),
    "iterations": Bound("--iterations", 1, integer=True, example="100"),
    "duration_s": Bound("--duration", 0.001, unit="seconds", example="2"),
    "min_time_s": Bound("--min-time", 0, 3600, unit="seconds", example="0.5"),
    "threads": Bound("--threads", 1, integer=True, example="4"),
    "rounds": Bound("--rounds", 1, 100, integer=True, example="3"),
    "calib_samples": Bound("--calib-samples", 1, integer=True, example="256"),
    "lock_wait": Bound("--lock-wait", 0, unit="seconds", example="600"),
    "jobs": Bound("--jobs", 1, integer=True, example="4"),
}


def number(name: str, value: Any) -> Any:
    """``value`` when it is inside the bounds of option ``name`` (None passes: the default); else UsageError."""
    if value is None:
        return None
    b = BOUNDS[name]
    numeric = isinstance(value, int) if b.integer else isinstance(value, (int, float)) and math.isfinite(value)
    if isinstance(value, bool) or not numeric or (b.low is not None and value < b.low) or (b.high is not None and value > b.high):
        shown = f"{value:g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
        raise UsageError(f"{b.flag} must be {b.words()}, got {shown}", f"e.g. {b.flag} {b.example}")
    return value


def warmup(value: Any) -> int | str | None:
    """A warm-up: a count N >= 0 (an int, or its digits as the CLI reads them), "auto" or None (the profile's)."""
    if value is None or value == "auto":
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise UsageError(f"--warmup wants a count N >= 0 or 'auto', got {value!r}", "e.g. --warmup 10, or --warmup auto (until latency is stable)")


def choice(flag: str, value: T, choices: Collection[T]) -> T:
    """``value`` when it is one of ``choices``; else UsageError listing them."""
    if value not in choices:
        raise UsageError(f"unknown {flag} {value!r}", f"choose one of: {', '.join(map(str, choices))}")
    return value


def option(name: str) -> Callable[[Any], Any]:
    """The check of bounded option ``name`` as a typer callback (its UsageError is the CLI's error line)."""

    def check(value: Any) -> Any:
        return number(name, value)

    return check


__all__ = ["BOUNDS", "Bound", "choice", "number", "option", "warmup"]
