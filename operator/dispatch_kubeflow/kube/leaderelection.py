"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics.

A program that runs as several replicas, of which exactly one may act, campaigns here for a
Lease: today the admission controller, whose Lease doubles as the heartbeat the adapter reads.
It lives in the foundation, not with that program, for the reason client-go keeps it in
``tools/leaderelection`` rather than in a controller: it knows nothing of what the leader does
(no Kueue, no settings, no decisions), only a Lease and its store (``kube.leases``) and a
clock. The admission controller hands it a ``lead`` coroutine; another program needing one
active replica would take it from here without importing a program.

The rules are client-go's ``tools/leaderelection`` with ``ReleaseOnCancel``:

* A candidate reads the Lease. It takes it when the Lease does not exist (create), when its
  ``holderIdentity`` is empty (released), or when the record has not changed for
  ``leaseDurationSeconds`` *as measured on the candidate's own clock since it first saw that
  record*. Measuring from the local observation rather than from the holder's ``renewTime`` keeps
  two clocks out of the comparison; the cost is that a freshly started candidate waits one full
  lease duration before taking over a Lease whose holder is already dead.
* Every write is an update carrying the ``resourceVersion`` last read, so two candidates racing for
  the same expired Lease cannot both win: the second gets a conflict.
* The leader renews every retry period. When it cannot renew for the renew deadline it has lost
  the lease and stops at once, before anyone else may take it over (renew deadline < lease
  duration). ``is_leader()`` also turns false on its own at the renew deadline, so a leader whose
  loop is stuck behind a hung request stops deciding in time too.
* On shutdown the leader releases the Lease: empty holder, ``leaseDurationSeconds: 1``, so a
  standby takes over at its next retry instead of after a lease duration.

Time, both reading it and waiting, comes from an injected ``Clock`` so the rules can be tested
without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import uuid
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from dispatch_kubeflow.clock import SYSTEM_CLOCK, Clock
from dispatch_kubeflow.errors import DispatchError
from dispatch_kubeflow.kube.leases import Lease, LeaseConflict, LeaseStore

log = logging.getLogger(__name__)

RELEASE_ATTEMPTS = 3
JITTER_FACTOR = 1.2  # client-go's JitterFactor: a candidate retries after retry_period * [1, 1.2)


def default_identity() -> str:
    """Host name plus a random suffix, as client-go's callers do: unique even across restarts."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


class ElectionTiming(BaseModel):
    """How long a Lease lasts, how long a leader keeps trying to renew, how often anyone tries.

    The defaults are client-go's (and kube-controller-manager's): 15 s, 10 s, 2 s.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    lease_duration: timedelta = timedelta(seconds=15)
    renew_deadline: timedelta = timedelta(seconds=10)
    retry_period: timedelta = timedelta(seconds=2)

    @model_validator(mode="after")
    def _ordered(self) -> ElectionTiming:
        if self.lease_duration <= self.renew_deadline:
            raise ValueError(
                f"leader election: lease duration {self.lease_duration} must be longer "
                f"than the renew deadline {self.renew_deadline}"
            )
        if self.renew_deadline <= self.retry_period * JITTER_FACTOR:
            raise ValueError(
                f"leader election: renew deadline {self.renew_deadline} must be longer "
                f"than {JITTER_FACTOR} x the retry period {self.retry_period}"
            )
        if self.retry_period <= timedelta(0):
            raise ValueError("leader election: retry period must be positive")
        return self

    @property
    def lease_duration_seconds(self) -> int:
        """The Lease's whole-second field; at least 1."""
        return max(1, int(self.lease_duration.total_seconds()))


