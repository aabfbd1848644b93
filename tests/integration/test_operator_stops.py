"""When the operator stops a deleted DispatchJob, on the real kube-apiserver.

A deletion hands the job's stop over to the operator's own tasks, a bounded number in flight, and
the operator's stop finalizer holds the DispatchJob until nothing of the job is left. The tests
hold the stops by a finalizer of their own on each TrainJob (the TrainJob cannot go, so the stop
waits for it), which they take off when the test lets the stops finish. The operator runs
in-process (``running_operator``) and the test plays Trainer, as in ``test_operator``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
from kubernetes_asyncio import client

from dispatch_kubeflow.constants import (
    FINALIZER,
    GROUP,
    LABEL_JOB,
    STOP_FINALIZER,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    VERSION,
)
from dispatch_kubeflow.handlers.handover import STARTS_IN_FLIGHT, STOPS_IN_FLIGHT
from dispatch_kubeflow.handlers.kube import change_finalizers, with_finalizer, without_finalizer
from tests.integration.test_adapter import garbage_collector
from tests.integration.test_operator import (
    ADAPTER,
    MERGE_PATCH,
    Scene,
    eventually,
    operator,
    operator_memo,
    running_operator,
    sample,
    scene,
    scrape,
)
from tests.integration.test_operator_starts import kueue_adapter, starts_in_flight_full

# fixtures used by the tests below
__all__ = ["garbage_collector", "operator", "operator_memo", "scene"]

HOLD = "test.dispatch.example/hold"
# Long enough that a held stop stays in flight for the whole test.
STOP_WITHIN = "300s"


async def trainjobs(scene: Scene) -> list[dict[str, Any]]:
    listed = await scene.objects.list_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, scene.namespace, TRAINJOBS, label_selector=LABEL_JOB
    )
    items: list[dict[str, Any]] = listed["items"]
    return items


async def set_trainjob_finalizers(scene: Scene, name: str, finalizers: list[str] | None) -> None:
    with contextlib.suppress(client.ApiException):  # gone already
        await scene.objects.patch_namespaced_custom_object(
            TRAINER_GROUP,
            TRAINER_VERSION,
            scene.namespace,
            TRAINJOBS,
            name,
            {"metadata": {"finalizers": finalizers}},
            _content_type=MERGE_PATCH,
        )


async def started_and_held(scene: Scene, names: list[str]) -> None:
    """Each job Pending, its TrainJob held by the test's finalizer."""
    await asyncio.gather(*(scene.create_job(name) for name in names))
    for name in names:
        await scene.job_in_state(name, "Pending")
        await set_trainjob_finalizers(scene, f"{name}-1", [HOLD])


async def delete_jobs(scene: Scene, names: list[str]) -> None:
    await asyncio.gather(
        *(
            scene.objects.delete_namespaced_custom_object(
                GROUP, VERSION, scene.namespace, "dispatchjobs", name
            )
            for name in names
        )
    )


async def stops_in_flight_full(scene: Scene) -> list[str]:
    """The TrainJobs the stops in flight have deleted, once the bound is reached, for a second.

    A stop past the bound would delete its TrainJob as soon as the first twenty did.
    """

    async def deleting() -> list[str]:
        return [
            item["metadata"]["name"]
            for item in await trainjobs(scene)
            if item["metadata"].get("deletionTimestamp")
        ]

    async def full() -> list[str] | None:
        names = await deleting()
        return names if len(names) >= STOPS_IN_FLIGHT else None

    names = await eventually(full, f"{STOPS_IN_FLIGHT} TrainJobs deleted, their stops waiting")
    for _ in range(10):
        assert len(await deleting()) == STOPS_IN_FLIGHT
        await asyncio.sleep(0.1)
    return names


@contextlib.asynccontextmanager
async def trainer_letting_go(scene: Scene) -> AsyncIterator[None]:
    """Take the test's finalizer off every TrainJob being deleted, until the block ends."""

    async def let_go() -> None:
        while True:
            for item in await trainjobs(scene):
                metadata = item["metadata"]
                if metadata.get("deletionTimestamp") and HOLD in (metadata.get("finalizers") or ()):
                    await set_trainjob_finalizers(scene, metadata["name"], None)
            await asyncio.sleep(0.2)

    task = asyncio.create_task(let_go())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def all_gone(scene: Scene, names: list[str]) -> None:
    async def gone() -> bool:
        return all([await scene.job(name) is None for name in names])

    await eventually(gone, "every deleted DispatchJob to go (its stop finalizer released)")
    left = [item["metadata"]["labels"][LABEL_JOB] for item in await trainjobs(scene)]
    assert set(left).isdisjoint(names), f"TrainJobs of deleted jobs left: {left}"


