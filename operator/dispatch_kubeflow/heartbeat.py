"""The admission controller's heartbeat, read from its leader-election Lease.

The controller is alive while ``now < renewTime + leaseDurationSeconds + skew``. Staleness is the
absence of an update, so a watch alone never sees it: ``LeaseHeartbeat`` also runs a timer that
wakes at the instant the current renewal runs out. Time comes from an injected ``Clock`` so that
tests drive it (``LoopClock`` under looptime) instead of sleeping.

The timer never computes an event itself: it only asks for a check (``wake``), and the gate is
judged when the consumer gets to it (``check``), from the latest Lease observed and the time of
that moment. A consumer that lags behind the timer so still reports the gate as it is, never a
``closed`` computed before a renewal it had not yet applied.

The skew allowance (``DEFAULT_SKEW``, 2 s) absorbs the difference between the controller's clock,
which stamps ``renewTime``, and ours, which compares against it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Literal

from dispatch_kubeflow.clock import Clock
from dispatch_kubeflow.constants import KIND_LEASE
from dispatch_kubeflow.events import DispatchEvent, Evidence, heartbeat_event
from dispatch_kubeflow.kube.leases import Lease
from dispatch_kubeflow.tasks import cancel_and_wait

DEFAULT_SKEW = timedelta(seconds=2)

REASON_RENEWED = "LeaseRenewed"
REASON_EXPIRED = "LeaseExpired"
REASON_MISSING = "LeaseMissing"
REASON_RELEASED = "LeaseReleased"

Gate = Literal["open", "closed"]


def is_alive(lease: Lease | None, now: datetime, skew: timedelta = DEFAULT_SKEW) -> bool:
    """Whether the holder of ``lease`` counts as alive at ``now``."""
    expiry = lease.expiry(skew) if lease is not None else None
    return expiry is not None and now < expiry


class LeaseHeartbeat:
    """Tracks one Lease and reports each change of the gate (open = controller alive) once.

    ``observe`` takes what the watch saw (None when the Lease is gone); ``run_timer`` asks for a
    ``check`` at the expiry instant. Both go through ``_settle``, which emits only on a change.
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
        self._lease: Lease | None = None
        self._seen = False
        self._gate: Gate | None = None
        self._changed = asyncio.Event()

    @property
    def gate(self) -> Gate | None:
        return self._gate

    def observe(self, lease: Mapping[str, Any] | None) -> DispatchEvent | None:
        self._lease = Lease.from_object(lease) if lease is not None else None
        self._seen = True
        self._changed.set()
        return self._settle()

    def _settle(self) -> DispatchEvent | None:
        now = self._clock.now()
        gate: Gate = "open" if is_alive(self._lease, now, self._skew) else "closed"
        if gate == self._gate:
            return None
        self._gate = gate
        reason, message = self._explain(gate, self._lease)
        evidence = Evidence(
            kind=KIND_LEASE,
            name=self.name,
            field="spec.renewTime",
            reason=reason,
            message=message,
        )
        return heartbeat_event(
            gate=gate, now=now, reason=reason, message=message, evidence=(evidence,)
        )

    def _explain(self, gate: Gate, lease: Lease | None) -> tuple[str, str]:
        where = f"Lease {self.namespace}/{self.name}"
        if lease is None:
            return REASON_MISSING, f"{where} does not exist"
        if not lease.held:
            return REASON_RELEASED, f"{where} has no holder"
        holder = lease.holder_identity
        expiry = lease.expiry(self._skew)
        if gate == "open":
            return REASON_RENEWED, f"{where} held by {holder}, valid until {expiry}"
        return (
            REASON_EXPIRED,
            f"{where} held by {holder} was last renewed at {lease.renew_time}"
            f" and expired at {expiry} (including {self._skew.total_seconds():g}s skew allowance)",
        )

    def check(self) -> DispatchEvent | None:
        """Re-evaluate against the clock: what the consumer calls when the timer woke it."""
        self._changed.set()  # re-arms the timer, which waits for its wake-up to be consumed
        return self._settle() if self._seen else None

    async def run_timer(self, wake: Callable[[], Awaitable[None]]) -> None:
        """Forever: sleep until the current renewal runs out, then ask for a ``check``.

        A new observation re-arms the sleep. After a wake-up the timer waits until it has been
        consumed (``check``) or the Lease changed, so a lagging consumer gets one check, not many.
        """
        while True:
            self._changed.clear()
            expiry = self._lease.expiry(self._skew) if self._lease is not None else None
            if expiry is None or self._gate != "open":
                await self._changed.wait()
                continue
            if await self._sleep_unless_changed(expiry):
                continue
            await wake()
            await self._changed.wait()

    async def _sleep_unless_changed(self, instant: datetime) -> bool:
        """Sleep until ``instant``; True when the Lease changed (or a check ran) first."""
        waiter = asyncio.ensure_future(self._changed.wait())
        sleeper = asyncio.ensure_future(self._clock.sleep_until(instant))
        try:
            await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(waiter, sleeper)
        return self._changed.is_set() and not self._expired(instant)

    def _expired(self, instant: datetime) -> bool:
        return self._clock.now() >= instant
