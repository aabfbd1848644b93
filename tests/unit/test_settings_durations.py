"""Go duration strings read and written exactly as Go's time package does.

The cases are those of Go's own time package tests (parseDurationTests, durationTests), so a
value a Go host reads one way is read the same way here.
"""

from __future__ import annotations

import copy
import pickle
from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch_kubeflow.gotime import (
    HOUR,
    MICROSECOND,
    MILLISECOND,
    MINUTE,
    NANOSECOND,
    SECOND,
    Duration,
    DurationError,
    format_duration,
    parse_duration,
    parse_duration_ns,
)

MAX = (1 << 63) - 1
MIN = -(1 << 63)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        ("5s", 5 * SECOND),
        ("30s", 30 * SECOND),
        ("1478s", 1478 * SECOND),
        ("-5s", -5 * SECOND),
        ("+5s", 5 * SECOND),
        ("-0", 0),
        ("+0", 0),
        ("5.0s", 5 * SECOND),
        ("5.6s", 5 * SECOND + 600 * MILLISECOND),
        ("5.s", 5 * SECOND),
        (".5s", 500 * MILLISECOND),
        ("1.0s", 1 * SECOND),
        ("1.00s", 1 * SECOND),
        ("1.004s", 1 * SECOND + 4 * MILLISECOND),
        ("1.0040s", 1 * SECOND + 4 * MILLISECOND),
        ("100.00100s", 100 * SECOND + 1 * MILLISECOND),
        ("10ns", 10 * NANOSECOND),
        ("11us", 11 * MICROSECOND),
        ("12\u00b5s", 12 * MICROSECOND),
        ("12\u03bcs", 12 * MICROSECOND),
        ("13ms", 13 * MILLISECOND),
        ("14s", 14 * SECOND),
        ("15m", 15 * MINUTE),
        ("16h", 16 * HOUR),
        ("3h30m", 3 * HOUR + 30 * MINUTE),
        ("10.5s4m", 4 * MINUTE + 10 * SECOND + 500 * MILLISECOND),
        ("-2m3.4s", -(2 * MINUTE + 3 * SECOND + 400 * MILLISECOND)),
        (
            "1h2m3s4ms5us6ns",
            1 * HOUR + 2 * MINUTE + 3 * SECOND + 4 * MILLISECOND + 5 * MICROSECOND + 6,
        ),
        ("39h9m14.425s", 39 * HOUR + 9 * MINUTE + 14 * SECOND + 425 * MILLISECOND),
        ("52763797000ns", 52763797000),
        ("0.3333333333333333333h", 20 * MINUTE),
        ("9007199254740993ns", (1 << 53) + 1),
        ("9223372036854775807ns", MAX),
        ("9223372036854775.807us", MAX),
        ("9223372036s854ms775us807ns", MAX),
        ("-9223372036854775808ns", MIN),
        ("-9223372036854775.808us", MIN),
        ("-9223372036s854ms775us808ns", MIN),
        ("-2562047h47m16.854775808s", MIN),
        ("0.100000000000000000000h", 6 * MINUTE),
        ("0.830103483285477580700h", 49 * MINUTE + 48 * SECOND + 372539827),
    ],
)
def test_parse_like_go(text: str, expected: int) -> None:
    assert parse_duration_ns(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", 'time: invalid duration ""'),
        ("3", 'time: missing unit in duration "3"'),
        ("-", 'time: invalid duration "-"'),
        ("s", 'time: invalid duration "s"'),
        (".", 'time: invalid duration "."'),
        ("-.", 'time: invalid duration "-."'),
        (".s", 'time: invalid duration ".s"'),
        ("+.s", 'time: invalid duration "+.s"'),
        ("1d", 'time: unknown unit "d" in duration "1d"'),
        ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
        ("9223372036854775.808us", 'time: invalid duration "9223372036854775.808us"'),
        ("9223372036854ms775us808ns", 'time: invalid duration "9223372036854ms775us808ns"'),
        ("-9223372036854775809ns", 'time: invalid duration "-9223372036854775809ns"'),
    ],
)
def test_refuse_like_go(text: str, message: str) -> None:
    with pytest.raises(DurationError) as info:
        parse_duration_ns(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("expected", "value"),
    [
        ("0s", 0),
        ("1ns", 1 * NANOSECOND),
        ("1.1\u00b5s", 1100 * NANOSECOND),
        ("2.2ms", 2200 * MICROSECOND),
        ("3.3s", 3300 * MILLISECOND),
        ("4m5s", 4 * MINUTE + 5 * SECOND),
        ("4m5.001s", 4 * MINUTE + 5001 * MILLISECOND),
        ("5h6m7.001s", 5 * HOUR + 6 * MINUTE + 7001 * MILLISECOND),
        ("8m0.000000001s", 8 * MINUTE + 1 * NANOSECOND),
        ("2562047h47m16.854775807s", MAX),
        ("-2562047h47m16.854775808s", MIN),
        ("5m0s", 5 * MINUTE),
        ("1m5s", 65 * SECOND),
        ("30s", 30 * SECOND),
        ("1h30m0s", 90 * MINUTE),
        ("1.5s", 1500 * MILLISECOND),
        ("500ms", 500 * MILLISECOND),
    ],
)
def test_format_like_go(expected: str, value: int) -> None:
    assert format_duration(value) == expected


@pytest.mark.parametrize("value", [1, 1100, 3300 * MILLISECOND, 5 * HOUR + 7 * SECOND, MAX])
def test_format_negative_like_go(value: int) -> None:
    assert format_duration(-value) == "-" + format_duration(value)


def test_format_timedelta() -> None:
    assert format_duration(timedelta(minutes=5)) == "5m0s"
    assert format_duration(timedelta(microseconds=1500)) == "1.5ms"


@settings(deadline=None)
@given(st.integers(min_value=MIN, max_value=MAX))
def test_format_then_parse_is_the_same_duration(value: int) -> None:
    assert parse_duration_ns(format_duration(value)) == value


class TestDurationValue:
    def test_is_a_timedelta_rounded_up_to_the_microsecond(self) -> None:
        one = parse_duration("1ns")
        assert isinstance(one, timedelta)
        assert one == timedelta(microseconds=1)
        assert one.nanoseconds == 1
        assert parse_duration("-1500ns") == timedelta(microseconds=-1)

    def test_text_is_gos(self) -> None:
        assert str(parse_duration("90s")) == "1m30s"
        assert repr(parse_duration("90s")) == "Duration('1m30s')"

    def test_copies_keep_the_nanoseconds(self) -> None:
        value = parse_duration("1.000000001s")
        assert copy.deepcopy(value).nanoseconds == 1_000_000_001
        assert pickle.loads(pickle.dumps(value)).nanoseconds == 1_000_000_001

    def test_from_timedelta(self) -> None:
        assert Duration.from_timedelta(timedelta(seconds=2)).nanoseconds == 2 * SECOND

    def test_outside_gos_range(self) -> None:
        with pytest.raises(OverflowError):
            Duration(MAX + 1)
