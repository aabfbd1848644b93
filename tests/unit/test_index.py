"""The job index: what is kept of each kind, and how a change is routed to the jobs it affects."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch_kubeflow.constants import (
    BUILTIN_LOSS_TAINTS,
    KIND_NODE,
    KIND_POD,
    KIND_TRAINJOB,
    KIND_WORKLOAD,
    LABEL_ATTEMPT,
    LABEL_JOB,
    TAINT_UNREACHABLE,
)
from dispatch_kubeflow.events import Taint
from dispatch_kubeflow.index import (
    DELETED_PODS_KEPT,
    FORGOTTEN_KEPT,
    JobIndex,
    loss_taints_of,
    node_taints,
    pods_as_read,
    trim,
)
from dispatch_kubeflow.kube.informer import Change
from dispatch_kubeflow.settings import RuntimeRef, Settings


def obj(name: str, rv: str, job: str = "j") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "resourceVersion": rv,
            "labels": {LABEL_JOB: job, LABEL_ATTEMPT: "1"},
        },
        "spec": {},
        "status": {},
    }


def test_nodes_keep_only_noexecute_taints_and_pods_only_what_derivation_reads() -> None:
    node = {
        "metadata": {"name": "n1", "resourceVersion": "1", "labels": {"big": "x"}},
        "spec": {
            "taints": [
                {"key": "a", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            ]
        },
        "status": {"images": ["lots"]},
    }
    assert trim(KIND_NODE, node) == {
        "metadata": {"name": "n1", "resourceVersion": "1"},
        "spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
    }
    pod = {**obj("p", "1"), "spec": {"nodeName": "n1", "containers": [{"name": "node"}]}}
    assert trim(KIND_POD, pod)["spec"] == {"nodeName": "n1"}


def test_index_routes_node_changes_to_the_jobs_with_pods_there() -> None:
    index = JobIndex()
    pod = {**obj("p", "1", job="j"), "spec": {"nodeName": "n1"}}
    assert index.apply(Change(KIND_POD, "ADDED", trim(KIND_POD, pod))) == {("j", 1)}
    tainted = {
        "metadata": {"name": "n1"},
        "spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
    }
    assert index.apply(Change(KIND_NODE, "MODIFIED", tainted)) == {("j", 1)}
    assert index.apply(Change(KIND_NODE, "MODIFIED", tainted)) == set()  # no change, no work
    assert index.apply(Change(KIND_NODE, "ADDED", {"metadata": {"name": "n2"}})) == set()
    observed = index.observation(("j", 1), stopped=False)
    assert [t.key for t in observed.node_taints["n1"]] == ["node.kubernetes.io/unreachable"]


def test_index_tells_the_jobs_on_a_deleted_node_and_forgets_it_when_it_returns() -> None:
    index = JobIndex()
    pod = {**obj("p", "1", job="j"), "spec": {"nodeName": "n1"}}
    index.apply(Change(KIND_POD, "ADDED", trim(KIND_POD, pod)))
    node = {"metadata": {"name": "n1"}, "spec": {}}
    assert index.apply(Change(KIND_NODE, "ADDED", node)) == set()
    assert index.apply(Change(KIND_NODE, "DELETED", node)) == {("j", 1)}
    assert index.observation(("j", 1), stopped=False).deleted_nodes == {"n1"}
    # A node nobody's pods are on is not remembered.
    assert index.apply(Change(KIND_NODE, "DELETED", {"metadata": {"name": "n2"}})) == set()
    assert index.apply(Change(KIND_NODE, "ADDED", node)) == {("j", 1)}
    assert index.observation(("j", 1), stopped=False).deleted_nodes == frozenset()


def test_trimmed_pods_keep_the_reason_the_kubelet_failed_them_with() -> None:
    pod = {
        **obj("p", "1"),
        "status": {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "m"},
    }
    assert trim(KIND_POD, pod)["status"] == {
        "phase": "Failed",
        "reason": "UnexpectedAdmissionError",
        "message": "m",
    }


def test_index_matches_workloads_by_owner_uid_and_keeps_deleted_pods_as_evidence() -> None:
    index = JobIndex()
    tj = obj("j-1", "1", job="j")
    tj["metadata"]["uid"] = "u1"
    index.apply(Change(KIND_TRAINJOB, "ADDED", tj))
    workload = {
        "metadata": {"name": "w", "ownerReferences": [{"kind": "TrainJob", "uid": "u1"}]},
        "spec": {},
        "status": {},
    }
    assert index.apply(Change(KIND_WORKLOAD, "ADDED", workload)) == {("j", 1)}
    index.apply(Change(KIND_POD, "DELETED", trim(KIND_POD, obj("p", "2", job="j"))))
    observed = index.observation(("j", 1), stopped=False)
    assert observed.workload == workload
    assert observed.pods[0]["metadata"]["deletionTimestamp"] is not None


@pytest.mark.parametrize("labels", [{}, {LABEL_JOB: "j"}, {LABEL_JOB: "j", LABEL_ATTEMPT: "x"}])
def test_objects_without_job_labels_are_ignored(labels: dict[str, str]) -> None:
    index = JobIndex()
    body = {"metadata": {"name": "x", "labels": labels}, "spec": {}, "status": {}}
    assert index.apply(Change(KIND_TRAINJOB, "ADDED", body)) == set()
    assert index.job_keys() == set()


def test_node_taints_are_the_noexecute_ones_whatever_else_a_taint_carries() -> None:
    """find and the watch read a node the same way; Kubernetes stamps NoExecute taints with
    timeAdded, which is kept (a taint put back is another loss), and anything else is ignored."""
    node = {
        "spec": {
            "taints": [
                {
                    "key": TAINT_UNREACHABLE,
                    "effect": "NoExecute",
                    "timeAdded": "2026-01-01T12:00:00Z",
                },
                {"key": TAINT_UNREACHABLE, "effect": "NoSchedule"},
                "not a taint",
            ]
        }
    }
    assert node_taints(node) == (
        Taint(key=TAINT_UNREACHABLE, effect="NoExecute", time_added="2026-01-01T12:00:00Z"),
    )
    assert node_taints({}) == ()


def test_loss_taints_are_kubernetes_own_and_the_adapters() -> None:
    runtime = RuntimeRef(kind="TrainingRuntime", name="r")
    settings = Settings(
        namespace="ns",
        runtimes=(runtime,),
        probe_runtime=runtime,
        node_loss_taints=("example.com/spot-reclaim",),
    )
    assert loss_taints_of(settings) == {*BUILTIN_LOSS_TAINTS, "example.com/spot-reclaim"}


def pod(name: str, job: str = "j", *, node: str = "n1", deleting: bool = False) -> dict[str, Any]:
    body = obj(name, "1", job=job)
    body["spec"] = {"nodeName": node}
    if deleting:
        body["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return body


def test_the_deleted_pods_kept_of_a_job_are_the_newest_and_bounded() -> None:
    index = JobIndex()
    index.apply(Change(KIND_POD, "ADDED", pod("live")))
    for n in range(DELETED_PODS_KEPT + 10):
        index.apply(Change(KIND_POD, "DELETED", pod(f"gone-{n}")))
    kept = [p["metadata"]["name"] for p in index.observation(("j", 1), stopped=False).pods]
    newest = [f"gone-{n}" for n in range(10, DELETED_PODS_KEPT + 10)]
    assert sorted(kept) == sorted(["live", *newest])
    assert set(index.pod_keys) == {"live", *newest}


def test_a_forgotten_job_keeps_nothing_and_ignores_its_objects_going() -> None:
    index = JobIndex()
    tj = obj("j-1", "1")
    tj["metadata"]["uid"] = "u1"
    index.apply(Change(KIND_TRAINJOB, "ADDED", tj))
    index.apply(Change(KIND_POD, "ADDED", pod("p")))
    index.apply(Change(KIND_TRAINJOB, "DELETED", tj))
    index.apply(Change(KIND_POD, "MODIFIED", pod("p", deleting=True)))
    assert index.all_gone(("j", 1))
    index.forget(("j", 1))
    # The pod's own DELETED comes after: nothing of the job is brought back.
    assert index.apply(Change(KIND_POD, "DELETED", pod("p", deleting=True))) == set()
    assert index.job_keys() == set()
    assert (index.pods, index.pod_keys, index.train_jobs) == ({}, {}, {})
    assert (index.train_job_keys_by_uid, dict(index.keys_by_node)) == ({}, {})


def test_a_new_object_of_a_forgotten_job_is_a_new_job() -> None:
    index = JobIndex()
    index.forget(("j", 1))
    assert index.apply(Change(KIND_TRAINJOB, "ADDED", obj("j-1", "5"))) == {("j", 1)}
    assert not index.is_forgotten(("j", 1))


def test_the_forgotten_jobs_remembered_are_bounded() -> None:
    index = JobIndex()
    for n in range(FORGOTTEN_KEPT + 5):
        index.forget((f"j{n}", 1))
    assert len(index.forgotten) == FORGOTTEN_KEPT
    assert not index.is_forgotten(("j0", 1))
    assert index.is_forgotten((f"j{FORGOTTEN_KEPT + 4}", 1))


def phase(pod: dict[str, Any], value: str, *, deleted: bool = False) -> dict[str, Any]:
    metadata = {**pod["metadata"], **({"deletionTimestamp": "deleted"} if deleted else {})}
    return {**pod, "metadata": metadata, "status": {"phase": value}}


def test_pods_as_read_take_the_read_and_keep_what_the_watch_saw_otherwise() -> None:
    running, gone, evicted, done = (obj(f"p{i}", str(i)) for i in range(4))
    seen = [
        phase(running, "Running"),
        phase(gone, "Running"),
        phase(evicted, "Failed", deleted=True),
        phase(done, "Succeeded"),
    ]
    read = {"p0": phase(running, "Failed"), "p1": None, "p4": phase(obj("p4", "9"), "Pending")}

    pods = pods_as_read(seen, read)

    assert [(p["metadata"]["name"], p["status"]["phase"]) for p in pods] == [
        ("p0", "Failed"),  # the read is newer than the watch
        ("p1", "Running"),  # gone since: kept as evidence, marked deleted
        ("p2", "Failed"),  # deleted before: the watch's evidence stays
        ("p3", "Succeeded"),  # not read: as watched
        ("p4", "Pending"),  # found by the read, not yet shown by the watch
    ]
    assert [p["metadata"].get("deletionTimestamp") for p in pods] == [
        None,
        "deleted",
        "deleted",
        None,
        None,
    ]
