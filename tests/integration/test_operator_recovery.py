"""Issue 15: back from a disruption through the DispatchJob, on the real kube-apiserver.

The operator runs in-process (``running_operator``) serving a KubeflowAdapter in Kueue mode with a
readmission gate; the test plays Kueue (a Workload per TrainJob, then its admission and eviction)
and Trainer, as ``test_operator`` and ``test_adapter`` do. What it checks is the dispatch side of
the gate: the job held at the gate says so, ``spec.readmit`` opens the gate for the eviction
(the TrainJob's readmit annotation, which the admission controller reads), and
``spec.recovery`` readmits or starts the next attempt with no human step, as a Kubernetes Event
and an entry of ``status.recovery``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from dispatch_kubeflow.constants import (
    ANNOTATION_READMIT,
    ANNOTATION_REJECT,
    GROUP,
    KUEUE_GROUP,
    KUEUE_VERSION,
    MERGE_PATCH,
    VERSION,
)
from dispatch_kubeflow.handlers.recovery import raise_attempt_from
from tests.integration.test_adapter import (
    create_local_queue,
    garbage_collector,
    kueue_stand_in,
)
from tests.integration.test_operator import (
    Scene,
    condition,
    eventually,
    operator,
    operator_memo,
    running_operator,
    scene,
)
from tests.integration.test_watching import cond

__all__ = [
    "garbage_collector",
    "operator",
    "operator_memo",
    "scene",
]  # fixtures used by the tests below

GATE = "dispatch-gate"


@pytest.fixture
async def gated(
    garbage_collector: None, scene: Scene, kube_api: client.ApiClient, operator: Path
) -> AsyncIterator[Scene]:
    """The scene's adapter in Kueue mode with a readmission gate, Ready, with Kueue played (and
    the garbage collector, which takes the probe's Workload after its TrainJob)."""
    await create_local_queue(kube_api, scene.namespace, "lq")
    async with kueue_stand_in(kube_api, scene.namespace):
        await scene.apply_adapter(
            scene.adapter_spec(kueue={"localQueue": "lq", "admissionCheck": GATE})
        )
        await scene.ready_adapter()
        yield scene


async def workload_of(scene: Scene, trainjob: str) -> str:
    async def found() -> str | None:
        listed = await scene.objects.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, scene.namespace, "workloads"
        )
        for item in listed["items"]:
            if any(o.get("name") == trainjob for o in item["metadata"].get("ownerReferences", [])):
                return str(item["metadata"]["name"])
        return None

    return await eventually(found, f"the Workload of {trainjob}")


async def workload_status(scene: Scene, name: str, status: dict[str, Any]) -> None:
    await scene.objects.patch_namespaced_custom_object_status(
        KUEUE_GROUP,
        KUEUE_VERSION,
        scene.namespace,
        "workloads",
        name,
        {"status": status},
        _content_type=MERGE_PATCH,
    )


async def admit_then_preempt(scene: Scene, job: str) -> str:
    """Kueue admits the job's Workload, then preempts it: one eviction."""
    workload = await workload_of(scene, f"{job}-1")
    await workload_status(scene, workload, {"conditions": [cond("Admitted", reason="Admitted")]})
    await scene.job_in_state(job, "Pending")
    await workload_status(
        scene,
        workload,
        {
            "conditions": [
                cond("Admitted", reason="Admitted"),
                cond("Evicted", reason="Preempted", message="preempted by team-b", at=5),
            ],
            "schedulingStats": {
                "evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 1}]
            },
        },
    )
    return workload


async def held_at_gate(scene: Scene, job: str) -> dict[str, Any]:
    async def held() -> dict[str, Any] | None:
        admitted = condition(await scene.job(job), "Admitted")
        return admitted if admitted and admitted["reason"] == "HeldAtGate" else None

    return await eventually(held, f"{job} held at the gate")


async def annotation(scene: Scene, trainjob: str, key: str) -> str | None:
    body = await scene.trainjob(trainjob)
    return ((body or {}).get("metadata", {}).get("annotations") or {}).get(key)


async def patch_spec(scene: Scene, job: str, spec: dict[str, Any]) -> None:
    await scene.objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        scene.namespace,
        "dispatchjobs",
        job,
        {"spec": spec},
        _content_type=MERGE_PATCH,
    )


async def event_reasons(scene: Scene, job: str, *wanted: str) -> list[str] | None:
    """The job's Kubernetes Event reasons once they include every one of ``wanted``."""
    reasons = [e.reason for e in await scene.kube_events(job)]
    return reasons if set(wanted) <= set(reasons) else None


async def recovery_actions(scene: Scene, job: str) -> list[str]:
    status = (await scene.job(job) or {}).get("status") or {}
    return [entry["action"] for entry in status.get("recovery") or []]


async def recorded_actions(scene: Scene, job: str) -> list[str] | None:
    """The recorded actions once there is one (None before: ``eventually`` waits on None)."""
    return await recovery_actions(scene, job) or None


