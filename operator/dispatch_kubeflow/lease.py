"""The admission controller's heartbeat, read from its leader-election Lease.

The controller is alive while ``now < renewTime + leaseDurationSeconds + skew``. Staleness is the
absence of an update, so a watch alone never sees it: ``LeaseHeartbeat`` also runs a timer that
wakes at the instant the current renewal runs out. Time comes from an injected ``Clock`` so that
tests drive it (``LoopClock`` under looptime) instead of sleeping.

The skew allowance (``DEFAULT_SKEW``, 2 s) absorbs the difference between the controller's clock,
which stamps ``renewTime``, and ours, which compares against it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict

from dispatch_kubeflow.events import DispatchEvent, Evidence, heartbeat_event

DEFAULT_SKEW = timedelta(seconds=2)

REASON_RENEWED = "LeaseRenewed"
REASON_EXPIRED = "LeaseExpired"
REASON_MISSING = "LeaseMissing"
REASON_RELEASED = "LeaseReleased"

Gate = Literal["open", "closed"]


class Clock(Protocol):
    """Wall-clock time in UTC, and a way to wait until an instant of it."""

    def now(self) -> datetime: ...

    async def sleep_until(self, instant: datetime) -> None: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)

    async def sleep_until(self, instant: datetime) -> None:
        # The timer re-checks after waking, so a wall clock stepped meanwhile only delays a check.
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


class LeaseReading(BaseModel):
    """The fields of a Lease that say whether its holder is alive."""

    model_config = ConfigDict(frozen=True)

    name: str
    holder: str | None = None
    renew_time: AwareDatetime | None = None
    duration: timedelta | None = None

    @classmethod
    def from_object(cls, lease: Mapping[str, Any]) -> LeaseReading:
        spec = lease.get("spec") or {}
        renew = spec.get("renewTime")
        seconds = spec.get("leaseDurationSeconds")
        return cls(
            name=str((lease.get("metadata") or {}).get("name") or ""),
            holder=spec.get("holderIdentity") or None,
            renew_time=_parse_time(renew) if renew else None,
            duration=timedelta(seconds=int(seconds)) if seconds is not None else None,
        )

    def expiry(self, skew: timedelta) -> datetime | None:
        """The instant after which the holder counts as gone, or None when it never held it."""
        if self.holder is None or self.renew_time is None or self.duration is None:
            return None
        return self.renew_time + self.duration + skew


def _parse_time(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def is_alive(reading: LeaseReading | None, now: datetime, skew: timedelta = DEFAULT_SKEW) -> bool:
    expiry = reading.expiry(skew) if reading is not None else None
    return expiry is not None and now < expiry


class LeaseHeartbeat:
    """Tracks one Lease and reports each change of the gate (open = controller alive) once.

    ``observe`` takes what the watch saw (None when the Lease is gone); ``run_timer`` wakes at
    the expiry instant. Both go through ``_settle``, which emits only on a change.
    """

    def __init__(
        self,
        *,
        namespace: str,
        name: str,
        clock: Clock,
        skew: timedelta = DEFAULT_SKEW,
    ) -> None:
        self.namespace = namespace
        self.name = name
        self._clock = clock
        self._skew = skew
        self._reading: LeaseReading | None = None
        self._seen = False
        self._gate: Gate | None = None
        self._changed = asyncio.Event()

    @property
    def gate(self) -> Gate | None:
        return self._gate

    def observe(self, lease: Mapping[str, Any] | None) -> DispatchEvent | None:
        self._reading = LeaseReading.from_object(lease) if lease is not None else None
        self._seen = True
        self._changed.set()
        return self._settle()

    def check(self) -> DispatchEvent | None:
        """Re-evaluate against the clock alone (what the timer calls)."""
        return self._settle() if self._seen else None

    def _settle(self) -> DispatchEvent | None:
        now = self._clock.now()
        reading = self._reading
        gate: Gate = "open" if is_alive(reading, now, self._skew) else "closed"
        if gate == self._gate:
            return None
        self._gate = gate
        reason, message = self._explain(gate, reading)
        evidence = Evidence(
            kind="Lease",
            name=self.name,
            field="spec.renewTime",
            reason=reason,
            message=message,
        )
        return heartbeat_event(
            gate=gate, now=now, reason=reason, message=message, evidence=(evidence,)
        )

    def _explain(self, gate: Gate, reading: LeaseReading | None) -> tuple[str, str]:
        where = f"Lease {self.namespace}/{self.name}"
        if reading is None:
            return REASON_MISSING, f"{where} does not exist"
        if reading.holder is None:
            return REASON_RELEASED, f"{where} has no holder"
        expiry = reading.expiry(self._skew)
        if gate == "open":
            return REASON_RENEWED, f"{where} held by {reading.holder}, valid until {expiry}"
        return (
            REASON_EXPIRED,
            f"{where} held by {reading.holder} was last renewed at {reading.renew_time}"
            f" and expired at {expiry} (including {self._skew.total_seconds():g}s skew allowance)",
        )

    async def run_timer(self, emit: Callable[[DispatchEvent], Awaitable[None]]) -> None:
        """Forever: sleep until the current renewal runs out (or a new one arrives), re-check."""
        while True:
            self._changed.clear()
            expiry = self._reading.expiry(self._skew) if self._reading is not None else None
            waiter = asyncio.ensure_future(self._changed.wait())
            try:
                if expiry is not None and self._gate == "open":
                    sleeper = asyncio.ensure_future(self._clock.sleep_until(expiry))
                    try:
                        await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        sleeper.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await sleeper
                else:
                    await waiter
            finally:
                waiter.cancel()
            event = self.check()
            if event is not None:
                await emit(event)
