"""The admission controller's decisions, as pure functions of a Workload and its TrainJob."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch_kubeflow.admission.decisions import (
    ACTIVE_MESSAGE,
    Decision,
    active_apply_body,
    decide,
    workload_apply_body,
)
from dispatch_kubeflow.admission.serving import (
    Serving,
    invalid_adapters,
    lease_mismatches,
    serving_of,
)
from dispatch_kubeflow.constants import (
    ADMISSION_CONTROLLER_NAME,
    ANNOTATION_READMIT,
    ANNOTATION_REJECT,
    LABEL_JOB,
    CheckState,
)
from dispatch_kubeflow.kube.workloads import eviction_count, owner_trainjob

CHECK = "dispatch-admission"
NOW = datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)


def workload(
    *,
    state: str = "Pending",
    message: str = "",
    quota: bool = True,
    evictions: int = 0,
    evicted_condition: bool = False,
    others: tuple[dict[str, Any], ...] = (),
    active: bool = True,
    finished: bool = False,
) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = [
        {"type": "QuotaReserved", "status": "True" if quota else "False", "reason": "x"}
    ]
    if evicted_condition:
        conditions.append({"type": "Evicted", "status": "False", "reason": "QuotaReserved"})
    if finished:
        conditions.append({"type": "Finished", "status": "True", "reason": "Succeeded"})
    status: dict[str, Any] = {
        "conditions": conditions,
        "admissionChecks": [
            *others,
            {
                "name": CHECK,
                "state": state,
                "message": message,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            },
        ],
    }
    if evictions:
        status["schedulingStats"] = {
            "evictions": [{"reason": "Preempted", "underlyingCause": "", "count": evictions}]
        }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "trainjob-job-1-abcde",
            "namespace": "team-a",
            "resourceVersion": "42",
            "uid": "wl-uid",
            "ownerReferences": [
                {
                    "apiVersion": "trainer.kubeflow.org/v1alpha1",
                    "kind": "TrainJob",
                    "name": "job-1",
                    "uid": "tj-uid",
                    "controller": True,
                }
            ],
        },
        "spec": {"active": active},
        "status": status,
    }


def trainjob(annotations: dict[str, str] | None = None, dispatch: bool = True) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "job-1",
            "uid": "tj-uid",
            "labels": {LABEL_JOB: "job"} if dispatch else {},
            "annotations": annotations or {},
        }
    }


# Which admission this is.


def test_a_workload_never_evicted_has_eviction_count_zero() -> None:
    assert eviction_count(workload()) == 0


def test_eviction_count_sums_kueues_scheduling_stats() -> None:
    wl = workload()
    wl["status"]["schedulingStats"] = {
        "evictions": [
            {"reason": "Preempted", "underlyingCause": "", "count": 2},
            {"reason": "PodsReadyTimeout", "underlyingCause": "", "count": 1},
        ]
    }
    assert eviction_count(wl) == 3


def test_an_evicted_condition_alone_counts_as_one_eviction() -> None:
    assert eviction_count(workload(evicted_condition=True)) == 1


def test_requeue_state_count_is_a_lower_bound() -> None:
    wl = workload(evictions=1)
    wl["status"]["requeueState"] = {"count": 4}
    assert eviction_count(wl) == 4


def test_owner_trainjob_finds_the_trainer_owner_only() -> None:
    wl = workload()
    assert owner_trainjob(wl) == wl["metadata"]["ownerReferences"][0]
    wl["metadata"]["ownerReferences"][0]["apiVersion"] = "example.com/v1"
    assert owner_trainjob(wl) is None


# Decisions.


def test_first_admission_is_ready() -> None:
    assert decide(workload(), trainjob(), CHECK) == Decision(CheckState.READY, "first admission")


def test_evicted_job_is_held_pending_without_a_readmit() -> None:
    decision = decide(workload(evictions=1), trainjob(), CHECK)
    assert decision is not None
    assert decision.state == CheckState.PENDING
    assert "held after eviction 1" in decision.message
    assert "job-1" in decision.message


def test_the_held_message_is_written_once() -> None:
    first = decide(workload(evictions=1), trainjob(), CHECK)
    assert first is not None
    assert decide(workload(evictions=1, message=first.message), trainjob(), CHECK) is None


def test_readmit_for_the_current_eviction_opens_the_gate() -> None:
    decision = decide(workload(evictions=2), trainjob({ANNOTATION_READMIT: "2"}), CHECK)
    assert decision is not None
    assert decision.state == CheckState.READY


def test_readmit_for_an_earlier_eviction_does_not_open_the_gate() -> None:
    decision = decide(workload(evictions=2), trainjob({ANNOTATION_READMIT: "1"}), CHECK)
    assert decision is not None
    assert decision.state == CheckState.PENDING


def test_a_malformed_readmit_keeps_the_gate_closed_and_says_why() -> None:
    decision = decide(workload(evictions=1), trainjob({ANNOTATION_READMIT: "yes"}), CHECK)
    assert decision is not None
    assert decision.state == CheckState.PENDING
    assert "not a decimal eviction count" in decision.message


def test_reject_makes_the_check_rejected_with_the_reason() -> None:
    decision = decide(
        workload(evictions=1),
        trainjob({ANNOTATION_REJECT: "budget exhausted", ANNOTATION_READMIT: "1"}),
        CHECK,
    )
    assert decision == Decision(CheckState.REJECTED, "budget exhausted")


def test_reject_applies_to_a_first_admission_too() -> None:
    decision = decide(workload(), trainjob({ANNOTATION_REJECT: "no"}), CHECK)
    assert decision is not None
    assert decision.state == CheckState.REJECTED


def test_an_empty_reject_is_no_reject() -> None:
    decision = decide(workload(), trainjob({ANNOTATION_REJECT: "  "}), CHECK)
    assert decision is not None
    assert decision.state == CheckState.READY


def test_a_workload_without_a_dispatch_trainjob_is_not_held() -> None:
    for owner in (None, trainjob(dispatch=False)):
        decision = decide(workload(evictions=3), owner, CHECK)
        assert decision is not None
        assert decision.state == CheckState.READY


@pytest.mark.parametrize("state", ["Ready", "Rejected", "Retry"])
def test_a_decided_check_is_never_decided_again(state: str) -> None:
    assert decide(workload(state=state), trainjob({ANNOTATION_REJECT: "x"}), CHECK) is None


def being_evicted() -> dict[str, Any]:
    """Kueue's eviction write: Evicted=True, checks reset, count raised; quota not yet released."""
    wl = workload(evictions=1)
    wl["status"]["conditions"].append({"type": "Evicted", "status": "True", "reason": "Preempted"})
    return wl


