"""Small helpers the full-stack tests share: TrainJob bodies and waiting on real controllers.

The controllers under test run in other processes at their own pace, so a test waits for what
they write by reading it back until a deadline, and fails with the last object it saw.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.cluster.fullstack.stack import EXAMPLE_RUNTIME_NAME

T = TypeVar("T")
TRAINER = ("trainer.kubeflow.org", "v1alpha1", "trainjobs")
JOBSET = ("jobset.x-k8s.io", "v1alpha2", "jobsets")
WORKLOAD = ("kueue.x-k8s.io", "v1beta2", "workloads")
POLL_INTERVAL = 0.25


async def wait_for(
    read: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    seconds: float,
    what: str,
) -> T:
    """Read until `done(value)`; past `seconds` fail with `what` and the last value."""
    deadline = time.monotonic() + seconds
    last: T | None = None
    while True:
        try:
            last = await read()
        except ApiException as error:
            if error.status != 404:
                raise
        else:
            if done(last):
                return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {seconds:.0f} s waiting for {what}; last seen: {last}"
            )
        await asyncio.sleep(POLL_INTERVAL)


def condition(obj: Mapping[str, Any] | None, kind: str) -> Mapping[str, Any] | None:
    for item in (obj or {}).get("status", {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return None


def is_true(obj: Mapping[str, Any] | None, kind: str) -> bool:
    found = condition(obj, kind)
    return found is not None and found.get("status") == "True"


def trainjob(
    name: str,
    env: Mapping[str, str] | None = None,
    num_nodes: int = 1,
    gpus: int = 1,
    labels: Mapping[str, str] | None = None,
    active_deadline_seconds: int | None = None,
) -> dict[str, Any]:
    """A TrainJob on the example runtime whose simulated ranks follow `env` (kwok-stages.yaml)."""
    spec: dict[str, Any] = {
        "runtimeRef": {"name": EXAMPLE_RUNTIME_NAME},
        "trainer": {
            "numNodes": num_nodes,
            "env": [{"name": key, "value": value} for key, value in (env or {}).items()],
            "resourcesPerNode": {"limits": {"nvidia.com/gpu": str(gpus)}},
        },
    }
    if active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = active_deadline_seconds
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": dict(labels or {})},
        "spec": spec,
    }


class Kube:
    """Reads and writes of the objects the scenarios look at, for one namespace."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    async def create(self, resource: tuple[str, str, str], body: dict[str, Any]) -> dict[str, Any]:
        group, version, plural = resource
        created: dict[str, Any] = await self.custom.create_namespaced_custom_object(
            group, version, self.namespace, plural, body
        )
        return created

    async def get(self, resource: tuple[str, str, str], name: str) -> dict[str, Any]:
        group, version, plural = resource
        found: dict[str, Any] = await self.custom.get_namespaced_custom_object(
            group, version, self.namespace, plural, name
        )
        return found

    async def list_objects(
        self, resource: tuple[str, str, str], selector: str = ""
    ) -> list[dict[str, Any]]:
        group, version, plural = resource
        found = await self.custom.list_namespaced_custom_object(
            group, version, self.namespace, plural, label_selector=selector
        )
        items: list[dict[str, Any]] = found.get("items", [])
        return items

    async def pods(self, selector: str = "") -> list[Any]:
        found = await self.core.list_namespaced_pod(self.namespace, label_selector=selector)
        return list(found.items)

    async def workload_of(self, trainjob_uid: str) -> dict[str, Any] | None:
        items = await self.list_objects(WORKLOAD, f"kueue.x-k8s.io/job-uid={trainjob_uid}")
        return items[0] if items else None
