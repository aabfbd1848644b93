"""The one clock: a manual clock that tests move, the loop clock, and Kubernetes' time formats."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta, timezone

import pytest

from dispatch_kubeflow.clock import (
    LoopClock,
    ManualClock,
    format_micro_time,
    format_time,
    parse_time,
    utc_now,
)

START = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


async def test_a_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(START)
    assert clock.now() == START
    await asyncio.sleep(0.01)
    assert clock.now() == START
    clock.advance(timedelta(seconds=5))
    assert clock.now() == START + timedelta(seconds=5)
    clock.set(START)
    assert clock.now() == START


async def test_a_manual_clock_wakes_a_sleeper_once_the_instant_is_reached() -> None:
    clock = ManualClock(START)
    sleeper = asyncio.create_task(clock.sleep_until(START + timedelta(seconds=10)))
    await asyncio.sleep(0)
    clock.advance(timedelta(seconds=9))
    await asyncio.sleep(0)
    assert not sleeper.done()  # moved, but not far enough
    clock.advance(timedelta(seconds=1))
    await asyncio.wait_for(sleeper, 1)


async def test_a_manual_clock_wakes_every_sleeper_and_returns_at_once_for_the_past() -> None:
    clock = ManualClock(START)
    sleepers = [
        asyncio.create_task(clock.sleep_until(START + timedelta(seconds=s))) for s in (1, 2)
    ]
    await asyncio.sleep(0)
    clock.advance(timedelta(seconds=2))
    await asyncio.wait_for(asyncio.gather(*sleepers), 1)
    await asyncio.wait_for(clock.sleep_until(START), 1)


@pytest.mark.looptime(start=0)
async def test_a_loop_clock_follows_the_event_loop() -> None:
    clock = LoopClock(START)
    assert clock.now() == START
    await asyncio.sleep(30)  # fake time
    assert clock.now() == START + timedelta(seconds=30)
    await clock.sleep_until(START + timedelta(seconds=45))
    assert clock.now() == START + timedelta(seconds=45)


def test_utc_now_is_aware_and_in_utc() -> None:
    assert utc_now().tzinfo is UTC


def test_times_are_formatted_in_utc_as_kubernetes_writes_them() -> None:
    moment = datetime(2026, 1, 1, 13, 0, 0, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert format_time(moment) == "2026-01-01T12:00:00Z"
    assert format_micro_time(moment) == "2026-01-01T12:00:00.123456Z"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("2026-01-01T12:00:00Z", START),
        ("2026-01-01T12:00:00.000000Z", START),
        ("2026-01-01T13:00:00+01:00", START),
        ("2026-01-01T12:00:00", START),  # no offset: read as UTC
        (datetime(2026, 1, 1, 12, 0, 0), START),
        (START, START),
        ("", None),
        (None, None),
        ("yesterday", None),
        (42, None),
    ],
)
def test_parse_time_reads_metav1_times_and_refuses_nothing(value: object, expected: object) -> None:
    parsed = parse_time(value)
    assert parsed == expected
    if parsed is not None:
        assert parsed.tzinfo == UTC
