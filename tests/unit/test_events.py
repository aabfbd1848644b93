"""State and cause derivation: one test per row of the cause table, plus precedence and states."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from dispatch_kubeflow.constants import (
    BUILTIN_LOSS_TAINTS,
    LABEL_RESTART_ATTEMPT,
    Cause,
    EventType,
    State,
)
from dispatch_kubeflow.derivation import derive, pods_have_ended
from dispatch_kubeflow.events import DerivedStatus, DispatchEvent, Evidence, JobObservation, Taint

LOSS = frozenset(BUILTIN_LOSS_TAINTS) | {"example.com/node-dead"}
T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:01:00Z"
T2 = "2026-01-01T00:02:00Z"


def cond(
    type_: str, status: str = "True", reason: str = "", message: str = "", t: str = T0
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": t,
    }


def trainjob(*conditions: dict[str, Any], suspend: bool = False, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j1-1"},
        "spec": {"suspend": suspend},
        "status": {"conditions": list(conditions), **status},
    }


def workload(*conditions: dict[str, Any], active: bool = True, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "trainjob-j1-1-abcde"},
        "spec": {"active": active},
        "status": {"conditions": list(conditions), **status},
    }


def pod(
    name: str = "j1-1-node-0-0",
    *,
    phase: str = "Running",
    node: str | None = "n1",
    containers: list[dict[str, Any]] | None = None,
    conditions: list[dict[str, Any]] | None = None,
    restart_attempt: int = 0,
    index: str = "0",
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                LABEL_RESTART_ATTEMPT: str(restart_attempt),
                "batch.kubernetes.io/job-completion-index": index,
            },
        },
        "spec": {"nodeName": node} if node else {},
        "status": {
            "phase": phase,
            "conditions": conditions or [],
            "containerStatuses": containers or [],
        },
    }


def terminated(
    exit_code: int, reason: str = "Error", message: str = "", name: str = "node"
) -> dict[str, Any]:
    return {
        "name": name,
        "state": {"terminated": {"exitCode": exit_code, "reason": reason, "message": message}},
    }


def waiting(reason: str, message: str = "", name: str = "node") -> dict[str, Any]:
    return {"name": name, "state": {"waiting": {"reason": reason, "message": message}}}


def observe(**fields: Any) -> JobObservation:
    fields.setdefault("train_job", trainjob())
    return JobObservation(job="j1", attempt=1, **fields)


def status_of(**fields: Any) -> DerivedStatus:
    return derive(observe(**fields), loss_taints=LOSS)


ADMITTED = cond("Admitted", reason="Admitted", message="The workload is admitted")


# --- one test per row of the cause table ------------------------------------------------------


def test_preempted_from_workload_evicted_preempted() -> None:
    st = status_of(
        workload=workload(
            ADMITTED, cond("Evicted", reason="Preempted", message="Preempted to accommodate", t=T1)
        )
    )
    assert st.cause is Cause.PREEMPTED
    assert (st.reason, st.message) == ("Preempted", "Preempted to accommodate")
    assert st.evidence[0].kind == "Workload"
    assert st.state is State.PENDING  # a preempted workload is requeued, not finished


def test_node_lost_from_loss_taint_on_the_pods_node() -> None:
    st = status_of(
        pods=(pod(node="n1"),),
        node_taints={"n1": (Taint(key="node.kubernetes.io/unreachable", effect="NoExecute"),)},
    )
    assert st.cause is Cause.NODE_LOST
    assert st.state is State.RUNNING  # node loss is a cause while still running
    ev = st.evidence[0]
    assert (ev.kind, ev.node, ev.taint_key, ev.effect) == (
        "Node",
        "n1",
        "node.kubernetes.io/unreachable",
        "NoExecute",
    )


def test_node_lost_from_a_site_loss_taint() -> None:
    st = status_of(
        pods=(pod(node="n1"),),
        node_taints={"n1": (Taint(key="example.com/node-dead", effect="NoExecute"),)},
    )
    assert st.cause is Cause.NODE_LOST


def test_a_noschedule_or_unlisted_taint_is_not_node_loss() -> None:
    st = status_of(
        pods=(pod(node="n1"),),
        node_taints={
            "n1": (
                Taint(key="node.kubernetes.io/unreachable", effect="NoSchedule"),
                Taint(key="example.com/other", effect="NoExecute"),
            )
        },
    )
    assert st.cause is None


def test_a_taint_on_a_node_without_pods_of_the_job_is_not_node_loss() -> None:
    st = status_of(
        pods=(pod(node="n1"),),
        node_taints={"n2": (Taint(key="node.kubernetes.io/not-ready", effect="NoExecute"),)},
    )
    assert st.cause is None


def test_node_lost_from_taint_manager_deletion() -> None:
    target = cond(
        "DisruptionTarget",
        reason="DeletionByTaintManager",
        message="Taint manager: deleting due to NoExecute taint",
    )
    st = status_of(pods=(pod(conditions=[target], phase="Failed"),))
    assert st.cause is Cause.NODE_LOST
    assert st.reason == "DeletionByTaintManager"
    assert st.message == "Taint manager: deleting due to NoExecute taint"


@pytest.mark.parametrize(
    ("reason", "message", "cause"),
    [
        ("DeletionByPodGC", "PodGC: node no longer exists", Cause.NODE_LOST),
        ("DeletionByDeviceTaintManager", "Device Taint manager: deleting", Cause.NODE_LOST),
        ("TerminationByKubelet", "The node was low on resource: memory.", Cause.NODE_LOST),
        (
            "TerminationByKubelet",
            "Pod was terminated in response to imminent node shutdown.",
            Cause.NODE_LOST,
        ),
        (
            "TerminationByKubelet",
            "Pod was preempted by Kubelet to accommodate a critical pod.",
            Cause.PREEMPTED,
        ),
        ("PreemptionByScheduler", "default-scheduler: preempting", Cause.PREEMPTED),
        ("EvictionByEvictionAPI", "Eviction API: evicting", Cause.PREEMPTED),
    ],
)
def test_cause_from_a_pods_disruption_target(reason: str, message: str, cause: Cause) -> None:
    """A rank killed by a signal because something disrupted it is not the program's fault."""
    tj = trainjob(cond("Failed", reason="FailedJobs", message="jobset failed"))
    target = cond("DisruptionTarget", reason=reason, message=message)
    killed = pod(phase="Failed", conditions=[target], containers=[terminated(143, "Error")])
    st = status_of(train_job=tj, pods=(killed,))
    assert (st.state, st.cause, st.reason, st.message) == (State.FAILED, cause, reason, message)


