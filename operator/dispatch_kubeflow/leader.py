"""Leader election on a coordination.k8s.io/v1 Lease, with client-go's semantics.

The admission controller runs as several replicas and exactly one of them may decide Workloads.
The Lease it holds doubles as its heartbeat, which the adapter reads: a Lease that stops being
renewed is how the adapter learns the readmission gate is gone.

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

Time comes from an injected clock so the rules can be tested without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import uuid
from collections.abc import Awaitable, Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict, model_validator

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
Sleep = Callable[[float], Awaitable[None]]

LEASE_GROUP = "coordination.k8s.io"
LEASE_VERSION = "v1"
LEASES = "leases"
RELEASE_ATTEMPTS = 3
JITTER_FACTOR = 1.2  # client-go's JitterFactor: a candidate retries after retry_period * [1, 1.2)


def utc_now() -> datetime:
    return datetime.now(UTC)


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


class LeaseRecord(BaseModel):
    """The election fields of a Lease's spec, plus the resourceVersion they were read at."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    holder_identity: str = ""
    lease_duration_seconds: int = 0
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    lease_transitions: int = 0
    resource_version: str | None = None

    def same_election_state(self, other: LeaseRecord | None) -> bool:
        return other is not None and self.model_dump(
            exclude={"resource_version"}
        ) == other.model_dump(exclude={"resource_version"})

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.lease_transitions,
        }
        if self.acquire_time is not None:
            spec["acquireTime"] = format_micro_time(self.acquire_time)
        if self.renew_time is not None:
            spec["renewTime"] = format_micro_time(self.renew_time)
        return spec

    @classmethod
    def from_lease(cls, lease: dict[str, Any]) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder_identity=spec.get("holderIdentity") or "",
            lease_duration_seconds=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=parse_time(spec.get("acquireTime")),
            renew_time=parse_time(spec.get("renewTime")),
            lease_transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=(lease.get("metadata") or {}).get("resourceVersion"),
        )


def format_micro_time(when: datetime) -> str:
    """metav1.MicroTime: RFC 3339 in UTC with six fractional digits."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).astimezone(UTC)


class LeaseConflict(Exception):
    """Someone else wrote the Lease since it was read (HTTP 409)."""


class LeaseStore(Protocol):
    """Reads and writes one Lease. ``update`` must carry the record's resourceVersion."""

    async def get(self) -> LeaseRecord | None: ...

    async def create(self, record: LeaseRecord) -> LeaseRecord: ...

    async def update(self, record: LeaseRecord) -> LeaseRecord: ...


