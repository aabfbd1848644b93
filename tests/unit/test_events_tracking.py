"""Exactly-once reporting: each transition once, in order, across restarts with a stored record."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatch_kubeflow.constants import BUILTIN_LOSS_TAINTS, Cause, EventType, State
from dispatch_kubeflow.derivation import derive
from dispatch_kubeflow.events import DispatchEvent, JobObservation, Taint
from dispatch_kubeflow.reporting import MemoryStore, ReportedRecord, Reporter, advance
from tests.unit.test_events import (
    ADMITTED,
    T1,
    T2,
    cond,
    pod,
    terminated,
    trainjob,
    waiting,
    workload,
)

LOSS = frozenset(BUILTIN_LOSS_TAINTS)
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def obs(**fields: Any) -> JobObservation:
    fields.setdefault("train_job", trainjob())
    return JobObservation(job="j1", attempt=1, **fields)


async def step(reporter: Reporter, observation: JobObservation) -> list[EventType]:
    events = await reporter.report(
        job="j1",
        attempt=1,
        train_job="j1-1",
        status=derive(observation, loss_taints=LOSS),
        now=NOW,
    )
    return [e.type for e in events]


QUEUED = obs(train_job=trainjob(suspend=True), workload=workload())
ADMITTED_NOT_RUNNING = obs(workload=workload(ADMITTED), pods=(pod(phase="Pending", node=None),))
RUNNING = obs(workload=workload(ADMITTED), pods=(pod(),))
SUCCEEDED = obs(
    train_job=trainjob(cond("Complete", reason="AllJobsCompleted")),
    workload=workload(ADMITTED),
    pods=(pod(phase="Succeeded", containers=[terminated(0, "Completed", '{"loss": 0.5}')]),),
)


async def test_a_lifecycle_reports_each_transition_once_in_order() -> None:
    reporter = Reporter(MemoryStore())
    assert await step(reporter, QUEUED) == [EventType.SUBMITTED]
    assert await step(reporter, QUEUED) == []
    assert await step(reporter, ADMITTED_NOT_RUNNING) == [EventType.ADMITTED]
    assert await step(reporter, RUNNING) == [EventType.RUNNING]
    assert await step(reporter, RUNNING) == []
    assert await step(reporter, SUCCEEDED) == [EventType.FINISHED]
    assert await step(reporter, SUCCEEDED) == []
    assert await step(reporter, obs(train_job=None)) == []  # no Vanished after Finished


async def test_finished_carries_state_cause_and_result() -> None:
    reporter = Reporter(MemoryStore())
    events = await reporter.report(
        job="j1",
        attempt=1,
        train_job="j1-1",
        status=derive(SUCCEEDED, loss_taints=LOSS),
        now=NOW,
    )
    finished = events[-1]
    assert finished.type is EventType.FINISHED
    assert (finished.state, finished.cause, finished.reason) == (
        State.SUCCEEDED,
        None,
        "AllJobsCompleted",
    )
    assert finished.result == {"loss": 0.5}
    assert [e.result for e in events[:-1]] == [None, None]


async def test_a_job_that_finished_while_nothing_watched_gets_its_finished_event() -> None:
    reporter = Reporter(MemoryStore())
    assert await step(reporter, SUCCEEDED) == [
        EventType.SUBMITTED,
        EventType.ADMITTED,
        EventType.FINISHED,
    ]


async def test_a_restarted_reporter_repeats_nothing_and_loses_nothing() -> None:
    store = MemoryStore()
    first = Reporter(store)
    assert await step(first, QUEUED) == [EventType.SUBMITTED]
    assert await step(first, ADMITTED_NOT_RUNNING) == [EventType.ADMITTED]
    # The job starts running and finishes while no reporter is running.
    second = Reporter(store)
    assert await step(second, RUNNING) == [EventType.RUNNING]
    third = Reporter(store)
    assert await step(third, RUNNING) == []
    assert await step(third, SUCCEEDED) == [EventType.FINISHED]
    assert await step(Reporter(store), SUCCEEDED) == []


async def test_the_record_survives_as_short_json() -> None:
    store = MemoryStore()
    reporter = Reporter(store)
    await step(reporter, RUNNING)
    record = store.records[("j1", 1)]
    text = record.to_json()
    assert len(text) < 64
    assert json.loads(text) == {"s": True, "a": 0, "r": 0, "c": "0.0.R:-", "q": 3}
    assert ReportedRecord.from_json(text) == record
    assert ReportedRecord.from_json("") is None
    assert ReportedRecord.from_json("not json") is None


async def test_eviction_and_readmission() -> None:
    reporter = Reporter(MemoryStore())
    assert await step(reporter, RUNNING) == [
        EventType.SUBMITTED,
        EventType.ADMITTED,
        EventType.RUNNING,
    ]
    evicted = obs(
        train_job=trainjob(suspend=True),
        workload=workload(
            cond("Admitted", t="2026-01-01T00:00:00Z"),
            cond("Evicted", reason="Preempted", message="preempted", t=T1),
        ),
        pods=(pod(),),
    )
    events = await reporter.report(
        job="j1", attempt=1, train_job="j1-1", status=derive(evicted, loss_taints=LOSS), now=NOW
    )
    assert [e.type for e in events] == [EventType.EVICTED]
    assert (events[0].cause, events[0].reason, events[0].message) == (
        Cause.PREEMPTED,
        "Preempted",
        "preempted",
    )
    assert await step(reporter, evicted) == []
    readmitted = obs(
        workload=workload(cond("Admitted", t=T2), cond("Evicted", reason="Preempted", t=T1)),
        pods=(pod(),),
    )
    assert await step(reporter, readmitted) == [EventType.ADMITTED, EventType.RUNNING]
    assert await step(reporter, readmitted) == []


async def test_node_lost_once_then_finished_with_node_lost() -> None:
    reporter = Reporter(MemoryStore())
    taints = {"n1": (Taint(key="node.kubernetes.io/unreachable", effect="NoExecute"),)}
    assert await step(reporter, RUNNING) == [
        EventType.SUBMITTED,
        EventType.ADMITTED,
        EventType.RUNNING,
    ]
    lost = obs(workload=workload(ADMITTED), pods=(pod(),), node_taints=taints)
    assert await step(reporter, lost) == [EventType.NODE_LOST]
    assert await step(reporter, lost) == []
    failed = obs(
        train_job=trainjob(cond("Failed", reason="FailedJobs")),
        workload=workload(ADMITTED),
        pods=(pod(phase="Failed", containers=[terminated(1)]),),
        node_taints=taints,
    )
    events = await reporter.report(
        job="j1", attempt=1, train_job="j1-1", status=derive(failed, loss_taints=LOSS), now=NOW
    )
    assert [(e.type, e.state, e.cause) for e in events] == [
        (EventType.FINISHED, State.FAILED, Cause.NODE_LOST)
    ]


async def test_jobset_restart_gives_restarted_once_per_attempt() -> None:
    reporter = Reporter(MemoryStore())
    await step(reporter, RUNNING)
    again = obs(workload=workload(ADMITTED), pods=(pod("p2", restart_attempt=1),))
    assert await step(reporter, again) == [EventType.RESTARTED]
    assert await step(reporter, again) == []
    third = obs(workload=workload(ADMITTED), pods=(pod("p3", restart_attempt=2),))
    assert await step(reporter, third) == [EventType.RESTARTED]


async def test_vanished_before_a_terminal_state() -> None:
    reporter = Reporter(MemoryStore())
    await step(reporter, RUNNING)
    events = await reporter.report(
        job="j1",
        attempt=1,
        train_job="j1-1",
        status=derive(obs(train_job=None), loss_taints=LOSS),
        now=NOW,
    )
    assert [(e.type, e.state, e.cause) for e in events] == [
        (EventType.VANISHED, State.UNKNOWN, Cause.EVIDENCE_LOST)
    ]
    assert await step(reporter, obs(train_job=None)) == []


async def test_nothing_is_reported_of_a_job_never_seen_that_is_gone() -> None:
    assert await step(Reporter(MemoryStore()), obs(train_job=None)) == []


async def test_stop_gives_finished_stopped() -> None:
    reporter = Reporter(MemoryStore())
    await step(reporter, RUNNING)
    events = await reporter.report(
        job="j1",
        attempt=1,
        train_job="j1-1",
        status=derive(obs(train_job=None, stopped=True), loss_taints=LOSS),
        now=NOW,
    )
    assert [(e.type, e.state, e.cause) for e in events] == [
        (EventType.FINISHED, State.STOPPED, Cause.STOPPED)
    ]


async def test_the_store_is_written_only_when_something_is_reported() -> None:
    class CountingStore(MemoryStore):
        saves = 0

        async def commit(
            self, job: str, attempt: int, record: ReportedRecord, events: Sequence[DispatchEvent]
        ) -> None:
            self.saves += 1
            await super().commit(job, attempt, record, events)

    store = CountingStore()
    reporter = Reporter(store)
    for _ in range(3):
        await step(reporter, RUNNING)
    assert store.saves == 1


def test_advance_is_pure_and_keeps_the_time_given() -> None:
    later = NOW + timedelta(seconds=5)
    status = derive(RUNNING, loss_taints=LOSS)
    events, record = advance(
        job="j1", attempt=1, train_job="j1-1", record=None, status=status, now=later
    )
    assert {e.time for e in events} == {later}
    again, same = advance(
        job="j1", attempt=1, train_job="j1-1", record=record, status=status, now=later
    )
    assert (again, same) == ([], record)


NO_FIT = "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu"
OVER_QUOTA = obs(
    train_job=trainjob(suspend=True),
    workload=workload(cond("QuotaReserved", "False", "Pending", NO_FIT)),
)
UNSCHEDULABLE = obs(
    workload=workload(ADMITTED),
    pods=(
        pod(
            phase="Pending",
            node=None,
            conditions=[cond("PodScheduled", "False", "Unschedulable", "0/2 nodes are available")],
        ),
    ),
)


async def report(reporter: Reporter, observation: JobObservation) -> list[DispatchEvent]:
    return await reporter.report(
        job="j1",
        attempt=1,
        train_job="j1-1",
        status=derive(observation, loss_taints=LOSS),
        now=NOW,
    )


def summary(events: list[DispatchEvent]) -> list[tuple[Any, ...]]:
    return [(e.type, e.state, e.cause, e.reason, e.message) for e in events]


async def test_running_out_of_quota_while_queued_is_reported_once() -> None:
    store = MemoryStore()
    reporter = Reporter(store)
    assert await step(reporter, QUEUED) == [EventType.SUBMITTED]
    events = await report(reporter, OVER_QUOTA)
    assert summary(events) == [
        (EventType.SUBMITTED, State.PENDING, Cause.NO_CAPACITY, "Pending", NO_FIT)
    ]
    assert [(e.kind, e.type) for e in events[0].evidence] == [("Workload", "QuotaReserved")]
    assert await step(reporter, OVER_QUOTA) == []
    assert await step(Reporter(store), OVER_QUOTA) == []  # a restart repeats nothing
    assert await step(reporter, ADMITTED_NOT_RUNNING) == [EventType.ADMITTED]


async def test_a_job_first_seen_over_quota_carries_it_on_submitted_only() -> None:
    reporter = Reporter(MemoryStore())
    events = await report(reporter, OVER_QUOTA)
    assert [(e.type, e.cause) for e in events] == [(EventType.SUBMITTED, Cause.NO_CAPACITY)]
    assert await step(reporter, OVER_QUOTA) == []


async def test_pods_turning_unschedulable_after_admission_repeat_admitted() -> None:
    reporter = Reporter(MemoryStore())
    assert await step(reporter, QUEUED) == [EventType.SUBMITTED]
    assert await step(reporter, ADMITTED_NOT_RUNNING) == [EventType.ADMITTED]
    events = await report(reporter, UNSCHEDULABLE)
    assert summary(events) == [
        (
            EventType.ADMITTED,
            State.PENDING,
            Cause.NO_CAPACITY,
            "Unschedulable",
            "0/2 nodes are available",
        )
    ]
    assert await step(reporter, UNSCHEDULABLE) == []
    assert await step(reporter, RUNNING) == [EventType.RUNNING]


async def test_image_pull_while_pods_wait_is_reported() -> None:
    reporter = Reporter(MemoryStore())
    await step(reporter, ADMITTED_NOT_RUNNING)
    pulling = obs(
        workload=workload(ADMITTED),
        pods=(pod(phase="Pending", containers=[waiting("ImagePullBackOff", "Back-off")]),),
    )
    events = await report(reporter, pulling)
    assert summary(events) == [
        (EventType.ADMITTED, State.PENDING, Cause.IMAGE_PULL, "ImagePullBackOff", "Back-off")
    ]
    assert await step(reporter, pulling) == []


async def test_each_distinct_cause_is_reported_once_per_phase() -> None:
    reporter = Reporter(MemoryStore())
    waiting_gate = obs(
        train_job=trainjob(suspend=True),
        workload=workload(cond("QuotaReserved", reason="QuotaReserved")),
    )
    causes = []
    for observation in (QUEUED, OVER_QUOTA, waiting_gate, OVER_QUOTA, waiting_gate, OVER_QUOTA):
        causes += [(e.type, e.cause) for e in await report(reporter, observation)]
    assert causes == [(EventType.SUBMITTED, None), (EventType.SUBMITTED, Cause.NO_CAPACITY)]


async def test_a_readmission_starts_a_new_phase_for_causes() -> None:
    reporter = Reporter(MemoryStore())
    await step(reporter, OVER_QUOTA)
    await step(reporter, RUNNING)
    evicted = obs(
        train_job=trainjob(suspend=True),
        workload=workload(
            cond("Admitted", "False", t=T1),
            cond("Evicted", reason="Preempted", message="preempted", t=T1),
            cond("QuotaReserved", "False", "Pending", "preempted", t=T1),
        ),
    )
    assert await step(reporter, evicted) == [EventType.EVICTED]
    requeued = obs(
        train_job=trainjob(suspend=True),
        workload=workload(
            cond("Admitted", "False", t=T1),
            cond("Evicted", "False", reason="Preempted", t=T2),
            cond("QuotaReserved", "False", "Pending", NO_FIT, t=T2),
        ),
    )
    events = await report(reporter, requeued)
    assert [(e.type, e.state, e.cause) for e in events] == [
        (EventType.SUBMITTED, State.PENDING, Cause.NO_CAPACITY)
    ]


async def test_a_record_from_before_cause_tracking_loads_and_repeats_nothing() -> None:
    store = MemoryStore()
    legacy = ReportedRecord.from_json('{"s":true}')
    assert legacy is not None
    assert legacy.causes is None
    await store.commit("j1", 1, legacy, [])
    reporter = Reporter(store)
    assert await step(reporter, OVER_QUOTA) == []  # its cause is adopted, not re-reported
    assert await step(reporter, ADMITTED_NOT_RUNNING) == [EventType.ADMITTED]
    assert await step(reporter, UNSCHEDULABLE) == [EventType.ADMITTED]


async def test_ranks_ending_before_the_trainjob_says_so_report_nothing_more() -> None:
    """Pods finish a moment before Trainer marks the TrainJob; only its Finished follows."""
    for ended in (
        pod(phase="Succeeded", containers=[terminated(0, "Completed")]),
        pod(phase="Failed", containers=[terminated(3)]),
    ):
        reporter = Reporter(MemoryStore())
        await step(reporter, RUNNING)
        assert await step(reporter, obs(workload=workload(ADMITTED), pods=(ended,))) == []


async def test_each_event_carries_a_stable_id_of_job_attempt_and_sequence() -> None:
    reporter = Reporter(MemoryStore())
    first = await report(reporter, RUNNING)
    assert [e.id for e in first] == [f"j1/1/{n}" for n in range(1, len(first) + 1)]
    record = await reporter.record_of("j1", 1)
    assert record is not None
    assert record.sequence == len(first)


async def test_a_failed_commit_reports_nothing_and_the_same_ids_come_again() -> None:
    class RefusingStore(MemoryStore):
        refuse = True

        async def commit(
            self, job: str, attempt: int, record: ReportedRecord, events: Sequence[DispatchEvent]
        ) -> None:
            if self.refuse:
                raise OSError("the store is down")
            await super().commit(job, attempt, record, events)

    store = RefusingStore()
    reporter = Reporter(store)
    status = derive(RUNNING, loss_taints=LOSS)
    transition = await reporter.next_transition(
        job="j1", attempt=1, train_job="j1-1", status=status, now=NOW
    )
    assert transition is not None
    with pytest.raises(OSError, match="down"):
        await reporter.commit(transition)
    assert await reporter.record_of("j1", 1) is None
    store.refuse = False
    again = await reporter.report(job="j1", attempt=1, train_job="j1-1", status=status, now=NOW)
    assert [e.id for e in again] == [e.id for e in transition.events]
    assert [e.type for e in again] == [e.type for e in transition.events]
