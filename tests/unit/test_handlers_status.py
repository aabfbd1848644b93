"""Folding dispatch events into a DispatchJob's status."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from dispatch_kubeflow.constants import Cause
from dispatch_kubeflow.derivation import derive
from dispatch_kubeflow.events import JobObservation
from dispatch_kubeflow.handlers.conditions import find_condition
from dispatch_kubeflow.handlers.status import (
    HISTORY_LIMIT,
    DispatchJobStatus,
    begin_attempt,
    fold_event,
    refuse_attempt,
)
from dispatch_kubeflow.reporting import MemoryStore, Reporter
from tests.unit.test_events import cond, trainjob, workload

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def event(
    kind: str,
    state: str,
    *,
    attempt: int = 1,
    cause: str | None = None,
    reason: str = "",
    minute: int = 0,
) -> dict[str, Any]:
    return {
        "type": kind,
        "job": "j1",
        "attempt": attempt,
        "trainJob": f"j1-{attempt}",
        "time": (T0 + timedelta(minutes=minute)).isoformat(),
        "state": state,
        "cause": cause,
        "reason": reason,
        "message": f"{kind} message",
        "evidence": [],
    }


def fold(status: DispatchJobStatus, *events: dict[str, Any], attempt: int = 1) -> DispatchJobStatus:
    for one in events:
        status = fold_event(status, one, attempt=attempt, generation=1, now=T0)
    return status


def condition_status(status: DispatchJobStatus, kind: str) -> str | None:
    found = find_condition(status.conditions, kind)
    return None if found is None else found.status


def test_begin_attempt_is_pending_with_unknown_admission() -> None:
    status = begin_attempt(DispatchJobStatus(), attempt=1, train_job="j1-1", generation=1, now=T0)
    assert (status.state, status.train_job, status.attempt) == ("Pending", "j1-1", 1)
    assert condition_status(status, "Admitted") == "Unknown"
    assert condition_status(status, "Finished") == "False"


def test_running_then_failed_with_cause_sets_state_cause_and_conditions() -> None:
    status = fold(
        DispatchJobStatus(),
        event("Submitted", "Pending"),
        event("Admitted", "Pending", minute=1),
        event("Running", "Running", minute=2),
    )
    assert status.state == "Running"
    assert condition_status(status, "Admitted") == "True"
    assert condition_status(status, "Running") == "True"
    status = fold(status, event("Finished", "Failed", cause="NodeLost", reason="Evicted", minute=3))
    assert (status.state, status.cause, status.reason) == ("Failed", "NodeLost", "Evicted")
    assert condition_status(status, "Running") == "False"
    assert condition_status(status, "Finished") == "True"
    assert status.finished
    assert [e["type"] for e in status.events] == ["Submitted", "Admitted", "Running", "Finished"]


def test_the_same_event_twice_is_recorded_once() -> None:
    once = fold(DispatchJobStatus(), event("Running", "Running"))
    twice = fold(once, event("Running", "Running"))
    assert twice == once
    assert len(twice.events) == 1


def test_an_older_attempts_event_is_history_only() -> None:
    status = fold(DispatchJobStatus(), event("Running", "Running", attempt=2), attempt=2)
    status = fold(status, event("Finished", "Failed", attempt=1, cause="ProgramError"), attempt=2)
    assert (status.state, status.cause, status.attempt) == ("Running", None, 2)
    assert len(status.events) == 2


def test_history_keeps_the_last_fifty() -> None:
    events = [event("Restarted", "Running", minute=i) for i in range(HISTORY_LIMIT + 7)]
    status = fold(DispatchJobStatus(), *events)
    assert len(status.events) == HISTORY_LIMIT
    assert status.events[0]["time"] == events[7]["time"]


def test_a_reason_that_is_not_camel_case_falls_back_to_the_event_type_in_conditions() -> None:
    status = fold(DispatchJobStatus(), event("Finished", "Failed", reason="exit code 1"))
    assert status.reason == "exit code 1"
    finished = find_condition(status.conditions, "Finished")
    assert finished is not None
    assert finished.reason == "Finished"


def test_refused_attempt_is_finished_and_failed_with_the_reason() -> None:
    status = refuse_attempt(
        DispatchJobStatus(),
        attempt=1,
        reason="Unsupported",
        message="runtime x",
        cause=Cause.RUNTIME_UNSUPPORTED,
        generation=1,
        now=T0,
    )
    assert (status.state, status.reason, status.message) == ("Failed", "Unsupported", "runtime x")
    assert status.cause == "RuntimeUnsupported"
    assert condition_status(status, "Finished") == "True"


def test_wire_round_trip_keeps_everything() -> None:
    status = fold(DispatchJobStatus(), event("Running", "Running"))
    wire = status.to_wire()
    assert wire["trainJob"] == "j1-1"
    assert wire["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert DispatchJobStatus.from_wire({**wire, "unknownKey": 1}) == status


async def test_a_cause_reported_while_pending_shows_in_the_status() -> None:
    """The events the adapter reports for a job that runs out of quota in the queue."""
    no_fit = "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu"
    queued = JobObservation(job="j1", attempt=1, train_job=trainjob(suspend=True))
    over_quota = queued.model_copy(
        update={"workload": workload(cond("QuotaReserved", "False", "Pending", no_fit))}
    )
    reporter = Reporter(MemoryStore())
    status = begin_attempt(DispatchJobStatus(), attempt=1, train_job="j1-1", generation=1, now=T0)
    for minute, observation in enumerate((queued, over_quota, over_quota)):
        reported_now = await reporter.report(
            job="j1",
            attempt=1,
            train_job="j1-1",
            status=derive(observation, loss_taints=frozenset()),
            now=T0 + timedelta(minutes=minute),
        )
        for reported in reported_now:
            status = fold(status, reported.model_dump(mode="json", by_alias=True))

    assert (status.state, status.cause, status.reason, status.message) == (
        "Pending",
        "NoCapacity",
        "Pending",
        no_fit,
    )
    assert [(e["type"], e["cause"]) for e in status.events] == [
        ("Submitted", None),
        ("Submitted", "NoCapacity"),
    ]
    assert condition_status(status, "Admitted") == "False"
    assert condition_status(status, "Finished") == "False"
