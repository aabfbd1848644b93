"""When the operator starts a DispatchJob's attempt, on the real kube-apiserver.

An attempt starts once the KubeflowAdapter serving the DispatchJob's namespace is open, and a raised
attempt once the current one has finished. A DispatchJob waiting for either says why in its status.
The operator runs in-process (``running_operator``) and the test plays Trainer, as in
``test_operator``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import kopf
from kubernetes_asyncio import client

from dispatch_kubeflow.constants import (
    GROUP,
    LABEL_JOB,
    STOP_FINALIZER,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    VERSION,
)
from dispatch_kubeflow.handlers.handover import STARTS_IN_FLIGHT
from tests.integration.test_adapter import create_local_queue, garbage_collector, kueue_stand_in
from tests.integration.test_operator import (
    ADAPTER,
    MERGE_PATCH,
    Scene,
    condition,
    eventually,
    operator,
    operator_memo,
    running_operator,
    sample,
    scene,
    scrape,
)

__all__ = [
    "garbage_collector",
    "operator",
    "operator_memo",
    "scene",
]  # fixtures used by the tests below


async def raise_attempt(scene: Scene, name: str, attempt: int) -> None:
    await scene.objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        scene.namespace,
        "dispatchjobs",
        name,
        {"spec": {"attempt": attempt}},
        _content_type=MERGE_PATCH,
    )


async def test_item8_a_vanished_attempt_lets_a_raised_attempt_start(
    scene: Scene, operator: Path
) -> None:
    await scene.apply_adapter(scene.adapter_spec())
    await scene.ready_adapter()
    await scene.create_job("lost")
    await scene.job_in_state("lost", "Pending")
    await scene.play_running("lost-1")
    await scene.job_in_state("lost", "Running")
    # Everything of the attempt goes behind the adapter's back: it is Vanished, state Unknown.
    await scene.objects.delete_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, scene.namespace, TRAINJOBS, "lost-1"
    )
    vanished = await scene.job_in_state("lost", "Unknown", "EvidenceLost")
    assert vanished["status"]["events"][-1]["type"] == "Vanished"

    await raise_attempt(scene, "lost", 2)
    second = await scene.job_in_state("lost", "Pending")
    assert second["status"]["attempt"] == 2
    assert second["status"]["trainJob"] == "lost-2"
    finished: Any = condition(second, "Finished")
    assert finished["status"] == "False"
    assert await scene.trainjob("lost-2") is not None


async def admitted_false(scene: Scene, name: str, reason: str) -> dict[str, Any]:
    async def waiting() -> dict[str, Any] | None:
        found = condition(await scene.job(name), "Admitted")
        if found and (found["status"], found["reason"]) == ("False", reason):
            return found
        return None

    return await eventually(waiting, f"DispatchJob {name} Admitted=False ({reason})")


async def test_item18_a_job_naming_a_missing_adapter_says_so_and_starts_once_it_is_ready(
    scene: Scene, operator: Path
) -> None:
    await scene.create_job("early")
    missing = await admitted_false(scene, "early", "AdapterNotFound")
    expected = f"no KubeflowAdapter named {ADAPTER} serves namespace {scene.namespace}"
    assert expected in missing["message"]
    assert missing["observedGeneration"] == 1
    assert await scene.trainjob("early-1") is None

    # The adapter appears with settings the operator refuses: there, but not Ready.
    await scene.apply_adapter(scene.adapter_spec(kueue=None))
    not_ready = await admitted_false(scene, "early", "AdapterNotReady")
    assert f"KubeflowAdapter {scene.namespace}/{ADAPTER}" in not_ready["message"]
    assert "InvalidSettings" in not_ready["message"]
    assert await scene.trainjob("early-1") is None

    await scene.patch_adapter_spec({"kueue": None})  # a merge patch's null removes the key
    await scene.ready_adapter(generation=2)
    started = await scene.job_in_state("early", "Pending")
    assert started["status"]["trainJob"] == "early-1"
    # Submitted or already Admitted, as the attempt's own events say: no longer waiting.
    admitted: Any = condition(started, "Admitted")
    assert admitted["reason"] in {"Submitted", "Admitted"}
    assert await scene.trainjob("early-1") is not None


async def test_item18_a_job_whose_adapter_never_existed_is_deleted_at_once(
    scene: Scene, operator: Path
) -> None:
    await scene.create_job("typo", adapter="no-such-adapter")
    await admitted_false(scene, "typo", "AdapterNotFound")

    await scene.objects.delete_namespaced_custom_object(
        GROUP, VERSION, scene.namespace, "dispatchjobs", "typo"
    )

    async def gone() -> bool:
        return await scene.job("typo") is None

    await eventually(gone, "the DispatchJob to go (its finalizer released)")


async def kueue_adapter(scene: Scene, kube_api: client.ApiClient) -> None:
    """A Ready adapter in Kueue mode; with the stand-in stopped, every start waits for a
    Workload, so the TrainJobs that exist are exactly the starts in flight."""
    await create_local_queue(kube_api, scene.namespace, "lq")
    async with kueue_stand_in(kube_api, scene.namespace):
        await scene.apply_adapter(scene.adapter_spec(kueue={"localQueue": "lq"}))
        await scene.ready_adapter()


async def made(scene: Scene) -> list[str]:
    """The names of the TrainJobs the operator made in the scene's namespace."""
    listed = await scene.objects.list_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, scene.namespace, TRAINJOBS, label_selector=LABEL_JOB
    )
    return [item["metadata"]["name"] for item in listed["items"]]


