"""The recovery policy's decisions, and the status of a job held at the readmission gate."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest

from dispatch_kubeflow.handlers.recovery import (
    RECOVERY_KEPT,
    decide,
    has_recovery_policy,
    recovery_entry,
    with_entry,
)
from dispatch_kubeflow.handlers.status import DispatchJobStatus, fold_events

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
POLICY = {"readmitOn": ["Preempted"], "retryOn": ["NodeLost"], "maxAttempts": 3, "backoff": "30s"}


def event(type_: str, seq: int, attempt: int = 1, **fields: Any) -> dict[str, Any]:
    return {
        "type": type_,
        "id": f"j/{attempt}/{seq}",
        "job": "j",
        "attempt": attempt,
        "time": (T0 + timedelta(seconds=seq)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **fields,
    }


def evicted(seq: int = 2, cause: str = "Preempted", attempt: int = 1) -> dict[str, Any]:
    return event("Evicted", seq, attempt, state="Pending", cause=cause, reason="Preempted")


def failed(seq: int = 3, cause: str = "NodeLost", attempt: int = 1) -> dict[str, Any]:
    return event("Finished", seq, attempt, state="Failed", cause=cause, reason="Failed")


def spec(attempt: int = 1, **extra: Any) -> dict[str, Any]:
    return {"adapter": "a", "attempt": attempt, "recovery": POLICY, **extra}


def test_no_policy_decides_nothing() -> None:
    assert decide({"adapter": "a"}, {"events": [evicted()]}) is None


def test_an_eviction_with_a_listed_cause_is_readmitted_after_the_backoff() -> None:
    decision = decide(spec(), {"events": [event("Admitted", 1), evicted()]})
    assert decision is not None
    assert (decision.action, decision.event, decision.attempt) == ("Readmitted", "j/1/2", 1)
    assert decision.due == T0 + timedelta(seconds=2 + 30)


def test_an_eviction_with_another_cause_waits_for_a_person() -> None:
    assert decide(spec(), {"events": [evicted(cause="NodeLost")]}) is None


def test_a_failure_with_a_listed_cause_raises_the_attempt_within_the_bound() -> None:
    decision = decide(spec(), {"events": [failed()]})
    assert decision is not None
    assert (decision.action, decision.attempt) == ("Retried", 1)
    assert decide(spec(attempt=3), {"events": [failed(attempt=3)]}) is None


def test_a_decision_already_recorded_is_not_taken_again() -> None:
    done = recovery_entry("Readmitted", event="j/1/2", attempt=1, now=T0, message="m")
    assert decide(spec(), {"events": [evicted()], "recovery": [done]}) is None


def test_readmissions_of_one_attempt_are_bounded() -> None:
    policy = {**POLICY, "maxReadmissions": 1}
    done = recovery_entry("Readmitted", event="j/1/2", attempt=1, now=T0, message="m")
    status = {"events": [evicted(2), event("Admitted", 3), evicted(4)], "recovery": [done]}
    assert decide({**spec(), "recovery": policy}, status) is None


def test_a_rejected_job_is_not_readmitted() -> None:
    assert decide(spec(reject="no"), {"events": [evicted()]}) is None


def test_only_the_current_attempts_latest_event_counts() -> None:
    assert decide(spec(attempt=2), {"events": [failed(attempt=1)]}) is None
    assert decide(spec(), {"events": [evicted(), event("Admitted", 5)]}) is None


def test_the_recovery_history_keeps_the_newest_entries() -> None:
    entries: list[Any] = []
    for n in range(RECOVERY_KEPT + 3):
        entry = recovery_entry("Retried", event=f"j/{n}/1", attempt=n, now=T0, message="m")
        entries = with_entry(entries, entry)
    assert len(entries) == RECOVERY_KEPT
    assert entries[-1]["event"] == f"j/{RECOVERY_KEPT + 2}/1"


@pytest.mark.parametrize(("gate", "reason"), [(True, "HeldAtGate"), (False, "Preempted")])
def test_an_eviction_behind_a_gate_is_held_there_and_says_why(gate: bool, reason: str) -> None:
    status, _ = fold_events(
        DispatchJobStatus(),
        [event("Admitted", 1, state="Pending"), {**evicted(), "message": "preempted by team-b"}],
        attempt=1,
        generation=1,
        now=T0,
        gate=gate,
    )
    admitted = next(c for c in status.conditions if c.type == "Admitted")
    assert (admitted.status, admitted.reason) == ("False", reason)
    if gate:
        assert "Preempted" in admitted.message
        assert "preempted by team-b" in admitted.message
        assert "spec.readmit" in admitted.message


def test_only_a_dispatchjob_with_a_policy_reaches_the_recovery_handler() -> None:
    assert has_recovery_policy(kopf.Spec(kopf.Body({"spec": {"recovery": POLICY}})))
    assert not has_recovery_policy(kopf.Spec(kopf.Body({"spec": {"attempt": 2}})))
    assert not has_recovery_policy(kopf.Spec(kopf.Body({"spec": {"recovery": None}})))