async def test_a_held_job_says_so_and_spec_readmit_opens_the_gate(gated: Scene) -> None:
    scene = gated
    await scene.create_job("held")
    await admit_then_preempt(scene, "held")
    admitted = await held_at_gate(scene, "held")
    assert admitted["status"] == "False"
    assert "Preempted" in admitted["message"]
    assert "preempted by team-b" in admitted["message"]
    assert await annotation(scene, "held-1", ANNOTATION_READMIT) is None

    await patch_spec(scene, "held", {"readmit": 1})

    async def readmitted() -> str | None:
        return await annotation(scene, "held-1", ANNOTATION_READMIT)

    assert await eventually(readmitted, "the readmit annotation") == "1"  # for eviction 1
    assert await eventually(lambda: recorded_actions(scene, "held"), "the record") == ["Readmitted"]
    assert "Readmitted" in await eventually(
        lambda: event_reasons(scene, "held", "Readmitted"), "an Event"
    )

    await patch_spec(scene, "held", {"reject": "the dataset was withdrawn"})

    async def rejected() -> str | None:
        return await annotation(scene, "held-1", ANNOTATION_REJECT)

    assert await eventually(rejected, "the reject annotation") == "the dataset was withdrawn"


async def test_spec_readmit_may_only_go_up(gated: Scene) -> None:
    scene = gated
    await scene.create_job("down", readmit=2)
    with pytest.raises(client.exceptions.ApiException) as refused:
        await patch_spec(scene, "down", {"readmit": 1})
    assert "spec.readmit may only be raised" in str(refused.value.body)


async def test_a_retry_meant_for_a_deleted_dispatchjob_leaves_its_namesake_alone(
    scene: Scene,
) -> None:
    # A retry is decided from the DispatchJob as read; it may be deleted, and a new one applied
    # under its name, before the attempt is raised.
    await scene.create_job("reborn", attempt=1)
    deleted = await scene.job("reborn")
    assert deleted is not None
    await scene.objects.delete_namespaced_custom_object(
        GROUP, VERSION, scene.namespace, "dispatchjobs", "reborn"
    )
    await scene.create_job("reborn", attempt=1)
    uid = deleted["metadata"]["uid"]
    assert not await raise_attempt_from(scene.api, scene.namespace, "reborn", uid, 1)
    current = await scene.job("reborn")
    assert current is not None
    assert current["spec"]["attempt"] == 1
    assert await raise_attempt_from(
        scene.api, scene.namespace, "reborn", current["metadata"]["uid"], 1
    )
    assert (await scene.job("reborn") or {})["spec"]["attempt"] == 2


async def test_a_recovery_policy_readmits_and_retries_without_a_person(gated: Scene) -> None:
    scene = gated
    policy = {"readmitOn": ["Preempted"], "retryOn": ["ProgramError"], "backoff": "1s"}
    await scene.create_job("auto", recovery=policy)
    workload = await admit_then_preempt(scene, "auto")
    await held_at_gate(scene, "auto")

    async def readmitted() -> str | None:
        return await annotation(scene, "auto-1", ANNOTATION_READMIT)

    assert await eventually(readmitted, "the policy's readmission") == "1"

    # Kueue admits it again (a new admission), and then the program fails.
    await workload_status(
        scene,
        workload,
        {
            "conditions": [
                cond("Admitted", reason="Admitted", at=9),
                cond("Evicted", "False", reason="Preempted", message="preempted by team-b", at=9),
            ]
        },
    )
    await scene.play_trainer(
        "auto-1",
        {"conditions": [cond("Failed", reason="FailedJobs", message="exit code 1", at=12)]},
    )

    async def second_attempt() -> dict[str, Any] | None:
        return await scene.trainjob("auto-2")

    await eventually(second_attempt, "the TrainJob of attempt 2")
    await scene.job_in_state("auto", "Pending")  # attempt 2 started
    body = await scene.job("auto")
    assert body is not None
    assert body["spec"]["attempt"] == 2
    assert await recovery_actions(scene, "auto") == ["Readmitted", "Retried"]
    reasons = await eventually(
        lambda: event_reasons(scene, "auto", "Readmitted", "Retried"), "the Events"
    )
    assert {"Readmitted", "Retried"} <= set(reasons)


async def test_a_retry_due_after_an_operator_restart_is_carried_out_once_by_the_next(
    cluster: Any, scene: Scene, tmp_path: Path
) -> None:
    """The operator that reported the failure stops before the policy's backoff has passed; the
    next one lists the DispatchJob, schedules the same decision from its status and carries it
    out once, for the event the first one reported."""
    events = tmp_path / "events.jsonl"
    policy = {"retryOn": ["ProgramError"], "backoff": "10s"}
    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        await scene.apply_adapter(scene.adapter_spec())
        await scene.ready_adapter()
        await scene.create_job("again", recovery=policy)
        await scene.job_in_state("again", "Pending")
        await scene.play_trainer(
            "again-1", {"conditions": [cond("Failed", reason="FailedJobs", message="exit code 1")]}
        )
        failed = await scene.job_in_state("again", "Failed", "ProgramError")
    reported = failed["status"]["events"][-1]

    stopped = await scene.job("again")
    assert stopped is not None
    assert stopped["spec"]["attempt"] == 1, "the first operator retried before its backoff"
    assert not stopped["status"].get("recovery"), stopped["status"]["recovery"]

    async with running_operator(cluster.kubeconfig, [scene.namespace], events):

        async def second_attempt() -> dict[str, Any] | None:
            return await scene.trainjob("again-2")

        await eventually(second_attempt, "the TrainJob of attempt 2, started by the next operator")
        await scene.job_in_state("again", "Pending")

    body = await scene.job("again")
    assert body is not None
    assert body["spec"]["attempt"] == 2
    entries = body["status"]["recovery"]
    assert [(e["action"], e["attempt"], e.get("event")) for e in entries] == [
        ("Retried", 1, reported["id"])
    ]
    assert await scene.trainjob("again-3") is None