async def starts_in_flight_full(scene: Scene) -> list[str]:
    """The TrainJobs of the starts in flight, once the bound is reached; it holds for a second.

    A start past the bound would make its TrainJob as soon as the first twenty did.
    """

    async def full() -> list[str] | None:
        names = await made(scene)
        return names if len(names) >= STARTS_IN_FLIGHT else None

    names = await eventually(full, f"{STARTS_IN_FLIGHT} TrainJobs, their starts waiting")
    for _ in range(10):
        assert len(await made(scene)) == STARTS_IN_FLIGHT
        await asyncio.sleep(0.1)
    return names


async def test_a_burst_of_creations_starts_at_most_starts_in_flight_at_once(
    garbage_collector: None,
    scene: Scene,
    kube_api: client.ApiClient,
    operator: Path,
    operator_memo: kopf.Memo,
) -> None:
    """Once Kueue plays again, every DispatchJob of the burst starts."""
    await kueue_adapter(scene, kube_api)
    burst = [f"burst{index}" for index in range(STARTS_IN_FLIGHT + 10)]
    await asyncio.gather(*(scene.create_job(name) for name in burst))
    await starts_in_flight_full(scene)
    samples = await scrape(operator_memo.metrics_port)
    assert sample(samples, "dispatch_kubeflow_starts_pending") == len(burst)

    async def none_pending() -> bool:
        samples = await scrape(operator_memo.metrics_port)
        return sample(samples, "dispatch_kubeflow_starts_pending") == 0

    async with kueue_stand_in(kube_api, scene.namespace):
        for name in burst:
            started = await scene.job_in_state(name, "Pending")
            assert started["status"]["trainJob"] == f"{name}-1"
        # Each start ends once Kueue has made its Workload.
        await eventually(none_pending, "no start pending")
    assert sorted(await made(scene)) == sorted(f"{name}-1" for name in burst)


def handed_over(body: dict[str, Any] | None) -> bool:
    """Whether the DispatchJob's start is handed over: the stop finalizer goes on just before."""
    return STOP_FINALIZER in (((body or {}).get("metadata") or {}).get("finalizers") or [])


