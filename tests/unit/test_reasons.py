"""The reason table: its lookups, its shape, and the generated copy in docs/events.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dispatch_kubeflow import reasons
from dispatch_kubeflow.constants import Cause
from dispatch_kubeflow.reasons import ANY, TABLE, Where

ROOT = Path(__file__).resolve().parents[2]


class TestGeneratedTable:
    def test_docs_table_is_current(self) -> None:
        current = (ROOT / reasons.DOC_FILE).read_text()
        assert reasons.render(current) == current, (
            "the reason table in docs/events.md is stale: "
            "run python -m dispatch_kubeflow.reasons --write"
        )

    def test_check_reports_a_stale_table(self, tmp_path: Path) -> None:
        doc = tmp_path / reasons.DOC_FILE
        doc.parent.mkdir(parents=True)
        doc.write_text(f"# Events\n\n{reasons.BEGIN}\nold\n{reasons.END}\n\nafter\n")
        assert reasons.main(["--root", str(tmp_path), "--check"]) == 1
        assert reasons.main(["--root", str(tmp_path), "--write"]) == 0
        assert reasons.main(["--root", str(tmp_path), "--check"]) == 0
        written = doc.read_text()
        assert written.endswith(f"{reasons.END}\n\nafter\n")
        assert "| `DeletionByPodGC` |  | `NodeLost` |" in written

    def test_render_refuses_a_document_without_markers(self) -> None:
        with pytest.raises(ValueError, match="markers"):
            reasons.render("# no table here\n")


class TestTableShape:
    def test_every_row_says_why_and_who(self) -> None:
        for row in TABLE:
            assert row.why, row
            assert row.source, row
            assert all(row.reasons), row

    def test_every_message_pattern_compiles(self) -> None:
        for row in TABLE:
            if row.message is not None:
                re.compile(row.message)

    def test_no_row_is_hidden_behind_an_earlier_catch_all(self) -> None:
        for index, row in enumerate(TABLE):
            for earlier in TABLE[:index]:
                catch_all = (
                    earlier.where is row.where
                    and earlier.message is None
                    and not earlier.after_queue_stop
                    and not earlier.prefix
                )
                shared = set(earlier.reasons) & set(row.reasons) or ANY in earlier.reasons
                assert not (catch_all and shared), f"{row} is hidden by {earlier}"


QUOTA = [
    ("Inadmissible", "LocalQueue lq-missing doesn't exist", False, Cause.CONFIG_ERROR),
    ("Misconfigured", "LocalQueue lq-missing doesn't exist", False, Cause.CONFIG_ERROR),
    ("Inadmissible", "ClusterQueue cq is terminating or missing", False, Cause.CONFIG_ERROR),
    ("Pending", "ClusterQueue cq not found", False, Cause.CONFIG_ERROR),
    ("Inadmissible", "LocalQueue lq is inactive", False, Cause.STOPPED),
    ("Suspended", "ClusterQueue cq is stopped", False, Cause.STOPPED),
    ("Inadmissible", "ClusterQueue cq is inactive", False, Cause.CONFIG_ERROR),
    ("Inadmissible", "ClusterQueue cq is inactive", True, Cause.STOPPED),
    ("Suspended", "ClusterQueue cq is inactive", True, Cause.STOPPED),
    (
        "Pending",
        "workload namespace doesn't match ClusterQueue selector",
        False,
        Cause.CONFIG_ERROR,
    ),
    ("WaitingForQuota", "couldn't assign flavors to pod set node: ...", False, Cause.NO_CAPACITY),
    ("TopologyPlacementFailed", "no domain fits", False, Cause.NO_CAPACITY),
    ("NoMatchingFlavor", "", False, Cause.NO_CAPACITY),
    ("ExceedsMaxQuota", "", False, Cause.NO_CAPACITY),
    (
        "Pending",
        "couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu",
        False,
        Cause.NO_CAPACITY,
    ),
    (
        "Pending",
        "couldn't assign flavors to pod set node: ... . Pending the preemption of 1 workload(s)",
        False,
        None,
    ),
    ("Pending", "The ClusterQueue is stopped", True, None),
    ("WaitingForPreemptedWorkloads", "", False, None),
    ("PendingEvaluation", "", False, None),
    ("Deactivated", "The workload is deactivated", False, None),
]


@pytest.mark.parametrize(("reason", "message", "queue_stopped", "cause"), QUOTA)
def test_quota_reserved_false_cause(
    reason: str, message: str, queue_stopped: bool, cause: Cause | None
) -> None:
    assert reasons.quota_reserved_cause(reason, message, queue_stopped=queue_stopped) == cause


EVICTED = [
    ("Preempted", "Preempted to accommodate a workload", (), Cause.PREEMPTED),
    ("ClusterQueueStopped", "The ClusterQueue is stopped", (), Cause.STOPPED),
    ("LocalQueueStopped", "The LocalQueue is stopped", (), Cause.STOPPED),
    ("Deactivated", "The workload is deactivated", (), Cause.STOPPED),
    (
        "Deactivated",
        "The workload is deactivated",
        ("MaximumExecutionTimeExceeded",),
        Cause.TIMEOUT,
    ),
    ("DeactivatedDueToMaximumExecutionTimeExceeded", "", (), Cause.TIMEOUT),
    ("DeactivatedDueToRequeuingLimitExceeded", "", (), Cause.PODS_READY_TIMEOUT),
    ("DeactivatedDueToAdmissionCheck", "", (), Cause.ADMISSION_REJECTED),
    (
        "Deactivated",
        "The workload is deactivated due to exceeding the maximum execution time",
        (),
        Cause.TIMEOUT,
    ),
    (
        "AdmissionCheck",
        "Evicted due to AdmissionCheck in Retry state: prov: capacity revoked",
        (),
        Cause.PREEMPTED,
    ),
    ("AdmissionCheck", "AdmissionCheck in Rejected state: gate: no", (), Cause.ADMISSION_REJECTED),
    ("NodeFailures", "Workload was evicted as there was no replacement", (), Cause.NODE_LOST),
    ("PodsReadyTimeout", "Exceeded the PodsReady timeout", (), Cause.PODS_READY_TIMEOUT),
    ("WorkloadSliceReplaced", "", (), None),
]


@pytest.mark.parametrize(("reason", "message", "underlying", "cause"), EVICTED)
def test_eviction_cause(
    reason: str, message: str, underlying: tuple[str, ...], cause: Cause | None
) -> None:
    assert reasons.eviction_cause(reason, message, underlying) == cause


@pytest.mark.parametrize(
    ("reason", "message", "cause"),
    [
        (
            "DeletionByTaintManager",
            "Taint manager: deleting due to NoExecute taint",
            Cause.NODE_LOST,
        ),
        ("DeletionByPodGC", "PodGC: node no longer exists", Cause.NODE_LOST),
        ("TerminationByKubelet", "The node was low on resource: memory.", Cause.NODE_LOST),
        (
            "TerminationByKubelet",
            "Pod was preempted by Kubelet to accommodate a critical pod.",
            Cause.PREEMPTED,
        ),
        ("PreemptionByScheduler", "default-scheduler: preempting", Cause.PREEMPTED),
        ("EvictionByEvictionAPI", "Eviction API: evicting", Cause.PREEMPTED),
        ("SomethingNew", "", None),
    ],
)
def test_disruption_target_cause(reason: str, message: str, cause: Cause | None) -> None:
    assert reasons.disruption_cause(reason, message) == cause


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("UnexpectedAdmissionError", Cause.NODE_LOST),
        ("OutOfnvidia.com/gpu", Cause.NO_CAPACITY),
        ("OutOfcpu", Cause.NO_CAPACITY),
        ("Evicted", Cause.NODE_LOST),
        ("Terminated", Cause.NODE_LOST),
        ("Preempting", Cause.PREEMPTED),
        ("SysctlForbidden", Cause.CONFIG_ERROR),
        ("", None),
    ],
)
def test_pod_failure_cause(reason: str, cause: Cause | None) -> None:
    assert reasons.pod_failure_cause(reason) == cause


@pytest.mark.parametrize(
    ("reason", "exit_code", "cause"),
    [
        ("OOMKilled", 137, Cause.OUT_OF_MEMORY),
        ("OOMKilled", 0, None),
        ("Error", 3, Cause.PROGRAM_ERROR),
        ("Completed", 0, None),
        ("", 1, Cause.PROGRAM_ERROR),
        ("StartError", 128, Cause.CONFIG_ERROR),
    ],
)
def test_terminated_cause(reason: str, exit_code: int, cause: Cause | None) -> None:
    assert reasons.terminated_cause(reason, exit_code) == cause


def test_waiting_and_scheduling_and_trainjob_causes() -> None:
    assert reasons.waiting_cause("ErrImageNeverPull") == Cause.IMAGE_PULL
    assert reasons.waiting_cause("CreateContainerConfigError") == Cause.CONFIG_ERROR
    assert reasons.waiting_cause("ContainerCreating") is None
    assert reasons.scheduling_cause("Unschedulable") == Cause.NO_CAPACITY
    assert reasons.scheduling_cause("SchedulingGated") is None
    assert reasons.trainjob_failed_cause("DeadlineExceeded") == Cause.TIMEOUT
    assert reasons.trainjob_failed_cause("FailedJobs") == Cause.PROGRAM_ERROR
    assert reasons.check_cause("Rejected") == Cause.ADMISSION_REJECTED
    assert reasons.check_cause("Retry") is None


def test_queue_stop_evictions() -> None:
    assert reasons.is_queue_stop("ClusterQueueStopped")
    assert reasons.is_queue_stop("LocalQueueStopped")
    assert not reasons.is_queue_stop("Preempted")


def test_every_field_has_rows() -> None:
    assert {row.where for row in TABLE} == set(Where)