def test_a_disruption_target_that_is_false_is_no_cause() -> None:
    target = cond("DisruptionTarget", "False", reason="EvictionByEvictionAPI")
    assert status_of(pods=(pod(conditions=[target]),)).cause is None


def kubelet_refused(reason: str, message: str) -> dict[str, Any]:
    refused = pod(phase="Failed")
    refused["status"].update(reason=reason, message=message)
    return refused


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("UnexpectedAdmissionError", Cause.NODE_LOST),
        ("Evicted", Cause.NODE_LOST),
        ("Terminated", Cause.NODE_LOST),
        ("OutOfnvidia.com/gpu", Cause.NO_CAPACITY),
        ("SysctlForbidden", Cause.CONFIG_ERROR),
        ("Preempting", Cause.PREEMPTED),
    ],
)
def test_cause_from_a_pod_the_kubelet_failed(reason: str, cause: Cause) -> None:
    message = "Pod was rejected: Allocate failed due to ..., which is unexpected"
    tj = trainjob(cond("Failed", reason="FailedJobs", message="jobset failed"))
    st = status_of(train_job=tj, pods=(kubelet_refused(reason, message),))
    assert (st.state, st.cause, st.reason, st.message) == (State.FAILED, cause, reason, message)
    assert (st.evidence[0].kind, st.evidence[0].field, st.evidence[0].node) == (
        "Pod",
        "status.reason",
        "n1",
    )


def test_node_lost_when_the_node_of_a_running_rank_is_deleted() -> None:
    st = status_of(pods=(pod(node="n1"),), deleted_nodes=frozenset({"n1"}))
    assert (st.state, st.cause, st.reason) == (State.RUNNING, Cause.NODE_LOST, "NodeDeleted")
    assert (st.evidence[0].kind, st.evidence[0].name, st.evidence[0].node) == ("Node", "n1", "n1")


def test_a_deleted_node_under_a_finished_rank_is_no_cause() -> None:
    done = pod(phase="Succeeded", containers=[terminated(0, "Completed")])
    failed = pod("b", phase="Failed", containers=[terminated(3)])
    assert status_of(pods=(done,), deleted_nodes=frozenset({"n1"})).cause is None
    st = status_of(pods=(failed,), deleted_nodes=frozenset({"n1"}))
    assert st.cause is Cause.PROGRAM_ERROR


