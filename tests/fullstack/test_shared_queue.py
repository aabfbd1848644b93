"""Kueue as platforms run it: two teams and a third namespace on one ClusterQueue, one gate.

The real Trainer, JobSet and Kueue controllers and KWOK nodes run underneath; the operator serves
two KubeflowAdapters (team low and team high, each in its own namespace, priorities low and high)
and two `dispatch-kubeflow admission` processes (one leading, one standing by) control the one
AdmissionCheck the shared ClusterQueue lists. A third namespace, served by no adapter, runs a
plain TrainJob in the same ClusterQueue. The test only creates resources, patches one spec field
and kills a process, as a platform team would; everything it checks is read back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
from kubernetes_asyncio import client

from dispatch_kubeflow.constants import (
    GROUP,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_QUEUE_NAME,
    MERGE_PATCH,
    TRAINER_GROUP,
    TRAINER_VERSION,
    VERSION,
)
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fullstack.stack import ADMISSION_CHECK, EXAMPLE_RUNTIME_NAME, FullStack
from tests.fullstack.test_operator_scenarios import _operator
from tests.integration.test_operator import eventually

LEASE = "dispatch-admission"
WAIT = 150.0


def adapter(namespace: str, name: str, priority: str, lease_namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "KubeflowAdapter",
        "metadata": {"name": name},
        "spec": {
            "namespace": namespace,
            "runtimes": [{"kind": "ClusterTrainingRuntime", "name": EXAMPLE_RUNTIME_NAME}],
            "timeouts": {"workload": "30s", "stopJob": "60s"},
            "kueue": {
                "localQueue": "lq",
                "priorityClass": priority,
                "admissionCheck": ADMISSION_CHECK,
                "admissionLease": {"namespace": lease_namespace, "name": LEASE},
            },
        },
    }


def dispatch_job(name: str, adapter_name: str, gpus: int, seconds: int, **spec: Any) -> Any:
    env = {"SIM_OUTCOME": "succeed", "SIM_DURATION": f"{seconds}s"}
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DispatchJob",
        "metadata": {"name": name},
        "spec": {
            "adapter": adapter_name,
            "numNodes": 1,
            "gpusPerNode": gpus,
            "env": [{"name": k, "value": v} for k, v in env.items()],
            **spec,
        },
    }


def plain_trainjob(name: str) -> dict[str, Any]:
    """A TrainJob no adapter knows, queued in the shared ClusterQueue."""
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {LABEL_QUEUE_NAME: "lq"}},
        "spec": {
            "runtimeRef": {"name": EXAMPLE_RUNTIME_NAME},
            "trainer": {
                "numNodes": 1,
                "env": [
                    {"name": "SIM_OUTCOME", "value": "succeed"},
                    {"name": "SIM_DURATION", "value": "1s"},
                ],
            },
        },
    }


@contextlib.asynccontextmanager
async def admission_replica(
    kubeconfig: Path, lease_namespace: str, identity: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    """One `dispatch-kubeflow admission` process; SIGKILLed (if still running) at the end."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatch_kubeflow.admission",
        "--kubeconfig",
        str(kubeconfig),
        "--admission-check",
        ADMISSION_CHECK,
        "--lease-namespace",
        lease_namespace,
        "--lease-name",
        LEASE,
        "--identity",
        identity,
        "--lease-duration=4",
        "--renew-deadline=3",
        "--retry-period=0.5",
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "KUBECONFIG": str(kubeconfig)},
    )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await process.wait()


