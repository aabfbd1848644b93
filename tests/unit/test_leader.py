"""Leader election on a Lease: the client-go rules, with time under the test's control."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatch_kubeflow.clock import LoopClock, ManualClock, format_micro_time, parse_time
from dispatch_kubeflow.errors import UnavailableError
from dispatch_kubeflow.kube.leaderelection import ElectionTiming, LeaderElector
from dispatch_kubeflow.kube.leases import Lease, LeaseConflict

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TIMING = ElectionTiming()  # 15 s / 10 s / 2 s


class MemoryLeaseStore:
    """A Lease with the API server's optimistic concurrency: a stale resourceVersion conflicts."""

    def __init__(self) -> None:
        self.record: Lease | None = None
        self.version = 0
        self.writes = 0
        self.fail = False

    def _check(self) -> None:
        if self.fail:
            raise UnavailableError("get Lease: connection refused")

    async def get(self) -> Lease | None:
        self._check()
        return self.record

    async def create(self, record: Lease) -> Lease:
        self._check()
        if self.record is not None:
            raise LeaseConflict("exists")
        return self._store(record)

    async def update(self, record: Lease) -> Lease:
        self._check()
        if self.record is None or record.resource_version != self.record.resource_version:
            raise LeaseConflict("stale")
        return self._store(record)

    def _store(self, record: Lease) -> Lease:
        self.version += 1
        self.writes += 1
        self.record = record.model_copy(update={"resource_version": str(self.version)})
        return self.record


def elector(store: MemoryLeaseStore, identity: str, clock: ManualClock) -> LeaderElector:
    return LeaderElector(store, identity, TIMING, clock=clock)


async def test_first_candidate_creates_the_lease_and_leads() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a = elector(store, "a", clock)

    assert await a.try_acquire_or_renew()

    assert a.is_leader()
    assert store.record is not None
    assert store.record.holder_identity == "a"
    assert store.record.lease_duration_seconds == 15
    assert store.record.acquire_time == T0
    assert store.record.renew_time == T0
    assert store.record.lease_transitions == 0


async def test_renewal_moves_renew_time_and_keeps_acquire_time() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a = elector(store, "a", clock)
    await a.try_acquire_or_renew()

    clock.advance(timedelta(seconds=2))
    assert await a.try_acquire_or_renew()

    assert store.record is not None
    assert store.record.acquire_time == T0
    assert store.record.renew_time == T0 + timedelta(seconds=2)
    assert store.record.lease_transitions == 0


async def test_standby_cannot_take_a_lease_that_is_being_renewed() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    await a.try_acquire_or_renew()

    for _ in range(20):  # 40 s of renewals, far beyond one lease duration
        assert not await b.try_acquire_or_renew()
        clock.advance(timedelta(seconds=2))
        assert await a.try_acquire_or_renew()

    assert not b.is_leader()
    assert store.record is not None
    assert store.record.holder_identity == "a"


async def test_standby_takes_over_once_the_record_is_unchanged_for_a_lease_duration() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()  # b first sees a's record at T0

    clock.advance(timedelta(seconds=14.9))
    assert not await b.try_acquire_or_renew()
    clock.advance(timedelta(seconds=0.2))
    assert await b.try_acquire_or_renew()

    assert b.is_leader()
    assert store.record is not None
    assert store.record.holder_identity == "b"
    assert store.record.acquire_time == clock.now()
    assert store.record.lease_transitions == 1


async def test_expiry_is_measured_from_when_the_candidate_saw_the_record() -> None:
    """A newcomer does not trust the holder's renewTime: it waits a lease duration of its own."""
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a = elector(store, "a", clock)
    await a.try_acquire_or_renew()
    clock.advance(timedelta(seconds=3600))  # a died an hour ago

    late = elector(store, "late", clock)
    assert not await late.try_acquire_or_renew()
    clock.advance(timedelta(seconds=15.1))
    assert await late.try_acquire_or_renew()


async def test_leader_stops_leading_at_the_renew_deadline_without_a_renewal() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a = elector(store, "a", clock)
    await a.try_acquire_or_renew()

    clock.advance(timedelta(seconds=9.9))
    assert a.is_leader()
    clock.advance(timedelta(seconds=0.1))
    assert not a.is_leader()


async def test_failed_renewal_does_not_extend_leadership() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a = elector(store, "a", clock)
    await a.try_acquire_or_renew()
    store.fail = True

    clock.advance(timedelta(seconds=5))
    assert not await a.try_acquire_or_renew()
    clock.advance(timedelta(seconds=5))
    assert not a.is_leader()


async def test_release_empties_the_holder_so_a_standby_takes_over_at_once() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    await a.try_acquire_or_renew()
    assert not await b.try_acquire_or_renew()

    assert await a.release()

    assert not a.is_leader()
    assert store.record is not None
    assert store.record.holder_identity == ""
    assert store.record.lease_duration_seconds == 1
    assert await b.try_acquire_or_renew()
    assert store.record.holder_identity == "b"