def test_node_lost_from_workload_evicted_node_failures() -> None:
    st = status_of(
        workload=workload(cond("Evicted", reason="NodeFailures", message="nodes failed"))
    )
    assert st.cause is Cause.NODE_LOST
    assert st.message == "nodes failed"


def test_out_of_memory_from_oomkilled() -> None:
    st = status_of(pods=(pod(phase="Failed", containers=[terminated(137, "OOMKilled")]),))
    assert st.cause is Cause.OUT_OF_MEMORY
    assert st.evidence[0].container == "node"
    assert st.evidence[0].exit_code == 137


def test_oom_killed_with_exit_code_zero_is_no_cause() -> None:
    """kubernetes/kubernetes#116042: OOMKilled is reported for containers that exited 0."""
    spared = pod("a", phase="Succeeded", containers=[terminated(0, "OOMKilled")])
    st = status_of(pods=(spared, pod("b")))
    assert (st.state, st.cause) == (State.RUNNING, None)
    st = status_of(pods=(spared, pod("b", phase="Failed", containers=[terminated(1)])))
    assert st.cause is Cause.PROGRAM_ERROR


def test_timeout_from_trainjob_deadline_exceeded() -> None:
    tj = trainjob(
        cond("Failed", reason="DeadlineExceeded", message="TrainJob exceeded its active deadline")
    )
    st = status_of(train_job=tj)
    assert (st.state, st.cause) == (State.FAILED, Cause.TIMEOUT)
    assert st.message == "TrainJob exceeded its active deadline"
    assert st.finished


def test_timeout_from_workload_deactivated_for_max_execution_time() -> None:
    wl = workload(
        cond(
            "Evicted",
            reason="Deactivated",
            message="The workload is deactivated due to exceeding the maximum execution time",
        ),
        cond(
            "DeactivationTarget",
            reason="MaximumExecutionTimeExceeded",
            message="exceeding the maximum execution time",
        ),
        active=False,
    )
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert (st.state, st.cause) == (State.FAILED, Cause.TIMEOUT)
    assert st.reason == "Deactivated"


@pytest.mark.parametrize(
    "reason", ["WaitingForQuota", "ExceedsMaxQuota", "NoMatchingFlavor", "TopologyPlacementFailed"]
)
def test_no_capacity_from_quota_not_reserved(reason: str) -> None:
    """The granular reasons of UnadmittedWorkloadsObservability for a job that does not fit."""
    wl = workload(cond("QuotaReserved", "False", reason, "couldn't assign flavors"))
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert (st.state, st.cause, st.reason) == (State.PENDING, Cause.NO_CAPACITY, reason)


NO_FIT = (
    "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu in flavor "
    "sim-gpu, previously considered podsets requests (0) + current podset request (16) > "
    "maximum capacity (8)"
)


def test_no_capacity_from_kueue_default_reason_pending() -> None:
    """Kueue without UnadmittedWorkloadsObservability says Pending with the assigner's verdict."""
    wl = workload(cond("QuotaReserved", "False", "Pending", NO_FIT))
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert (st.state, st.cause, st.reason, st.message) == (
        State.PENDING,
        Cause.NO_CAPACITY,
        "Pending",
        NO_FIT,
    )
    assert [(e.kind, e.type, e.reason, e.message) for e in st.evidence] == [
        ("Workload", "QuotaReserved", "Pending", NO_FIT)
    ]


@pytest.mark.parametrize(
    "message",
    [
        # Room was found by preempting others: the job fits once they are gone.
        NO_FIT + ". Pending the preemption of 1 workload(s)",
        NO_FIT + ". Preempting 1 workload(s) failed, will retry.",
        # Kueue releases an evicted Workload's quota with reason Pending and the eviction message.
        "Preempted to accommodate a workload (UID: 1234) due to prioritization in the ClusterQueue",
    ],
)
def test_reason_pending_without_a_no_fit_verdict_is_not_no_capacity(message: str) -> None:
    wl = workload(cond("QuotaReserved", "False", "Pending", message))
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert (st.state, st.cause, st.reason, st.message) == (State.PENDING, None, "Pending", message)