class Platform:
    """Reads what a platform team looks at."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.objects: Any = client.CustomObjectsApi(api)

    async def create(self, namespace: str, plural: str, body: dict[str, Any]) -> None:
        group, version = (
            (TRAINER_GROUP, TRAINER_VERSION) if plural == "trainjobs" else (GROUP, VERSION)
        )
        await self.objects.create_namespaced_custom_object(group, version, namespace, plural, body)

    async def job(self, namespace: str, name: str) -> dict[str, Any]:
        body: dict[str, Any] = await self.objects.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "dispatchjobs", name
        )
        return body

    async def job_state(self, namespace: str, name: str, state: str) -> dict[str, Any]:
        async def reached() -> dict[str, Any] | None:
            status = (await self.job(namespace, name)).get("status") or {}
            return status if status.get("state") == state else None

        return await eventually(reached, f"{namespace}/{name} {state}", WAIT)

    async def admitted_condition(self, namespace: str, name: str) -> dict[str, Any]:
        status = (await self.job(namespace, name)).get("status") or {}
        return next(c for c in status.get("conditions", []) if c["type"] == "Admitted")

    async def event_types(self, namespace: str, name: str) -> list[str]:
        status = (await self.job(namespace, name)).get("status") or {}
        return [e["type"] for e in status.get("events") or []]

    async def kube_event_reasons(self, namespace: str, name: str) -> list[str]:
        listed = await client.CoreV1Api(self.api).list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        )
        return [e.reason for e in listed.items]

    async def lease_holder(self, namespace: str) -> str | None:
        try:
            lease = await client.CoordinationV1Api(self.api).read_namespaced_lease(LEASE, namespace)
        except client.exceptions.ApiException as error:
            if error.status == 404:
                return None
            raise
        holder: str | None = lease.spec.holder_identity
        return holder

    async def workloads(self, namespace: str) -> list[dict[str, Any]]:
        listed = await self.objects.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, namespace, "workloads"
        )
        items: list[dict[str, Any]] = listed["items"]
        return items


def condition_of(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next(
        (c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == kind), None
    )


async def test_two_teams_share_a_gated_cluster_queue_through_one_admission_controller(
    fullstack: FullStack,
    cluster: ControlPlane,
    namespace: str,
    kube_api: client.ApiClient,
    tmp_path: Path,
) -> None:
    low, high, plain = namespace, f"{namespace}-hi"[:63], f"{namespace}-pl"[:63]
    core = client.CoreV1Api(kube_api)
    for extra in (high, plain):
        await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=extra)))
    queue = fullstack.create_queues(low, gpus=8, admission_check=True, shared_with=[high, plain])
    platform = Platform(kube_api)
    try:
        async with (
            admission_replica(cluster.kubeconfig, low, "replica-a") as replica_a,
            admission_replica(cluster.kubeconfig, low, "replica-b") as replica_b,
            _operator(cluster.kubeconfig, [low, high], tmp_path / "events.jsonl", kopf.Memo()),
        ):
            await eventually(lambda: platform.lease_holder(low), "a leading replica", WAIT)
            await platform.create(low, "kubeflowadapters", adapter(low, "low", "low", low))
            await platform.create(high, "kubeflowadapters", adapter(high, "high", "high", low))

            # The plain TrainJob of the third namespace is no dispatch job: admitted at once.
            await platform.create(plain, "trainjobs", plain_trainjob("plain"))

            async def plain_admitted() -> dict[str, Any] | None:
                for workload in await platform.workloads(plain):
                    admitted = condition_of(workload, "Admitted")
                    if admitted and admitted["status"] == "True":
                        return workload
                return None

            # Not held: admitted without anyone readmitting it. Kueue does not always list the
            # ClusterQueue's check on the Workload before admitting it (observed: none listed
            # through admission and finish, or one listed and not yet Ready), so the check's
            # entry is read only where it says what this controller decided.
            workload = await eventually(plain_admitted, "the plain TrainJob admitted", WAIT)
            for check in workload["status"].get("admissionChecks") or []:
                assert check["state"] != "Rejected", check
                if check["state"] == "Ready" and check["name"] == ADMISSION_CHECK:
                    assert "not held by the readmission gate" in check["message"], check

            # Team low fills the quota; team high's job preempts both of its jobs.
            recovery = {"readmitOn": ["Preempted"], "backoff": "1s"}
            await platform.create(low, "dispatchjobs", dispatch_job("by-hand", "low", 4, 25))
            await platform.create(
                low, "dispatchjobs", dispatch_job("by-policy", "low", 4, 25, recovery=recovery)
            )
            await platform.job_state(low, "by-hand", "Running")
            await platform.job_state(low, "by-policy", "Running")
            await platform.create(high, "dispatchjobs", dispatch_job("urgent", "high", 8, 5))

            async def held() -> dict[str, Any] | None:
                admitted = await platform.admitted_condition(low, "by-hand")
                return admitted if admitted["reason"] == "HeldAtGate" else None

            held_condition = await eventually(held, "by-hand held at the gate", WAIT)
            assert "Preempted" in held_condition["message"]

            # The leading replica dies (no release): the standby takes over from its Lease.
            leader = await platform.lease_holder(low)
            dead = replica_a if leader == "replica-a" else replica_b
            dead.send_signal(signal.SIGKILL)
            await dead.wait()
            survivor = "replica-b" if leader == "replica-a" else "replica-a"

            async def taken_over() -> bool:
                return await platform.lease_holder(low) == survivor

            await eventually(taken_over, f"{survivor} to lead", WAIT)

            urgent = await platform.job_state(high, "urgent", "Succeeded")
            by_policy = await platform.job_state(low, "by-policy", "Succeeded")
            # Nobody touched by-hand: it still waits at the gate.
            assert (await platform.admitted_condition(low, "by-hand"))["reason"] == "HeldAtGate"

            await platform.objects.patch_namespaced_custom_object(
                GROUP,
                VERSION,
                low,
                "dispatchjobs",
                "by-hand",
                {"spec": {"readmit": 1}},
                _content_type=MERGE_PATCH,
            )
            by_hand = await platform.job_state(low, "by-hand", "Succeeded")

            by_policy_events = await platform.event_types(low, "by-policy")
            by_hand_events = await platform.event_types(low, "by-hand")
            policy_reasons = await platform.kube_event_reasons(low, "by-policy")
            hand_reasons = await platform.kube_event_reasons(low, "by-hand")
    finally:
        fullstack.delete_queues(queue)
        for extra in (high, plain):
            with contextlib.suppress(client.exceptions.ApiException):
                await core.delete_namespace(extra)

    assert urgent.get("cause") is None
    for status, events in ((by_policy, by_policy_events), (by_hand, by_hand_events)):
        assert status.get("cause") is None
        assert events.count("Evicted") == 1
        assert events[-1] == "Finished"
    assert [e["action"] for e in by_policy["recovery"]] == ["Readmitted"]
    assert [e["action"] for e in by_hand["recovery"]] == ["Readmitted"]
    assert "event" in by_policy["recovery"][0]  # decided by the policy, on that eviction
    assert "event" not in by_hand["recovery"][0]  # asked for through spec.readmit
    assert "Readmitted" in policy_reasons
    assert "Readmitted" in hand_reasons
