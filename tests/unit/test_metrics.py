"""The metrics module: what each observation counts, and labels that stay bounded."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dispatch_kubeflow import metrics

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def event(kind: str, seconds: float, attempt: int = 1, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "attempt": attempt, "time": at(seconds), **extra}


def value(name: str, **labels: str) -> float:
    found = metrics.REGISTRY.get_sample_value(name, labels)
    return found or 0.0


def test_a_committed_history_counts_the_finish_and_times_each_phase() -> None:
    where = {"namespace": "unit-phases", "runtime": "torch"}
    history = [
        event("Submitted", 0),
        event("Admitted", 3),
        event("Running", 5),
        event("Finished", 65, state="Failed", cause="OutOfMemory"),
    ]
    metrics.job_events_committed("unit-phases", "a", "torch", history, history, T0)

    finished = {**where, "adapter": "a", "state": "Failed", "cause": "OutOfMemory"}
    assert value("dispatch_kubeflow_jobs_finished_total", **finished) == 1
    assert value("dispatch_kubeflow_job_admission_wait_seconds_sum", **where) == 3
    assert value("dispatch_kubeflow_job_startup_seconds_sum", **where) == 2
    assert value("dispatch_kubeflow_job_run_seconds_sum", **where) == 60


def test_a_readmission_waits_from_its_eviction_and_earlier_attempts_are_not_used() -> None:
    where = {"namespace": "unit-readmit", "runtime": "torch"}
    history = [
        event("Submitted", 0, attempt=1),
        event("Submitted", 100, attempt=2),
        event("Admitted", 101, attempt=2),
        event("Evicted", 200, attempt=2),
        event("Admitted", 230, attempt=2),
    ]
    metrics.job_events_committed("unit-readmit", "a", "torch", history, history[2:3], T0)
    metrics.job_events_committed("unit-readmit", "a", "torch", history, history[4:], T0)

    assert value("dispatch_kubeflow_job_admission_wait_seconds_count", **where) == 2
    assert value("dispatch_kubeflow_job_admission_wait_seconds_sum", **where) == 1 + 30


@pytest.mark.parametrize(
    ("history", "expected"),
    [
        # A second Submitted for a new waiting cause does not restart the wait.
        ([event("Submitted", 0), event("Submitted", 20, cause="NoCapacity"), event("Admitted", 50)],
         50),
        # A repeated Admitted (a waiting cause while admitted) ends nothing.
        ([event("Submitted", 0), event("Admitted", 5), event("Admitted", 9, cause="ImagePull")],
         None),
        # Running after a repeated Admitted counts from the first.
        ([event("Submitted", 0), event("Admitted", 5), event("Admitted", 9, cause="ImagePull"),
          event("Running", 15)], 10),
        # After an eviction, Running counts from the readmission.
        ([event("Submitted", 0), event("Admitted", 1), event("Running", 2), event("Evicted", 10),
          event("Admitted", 40), event("Running", 43)], 3),
        # Finished after the second cycle counts from that cycle's Running.
        ([event("Submitted", 0), event("Admitted", 1), event("Running", 2), event("Evicted", 10),
          event("Admitted", 40), event("Running", 43), event("Finished", 100)], 57),
        # Finished without ever running times no run.
        ([event("Submitted", 0), event("Finished", 30)], None),
    ],
)  # fmt: skip
def test_each_phase_is_timed_once_from_its_first_beginning(
    history: list[dict[str, Any]], expected: float | None
) -> None:
    assert metrics.phase_seconds(history, history[-1]) == expected


def test_event_latency_runs_from_the_evidence_time_where_there_is_one() -> None:
    lost = event("NodeLost", 10, evidence=[{"kind": "Node", "name": "n", "timeAdded": at(4)}])
    now = T0 + timedelta(seconds=12)
    metrics.job_events_committed("unit-latency", "a", "torch", [lost], [lost], now)
    assert value("dispatch_kubeflow_event_latency_seconds_sum", type="NodeLost") >= 8


def test_no_metric_has_a_job_name_or_uid_label() -> None:
    labels = {
        label
        for metric in metrics.REGISTRY.collect()
        if metric.name.startswith(metrics.PREFIX)
        for sample in metric.samples
        for label in sample.labels
    }
    declared = {
        label
        for collector in (metrics.JOBS_FINISHED, metrics.EVENTS, metrics.API_REQUESTS)
        for label in collector._labelnames
    }
    assert not {"job", "name", "uid", "trainJob", "train_job"} & (labels | declared)


@pytest.mark.parametrize(
    ("method", "url", "query", "expected"),
    [
        ("GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs", [("watch", True)],
         ("watch", "trainjobs")),
        ("GET", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/a/trainjobs", None,
         ("list", "trainjobs")),
        ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/namespaces/a/workloads/w/status", None,
         ("patch", "workloads/status")),
        ("GET", "/api/v1/namespaces/team-a", None, ("get", "namespaces")),
        ("GET", "/api/v1/nodes?watch=true", None, ("watch", "nodes")),
        ("DELETE", "/api/v1/namespaces/a/pods", None, ("deletecollection", "pods")),
        ("POST", "/api/v1/namespaces/a/events", None, ("create", "events")),
        ("GET", "/version", None, ("get", "other")),
    ],
)  # fmt: skip
def test_a_request_is_labelled_with_the_apiservers_verb_and_resource(
    method: str, url: str, query: Any, expected: tuple[str, str]
) -> None:
    assert metrics.request_labels(method, "https://apiserver:6443" + url, query) == expected


def test_a_held_readmission_is_timed_from_its_first_pending_decision() -> None:
    before = value("dispatch_kubeflow_admission_gate_held_seconds_count")
    metrics.admission_decided("uid-1", 1, "Pending", T0)
    metrics.admission_decided("uid-1", 1, "Pending", T0 + timedelta(seconds=5))
    metrics.admission_decided("uid-1", 1, "Ready", T0 + timedelta(seconds=20))
    metrics.admission_decided("uid-2", 0, "Ready", T0)  # a first admission holds nothing
    assert value("dispatch_kubeflow_admission_gate_held_seconds_count") == before + 1
    assert value("dispatch_kubeflow_admission_decisions_total", verdict="Pending") >= 2


@pytest.mark.parametrize(
    ("address", "expected"),
    [("0.0.0.0:9090", ("0.0.0.0", 9090)), (":9090", ("0.0.0.0", 9090)), ("[::1]:0", ("::1", 0))],
)
def test_a_metrics_address_is_host_and_port(address: str, expected: tuple[str, int]) -> None:
    assert metrics.parse_address(address) == expected


@pytest.mark.parametrize("address", ["9090", "host:", "host:http", "host:70000"])
def test_an_address_without_a_port_is_refused(address: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        metrics.parse_address(address)


def test_the_served_endpoint_answers_in_the_prometheus_text_format() -> None:
    server = metrics.serve_metrics("127.0.0.1:0")
    try:
        url = f"http://127.0.0.1:{server.port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        server.close()
    names = {family.name for family in text_string_to_metric_families(text)}
    assert {"dispatch_kubeflow_events", "dispatch_kubeflow_watch_backlog"} <= names
