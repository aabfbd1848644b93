"""The Kueue Workload predicates, on Workloads as Kueue writes them."""

from __future__ import annotations

from typing import Any

from dispatch_kubeflow.constants import (
    LABEL_KUEUE_JOB_UID,
    WORKLOAD_ADMITTED,
    WORKLOAD_EVICTED,
    WORKLOAD_FINISHED,
    WORKLOAD_QUOTA_RESERVED,
)
from dispatch_kubeflow.kube.workloads import (
    check_entry,
    eviction_count,
    has_quota_reservation,
    is_active,
    is_admitted,
    is_evicted,
    is_finished,
    owner_trainjob,
    owner_trainjob_uids,
    rejected_checks,
)


def cond(type_: str, status: str = "True", at: str = "2026-01-01T12:00:00Z") -> dict[str, Any]:
    return {"type": type_, "status": status, "lastTransitionTime": at}


def workload(*conditions: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "w"},
        "spec": {},
        "status": {"conditions": list(conditions), **status},
    }


def test_conditions_that_say_where_a_workload_stands() -> None:
    reserved = workload(cond(WORKLOAD_QUOTA_RESERVED))
    assert has_quota_reservation(reserved)
    assert not has_quota_reservation(workload(cond(WORKLOAD_QUOTA_RESERVED, "False")))
    assert is_evicted(workload(cond(WORKLOAD_EVICTED)))
    assert is_finished(workload(cond(WORKLOAD_FINISHED)))
    assert not is_evicted(reserved)
    assert not is_finished(reserved)


def test_a_workload_is_active_until_spec_active_is_false() -> None:
    assert is_active(workload())
    assert is_active({"spec": {"active": True}})
    assert not is_active({"spec": {"active": False}})


def test_admitted_means_admitted_after_any_eviction() -> None:
    assert is_admitted(workload(cond(WORKLOAD_ADMITTED)))
    assert not is_admitted(workload(cond(WORKLOAD_ADMITTED, "False")))
    assert not is_admitted(workload())
    # Kueue leaves Admitted=True a moment after an eviction, until the job has stopped.
    stale = workload(
        cond(WORKLOAD_ADMITTED, at="2026-01-01T12:00:00Z"),
        cond(WORKLOAD_EVICTED, at="2026-01-01T12:05:00Z"),
    )
    assert not is_admitted(stale)
    readmitted = workload(
        cond(WORKLOAD_ADMITTED, at="2026-01-01T12:10:00Z"),
        cond(WORKLOAD_EVICTED, at="2026-01-01T12:05:00Z"),
    )
    assert is_admitted(readmitted)
    recovered = workload(cond(WORKLOAD_ADMITTED), cond(WORKLOAD_EVICTED, "False"))
    assert is_admitted(recovered)


def test_admission_check_entries_by_name_and_the_rejected_ones() -> None:
    checks = [
        {"name": "dispatch", "state": "Rejected"},
        {"name": "other", "state": "Ready"},
        "not an entry",
    ]
    found = workload(admissionChecks=checks)
    assert check_entry(found, "other") == {"name": "other", "state": "Ready"}
    assert check_entry(found, "missing") is None
    assert rejected_checks(found) == [{"name": "dispatch", "state": "Rejected"}]
    assert rejected_checks(workload()) == []


def test_eviction_count_is_the_largest_count_kueue_keeps() -> None:
    assert eviction_count(workload()) == 0
    # An Evicted condition alone (any status) is one eviction.
    assert eviction_count(workload(cond(WORKLOAD_EVICTED, "False"))) == 1
    stats = {
        "evictions": [{"reason": "Preempted", "count": 2}, {"reason": "PodsReady", "count": 1}]
    }
    assert eviction_count(workload(schedulingStats=stats)) == 3
    assert eviction_count(workload(requeueState={"count": 5}, schedulingStats=stats)) == 5
    broken = {"evictions": [{"count": "two"}, "x"]}
    assert eviction_count(workload(schedulingStats=broken)) == 0


def test_the_trainjob_a_workload_stands_for() -> None:
    found = {
        "metadata": {
            "labels": {LABEL_KUEUE_JOB_UID: "u-label"},
            "ownerReferences": [
                {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "uid": "u-1"},
                {"apiVersion": "batch/v1", "kind": "Job", "uid": "u-job"},
            ],
        }
    }
    owner = owner_trainjob(found)
    assert owner is not None
    assert owner["uid"] == "u-1"
    assert owner_trainjob_uids(found) == {"u-1", "u-label"}
    assert owner_trainjob({"metadata": {}}) is None
    assert owner_trainjob_uids({"metadata": {}}) == set()