@pytest.mark.parametrize(
    "wl",
    [
        workload(quota=False),
        workload(active=False),
        workload(finished=True),
        being_evicted(),
    ],
    ids=["no-quota", "deactivated", "finished", "being-evicted"],
)
def test_nothing_is_decided_without_quota_or_on_an_inactive_evicted_or_finished_workload(
    wl: dict[str, Any],
) -> None:
    assert decide(wl, trainjob(), CHECK) is None


def test_a_workload_without_our_check_is_left_alone() -> None:
    wl = workload()
    wl["status"]["admissionChecks"][0]["name"] = "someone-else"
    assert decide(wl, trainjob(), CHECK) is None


@given(
    evictions=st.integers(min_value=0, max_value=1000),
    readmit=st.one_of(st.none(), st.integers(min_value=0, max_value=1000)),
)
def test_the_gate_is_open_exactly_when_readmit_covers_the_evictions(
    evictions: int, readmit: int | None
) -> None:
    annotations = {} if readmit is None else {ANNOTATION_READMIT: str(readmit)}
    decision = decide(workload(evictions=evictions), trainjob(annotations), CHECK)
    assert decision is not None
    opened = evictions == 0 or (readmit is not None and readmit >= evictions)
    assert (decision.state == CheckState.READY) == opened


# Apply bodies.


def test_the_apply_body_holds_only_our_entry_and_the_version_decided_from() -> None:
    other = {"name": "provisioning", "state": "Pending", "message": "", "lastTransitionTime": "x"}
    wl = workload(others=(other,))
    body = workload_apply_body(wl, CHECK, Decision(CheckState.READY, "first admission"), NOW)
    assert body == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "trainjob-job-1-abcde",
            "namespace": "team-a",
            "resourceVersion": "42",
        },
        "status": {
            "admissionChecks": [
                {
                    "name": CHECK,
                    "state": "Ready",
                    "message": "first admission",
                    "lastTransitionTime": "2026-05-06T07:08:09Z",
                }
            ]
        },
    }