async def ready_plain_adapter(scene: Scene) -> None:
    await scene.apply_adapter(scene.adapter_spec(timeouts={"stopJob": STOP_WITHIN}))
    await scene.ready_adapter()


async def test_a_started_job_carries_the_stop_finalizer_alone(scene: Scene, operator: Path) -> None:
    """kopf's finalizer is not on a DispatchJob; the operator's own holds it from its start.
    kopf writes nothing to it either: the stop finalizer is the one write of its metadata."""
    await ready_plain_adapter(scene)
    await scene.create_job("held")
    started = await scene.job_in_state("held", "Pending")
    assert started["metadata"]["finalizers"] == [STOP_FINALIZER]
    annotations = started["metadata"].get("annotations") or {}
    assert not [key for key in annotations if key.startswith(f"{GROUP}/")]
    written = [
        (entry["manager"], entry.get("subresource"), sorted(entry["fieldsV1"]["f:metadata"]))
        for entry in started["metadata"]["managedFields"]
        if "f:metadata" in entry["fieldsV1"]
    ]
    assert written == [("OpenAPI-Generator", None, ["f:finalizers"])]


async def test_a_burst_of_deletions_stops_at_most_stops_in_flight_at_once(
    scene: Scene, operator: Path, operator_memo: kopf.Memo
) -> None:
    """Every deleted job stays, held, while its stop waits; once the TrainJobs can go, all go."""
    await ready_plain_adapter(scene)
    burst = [f"burst{index}" for index in range(STOPS_IN_FLIGHT + 10)]
    await started_and_held(scene, burst)

    await delete_jobs(scene, burst)
    await stops_in_flight_full(scene)
    samples = await scrape(operator_memo.metrics_port)
    assert sample(samples, "dispatch_kubeflow_stops_pending") == len(burst)
    for name in burst:
        body = await scene.job(name)
        assert body is not None, f"DispatchJob {name} went before its stop was done"
        assert body["metadata"]["finalizers"] == [STOP_FINALIZER]

    async def none_pending() -> bool:
        samples = await scrape(operator_memo.metrics_port)
        return sample(samples, "dispatch_kubeflow_stops_pending") == 0

    async with trainer_letting_go(scene):
        await all_gone(scene, burst)
        await eventually(none_pending, "no stop pending")


async def test_stops_left_when_the_operator_stops_are_done_by_the_next_one(
    cluster: Any, scene: Scene, tmp_path: Path
) -> None:
    """A stop is kept nowhere but in the operator: the deleted jobs stay held while none runs,
    and the next operator's first listing brings them back to be stopped."""
    events = tmp_path / "events.jsonl"
    burst = [f"left{index}" for index in range(STOPS_IN_FLIGHT + 5)]
    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        await ready_plain_adapter(scene)
        await started_and_held(scene, burst)
        await delete_jobs(scene, burst)
        await stops_in_flight_full(scene)

    for name in burst:
        body = await scene.job(name)
        assert body is not None, f"DispatchJob {name} went without its stop"
        assert body["metadata"]["deletionTimestamp"]
        assert body["metadata"]["finalizers"] == [STOP_FINALIZER]
    assert len(await trainjobs(scene)) == len(burst)

    async with (
        trainer_letting_go(scene),
        running_operator(cluster.kubeconfig, [scene.namespace], events),
    ):
        await all_gone(scene, burst)


async def held_by_kopf_alone(scene: Scene, name: str) -> None:
    """The job as an operator before the stop finalizer left it: kopf's finalizer alone."""
    await scene.objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        scene.namespace,
        "dispatchjobs",
        name,
        {"metadata": {"finalizers": [FINALIZER]}},
        _content_type=MERGE_PATCH,
    )


