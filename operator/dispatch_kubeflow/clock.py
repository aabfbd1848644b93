"""Time: one ``Clock`` for everything that waits or stamps, and Kubernetes' time formats.

Every timer in the project (the Lease heartbeat, leader election, condition transition times,
event timestamps) reads time through a ``Clock`` handed to it, so tests drive time instead of
sleeping: ``LoopClock`` follows the event loop's clock (and so looptime's fake time), and
``ManualClock`` moves only when a test moves it.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol


class Clock(Protocol):
    """Wall-clock time in UTC, and a way to wait until an instant of it."""

    def now(self) -> datetime: ...

    async def sleep_until(self, instant: datetime) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, instant: datetime) -> None:
        # Callers re-check after waking, so a wall clock stepped meanwhile only delays a check.
        await asyncio.sleep(max(0.0, (instant - self.now()).total_seconds()))


class LoopClock:
    """Wall time as ``start`` plus the event loop's elapsed time: fake time follows looptime."""

    def __init__(self, start: datetime) -> None:
        self._start = start
        self._origin: float | None = None

    def _loop_time(self) -> float:
        now = asyncio.get_running_loop().time()
        if self._origin is None:
            self._origin = now
        return now - self._origin

    def now(self) -> datetime:
        return self._start + timedelta(seconds=self._loop_time())

    async def sleep_until(self, instant: datetime) -> None:
        remaining = (instant - self.now()).total_seconds()
        if remaining > 0:
            await asyncio.sleep(remaining)


class ManualClock:
    """Time that moves only by ``advance`` or ``set``; ``sleep_until`` returns once it has."""

    def __init__(self, start: datetime) -> None:
        self._now = start
        self._moved: asyncio.Event | None = None

    def now(self) -> datetime:
        return self._now

    def set(self, instant: datetime) -> None:
        self._now = instant
        if self._moved is not None:
            self._moved.set()
            self._moved = None

    def advance(self, delta: timedelta) -> None:
        self.set(self._now + delta)

    async def sleep_until(self, instant: datetime) -> None:
        while self._now < instant:
            if self._moved is None:
                self._moved = asyncio.Event()
            await self._moved.wait()


SYSTEM_CLOCK = SystemClock()


def utc_now() -> datetime:
    return datetime.now(UTC)


def format_time(moment: datetime) -> str:
    """metav1.Time: RFC 3339 in UTC, whole seconds, a Z suffix."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def format_micro_time(moment: datetime) -> str:
    """metav1.MicroTime: RFC 3339 in UTC with six fractional digits."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: Any) -> datetime | None:
    """A metav1.Time or MicroTime (or a datetime) in UTC; None for absent or unreadable values."""
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
