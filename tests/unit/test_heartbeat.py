"""Lease liveness and the heartbeat timer, on fake loop time (looptime): no real sleeps."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatch_kubeflow.clock import LoopClock
from dispatch_kubeflow.constants import EventType
from dispatch_kubeflow.events import DispatchEvent
from dispatch_kubeflow.heartbeat import (
    DEFAULT_SKEW,
    REASON_EXPIRED,
    REASON_MISSING,
    REASON_RELEASED,
    REASON_RENEWED,
    LeaseHeartbeat,
    is_alive,
)
from dispatch_kubeflow.kube.leases import Lease

START = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def lease(
    renew: datetime | None, duration: int = 15, holder: str | None = "ctl-0"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseDurationSeconds": duration}
    if holder is not None:
        spec["holderIdentity"] = holder
    if renew is not None:
        spec["renewTime"] = renew.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"metadata": {"name": "dispatch-admission"}, "spec": spec}


def test_alive_until_renew_plus_duration_plus_skew() -> None:
    reading = Lease.from_object(lease(START, duration=15))
    assert reading.renew_time == START
    edge = START + timedelta(seconds=15) + DEFAULT_SKEW
    assert is_alive(reading, edge - timedelta(microseconds=1))
    assert not is_alive(reading, edge)
    assert is_alive(reading, START + timedelta(seconds=16))  # inside the skew allowance


def test_without_holder_or_renewal_it_is_not_alive() -> None:
    assert not is_alive(Lease.from_object(lease(START, holder=None)), START)
    assert not is_alive(Lease.from_object(lease(None)), START)
    assert not is_alive(None, START)


class Collector:
    """A consumer that checks the gate as soon as the timer wakes it."""

    def __init__(self, heartbeat: LeaseHeartbeat) -> None:
        self.heartbeat = heartbeat
        self.events: list[DispatchEvent] = []

    async def __call__(self) -> None:
        event = self.heartbeat.check()
        if event is not None:
            self.events.append(event)


@pytest.mark.looptime(start=0)
async def test_the_timer_closes_the_gate_when_renewals_stop() -> None:
    clock = LoopClock(START)
    heartbeat = LeaseHeartbeat(namespace="dispatch-system", name="dispatch-admission", clock=clock)
    collected = Collector(heartbeat)
    timer = asyncio.create_task(heartbeat.run_timer(collected))
    try:
        opened = heartbeat.observe(lease(clock.now(), duration=15))
        assert opened is not None
        assert (opened.type, opened.gate, opened.reason) == (
            EventType.ADMISSION_HEARTBEAT,
            "open",
            REASON_RENEWED,
        )
        await asyncio.sleep(16.9)  # fake time: within duration + skew
        assert collected.events == []
        await asyncio.sleep(0.2)  # past 17 s, no watch event came
        assert [(e.gate, e.reason) for e in collected.events] == [("closed", REASON_EXPIRED)]
        assert collected.events[0].time == START + timedelta(seconds=17)
    finally:
        timer.cancel()


@pytest.mark.looptime(start=0)
async def test_renewals_keep_the_gate_open_and_a_late_one_reopens_it() -> None:
    clock = LoopClock(START)
    heartbeat = LeaseHeartbeat(namespace="ns", name="l", clock=clock)
    collected = Collector(heartbeat)
    timer = asyncio.create_task(heartbeat.run_timer(collected))
    try:
        assert heartbeat.observe(lease(clock.now(), duration=10)) is not None
        for _ in range(5):  # renewed every 5 s for 25 s: stays open
            await asyncio.sleep(5)
            assert heartbeat.observe(lease(clock.now(), duration=10)) is None
        assert collected.events == []
        await asyncio.sleep(13)
        assert [e.gate for e in collected.events] == ["closed"]
        reopened = heartbeat.observe(lease(clock.now(), duration=10))
        assert reopened is not None
        assert reopened.gate == "open"
        await asyncio.sleep(1)
        assert [e.gate for e in collected.events] == ["closed"]  # nothing more from the timer
    finally:
        timer.cancel()


@pytest.mark.looptime(start=0)
async def test_a_lease_already_stale_when_first_seen_is_closed_at_once() -> None:
    clock = LoopClock(START)
    heartbeat = LeaseHeartbeat(namespace="ns", name="l", clock=clock)
    event = heartbeat.observe(lease(START - timedelta(minutes=5)))
    assert event is not None
    assert (event.gate, event.reason) == ("closed", REASON_EXPIRED)


def test_a_missing_or_released_lease_closes_the_gate() -> None:
    class Fixed:
        def now(self) -> datetime:
            return START

        async def sleep_until(self, instant: datetime) -> None:
            raise AssertionError("not used")

    heartbeat = LeaseHeartbeat(namespace="ns", name="l", clock=Fixed())
    assert heartbeat.check() is None  # nothing observed yet: no opinion
    missing = heartbeat.observe(None)
    assert missing is not None
    assert (missing.gate, missing.reason) == ("closed", REASON_MISSING)
    assert heartbeat.observe(lease(START, holder=None)) is None  # still closed: no event
    assert heartbeat.observe(lease(START)) is not None
    released = heartbeat.observe(lease(START, holder=None))
    assert released is not None
    assert (released.gate, released.reason) == ("closed", REASON_RELEASED)
    dumped = released.model_dump(mode="json", by_alias=True)
    assert dumped["gate"] == "closed"
    assert dumped["job"] is None


class LaggingConsumer:
    """The supervisor's loop in small: one queue for Lease changes and timer wake-ups, each
    applied only when consumed, by a consumer that is busy until ``busy_until`` (loop time)."""

    def __init__(self, heartbeat: LeaseHeartbeat, busy_until: float) -> None:
        self.heartbeat = heartbeat
        self.busy_until = busy_until
        self.queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.events: list[DispatchEvent] = []

    async def wake(self) -> None:
        await self.queue.put(None)

    async def run(self) -> None:
        while True:
            item = await self.queue.get()
            lag = self.busy_until - asyncio.get_running_loop().time()
            if lag > 0:
                await asyncio.sleep(lag)
            event = self.heartbeat.check() if item is None else self.heartbeat.observe(item)
            if event is not None:
                self.events.append(event)


@pytest.mark.looptime(start=0)
async def test_item17_a_consumer_lagging_past_the_lease_duration_reports_the_latest_gate() -> None:
    clock = LoopClock(START)
    heartbeat = LeaseHeartbeat(namespace="ns", name="l", clock=clock)
    consumer = LaggingConsumer(heartbeat, busy_until=25)
    opened = heartbeat.observe(lease(clock.now(), duration=15))  # valid until 17 s
    assert opened is not None
    tasks = [
        asyncio.create_task(heartbeat.run_timer(consumer.wake)),
        asyncio.create_task(consumer.run()),
    ]
    try:
        await asyncio.sleep(10)
        # Renewed at 10 s (valid until 27 s), but the consumer applies it only at 25 s; the
        # timer meanwhile wakes at 17 s for the renewal it knows of.
        await consumer.queue.put(lease(clock.now(), duration=15))
        await asyncio.sleep(16)
        assert consumer.events == []  # never closed: the renewal came before the expiry
        assert heartbeat.gate == "open"
        await asyncio.sleep(2)  # 28 s: the renewal ran out, and the consumer keeps up now
        assert [(e.gate, e.reason) for e in consumer.events] == [("closed", REASON_EXPIRED)]
        assert consumer.events[0].time == START + timedelta(seconds=27)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
