"""Derivation under what jobs write and what upstream says: it never raises, it never leaves a
finished attempt without a cause (issue 12, items 9 and 10)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from dispatch_kubeflow.constants import (
    BUILTIN_LOSS_TAINTS,
    LABEL_COMPLETION_INDEX,
    LABEL_RESTART_ATTEMPT,
    TRAINER_NODE,
    Cause,
    State,
)
from dispatch_kubeflow.derivation import derive, published_result
from dispatch_kubeflow.errors import ErrInvalid, ErrUnsupported, RuntimeUnsupportedError
from dispatch_kubeflow.events import JobObservation
from dispatch_kubeflow.handlers.jobs import refusal_of
from dispatch_kubeflow.handlers.status import DispatchJobStatus, refuse_attempt

LOSS = frozenset(BUILTIN_LOSS_TAINTS)
DEEP = "[" * 2000 + "]" * 2000
FAILED_TRAINJOB = {
    "metadata": {"name": "j1-1"},
    "spec": {},
    "status": {
        "conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs", "message": ""}]
    },
}


def failed_pod(
    message: Any = "",
    *,
    container: Any = TRAINER_NODE,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    node: Any = "n1",
    reason: Any = "Error",
    exit_code: Any = 1,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "j1-1-node-0-0",
            "labels": labels if labels is not None else {LABEL_COMPLETION_INDEX: "0"},
            "annotations": annotations or {},
        },
        "spec": {"nodeName": node},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": container,
                    "state": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": reason,
                            "message": message,
                        }
                    },
                }
            ],
        },
    }


def derive_failed(pod: dict[str, Any]) -> tuple[State, Cause | None]:
    obs = JobObservation(job="j1", attempt=1, train_job=FAILED_TRAINJOB, pods=(pod,))
    status = derive(obs, loss_taints=LOSS)
    return status.state, status.cause


# --- item 9: nothing a job writes raises out of derive ------------------------------------------

HOSTILE_PODS = {
    "termination message nested 2000 deep": failed_pod(DEEP),
    "termination message of objects nested 2000 deep": failed_pod(
        '{"a":' * 2000 + "1" + "}" * 2000
    ),
    "termination message with a lone surrogate": failed_pod('{"a": "\ud800"}'),
    "termination message with a 5000-digit number": failed_pod('{"a": ' + "1" * 5000 + "}"),
    "termination message over 4 KiB": failed_pod('{"a": "' + "x" * 100_000 + '"}'),
    "termination message that is not a string": failed_pod({"nested": [DEEP]}),
    "huge labels": failed_pod(
        "x",
        labels={
            LABEL_COMPLETION_INDEX: "0" * 100_000,
            LABEL_RESTART_ATTEMPT: "9" * 5000,
            "example.com/big": "v" * 1_000_000,
        },
    ),
    "huge annotations": failed_pod("x", annotations={f"k{n}": "v" * 10_000 for n in range(100)}),
    "odd container names": failed_pod("x", container="\x00\ud800/../node\n" * 100),
    "a container name that is not a string": failed_pod("x", container=["node"]),
    "a node name that is not a string": failed_pod("x", node=123),
    "an exit code that is not a number": failed_pod("x", exit_code="1e999"),
    "a huge exit code": failed_pod("x", exit_code=10**30),
    "a reason that is not a string": failed_pod("x", reason={"a": [1]}),
    "an upstream message of 1 MiB with regex bait": failed_pod(
        "x", reason="Error" + "Pending the preemption of " * 40_000
    ),
}


@pytest.mark.parametrize("pod", HOSTILE_PODS.values(), ids=HOSTILE_PODS.keys())
def test_item9_derive_never_raises_on_what_a_job_writes(pod: dict[str, Any]) -> None:
    assert derive_failed(pod) == (State.FAILED, Cause.PROGRAM_ERROR)


def test_item9_a_deeply_nested_termination_message_is_no_published_result() -> None:
    assert published_result([failed_pod(DEEP)]) is None


def test_item9_a_record_within_publishs_depth_is_still_read() -> None:
    nested: list[Any] = []
    for _ in range(62):
        nested = [nested]
    # Brackets inside strings do not count as nesting.
    record = {"a": nested, "s": '[[[[{{{{"]]'}
    assert published_result([failed_pod(json.dumps(record))]) == record


@pytest.mark.parametrize(
    "message",
    [
        "Pending the preemption of " * 50_000,
        "LocalQueue " + "q" * 500_000 + " doesn't exist",
        "\ud800\udfff\x00" * 10_000,
    ],
    ids=["preemption bait", "a huge queue name", "control characters and surrogates"],
)
def test_item9_upstream_messages_of_any_content_never_raise(message: str) -> None:
    wl = {
        "metadata": {"name": "trainjob-j1-1-abcde"},
        "spec": {"active": True},
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": message,
                },
                {"type": "Evicted", "status": "True", "reason": "Preempted", "message": message},
            ]
        },
    }
    tj = {"metadata": {"name": "j1-1"}, "spec": {}, "status": {}}
    status = derive(
        JobObservation(job="j1", attempt=1, train_job=tj, workload=wl), loss_taints=LOSS
    )
    assert status.cause is Cause.PREEMPTED


# --- item 10: never a bare failed ---------------------------------------------------------------


@pytest.mark.parametrize(
    "reason",
    ["DeactivatedDueToSomethingNew", "DeactivatedDueToEvictedOnManagerCluster", "SomeNewReason"],
)
def test_item10_a_deactivated_workload_with_an_unknown_reason_fails_with_a_cause(
    reason: str,
) -> None:
    wl = {
        "metadata": {"name": "trainjob-j1-1-abcde"},
        "spec": {"active": False},
        "status": {
            "conditions": [
                {"type": "Evicted", "status": "True", "reason": reason, "message": "why not"}
            ]
        },
    }
    tj = {"metadata": {"name": "j1-1"}, "spec": {"suspend": True}, "status": {}}
    status = derive(
        JobObservation(job="j1", attempt=1, train_job=tj, workload=wl), loss_taints=LOSS
    )
    assert (status.state, status.cause) == (State.FAILED, Cause.STOPPED)
    assert status.reason == reason


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (ErrInvalid("job spec: numNodes: too small"), Cause.CONFIG_ERROR),
        (
            RuntimeUnsupportedError("runtime TrainingRuntime 'x' is refused"),
            Cause.RUNTIME_UNSUPPORTED,
        ),
        (ErrUnsupported("Kueue made no Workload for TrainJob j-1"), Cause.CONFIG_ERROR),
    ],
    ids=["invalid job", "unsupported runtime", "other refusal"],
)
def test_item10_a_refused_start_fails_with_a_cause(error: Exception, cause: Cause) -> None:
    assert isinstance(error, ErrInvalid | ErrUnsupported)
    refusal = refusal_of(error)
    status = refuse_attempt(
        DispatchJobStatus(),
        attempt=1,
        reason=refusal.reason,
        message=refusal.message,
        cause=refusal.cause,
        generation=1,
        now=datetime(2026, 1, 1, tzinfo=UTC),
    )
    assert (status.state, status.cause, status.message) == ("Failed", cause.value, str(error))