async def test_starts_queued_when_the_operator_stops_are_made_by_the_next_one(
    garbage_collector: None,
    cluster: Any,
    scene: Scene,
    kube_api: client.ApiClient,
    tmp_path: Path,
) -> None:
    """A start handed over is kept nowhere but in the operator, and kopf writes nothing to mark
    the creation handled. The next operator finds the jobs never started by their status and
    starts them, each once (the starts that were in flight made their TrainJobs)."""
    events = tmp_path / "events.jsonl"
    burst = [f"queued{index}" for index in range(STARTS_IN_FLIGHT + 10)]
    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        await kueue_adapter(scene, kube_api)
        await asyncio.gather(*(scene.create_job(name) for name in burst))
        in_flight = await starts_in_flight_full(scene)

        async def all_handed_over() -> bool:
            bodies = [await scene.job(name) for name in burst]
            return all(handed_over(body) for body in bodies)

        await eventually(all_handed_over, "every start handed over")

    never = [name for name in burst if f"{name}-1" not in in_flight]
    assert len(never) == 10
    for name in never:
        body = await scene.job(name)
        assert body is not None
        assert (body.get("status") or {}).get("attempt") is None
    assert sorted(await made(scene)) == sorted(in_flight)

    async with (
        kueue_stand_in(kube_api, scene.namespace),
        running_operator(cluster.kubeconfig, [scene.namespace], events),
    ):
        for name in burst:
            started = await scene.job_in_state(name, "Pending")
            assert started["status"]["attempt"] == 1
            assert started["status"]["trainJob"] == f"{name}-1"
    assert sorted(await made(scene)) == sorted(f"{name}-1" for name in burst)


async def test_deleting_a_job_whose_start_is_queued_or_in_flight_leaves_nothing_of_it(
    garbage_collector: None, scene: Scene, kube_api: client.ApiClient, operator: Path
) -> None:
    """kopf no longer runs a job's deletion after its start: the deletion withdraws the start.
    A queued start never runs; one in flight is cancelled and its TrainJob deleted."""
    await kueue_adapter(scene, kube_api)
    burst = [f"gone{index}" for index in range(STARTS_IN_FLIGHT + 5)]
    await asyncio.gather(*(scene.create_job(name) for name in burst))
    in_flight = await starts_in_flight_full(scene)
    flying = next(name for name in burst if f"{name}-1" in in_flight)
    queued = next(name for name in burst if f"{name}-1" not in in_flight)
    deleted = [flying, queued]

    for name in deleted:
        await scene.objects.delete_namespaced_custom_object(
            GROUP, VERSION, scene.namespace, "dispatchjobs", name
        )
    for name in deleted:

        async def gone(name: str = name) -> bool:
            return await scene.job(name) is None

        await eventually(gone, f"DispatchJob {name} to go (its finalizer released)")
    assert await scene.trainjob(f"{flying}-1") is None

    kept = [name for name in burst if name not in deleted]
    async with kueue_stand_in(kube_api, scene.namespace):
        for name in kept:
            await scene.job_in_state(name, "Pending")
    # Nothing of a deleted job was made after its deletion, even once the others all started.
    assert sorted(await made(scene)) == sorted(f"{name}-1" for name in kept)


async def test_an_attempt_raised_while_no_operator_runs_starts_under_the_next_one(
    cluster: Any, scene: Scene, tmp_path: Path
) -> None:
    """kopf keeps no last-handled spec on the job: the next operator finds the raise by the
    attempt its status records, and starts attempt 2 (attempt 1 is not started again)."""
    events = tmp_path / "events.jsonl"
    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        await scene.apply_adapter(scene.adapter_spec())
        await scene.ready_adapter()
        await scene.create_job("later")
        await scene.job_in_state("later", "Pending")
        await scene.play_deadline_exceeded("later-1")
        await scene.job_in_state("later", "Failed", "Timeout")
    before = await scene.job("later")
    assert before is not None
    assert not [k for k in before["metadata"].get("annotations") or {} if k.startswith(GROUP)]

    await raise_attempt(scene, "later", 2)
    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        second = await scene.job_in_state("later", "Pending")
        assert second["status"]["attempt"] == 2
        assert second["status"]["trainJob"] == "later-2"
        assert await scene.trainjob("later-2") is not None
    assert [e["attempt"] for e in second["status"]["events"]].count(1) == len(
        before["status"]["events"]
    )
