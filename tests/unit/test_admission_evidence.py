"""Issue 12 item 4: evidence belongs to the admission it came from.

A Kueue eviction and readmission (suspend, then resume) does not raise JobSet's restart attempt,
so the pods of the earlier admission carry the same restart attempt as the new run's. Their
Unschedulable, image-pull or 137/143 exits must not colour the new run.
"""

from __future__ import annotations

from typing import Any

from dispatch_kubeflow.constants import Cause, State
from dispatch_kubeflow.derivation import admission_pods
from tests.unit.test_events import cond, observe, pod, status_of, terminated, trainjob, workload

EVICTED_AT = "2026-01-01T00:05:00Z"
READMITTED_AT = "2026-01-01T00:10:00Z"


def created(p: dict[str, Any], at: str) -> dict[str, Any]:
    return {**p, "metadata": {**p["metadata"], "creationTimestamp": at}}


def deleted(p: dict[str, Any]) -> dict[str, Any]:
    return {**p, "metadata": {**p["metadata"], "deletionTimestamp": "deleted"}}


UNSCHEDULABLE_BEFORE = deleted(
    created(
        pod(
            "old-0",
            phase="Pending",
            node=None,
            conditions=[cond("PodScheduled", "False", "Unschedulable", "0/3 nodes are available")],
        ),
        "2026-01-01T00:01:00Z",
    )
)
KILLED_BEFORE = deleted(
    created(
        pod("old-1", phase="Failed", containers=[terminated(137, "Error")]),
        "2026-01-01T00:02:00Z",
    )
)
# Kueue resets Evicted to False when it reserves quota again.
READMITTED = workload(
    cond("Admitted", reason="Admitted", t=READMITTED_AT),
    cond("Evicted", "False", "QuotaReserved", "Previously: preempted", t=READMITTED_AT),
)
FAILED_NOW = created(
    pod("new-0", phase="Failed", containers=[terminated(1, "Error")]), "2026-01-01T00:10:03Z"
)


def test_item4_a_readmitted_job_failing_with_exit_1_is_program_error_not_no_capacity() -> None:
    status = status_of(
        train_job=trainjob(cond("Failed", reason="FailedJobs")),
        workload=READMITTED,
        pods=(UNSCHEDULABLE_BEFORE, KILLED_BEFORE, FAILED_NOW),
    )
    assert (status.state, status.cause) == (State.FAILED, Cause.PROGRAM_ERROR)
    assert [(e.name, e.exit_code) for e in status.evidence] == [("new-0", 1)]


def test_item4_pods_of_an_earlier_admission_are_not_current_evidence() -> None:
    obs = observe(workload=READMITTED, pods=(UNSCHEDULABLE_BEFORE, KILLED_BEFORE, FAILED_NOW))
    assert [p["metadata"]["name"] for p in admission_pods(obs)] == ["new-0"]


def test_item4_a_readmitted_job_waiting_for_its_new_pods_is_not_no_capacity() -> None:
    status = status_of(workload=READMITTED, pods=(UNSCHEDULABLE_BEFORE,))
    assert (status.state, status.cause, status.admitted) == (State.PENDING, None, True)


def test_item4_a_first_admission_keeps_every_pod_whatever_its_creation_time() -> None:
    # Never evicted: a pod stamped before Kueue's Admitted time (clock skew) is still current.
    first = workload(cond("Admitted", reason="Admitted", t=READMITTED_AT))
    status = status_of(
        workload=first, pods=(created(UNSCHEDULABLE_BEFORE, "2026-01-01T00:09:59Z"),)
    )
    assert status.cause is Cause.NO_CAPACITY


def test_item4_while_evicted_and_not_yet_readmitted_the_last_admissions_pods_still_count() -> None:
    evicted = workload(
        cond("Admitted", "False", reason="NoReservation", t=EVICTED_AT),
        cond("Evicted", reason="Preempted", message="preempted", t=EVICTED_AT),
    )
    obs = observe(train_job=trainjob(suspend=True), workload=evicted, pods=(KILLED_BEFORE,))
    assert admission_pods(obs) == [KILLED_BEFORE]


def test_item4_an_eviction_a_later_admission_superseded_is_no_cause_of_the_new_run() -> None:
    # Evicted left True from the earlier admission, older than the current Admitted.
    readmitted = workload(
        cond("Admitted", reason="Admitted", t=READMITTED_AT),
        cond("Evicted", reason="Preempted", message="preempted", t=EVICTED_AT),
    )
    status = status_of(
        train_job=trainjob(cond("Failed", reason="FailedJobs")),
        workload=readmitted,
        pods=(UNSCHEDULABLE_BEFORE, FAILED_NOW),
    )
    assert (status.state, status.cause) == (State.FAILED, Cause.PROGRAM_ERROR)