@pytest.mark.parametrize(
    "reason", ["WaitingForPreemptedWorkloads", "PendingEvaluation", "WaitingForPodsReady"]
)
def test_waiting_for_the_scheduler_or_for_preemptions_is_not_no_capacity(reason: str) -> None:
    wl = workload(cond("QuotaReserved", "False", reason, "waiting"))
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert (st.state, st.cause, st.reason) == (State.PENDING, None, reason)


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("Inadmissible", "LocalQueue team-lq doesn't exist"),
        ("Misconfigured", "LocalQueue team-lq doesn't exist"),
        ("Inadmissible", "ClusterQueue team-cq is terminating or missing"),
        ("Pending", "ClusterQueue team-cq not found"),
        ("Pending", "workload namespace doesn't match ClusterQueue selector"),
    ],
)
def test_config_error_from_a_queue_that_does_not_exist_or_admit(reason: str, message: str) -> None:
    """Inadmissible is Kueue's gate-off word for Misconfigured (or Suspended), never NoCapacity."""
    wl = workload(cond("QuotaReserved", "False", reason, message))
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert (st.state, st.cause, st.reason, st.message) == (
        State.PENDING,
        Cause.CONFIG_ERROR,
        reason,
        message,
    )
    assert [(e.kind, e.type) for e in st.evidence] == [("Workload", "QuotaReserved")]


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("Inadmissible", "LocalQueue team-lq is inactive"),
        ("Suspended", "LocalQueue team-lq is inactive"),
        ("Inadmissible", "ClusterQueue team-cq is stopped"),
    ],
)
def test_stopped_from_a_stopped_queue_while_pending(reason: str, message: str) -> None:
    wl = workload(cond("QuotaReserved", "False", reason, message))
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert (st.state, st.cause, st.reason, st.message) == (
        State.PENDING,
        Cause.STOPPED,
        reason,
        message,
    )


def test_an_inactive_cluster_queue_is_a_config_error_unless_a_stop_evicted_the_job() -> None:
    inactive = cond("QuotaReserved", "False", "Inadmissible", "ClusterQueue team-cq is inactive")
    st = status_of(workload=workload(inactive), train_job=trainjob(suspend=True))
    assert st.cause is Cause.CONFIG_ERROR
    drained = workload(
        cond("Evicted", reason="ClusterQueueStopped", message="The ClusterQueue is stopped"),
        inactive,
    )
    st = status_of(workload=drained, train_job=trainjob(suspend=True))
    assert (st.state, st.cause, st.reason) == (State.PENDING, Cause.STOPPED, "ClusterQueueStopped")
    assert [e.type for e in st.evidence] == ["Evicted", "QuotaReserved"]


def test_no_capacity_from_unschedulable_pods() -> None:
    scheduled = cond("PodScheduled", "False", "Unschedulable", "0/3 nodes are available")
    st = status_of(pods=(pod(phase="Pending", node=None, conditions=[scheduled]),))
    assert (st.state, st.cause, st.message) == (
        State.PENDING,
        Cause.NO_CAPACITY,
        "0/3 nodes are available",
    )


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("ClusterQueueStopped", "The ClusterQueue is stopped"),
        ("LocalQueueStopped", "The LocalQueue is stopped"),
    ],
)
def test_stopped_from_a_queue_stopped_under_the_job(reason: str, message: str) -> None:
    st = status_of(
        workload=workload(ADMITTED, cond("Evicted", reason=reason, message=message, t=T1)),
        pods=(pod(),),
    )
    assert (st.cause, st.reason, st.message) == (Cause.STOPPED, reason, message)
    assert st.evidence[0].kind == "Workload"
    assert not st.finished  # Kueue requeues it once the queue is resumed


def test_stopped_from_a_person_deactivating_the_workload() -> None:
    wl = workload(
        cond("Evicted", reason="Deactivated", message="The workload is deactivated"),
        active=False,
    )
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert (st.state, st.cause, st.reason) == (State.FAILED, Cause.STOPPED, "Deactivated")
    assert st.evidence[0].kind == "Workload"


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("DeactivatedDueToMaximumExecutionTimeExceeded", Cause.TIMEOUT),
        ("DeactivatedDueToRequeuingLimitExceeded", Cause.PODS_READY_TIMEOUT),
        ("DeactivatedDueToAdmissionCheck", Cause.ADMISSION_REJECTED),
    ],
)
def test_deactivation_with_its_cause_in_the_reason(reason: str, cause: Cause) -> None:
    """Kueue v0.19 names the underlying cause in the reason: Deactivated + DueTo + cause."""
    wl = workload(
        cond("Evicted", reason=reason, message="The workload is deactivated due to ..."),
        active=False,
    )
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert (st.state, st.cause, st.reason) == (State.FAILED, cause, reason)


