"""End to end: the upstream reasons the reason table maps, produced by the real controllers.

Each scenario makes a real component write one reason (kube-controller-manager's pod GC for a
deleted node, kube-apiserver's Eviction API for a drain, Kueue for a missing LocalQueue and for a
stopped ClusterQueue, the kubelet (KWOK) for an OOMKilled container that exited 0 and for a pod it
refused) and checks the cause the adapter reports for it, and that no transition was reported
twice. The Kueue scenarios run under each Kueue configuration (``kueue_configuration``).
"""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio import client

from dispatch_kubeflow.constants import Cause, EventType, State
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fullstack.stack import FullStack
from tests.fullstack.kube import wait_for
from tests.fullstack.scenarios import job, open_adapter, settings

pytestmark = pytest.mark.timeout(600)


def _plain(cluster: ControlPlane, namespace: str) -> str:
    return settings(cluster.kubeconfig, namespace)


def _kueue(cluster: ControlPlane, namespace: str, local_queue: str = "lq") -> str:
    return settings(cluster.kubeconfig, namespace, {"localQueue": local_queue})


async def test_node_deleted_under_a_running_rank_is_node_lost(
    fullstack: FullStack, cluster: ControlPlane, namespace: str
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        await adapter.start(job("orphan", outcome="hang"))
        await log.wait_for(
            lambda e: e.job == "orphan" and e.type == EventType.RUNNING, 90, "orphan running"
        )
        (pod,) = (await adapter.find("orphan")).current.pods
        node = pod["spec"]["nodeName"]
        await asyncio.to_thread(fullstack.delete_node, node)
        try:
            lost = await log.wait_for(
                lambda e: e.job == "orphan" and e.cause == Cause.NODE_LOST,
                60,
                "NodeLost for orphan once its node is deleted",
            )
            # The pod GC fails the orphaned pod after its 40 s quarantine; the Job then fails.
            finished = await log.finished("orphan", 240)
        finally:
            await asyncio.to_thread(fullstack.restore_node, node)

    assert lost.type == EventType.NODE_LOST
    assert any(e.kind == "Node" and e.name == node for e in lost.evidence)
    assert (finished.state, finished.cause) == (State.FAILED, Cause.NODE_LOST)
    log.assert_exactly_once("orphan")


async def test_rank_evicted_through_the_eviction_api_is_preempted(
    fullstack: FullStack, cluster: ControlPlane, namespace: str, kube_api: client.ApiClient
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        await adapter.start(job("drained", outcome="hang"))
        await log.wait_for(
            lambda e: e.job == "drained" and e.type == EventType.RUNNING, 90, "drained running"
        )
        (pod,) = (await adapter.find("drained")).current.pods
        name = pod["metadata"]["name"]
        # What `kubectl drain` does for every pod of the node.
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        await client.CoreV1Api(kube_api).create_namespaced_pod_eviction(name, namespace, eviction)
        finished = await log.finished("drained")

    assert (finished.state, finished.cause) == (State.FAILED, Cause.PREEMPTED)
    assert any(
        (e.kind, e.type, e.reason) == ("Pod", "DisruptionTarget", "EvictionByEvictionAPI")
        for e in finished.evidence
    )
    log.assert_exactly_once("drained")


async def test_job_of_a_missing_local_queue_is_a_config_error(
    fullstack: FullStack, cluster: ControlPlane, namespace: str, kueue_configuration: str
) -> None:
    async with open_adapter(_kueue(cluster, namespace, "no-such-queue"), "fs") as (adapter, log):
        await adapter.start(job("misrouted"))
        pending = await log.wait_for(
            lambda e: e.job == "misrouted" and e.cause == Cause.CONFIG_ERROR,
            60,
            "ConfigError for misrouted",
        )
        found = await adapter.find("misrouted")
        await adapter.stop_job("misrouted")

    assert pending.state == State.PENDING
    assert "LocalQueue no-such-queue doesn't exist" in pending.message
    assert (
        pending.reason
        == {
            "observability-off": "Inadmissible",
            "observability-on": "Misconfigured",
        }[kueue_configuration]
    )
    assert any((e.kind, e.type) == ("Workload", "QuotaReserved") for e in pending.evidence)
    assert (found.state, found.cause) == (State.PENDING, Cause.CONFIG_ERROR)
    log.assert_exactly_once("misrouted")


async def test_cluster_queue_stopped_under_a_running_job_is_stopped(
    fullstack: FullStack, cluster: ControlPlane, namespace: str, queues: str
) -> None:
    async with open_adapter(_kueue(cluster, namespace, queues), "fs") as (adapter, log):
        await adapter.start(job("held", outcome="hang"))
        await log.wait_for(
            lambda e: e.job == "held" and e.type == EventType.RUNNING, 90, "held running"
        )
        await asyncio.to_thread(fullstack.stop_cluster_queue, namespace)
        evicted = await log.wait_for(
            lambda e: e.job == "held" and e.type == EventType.EVICTED, 90, "held evicted"
        )
        # Kueue drains it: the TrainJob is suspended and its pods go; it waits for the queue.
        drained = await wait_for(
            lambda: adapter.find("held"),
            lambda f: f.state == State.PENDING and not f.current.pods,
            90,
            "held drained and pending",
        )
        await adapter.stop_job("held")

    assert (evicted.cause, evicted.reason) == (Cause.STOPPED, "ClusterQueueStopped")
    assert drained.cause == Cause.STOPPED
    log.assert_exactly_once("held")


async def test_ranks_that_succeed_reporting_oom_killed_with_exit_zero_succeed(
    fullstack: FullStack, cluster: ControlPlane, namespace: str
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        # kubernetes/kubernetes#116042: the kubelet can say OOMKilled of a container that
        # exited 0 (a sibling process in its cgroup was killed).
        await adapter.start(job("spared", reason="OOMKilled", num_nodes=2))
        finished = await log.finished("spared")
        found = await adapter.find("spared")

    terminated = [
        status["state"]["terminated"]
        for pod in found.current.pods
        for status in pod["status"]["containerStatuses"]
    ]
    assert {(t["reason"], t["exitCode"]) for t in terminated} == {("OOMKilled", 0)}
    assert (finished.state, finished.cause) == (State.SUCCEEDED, None)
    assert all(e.cause is None for e in log.of("spared"))
    log.assert_exactly_once("spared")


async def test_pod_the_kubelet_refuses_at_admission_is_node_lost(
    fullstack: FullStack, cluster: ControlPlane, namespace: str
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        await adapter.start(job("refused", outcome="refuse"))
        finished = await log.finished("refused")

    assert (finished.state, finished.cause) == (State.FAILED, Cause.NODE_LOST)
    assert finished.reason == "UnexpectedAdmissionError"
    assert any(
        (e.kind, e.field, e.reason) == ("Pod", "status.reason", "UnexpectedAdmissionError")
        for e in finished.evidence
    )
    log.assert_exactly_once("refused")