class ApiLeaseStore:
    """A ``LeaseStore`` over the Kubernetes API."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        request_timeout: float = 10.0,
    ) -> None:
        self._objects = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.name = name
        self._timeout = request_timeout

    async def get(self) -> LeaseRecord | None:
        try:
            lease = await self._objects.get_namespaced_custom_object(
                LEASE_GROUP,
                LEASE_VERSION,
                self.namespace,
                LEASES,
                self.name,
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return LeaseRecord.from_lease(lease)

    async def create(self, record: LeaseRecord) -> LeaseRecord:
        body = {
            "apiVersion": f"{LEASE_GROUP}/{LEASE_VERSION}",
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": record.to_spec(),
        }
        try:
            lease = await self._objects.create_namespaced_custom_object(
                LEASE_GROUP,
                LEASE_VERSION,
                self.namespace,
                LEASES,
                body,
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict(f"Lease {self.namespace}/{self.name} already exists") from exc
            raise
        return LeaseRecord.from_lease(lease)

    async def update(self, record: LeaseRecord) -> LeaseRecord:
        body = {
            "apiVersion": f"{LEASE_GROUP}/{LEASE_VERSION}",
            "kind": "Lease",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": record.resource_version,
            },
            "spec": record.to_spec(),
        }
        try:
            lease = await self._objects.replace_namespaced_custom_object(
                LEASE_GROUP,
                LEASE_VERSION,
                self.namespace,
                LEASES,
                self.name,
                body,
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            if exc.status == 409:
                raise LeaseConflict(
                    f"Lease {self.namespace}/{self.name} changed since resourceVersion "
                    f"{record.resource_version}"
                ) from exc
            raise
        return LeaseRecord.from_lease(lease)


class LeaderElector:
    """One candidate for one Lease."""

    def __init__(
        self,
        store: LeaseStore,
        identity: str,
        timing: ElectionTiming | None = None,
        *,
        clock: Clock = utc_now,
        sleep: Sleep = asyncio.sleep,
        release_on_cancel: bool = True,
    ) -> None:
        if not identity:
            raise ValueError("leader election: identity must not be empty")
        self.store = store
        self.identity = identity
        self.timing = timing or ElectionTiming()
        self._clock = clock
        self._sleep = sleep
        self._release_on_cancel = release_on_cancel
        self._observed: LeaseRecord | None = None
        self._observed_time: datetime | None = None
        self._renewed_at: datetime | None = None

    # What this candidate knows.

    @property
    def observed(self) -> LeaseRecord | None:
        return self._observed

    def holds_record(self) -> bool:
        return self._observed is not None and self._observed.holder_identity == self.identity

    def is_leader(self) -> bool:
        """True while this candidate holds the Lease and renewed it within the renew deadline."""
        return (
            self.holds_record()
            and self._renewed_at is not None
            and self._clock() < self._renewed_at + self.timing.renew_deadline
        )

    def _lease_valid(self, now: datetime) -> bool:
        if self._observed is None or self._observed_time is None:
            return False
        held_for = timedelta(seconds=self._observed.lease_duration_seconds)
        return now < self._observed_time + held_for

    def _observe(self, record: LeaseRecord, now: datetime) -> None:
        if not record.same_election_state(self._observed):
            self._observed_time = now
        self._observed = record

    # One step of the protocol.

    async def try_acquire_or_renew(self) -> bool:
        """Take or renew the Lease once. True when this candidate holds it afterwards."""
        now = self._clock()
        wanted = LeaseRecord(
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
                if current.holder_identity and not self.holds_record() and self._lease_valid(now):
                    return False
                if self.holds_record() and self._renewed_at is not None:
                    wanted = wanted.model_copy(
                        update={
                            "acquire_time": current.acquire_time,
                            "lease_transitions": current.lease_transitions,
                        }
                    )
                else:
                    wanted = wanted.model_copy(
                        update={"lease_transitions": current.lease_transitions + 1}
                    )
                wanted = wanted.model_copy(update={"resource_version": current.resource_version})
                written = await self.store.update(wanted)
        except LeaseConflict as exc:
            log.debug("leader election: %s", exc)
            return False
        except (ApiException, OSError, TimeoutError) as exc:
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
            now = self._clock()
            try:
                current = await self.store.get()
                if current is None or current.holder_identity != self.identity:
                    self._observed = current
                    return True
                released = LeaseRecord(
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
            except (ApiException, OSError, TimeoutError) as exc:
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

    async def _acquire(self) -> None:
        while not await self._attempt(self.timing.renew_deadline):
            jitter = 1 + random.random() * (JITTER_FACTOR - 1)
            await self._sleep(self.timing.retry_period.total_seconds() * jitter)

    async def _renew_until_lost(self, leading: asyncio.Task[None]) -> None:
        while True:
            await self._sleep(self.timing.retry_period.total_seconds())
            while True:
                if leading.done():
                    # The leading work ended on its own (an error): step down so another replica
                    # can take over rather than holding a Lease nobody acts on.
                    await self.release()
                    return
                assert self._renewed_at is not None
                remaining = self._renewed_at + self.timing.renew_deadline - self._clock()
                if remaining <= timedelta(0):
                    self._renewed_at = None
                    return
                if await self._attempt(remaining):
                    break
                await self._sleep(self.timing.retry_period.total_seconds())

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