async def test_jobs_made_before_the_stop_finalizer_are_taken_over_or_stopped_as_before(
    cluster: Any, scene: Scene, tmp_path: Path
) -> None:
    """Upgrading the operator: a live job held by kopf's finalizer gets the stop finalizer, and
    kopf takes its own off; one deleted while no operator ran is stopped by kopf's handler."""
    events = tmp_path / "events.jsonl"
    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        await ready_plain_adapter(scene)
        await scene.create_job("kept")
        await scene.create_job("deleted")
        await scene.job_in_state("kept", "Pending")
        await scene.job_in_state("deleted", "Pending")
    for name in ("kept", "deleted"):
        await held_by_kopf_alone(scene, name)
    await delete_jobs(scene, ["deleted"])
    assert await scene.job("deleted") is not None  # held by kopf's finalizer

    async with running_operator(cluster.kubeconfig, [scene.namespace], events):

        async def taken_over() -> bool:
            body = await scene.job("kept")
            return body is not None and body["metadata"].get("finalizers") == [STOP_FINALIZER]

        await eventually(taken_over, "the live job to carry the stop finalizer alone")
        await all_gone(scene, ["deleted"])
        assert [item["metadata"]["name"] for item in await trainjobs(scene)] == ["kept-1"]

        await delete_jobs(scene, ["kept"])
        await all_gone(scene, ["kept"])


async def test_finalizer_writes_lose_no_finalizer_written_meanwhile(
    scene: Scene, kube_api: client.ApiClient
) -> None:
    """The stop finalizer goes on and comes off by JSON patches that test what they assume: a
    finalizer another writer put on meanwhile stays, and ours comes off where it has moved to."""
    await scene.create_job("shared")
    seen = await scene.job("shared")
    assert seen is not None

    async def finalizers() -> list[str]:
        body = await scene.job("shared")
        assert body is not None
        found: list[str] = body["metadata"].get("finalizers") or []
        return found

    async def set_finalizers(value: list[str]) -> None:
        await scene.objects.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            scene.namespace,
            "dispatchjobs",
            "shared",
            {"metadata": {"finalizers": value}},
            _content_type=MERGE_PATCH,
        )

    await set_finalizers([HOLD])  # after ``seen``: its resourceVersion is stale
    where = (kube_api, "dispatchjobs", scene.namespace, "shared")
    assert await change_finalizers(*where, with_finalizer(STOP_FINALIZER), known=seen)
    assert await finalizers() == [HOLD, STOP_FINALIZER]

    await set_finalizers(["a.example/first", HOLD, STOP_FINALIZER])  # ours moved from 1 to 2
    known = {"metadata": {"finalizers": [HOLD, STOP_FINALIZER]}}
    assert await change_finalizers(*where, without_finalizer(STOP_FINALIZER), known=known)
    assert await finalizers() == ["a.example/first", HOLD]

    await set_finalizers([])
    assert await change_finalizers(*where, without_finalizer(STOP_FINALIZER), known=known)
    await scene.objects.delete_namespaced_custom_object(
        GROUP, VERSION, scene.namespace, "dispatchjobs", "shared"
    )
    assert not await change_finalizers(*where, with_finalizer(STOP_FINALIZER))


async def test_a_queued_job_whose_adapter_was_deleted_is_released_without_a_stop(
    garbage_collector: None, scene: Scene, kube_api: client.ApiClient, operator: Path
) -> None:
    """A job held by the stop finalizer whose start never ran, and whose KubeflowAdapter is gone:
    nothing of it exists and nothing could stop it, so its deletion releases it at once."""
    await kueue_adapter(scene, kube_api)
    burst = [f"queued{index}" for index in range(STARTS_IN_FLIGHT + 1)]
    await asyncio.gather(*(scene.create_job(name) for name in burst))
    in_flight = await starts_in_flight_full(scene)
    queued = next(name for name in burst if f"{name}-1" not in in_flight)

    async def held() -> bool:
        body = await scene.job(queued)
        return body is not None and body["metadata"].get("finalizers") == [STOP_FINALIZER]

    await eventually(held, f"the queued job {queued} to carry the stop finalizer")
    await scene.objects.delete_namespaced_custom_object(
        GROUP, VERSION, scene.namespace, "kubeflowadapters", ADAPTER
    )

    async def adapter_gone() -> bool:
        listed = await scene.objects.list_namespaced_custom_object(
            GROUP, VERSION, scene.namespace, "kubeflowadapters"
        )
        return not listed["items"]

    await eventually(adapter_gone, "the KubeflowAdapter to go")
    await delete_jobs(scene, [queued])
    await all_gone(scene, [queued])
