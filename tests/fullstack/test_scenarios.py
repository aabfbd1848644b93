"""End to end: dispatch jobs through the adapter on the real Trainer, JobSet and Kueue controllers.

Nothing here writes a status: Trainer, JobSet, the Job controller, kube-scheduler, Kueue and the
node-lifecycle controller write every condition, and KWOK (the kubelet of the simulated nodes)
ends each rank the way its environment asks. Each scenario checks the job's state, cause and
events, and that no transition was reported twice.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from dispatch_kubeflow.adapter import AdapterConfig
from dispatch_kubeflow.admission.controller import AdmissionConfig, run_admission
from dispatch_kubeflow.constants import (
    API_VERSION,
    GROUP,
    KUBEFLOW_ADAPTER_KIND,
    KUBEFLOW_ADAPTERS,
    VERSION,
    Cause,
    EventType,
    State,
)
from dispatch_kubeflow.settings import Cluster, parse_settings
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fullstack.stack import ADMISSION_CHECK, FullStack
from tests.fullstack.kube import wait_for
from tests.fullstack.scenarios import job, open_adapter, settings

RESULT = '{"loss": 0.031, "checkpoint": "s3://bucket/run-7/step-900"}'


def _plain(cluster: ControlPlane, namespace: str) -> str:
    return settings(cluster.kubeconfig, namespace)


def _kueue(cluster: ControlPlane, namespace: str, priority: str, gated: bool = False) -> str:
    kueue: dict[str, object] = {"localQueue": "lq", "priorityClass": priority}
    if gated:
        kueue["admissionCheck"] = ADMISSION_CHECK
        kueue["admissionLease"] = {"namespace": namespace, "name": "dispatch-admission"}
    return settings(cluster.kubeconfig, namespace, kueue)


async def test_job_succeeds_with_its_published_result(
    fullstack: FullStack, cluster: ControlPlane, namespace: str
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        await adapter.start(job("train", published=RESULT, num_nodes=2, gpus_per_node=4))
        finished = await log.finished("train")
        found = await adapter.find("train")

    assert (finished.state, finished.cause) == (State.SUCCEEDED, None)
    assert finished.result == json.loads(RESULT)
    assert (found.state, found.result) == (State.SUCCEEDED, json.loads(RESULT))
    types = [e.type for e in log.of("train")]
    assert types.index(EventType.SUBMITTED) < types.index(EventType.RUNNING)
    assert types.index(EventType.RUNNING) < types.index(EventType.FINISHED)
    log.assert_exactly_once("train")


async def test_rank_exiting_non_zero_is_a_program_error(
    fullstack: FullStack, cluster: ControlPlane, namespace: str
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        await adapter.start(job("crash", outcome="fail", exit_code=3, num_nodes=2))
        finished = await log.finished("crash")

    assert (finished.state, finished.cause) == (State.FAILED, Cause.PROGRAM_ERROR)
    assert any(e.exit_code == 3 for e in finished.evidence)
    log.assert_exactly_once("crash")


async def test_oom_killed_rank_is_out_of_memory(
    fullstack: FullStack, cluster: ControlPlane, namespace: str
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        await adapter.start(job("oom", outcome="fail", exit_code=137, reason="OOMKilled"))
        finished = await log.finished("oom")

    assert (finished.state, finished.cause) == (State.FAILED, Cause.OUT_OF_MEMORY)
    assert any(e.reason == "OOMKilled" for e in finished.evidence)
    log.assert_exactly_once("oom")


async def test_job_past_its_active_deadline_times_out(
    fullstack: FullStack, cluster: ControlPlane, namespace: str
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        await adapter.start(job("slow", outcome="hang", active_deadline_seconds=5))
        finished = await log.finished("slow")

    assert (finished.state, finished.cause) == (State.FAILED, Cause.TIMEOUT)
    assert finished.reason == "DeadlineExceeded"
    log.assert_exactly_once("slow")


async def test_job_no_node_can_hold_is_pending_for_lack_of_capacity(
    fullstack: FullStack, cluster: ControlPlane, namespace: str
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        # Every simulated node has 8 GPUs; kube-scheduler finds none for 16.
        await adapter.start(job("huge", gpus_per_node=16))
        found = await wait_for(
            lambda: adapter.find("huge"),
            lambda f: f.cause == Cause.NO_CAPACITY,
            60.0,
            "find() to report NoCapacity for huge",
        )
        await adapter.stop_job("huge")

    assert found.state == State.PENDING
    assert any(
        e.kind == "Pod" and e.reason == "Unschedulable" for e in found.current.status.evidence
    )
    assert not any(e.type == EventType.RUNNING for e in log.of("huge"))
    log.assert_exactly_once("huge")


async def test_job_over_quota_is_pending_for_lack_of_capacity(
    fullstack: FullStack, cluster: ControlPlane, namespace: str, queues: str
) -> None:
    async with open_adapter(_kueue(cluster, namespace, "low"), "fs") as (adapter, log):
        # 2 nodes x 8 GPUs against a ClusterQueue with 8.
        await adapter.start(job("big", num_nodes=2, gpus_per_node=8))
        pending = await log.wait_for(
            lambda e: e.job == "big" and e.cause == Cause.NO_CAPACITY, 30.0, "NoCapacity for big"
        )
        found = await adapter.find("big")

    assert pending.state == State.PENDING
    # Kueue's own words, verbatim, with its Workload condition as the evidence.
    assert "insufficient quota" in pending.message
    assert any(
        (e.kind, e.type, e.status, e.reason, e.message)
        == ("Workload", "QuotaReserved", "False", pending.reason, pending.message)
        for e in pending.evidence
    )
    assert (found.state, found.cause) == (State.PENDING, Cause.NO_CAPACITY)
    assert not any(e.type == EventType.RUNNING for e in log.of("big"))
    log.assert_exactly_once("big")


async def test_preempted_job_waits_at_the_gate_and_is_readmitted(
    fullstack: FullStack,
    cluster: ControlPlane,
    namespace: str,
    kueue_configuration: str,
    kube_api: client.ApiClient,
) -> None:
    fullstack.create_queues(namespace, gpus=8, admission_check=True)
    low_settings = _kueue(cluster, namespace, "low", gated=True)
    high_settings = _kueue(cluster, namespace, "high", gated=True)
    # The KubeflowAdapter that tells the admission controller this namespace is dispatch's.
    objects: Any = client.CustomObjectsApi(kube_api)  # takes a plain dict as the body
    await objects.create_namespaced_custom_object(
        GROUP,
        VERSION,
        namespace,
        KUBEFLOW_ADAPTERS,
        {
            "apiVersion": API_VERSION,
            "kind": KUBEFLOW_ADAPTER_KIND,
            "metadata": {"name": "low"},
            "spec": json.loads(low_settings),
        },
    )
    gate = AdmissionConfig(
        check=ADMISSION_CHECK,
        lease_namespace=namespace,
        lease_name="dispatch-admission",
        identity="fullstack",
    )
    admission = asyncio.create_task(
        run_admission(gate, cluster=Cluster(kubeconfig=str(cluster.kubeconfig)))
    )
    try:
        async with (
            open_adapter(low_settings, "low") as (low, low_log),
            open_adapter(high_settings, "high") as (high, high_log),
        ):
            await low.start(job("low", outcome="hang", num_nodes=2, gpus_per_node=4))
            await low_log.wait_for(
                lambda e: e.job == "low" and e.type == EventType.RUNNING, 90.0, "low running"
            )
            await high.start(job("high", seconds=5, num_nodes=1, gpus_per_node=8))
            evicted = await low_log.wait_for(
                lambda e: e.job == "low" and e.type == EventType.EVICTED, 90.0, "low evicted"
            )
            # The high job finishes and frees the quota; the gate still holds the low one.
            await high_log.finished("high")
            held = await low.find("low")
            await low.readmit("low")
            readmitted = await low_log.wait_for(
                lambda e: e.job == "low" and e.type == EventType.RUNNING and e.time > evicted.time,
                120.0,
                "low running again after readmit",
            )
    finally:
        admission.cancel()
        await asyncio.gather(admission, return_exceptions=True)
        fullstack.delete_queues(namespace)

    assert evicted.cause == Cause.PREEMPTED
    assert held.state == State.PENDING
    (check,) = held.current.workload["status"]["admissionChecks"]  # type: ignore[index]
    assert (check["name"], check["state"]) == (ADMISSION_CHECK, "Pending")
    assert readmitted.state == State.RUNNING
    low_log.assert_exactly_once("low")


async def test_node_lost_is_reported_before_the_pod_is_evicted(
    fullstack: FullStack, cluster: ControlPlane, namespace: str, kube_api: client.ApiClient
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        await adapter.start(job("lost", outcome="hang"))
        await log.wait_for(lambda e: e.job == "lost" and e.type == EventType.RUNNING, 90, "running")
        (pod,) = (await adapter.find("lost")).current.pods
        node = pod["spec"]["nodeName"]
        fullstack.stop_heartbeats(node)
        try:
            lost = await log.wait_for(
                # nodeLossWindow is 5m; the taint comes after node-monitor-grace-period (50 s).
                lambda e: e.job == "lost" and e.cause == Cause.NODE_LOST,
                300.0,
                "NodeLost for lost",
            )
            still_there = await client.CoreV1Api(kube_api).read_namespaced_pod(
                pod["metadata"]["name"], namespace
            )
        finally:
            fullstack.resume_heartbeats(node)
            await adapter.stop_job("lost")

    assert lost.type == EventType.NODE_LOST
    assert any(e.node == node for e in lost.evidence)
    assert still_there.metadata.deletion_timestamp is None
    log.assert_exactly_once("lost")


async def test_events_survive_an_apiserver_restart_mid_job(
    fullstack: FullStack, cluster: ControlPlane, namespace: str
) -> None:
    async with open_adapter(_plain(cluster, namespace), "fs") as (adapter, log):
        await adapter.start(job("steady", seconds=20, published=RESULT))
        await log.wait_for(lambda e: e.job == "steady" and e.type == EventType.RUNNING, 90, "run")
        await asyncio.to_thread(cluster.restart_apiserver)
        finished = await log.finished("steady")

    assert (finished.state, finished.result) == (State.SUCCEEDED, json.loads(RESULT))
    log.assert_exactly_once("steady")


def test_settings_helper_matches_the_parser(tmp_path: Path) -> None:
    """The scenarios' settings are ones the adapter accepts (no cluster needed)."""
    parsed = parse_settings(settings(tmp_path / "kubeconfig", "team-a", {"localQueue": "lq"}))
    AdapterConfig(settings=parsed)
    assert parsed.namespace == "team-a"


pytestmark = pytest.mark.timeout(600)