def test_preempted_when_an_admission_check_revokes_its_capacity() -> None:
    message = "Evicted due to AdmissionCheck in Retry state: prov-req: capacity revoked"
    st = status_of(
        workload=workload(ADMITTED, cond("Evicted", reason="AdmissionCheck", message=message, t=T1))
    )
    assert (st.cause, st.reason, st.message) == (Cause.PREEMPTED, "AdmissionCheck", message)


def test_pods_ready_timeout_from_workload_evicted() -> None:
    st = status_of(
        workload=workload(
            cond("Evicted", reason="PodsReadyTimeout", message="Exceeded the PodsReady timeout")
        )
    )
    assert st.cause is Cause.PODS_READY_TIMEOUT


def test_admission_rejected_from_a_rejected_check() -> None:
    wl = workload(
        admissionChecks=[
            {"name": "dispatch-admission", "state": "Rejected", "message": "rejected by dispatch"}
        ]
    )
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert st.cause is Cause.ADMISSION_REJECTED
    assert st.message == "rejected by dispatch"
    assert st.evidence[0].type == "dispatch-admission"


def test_admission_rejected_from_deactivation_for_a_rejected_check() -> None:
    wl = workload(
        cond(
            "Evicted",
            reason="Deactivated",
            message="The workload is deactivated due to an AdmissionCheck rejection",
        ),
        active=False,
    )
    st = status_of(workload=wl, train_job=trainjob(suspend=True))
    assert (st.state, st.cause) == (State.FAILED, Cause.ADMISSION_REJECTED)


@pytest.mark.parametrize(
    "reason",
    [
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "ImageInspectError",
    ],
)
def test_image_pull(reason: str) -> None:
    st = status_of(pods=(pod(phase="Pending", containers=[waiting(reason, "pull failed")]),))
    assert (st.state, st.cause, st.reason, st.message) == (
        State.PENDING,
        Cause.IMAGE_PULL,
        reason,
        "pull failed",
    )


@pytest.mark.parametrize(
    "reason", ["CreateContainerConfigError", "CreateContainerError", "RunContainerError"]
)
def test_config_error(reason: str) -> None:
    st = status_of(pods=(pod(phase="Pending", containers=[waiting(reason, "bad config")]),))
    assert (st.cause, st.reason) == (Cause.CONFIG_ERROR, reason)


def test_runtime_unsupported() -> None:
    tj = trainjob(
        cond("Failed", reason="TrainingRuntimeNotSupported", message="unsupported runtime: x")
    )
    st = status_of(train_job=tj)
    assert (st.state, st.cause, st.message) == (
        State.FAILED,
        Cause.RUNTIME_UNSUPPORTED,
        "unsupported runtime: x",
    )


def test_program_error_carries_exit_code_and_signal() -> None:
    st = status_of(pods=(pod(phase="Failed", containers=[terminated(139, "Error")]),))
    assert st.cause is Cause.PROGRAM_ERROR
    assert (st.evidence[0].exit_code, st.evidence[0].signal) == (139, 11)


def test_program_error_from_a_restarted_containers_last_state() -> None:
    status = {
        "name": "node",
        "state": {"running": {}},
        "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}},
    }
    st = status_of(pods=(pod(containers=[status]),))
    assert (st.state, st.cause) == (State.RUNNING, Cause.PROGRAM_ERROR)
    assert st.evidence[0].exit_code == 2


def test_failed_trainjob_without_other_evidence_is_program_error() -> None:
    tj = trainjob(
        cond("Failed", reason="FailedJobs", message="jobset failed due to one or more job failures")
    )
    st = status_of(train_job=tj)
    assert (st.state, st.cause, st.reason) == (State.FAILED, Cause.PROGRAM_ERROR, "FailedJobs")


def test_stopped() -> None:
    st = status_of(stopped=True, pods=(pod(),))
    assert (st.state, st.cause, st.finished) == (State.STOPPED, Cause.STOPPED, True)