async def test_release_succeeds_after_a_renewal_whose_answer_was_lost() -> None:
    """A renewal cut off by cancellation can land unseen: release must not trip on it."""
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a = elector(store, "a", clock)
    await a.try_acquire_or_renew()
    assert store.record is not None
    store._store(store.record.model_copy(update={"renew_time": T0 + timedelta(seconds=2)}))

    assert await a.release()

    assert store.record.holder_identity == ""


async def test_release_succeeds_after_an_acquire_whose_answer_was_lost() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a = elector(store, "a", clock)
    await store.create(Lease(holder_identity="a", lease_duration_seconds=15))

    assert await a.release()

    assert store.record is not None
    assert store.record.holder_identity == ""


async def test_release_by_a_non_holder_writes_nothing() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a, b = elector(store, "a", clock), elector(store, "b", clock)
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    writes = store.writes

    assert await b.release()

    assert store.writes == writes
    assert store.record is not None
    assert store.record.holder_identity == "a"


async def test_two_candidates_racing_for_an_expired_lease_cannot_both_win() -> None:
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a, b, c = (elector(store, name, clock) for name in "abc")
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    await c.try_acquire_or_renew()
    clock.advance(timedelta(seconds=16))

    # Both read the same expired record before either writes.
    real_get = store.get
    seen = await real_get()

    async def stale_get() -> Lease | None:
        return seen

    store.get = stale_get  # type: ignore[method-assign]
    won = [await b.try_acquire_or_renew(), await c.try_acquire_or_renew()]

    assert sorted(won) == [False, True]
    assert [b.is_leader(), c.is_leader()] == won


def test_timing_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="lease duration"):
        ElectionTiming(lease_duration=timedelta(seconds=10), renew_deadline=timedelta(seconds=10))
    with pytest.raises(ValueError, match="renew deadline"):
        ElectionTiming(renew_deadline=timedelta(seconds=2), retry_period=timedelta(seconds=2))


def test_micro_time_round_trips() -> None:
    when = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
    assert format_micro_time(when) == "2026-03-04T05:06:07.123456Z"
    assert parse_time(format_micro_time(when)) == when
    assert parse_time("2026-03-04T05:06:07Z") == when.replace(microsecond=0)


@pytest.mark.looptime
async def test_run_loop_standby_takes_over_within_a_lease_duration_of_a_crash() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    loop_clock = LoopClock(T0)
    store = MemoryLeaseStore()
    leading: dict[str, float] = {}

    def lead_as(name: str) -> Callable[[], Coroutine[Any, Any, None]]:
        async def lead() -> None:
            leading[name] = loop.time() - start
            await asyncio.Event().wait()

        return lead

    a = LeaderElector(store, "a", TIMING, clock=loop_clock, release_on_cancel=False)
    b = LeaderElector(store, "b", TIMING, clock=loop_clock)
    task_a = asyncio.create_task(a.run(lead_as("a")))
    await asyncio.sleep(0.5)
    task_b = asyncio.create_task(b.run(lead_as("b")))
    await asyncio.sleep(60)
    assert list(leading) == ["a"]

    crashed_at = loop.time() - start
    task_a.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task_a
    await asyncio.sleep(30)

    assert "b" in leading
    jittered_retry = TIMING.retry_period.total_seconds() * 1.2
    assert leading["b"] - crashed_at <= TIMING.lease_duration.total_seconds() + 2 * jittered_retry
    task_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task_b
    assert store.record is not None
    assert store.record.holder_identity == ""  # b released on cancel


@pytest.mark.looptime
async def test_run_loop_cancels_the_leading_work_when_renewal_fails() -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    store = MemoryLeaseStore()
    stopped_at: list[float] = []

    async def lead() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped_at.append(loop.time() - start)

    a = LeaderElector(store, "a", TIMING, clock=LoopClock(T0))
    task = asyncio.create_task(a.run(lead))
    await asyncio.sleep(10)
    store.fail = True
    failed_at = loop.time() - start
    await asyncio.sleep(30)

    assert len(stopped_at) == 1
    # The last renewal was at most a retry period before the failure began.
    assert stopped_at[0] - failed_at <= TIMING.renew_deadline.total_seconds() + 0.01
    assert not a.is_leader()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_the_run_loop_waits_on_the_injected_clock() -> None:
    """Renewals follow the clock handed in: none while it stands still, one per retry period."""
    store, clock = MemoryLeaseStore(), ManualClock(T0)
    a = elector(store, "a", clock)

    async def settle() -> None:
        for _ in range(20):
            await asyncio.sleep(0)

    async def lead() -> None:
        await asyncio.Event().wait()

    task = asyncio.create_task(a.run(lead))
    await settle()
    assert store.writes == 1  # acquired
    await settle()
    assert store.writes == 1  # the clock has not moved: no renewal

    clock.advance(TIMING.retry_period)
    await settle()
    assert store.writes == 2
    assert store.record is not None
    assert store.record.renew_time == T0 + TIMING.retry_period

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.record.holder_identity == ""