def test_a_message_change_alone_keeps_the_transition_time() -> None:
    body = workload_apply_body(
        workload(evictions=1), CHECK, Decision(CheckState.PENDING, "held"), NOW
    )
    entry = body["status"]["admissionChecks"][0]
    assert entry["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def admission_check(conditions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": CHECK, "generation": 3},
        "spec": {"controllerName": ADMISSION_CONTROLLER_NAME},
        "status": {"conditions": conditions or []},
    }


def test_active_is_set_with_the_observed_generation() -> None:
    body = active_apply_body(admission_check(), NOW)
    assert body is not None
    assert body["metadata"] == {"name": CHECK}
    (active,) = body["status"]["conditions"]
    assert active["type"] == "Active"
    assert active["status"] == "True"
    assert active["reason"] == "Active"
    assert active["observedGeneration"] == 3
    assert active["lastTransitionTime"] == "2026-05-06T07:08:09Z"


ACTIVE_NOW = {
    "type": "Active",
    "status": "True",
    "message": ACTIVE_MESSAGE,
    "observedGeneration": 3,
    "lastTransitionTime": "2026-01-01T00:00:00Z",
}


def test_active_is_not_rewritten_when_already_true_for_this_generation() -> None:
    assert active_apply_body(admission_check([ACTIVE_NOW]), NOW) is None


def test_a_new_active_message_is_written_without_moving_the_transition_time() -> None:
    body = active_apply_body(admission_check([ACTIVE_NOW]), NOW, "lease mismatch")
    assert body is not None
    (active,) = body["status"]["conditions"]
    assert (active["message"], active["lastTransitionTime"]) == (
        "lease mismatch",
        "2026-01-01T00:00:00Z",
    )


def test_a_new_generation_refreshes_active_without_moving_its_transition_time() -> None:
    current = {
        "type": "Active",
        "status": "True",
        "observedGeneration": 2,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    body = active_apply_body(admission_check([current]), NOW)
    assert body is not None
    assert body["status"]["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert body["status"]["conditions"][0]["observedGeneration"] == 3


# Which namespaces are dispatch's.


def test_a_workload_of_a_namespace_no_adapter_serves_is_ready_at_once_even_after_evictions() -> (
    None
):
    decision = decide(workload(evictions=3), trainjob(), CHECK, served=False)
    assert decision == Decision(
        CheckState.READY,
        f"no KubeflowAdapter of AdmissionCheck {CHECK} serves namespace team-a: "
        "not held by the readmission gate",
    )
    assert decide(workload(quota=False), None, CHECK, served=False) is None


SPEC: dict[str, Any] = {
    "namespace": "team-a",
    "probeRuntime": {"kind": "ClusterTrainingRuntime", "name": "torch"},
    "kueue": {
        "localQueue": "lq",
        "admissionCheck": CHECK,
        "admissionLease": {"namespace": "dispatch-system", "name": "gate"},
    },
}


def adapter(spec: Any, name: str = "a") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "dispatch-system"}, "spec": spec}


def test_an_adapter_of_the_check_serves_its_namespace_and_names_its_lease() -> None:
    assert serving_of(adapter(SPEC), CHECK) == Serving(
        "dispatch-system/a", "team-a", ("dispatch-system", "gate")
    )


def test_adapters_of_another_check_or_without_kueue_serve_nothing() -> None:
    plain = {k: v for k, v in SPEC.items() if k != "kueue"}
    assert serving_of(adapter(plain), CHECK) is None
    assert serving_of(adapter(SPEC), "another-check") is None
    assert serving_of(adapter("not a mapping"), CHECK) is None


def test_an_invalid_adapter_of_the_check_keeps_its_namespace_served_and_says_why() -> None:
    found = serving_of(adapter({**SPEC, "timeouts": {"request": "soon"}}), CHECK)
    assert found is not None
    assert (found.namespace, found.lease) == ("team-a", None)
    (line,) = invalid_adapters([found])
    assert line.startswith("KubeflowAdapter dispatch-system/a is invalid (")
    assert "/spec/timeouts/request" in line


def test_an_adapter_reading_another_lease_is_named() -> None:
    right = Serving("ns/right", "team-a", ("dispatch-system", "gate"))
    wrong = Serving("ns/wrong", "team-b", ("team-b", "gate"))
    assert lease_mismatches([right, wrong], ("dispatch-system", "gate")) == [
        "KubeflowAdapter ns/wrong reads Lease team-b/gate, not dispatch-system/gate that this "
        "controller holds: its AdmissionHealthy follows the wrong heartbeat"
    ]