def test_stopped_and_gone_is_still_stopped() -> None:
    st = status_of(stopped=True, train_job=None)
    assert (st.state, st.cause) == (State.STOPPED, Cause.STOPPED)


def test_evidence_lost_when_the_trainjob_vanished() -> None:
    st = status_of(train_job=None, pods=(pod(),))
    assert (st.state, st.cause, st.finished) == (State.UNKNOWN, Cause.EVIDENCE_LOST, True)


def test_a_finished_job_vanishing_keeps_its_outcome_in_the_tracker_not_derive() -> None:
    # derive only sees what exists; the tracker refuses to report Vanished after Finished.
    assert status_of(train_job=None).cause is Cause.EVIDENCE_LOST


# --- precedence --------------------------------------------------------------------------------


def test_rank_exiting_nonzero_because_its_node_died_is_node_lost() -> None:
    tj = trainjob(cond("Failed", reason="FailedJobs", message="jobset failed"))
    st = status_of(
        train_job=tj,
        pods=(pod(phase="Failed", node="n1", containers=[terminated(1, "Error")]),),
        node_taints={"n1": (Taint(key="node.kubernetes.io/not-ready", effect="NoExecute"),)},
    )
    assert (st.state, st.cause) == (State.FAILED, Cause.NODE_LOST)
    assert st.evidence[0].taint_key == "node.kubernetes.io/not-ready"


def test_preemption_beats_node_loss_and_oom() -> None:
    st = status_of(
        workload=workload(cond("Evicted", reason="Preempted", message="p")),
        pods=(pod(phase="Failed", containers=[terminated(137, "OOMKilled")]),),
        node_taints={"n1": (Taint(key="node.kubernetes.io/unreachable", effect="NoExecute"),)},
    )
    assert st.cause is Cause.PREEMPTED


def test_oom_beats_program_error_and_deadline_beats_image_pull() -> None:
    st = status_of(
        pods=(
            pod("a", phase="Failed", containers=[terminated(1)]),
            pod("b", phase="Failed", containers=[terminated(137, "OOMKilled")]),
        )
    )
    assert st.cause is Cause.OUT_OF_MEMORY
    tj = trainjob(cond("Failed", reason="DeadlineExceeded"))
    st = status_of(train_job=tj, pods=(pod(containers=[waiting("ImagePullBackOff")]),))
    assert st.cause is Cause.TIMEOUT


def test_every_piece_of_evidence_for_the_winning_cause_is_kept() -> None:
    st = status_of(
        pods=(
            pod("a", phase="Failed", containers=[terminated(1)]),
            pod("b", phase="Failed", containers=[terminated(2)]),
        )
    )
    assert [e.exit_code for e in st.evidence] == [1, 2]


# --- states ------------------------------------------------------------------------------------


def test_pending_when_suspended_even_with_active_jobs() -> None:
    st = status_of(train_job=trainjob(suspend=True, jobsStatus=[{"name": "node", "active": 1}]))
    assert (st.state, st.admitted, st.running) == (State.PENDING, False, False)


def test_running_inferred_from_running_pods() -> None:
    st = status_of(pods=(pod(phase="Running"),))
    assert (st.state, st.admitted, st.running) == (State.RUNNING, True, True)


def test_running_inferred_from_jobs_status_when_no_pods_are_in_view() -> None:
    st = status_of(train_job=trainjob(jobsStatus=[{"name": "node", "ready": 1, "active": 1}]))
    assert st.state is State.RUNNING


def test_pending_pods_are_not_running() -> None:
    st = status_of(pods=(pod(phase="Pending", node=None),))
    assert st.state is State.PENDING


def test_deleted_pods_are_not_running() -> None:
    p = pod()
    p["metadata"]["deletionTimestamp"] = T1
    assert status_of(pods=(p,)).state is State.PENDING


def test_succeeded_with_published_result() -> None:
    record = {"loss": 0.1, "checkpoint": "s3://b/c"}
    tj = trainjob(
        cond("Complete", reason="AllJobsCompleted", message="jobset completed successfully")
    )
    st = status_of(
        train_job=tj,
        pods=(
            pod(
                "r1",
                phase="Succeeded",
                index="1",
                containers=[terminated(0, "Completed", json.dumps({"rank": 1}))],
            ),
            pod(
                "r0",
                phase="Succeeded",
                index="0",
                containers=[terminated(0, "Completed", json.dumps(record))],
            ),
        ),
    )
    assert (st.state, st.cause, st.reason) == (State.SUCCEEDED, None, "AllJobsCompleted")
    assert st.result == record  # rank 0 preferred


