"""What a job writes, or Kueue decides, never silences the watch or leaves a bare failure.

Issue 12, items 9, 10, 15 and 16, on the real kube-apiserver with the test playing the missing
controllers (``test_watching``'s ``World``) or calling ``start`` through an open adapter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from dispatch_kubeflow import constants
from dispatch_kubeflow.adapter import Adapter, AdapterConfig
from dispatch_kubeflow.clock import ManualClock
from dispatch_kubeflow.constants import Cause, EventType, State
from dispatch_kubeflow.errors import ErrInvalid
from dispatch_kubeflow.supervisor import Supervisor
from dispatch_kubeflow.trainjob import JobSpec, build_trainjob
from tests.cluster.controlplane import ControlPlane
from tests.integration.test_adapter import (
    create_runtime,
    example_runtime,
    list_trainjobs,
    raises,
    settings_for,
)
from tests.integration.test_watching import (
    ADAPTER,
    T0,
    Watcher,
    World,
    cond,
    make_settings,
    running,
    terminated,
    world,
)

__all__ = ["world"]  # the fixture this module uses from test_watching

DEEP = "[" * 2000 + "]" * 2000


@pytest.fixture
async def watcher(kube_api: client.ApiClient, namespace: str) -> AsyncIterator[Watcher]:
    supervisor = Supervisor(kube_api, make_settings(namespace), ADAPTER, clock=ManualClock(T0))
    w = Watcher(supervisor).start()
    try:
        yield w
    finally:
        await w.stop()


async def test_item9_a_termination_message_nested_2000_deep_stops_no_job(
    world: World, watcher: Watcher
) -> None:
    await world.trainjob("deep")
    await world.pod("deep", "deep-1-node-0-0")
    await world.pod_status("deep-1-node-0-0", phase="Running", containerStatuses=[running()])
    await watcher.wait_event("deep", EventType.RUNNING)
    await world.pod_status(
        "deep-1-node-0-0", phase="Failed", containerStatuses=[terminated(1, "Error", DEEP)]
    )
    await world.trainjob_status("deep", conditions=[cond("Failed", reason="FailedJobs")])

    # Another job's events still arrive, after the deep message was read and before.
    await world.trainjob("other")
    await world.pod("other", "other-1-node-0-0")
    await world.pod_status("other-1-node-0-0", phase="Running", containerStatuses=[running()])
    await watcher.wait_event("other", EventType.RUNNING)

    finished = await watcher.wait_event("deep", EventType.FINISHED)
    assert (finished.state, finished.cause, finished.result) == (
        State.FAILED,
        Cause.PROGRAM_ERROR,
        None,
    )
    assert finished.evidence[0].message == DEEP


async def test_item10_a_workload_deactivated_for_an_unknown_reason_fails_with_a_cause(
    world: World, watcher: Watcher
) -> None:
    tj = await world.trainjob("off", suspend=True)
    wl = await world.workload(tj)
    await watcher.wait_event("off", EventType.SUBMITTED)
    await world.workload_spec(wl, active=False)
    await world.workload_status(
        wl,
        conditions=[
            cond("QuotaReserved", "False", reason="Pending"),
            cond("Evicted", reason="DeactivatedDueToSomethingNew", message="a new Kueue cause"),
        ],
    )
    finished = await watcher.wait_event("off", EventType.FINISHED)
    assert (finished.state, finished.cause) == (State.FAILED, Cause.STOPPED)
    assert (finished.reason, finished.message) == (
        "DeactivatedDueToSomethingNew",
        "a new Kueue cause",
    )
    assert finished.evidence[0].kind == constants.KIND_WORKLOAD


async def test_item16_the_probe_trainjob_is_not_watched_as_a_job(
    world: World, watcher: Watcher, namespace: str
) -> None:
    settings = make_settings(namespace)
    probe = JobSpec(job_id=f"{constants.PROBE_JOB_PREFIX}0a1b2c3d", runtime=settings.probe_runtime)
    body: dict[str, Any] = build_trainjob(
        probe,
        settings,
        ADAPTER,
        suspend=True,
        extra_labels={constants.LABEL_PROBE: "true"},
    )
    await world.custom.create_namespaced_custom_object(body=body, **world._tj)
    pod_labels = {**body["metadata"]["labels"], constants.LABEL_RESTART_ATTEMPT: "0"}
    await world.core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "probe-pod", "labels": pod_labels},
            "spec": {"containers": [{"name": "node", "image": "busybox:1.37"}]},
        },
    )
    await watcher.settle(world, "before")
    await world.custom.delete_namespaced_custom_object(name=body["metadata"]["name"], **world._tj)
    await watcher.settle(world, "after")
    assert watcher.of(probe.job_id) == []


@pytest.fixture
async def adapter(cluster: ControlPlane, namespace: str, kube_api: client.ApiClient) -> Any:
    await create_runtime(kube_api, namespace, example_runtime())
    async with await Adapter.open(AdapterConfig(settings=settings_for(cluster, namespace))) as a:
        yield a


async def test_item15_start_refuses_an_id_whose_pod_names_jobset_would_refuse(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str
) -> None:
    # <id>-1-node-0-<rank>-abcde: 46 characters of id fit with ranks 0..9, not with rank 10.
    fits, too_long = "f" * 46, "t" * 46
    await adapter.start(JobSpec(job_id=fits, num_nodes=10))
    message = await raises(ErrInvalid, adapter.start(JobSpec(job_id=too_long, num_nodes=11)))
    assert "at most 63" in message
    assert f"{too_long}-1-node-0-10-abcde" in message
    names = [t["metadata"]["name"] for t in await list_trainjobs(kube_api, namespace)]
    assert names == [f"{fits}-1"]