class LeaderElector:
    """One candidate for one Lease."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        timing: ElectionTiming | None = None,
        *,
        clock: Clock = SYSTEM_CLOCK,
        release_on_cancel: bool = True,
    ) -> None:
        if not identity:
            raise ValueError("leader election: identity must not be empty")
        self.store = store
        self.identity = identity
        self.timing = timing or ElectionTiming()
        self._clock = clock
        self._release_on_cancel = release_on_cancel
        self._observed: Lease | None = None
        self._observed_time: datetime | None = None
        self._renewed_at: datetime | None = None

    # What this candidate knows.

    @property
    def observed(self) -> Lease | None:
        return self._observed

    def holds_record(self) -> bool:
        return self._observed is not None and self._observed.holder_identity == self.identity

    def is_leader(self) -> bool:
        """True while this candidate holds the Lease and renewed it within the renew deadline."""
        return (
            self.holds_record()
            and self._renewed_at is not None
            and self._clock.now() < self._renewed_at + self.timing.renew_deadline
        )

    def _lease_valid(self, now: datetime) -> bool:
        if self._observed is None or self._observed_time is None:
            return False
        return now < self._observed_time + self._observed.duration

    def _observe(self, lease: Lease, now: datetime) -> None:
        if not lease.same_election_state(self._observed):
            self._observed_time = now
        self._observed = lease

    # One step of the protocol.

    async def try_acquire_or_renew(self) -> bool:
        """Take or renew the Lease once. True when this candidate holds it afterwards."""
        now = self._clock.now()
        wanted = Lease(
            holder_identity=self.identity,
            lease_duration_seconds=self.timing.lease_duration_seconds,
            acquire_time=now,
            renew_time=now,
        )
        try:
            current = await self.store.get()
            if current is None:
                written = await self.store.create(wanted)
            else:
                self._observe(current, now)
                if current.held and not self.holds_record() and self._lease_valid(now):
                    return False
                if self.holds_record() and self._renewed_at is not None:
                    kept = {
                        "acquire_time": current.acquire_time,
                        "lease_transitions": current.lease_transitions,
                    }
                else:
                    kept = {"lease_transitions": current.lease_transitions + 1}
                wanted = wanted.model_copy(
                    update={**kept, "resource_version": current.resource_version}
                )
                written = await self.store.update(wanted)
        except LeaseConflict as exc:
            log.debug("leader election: %s", exc)
            return False
        except DispatchError as exc:
            log.warning("leader election: cannot read or write the Lease: %s", exc)
            return False
        self._observed = written
        self._observed_time = now
        self._renewed_at = now
        return True

    async def release(self) -> bool:
        """Give the Lease up if this candidate holds it: empty holder, one-second duration.

        The Lease is read again first, and released whenever it names this candidate: an acquire
        or renewal cut off by cancellation may have landed on the server without this candidate
        seeing the answer.
        """
        self._renewed_at = None
        for _ in range(RELEASE_ATTEMPTS):
            now = self._clock.now()
            try:
                current = await self.store.get()
                if current is None or current.holder_identity != self.identity:
                    self._observed = current
                    return True
                released = Lease(
                    holder_identity="",
                    lease_duration_seconds=1,
                    acquire_time=now,
                    renew_time=now,
                    lease_transitions=current.lease_transitions,
                    resource_version=current.resource_version,
                )
                self._observed = await self.store.update(released)
                self._observed_time = now
                return True
            except LeaseConflict:
                continue
            except DispatchError as exc:
                log.warning("leader election: cannot release the Lease: %s", exc)
                return False
        log.warning("leader election: the Lease kept changing while releasing it")
        return False

    # The loop.

    async def run(self, lead: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Campaign; while leader run ``lead()``; cancel it the moment leadership is lost; repeat.

        Cancelling ``run`` releases the Lease first when ``release_on_cancel`` is set.
        """
        try:
            while True:
                await self._acquire()
                log.info("leader election: %s leads", self.identity)
                leading = asyncio.create_task(lead(), name=f"leading:{self.identity}")
                try:
                    await self._renew_until_lost(leading)
                finally:
                    await _stop(leading)
                log.warning("leader election: %s lost the Lease", self.identity)
        except asyncio.CancelledError:
            if self._release_on_cancel:
                await asyncio.shield(self._release_bounded())
            else:
                self._renewed_at = None
            raise

    async def _release_bounded(self) -> None:
        try:
            async with asyncio.timeout(self.timing.renew_deadline.total_seconds()):
                await self.release()
        except TimeoutError:
            log.warning("leader election: releasing the Lease timed out")

    async def _wait(self, period: timedelta) -> None:
        await self._clock.sleep_until(self._clock.now() + period)

    async def _acquire(self) -> None:
        while not await self._attempt(self.timing.renew_deadline):
            jitter = 1 + random.random() * (JITTER_FACTOR - 1)
            await self._wait(self.timing.retry_period * jitter)

    async def _renew_until_lost(self, leading: asyncio.Task[None]) -> None:
        while True:
            await self._wait(self.timing.retry_period)
            while True:
                if leading.done():
                    # The leading work ended on its own (an error): step down so another replica
                    # can take over rather than holding a Lease nobody acts on.
                    await self.release()
                    return
                assert self._renewed_at is not None
                remaining = self._renewed_at + self.timing.renew_deadline - self._clock.now()
                if remaining <= timedelta(0):
                    self._renewed_at = None
                    return
                if await self._attempt(remaining):
                    break
                await self._wait(self.timing.retry_period)

    async def _attempt(self, bound: timedelta) -> bool:
        try:
            async with asyncio.timeout(bound.total_seconds()):
                return await self.try_acquire_or_renew()
        except TimeoutError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                # Python 3.11's timeout can turn a cancellation that races its deadline into
                # TimeoutError; a shutdown must not be mistaken for a slow request.
                raise asyncio.CancelledError from None
            log.warning("leader election: Lease request timed out after %s", bound)
            return False


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:
        log.exception("leader election: the leading work failed")