def test_result_ignores_other_containers_non_objects_and_oversize() -> None:
    tj = trainjob(cond("Complete"))
    assert (
        status_of(
            train_job=tj,
            pods=(pod(containers=[terminated(0, "Completed", '{"a":1}', name="side")]),),
        ).result
        is None
    )
    assert (
        status_of(
            train_job=tj, pods=(pod(containers=[terminated(0, "Completed", "[1,2]")]),)
        ).result
        is None
    )
    big = json.dumps({"x": "y" * 5000})
    assert (
        status_of(train_job=tj, pods=(pod(containers=[terminated(0, "Completed", big)]),)).result
        is None
    )


def test_success_is_not_blamed_on_a_later_taint() -> None:
    tj = trainjob(cond("Complete"))
    st = status_of(
        train_job=tj,
        pods=(pod(phase="Succeeded"),),
        node_taints={"n1": (Taint(key="node.kubernetes.io/unreachable", effect="NoExecute"),)},
    )
    assert (st.state, st.cause) == (State.SUCCEEDED, None)


def test_admitted_follows_kueue_and_an_eviction_newer_than_admission_revokes_it() -> None:
    assert status_of(workload=workload(ADMITTED)).admitted
    evicted = workload(cond("Admitted", t=T0), cond("Evicted", reason="Preempted", t=T1))
    assert not status_of(workload=evicted).admitted
    readmitted = workload(cond("Admitted", t=T2), cond("Evicted", reason="Preempted", t=T1))
    assert status_of(workload=readmitted).admitted


def test_a_queued_trainjob_is_not_admitted_before_its_workload_is_seen() -> None:
    tj = trainjob()
    tj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
    assert not status_of(train_job=tj).admitted
    assert status_of(train_job=tj, workload=workload(ADMITTED)).admitted
    assert status_of(train_job=trainjob()).admitted  # no queue: admitted when not suspended


def test_restart_attempt_from_pods_and_jobset_and_old_incarnations_are_ignored() -> None:
    old = pod("old", phase="Failed", containers=[terminated(1)], restart_attempt=0)
    new = pod("new", phase="Running", restart_attempt=1)
    st = status_of(pods=(old, new))
    assert (st.restart_attempt, st.cause, st.state) == (1, None, State.RUNNING)
    st = status_of(job_set={"status": {"restarts": 2}})
    assert st.restart_attempt == 2


# --- the event model ---------------------------------------------------------------------------


def test_event_serialises_with_camel_case_and_without_unset_evidence_fields() -> None:
    event = DispatchEvent(
        type=EventType.FINISHED,
        job="j1",
        attempt=1,
        train_job="j1-1",
        time=datetime(2026, 1, 1, tzinfo=UTC),
        state=State.FAILED,
        cause=Cause.PROGRAM_ERROR,
        reason="Error",
        message="m",
        evidence=(Evidence(kind="Pod", name="p", container="node", exit_code=1),),
    )
    dumped = event.model_dump(mode="json", by_alias=True)
    assert dumped["trainJob"] == "j1-1"
    assert dumped["time"] == "2026-01-01T00:00:00Z"
    assert dumped["evidence"] == [{"kind": "Pod", "name": "p", "container": "node", "exitCode": 1}]
    assert DispatchEvent.model_validate(dumped) == event


def test_event_requires_an_aware_time() -> None:
    with pytest.raises(ValueError, match="timezone"):
        DispatchEvent(type=EventType.SUBMITTED, time=datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("pods", "ended"),
    [
        ([], False),  # none seen yet: the watch may not have shown them
        ([pod(phase="Failed"), pod("b", phase="Succeeded")], True),
        ([pod(phase="Failed"), pod("b", phase="Running")], False),
        ([pod(phase="Pending")], False),
        ([{**pod(), "metadata": {"name": "x", "deletionTimestamp": "deleted"}}], True),
    ],
    ids=["no-pods", "all-final", "one-running", "pending", "deleted"],
)
def test_pods_have_ended_only_when_each_is_final_or_deleted(
    pods: list[dict[str, Any]], ended: bool
) -> None:
    assert pods_have_ended(observe(pods=tuple(pods))) is ended
