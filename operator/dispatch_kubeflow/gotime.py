"""Go's duration syntax, read and written exactly as Go's ``time`` package does.

The settings document's durations are Go duration strings (``30s``, ``1h30m``, ``1.5s``), and a
host written in Go reads the same document with ``time.ParseDuration``. ``parse_duration`` follows
that function step for step, including its float arithmetic for fractions, so both sides agree on
every value; ``format_duration`` is ``time.Duration.String``.

Go durations count nanoseconds; ``timedelta`` counts microseconds. ``Duration`` is a ``timedelta``
that also keeps the exact nanosecond count, so nothing is lost on the way back to text. Its
``timedelta`` value is rounded up to the microsecond, so a positive duration stays positive.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final

NANOSECOND: Final = 1
MICROSECOND: Final = 1000 * NANOSECOND
MILLISECOND: Final = 1000 * MICROSECOND
SECOND: Final = 1000 * MILLISECOND
MINUTE: Final = 60 * SECOND
HOUR: Final = 60 * MINUTE

_UNITS: Final = {
    "ns": NANOSECOND,
    "us": MICROSECOND,
    "\u00b5s": MICROSECOND,  # U+00B5 micro sign
    "\u03bcs": MICROSECOND,  # U+03BC Greek small letter mu
    "ms": MILLISECOND,
    "s": SECOND,
    "m": MINUTE,
    "h": HOUR,
}
_MAX_ABS: Final = 1 << 63  # uint64 bound Go checks against while accumulating
_MAX_INT64: Final = (1 << 63) - 1
_MIN_INT64: Final = -(1 << 63)


class DurationError(ValueError):
    """The text is not a Go duration; the message is the one Go's time package gives."""


class Duration(timedelta):
    """A ``timedelta`` that remembers the exact Go duration (nanoseconds) it was made from."""

    _nanoseconds: int

    def __new__(cls, nanoseconds: int) -> Duration:
        if not _MIN_INT64 <= nanoseconds <= _MAX_INT64:
            raise OverflowError(f"{nanoseconds}ns is outside Go's Duration range")
        micros = -((-nanoseconds) // MICROSECOND)  # ceiling: a positive duration stays positive
        self = super().__new__(cls, microseconds=micros)
        self._nanoseconds = nanoseconds
        return self

    @classmethod
    def from_timedelta(cls, value: timedelta) -> Duration:
        if isinstance(value, Duration):
            return value
        micros = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        return cls(micros * MICROSECOND)

    @property
    def nanoseconds(self) -> int:
        return self._nanoseconds

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self._nanoseconds,))

    def __repr__(self) -> str:
        return f"Duration({format_duration(self._nanoseconds)!r})"

    def __str__(self) -> str:
        return format_duration(self._nanoseconds)


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def _leading_int(s: str, i: int) -> tuple[int, int]:
    """Consume ``[0-9]*`` from ``s[i]``; raise on uint64 overflow as Go's leadingInt does."""
    x = 0
    while i < len(s) and _is_digit(s[i]):
        if x > _MAX_ABS // 10:
            raise OverflowError
        x = x * 10 + ord(s[i]) - ord("0")
        if x > _MAX_ABS:
            raise OverflowError
        i += 1
    return x, i


def _leading_fraction(s: str, i: int) -> tuple[int, float, int]:
    """Consume ``[0-9]*`` after a decimal point, keeping only the digits that fit (Go's rule)."""
    x = 0
    scale = 1.0
    overflow = False
    while i < len(s) and _is_digit(s[i]):
        if not overflow:
            if x > _MAX_INT64 // 10:
                overflow = True
            else:
                y = x * 10 + ord(s[i]) - ord("0")
                if y > _MAX_ABS:
                    overflow = True
                else:
                    x = y
                    scale *= 10
        i += 1
    return x, scale, i


def parse_duration_ns(text: str) -> int:
    """Go's ``time.ParseDuration``: the duration in nanoseconds, or ``DurationError``.

    One pass over ``text`` by index, so the cost is linear in its length.
    """
    invalid = DurationError("time: invalid duration " + _quote(text))
    s = text
    i = 0
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        i = 1
    if s[i:] == "0":
        return 0
    if i == len(s):
        raise invalid
    total = 0
    while i < len(s):
        if not (s[i] == "." or _is_digit(s[i])):
            raise invalid
        start = i
        try:
            whole, i = _leading_int(s, i)
        except OverflowError:
            raise invalid from None
        pre = i != start
        frac, scale, post = 0, 1.0, False
        if i < len(s) and s[i] == ".":
            i += 1
            start = i
            frac, scale, i = _leading_fraction(s, i)
            post = i != start
        if not pre and not post:
            raise invalid
        start = i
        while i < len(s) and not (s[i] == "." or _is_digit(s[i])):
            i += 1
        if i == start:
            raise DurationError("time: missing unit in duration " + _quote(text))
        unit_text = s[start:i]
        unit = _UNITS.get(unit_text)
        if unit is None:
            raise DurationError(
                "time: unknown unit " + _quote(unit_text) + " in duration " + _quote(text)
            )
        if whole > _MAX_ABS // unit:
            raise invalid
        value = whole * unit
        if frac > 0:
            # Go converts through float64 here; int() truncates toward zero like uint64().
            value += int(float(frac) * (float(unit) / scale))
            if value > _MAX_ABS:
                raise invalid
        total += value
        if total > _MAX_ABS:
            raise invalid
    if neg:
        return -total
    if total > _MAX_INT64:
        raise invalid
    return total


def parse_duration(text: str) -> Duration:
    """Go's ``time.ParseDuration`` as a ``Duration``."""
    return Duration(parse_duration_ns(text))


def _fmt_frac(v: int, prec: int) -> tuple[str, int]:
    digits: list[str] = []
    printing = False
    for _ in range(prec):
        digit = v % 10
        printing = printing or digit != 0
        if printing:
            digits.append(chr(ord("0") + digit))
        v //= 10
    if printing:
        digits.append(".")
    return "".join(reversed(digits)), v


def format_duration(value: int | timedelta) -> str:
    """Go's ``time.Duration.String`` for a nanosecond count or a ``timedelta``."""
    if isinstance(value, Duration):
        ns = value.nanoseconds
    elif isinstance(value, timedelta):
        ns = Duration.from_timedelta(value).nanoseconds
    else:
        ns = value
    neg = ns < 0
    u = -ns if neg else ns
    if u < SECOND:
        if u == 0:
            return "0s"
        if u < MICROSECOND:
            prec, unit = 0, "ns"
        elif u < MILLISECOND:
            prec, unit = 3, "\u00b5s"
        else:
            prec, unit = 6, "ms"
        frac, u = _fmt_frac(u, prec)
        out = f"{u}{frac}{unit}"
    else:
        frac, u = _fmt_frac(u, 9)
        out = f"{u % 60}{frac}s"
        u //= 60
        if u > 0:
            out = f"{u % 60}m{out}"
            u //= 60
            if u > 0:
                out = f"{u}h{out}"
    return "-" + out if neg else out
