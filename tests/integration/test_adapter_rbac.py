"""The adapter works with exactly the permissions the chart grants it, and those include no Secret.

The adapter runs as a restricted identity bound to a ClusterRole made of the chart's
``files/rbac-adapter*.yaml`` and nothing else, on the real kube-apiserver with RBAC enforced.
The test's own setup (runtimes, the objects controllers would make) runs as the admin.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.adapter import Adapter, AdapterConfig
from dispatch_kubeflow.errors import ErrNotFound
from dispatch_kubeflow.events import DispatchEvent
from dispatch_kubeflow.settings import Cluster, Kueue
from dispatch_kubeflow.trainjob import JobSpec
from tests.cluster.controlplane import ControlPlane
from tests.integration.rbac import chart_rules, user_with_rules
from tests.integration.test_adapter import (
    create_runtime,
    example_runtime,
    kueue_stand_in,
    make_jobset_and_pod,
    read_trainjob,
    settings_for,
    until,
)

# The adapter's rules, as the chart grants them serving every namespace.
CHART_RULES = chart_rules("adapter", "adapter-cluster", "adapter-lease")


@pytest.fixture
async def restricted_kubeconfig(
    cluster: ControlPlane, kube_api: client.ApiClient
) -> AsyncIterator[Path]:
    """A kubeconfig for a user that holds only the chart's adapter rules."""
    async with user_with_rules(cluster, kube_api, CHART_RULES, "dispatch-adapter") as kubeconfig:
        yield kubeconfig


@pytest.fixture
async def runtime(kube_api: client.ApiClient, namespace: str) -> None:
    await create_runtime(kube_api, namespace, example_runtime())


async def test_open_start_find_stop_job_with_the_chart_rules(
    cluster: ControlPlane,
    namespace: str,
    runtime: None,
    kube_api: client.ApiClient,
    restricted_kubeconfig: Path,
) -> None:
    cluster.start_controller_manager()
    s = settings_for(cluster, namespace, cluster=Cluster(kubeconfig=str(restricted_kubeconfig)))
    async with await Adapter.open(AdapterConfig(settings=s)) as adapter:
        await adapter.start(JobSpec(job_id="limited"))
        trainjob = await read_trainjob(kube_api, namespace, "limited-1")
        await make_jobset_and_pod(kube_api, namespace, trainjob)
        found = await adapter.find("limited")
        assert sorted(found.remaining()) == [
            "JobSet/limited-1",
            "Pod/limited-1-node-0-0",
            "TrainJob/limited-1",
        ]
        await adapter.stop_job("limited")
        with pytest.raises(ErrNotFound):
            await adapter.find("limited")


async def test_kueue_mode_and_the_gate_with_the_chart_rules(
    cluster: ControlPlane,
    namespace: str,
    runtime: None,
    kube_api: client.ApiClient,
    restricted_kubeconfig: Path,
) -> None:
    cluster.start_controller_manager()
    s = settings_for(
        cluster,
        namespace,
        cluster=Cluster(kubeconfig=str(restricted_kubeconfig)),
        kueue=Kueue(local_queue="lq", admission_check="gate"),
    )
    async with (
        kueue_stand_in(kube_api, namespace),
        await Adapter.open(AdapterConfig(settings=s)) as adapter,
    ):
        ref = await adapter.start(JobSpec(job_id="queued"))
        assert ref.workload is not None
        await adapter.readmit("queued")
        await adapter.reject("queued", "no more")
        assert (await adapter.find("queued")).current.workload is not None
        await adapter.stop_job("queued")


@contextlib.asynccontextmanager
async def watching_as(
    cluster: ControlPlane, namespace: str, kubeconfig: Path, job: str
) -> AsyncIterator[tuple[Adapter, AsyncGenerator[DispatchEvent, None]]]:
    """The adapter as the user of ``kubeconfig``, ``job`` started and its first event seen;
    what the caller does with them is bounded by the same 20 s."""
    s = settings_for(cluster, namespace, cluster=Cluster(kubeconfig=str(kubeconfig)))
    async with await Adapter.open(AdapterConfig(settings=s)) as adapter:
        await adapter.start(JobSpec(job_id=job))
        stream = adapter.watch()
        try:
            async with asyncio.timeout(20):
                assert (await anext(stream)).job == job
                yield adapter, stream
        finally:
            await stream.aclose()


async def test_watch_starts_with_the_chart_rules(
    cluster: ControlPlane,
    namespace: str,
    runtime: None,
    restricted_kubeconfig: Path,
) -> None:
    async with watching_as(cluster, namespace, restricted_kubeconfig, "watched") as (adapter, _):
        # The runtimes too, which hold no event back when they cannot be listed.
        runtimes = adapter.supervisor.runtimes.informers.values()
        for informer in runtimes:
            await informer.synced.wait()
    assert [informer.last_failure for informer in runtimes] == [None, None]


async def test_without_the_runtime_watch_rules_starts_read_and_events_flow(
    cluster: ControlPlane, namespace: str, runtime: None, kube_api: client.ApiClient
) -> None:
    """A role from before the runtime watch (runtimes: get only): the runtime watch cannot list,
    and that holds nothing back: the watch yields events and a start reads its runtime."""
    runtimes = {"trainingruntimes", "clustertrainingruntimes"}
    rules = [
        {**rule, "verbs": ["get"]} if runtimes & set(rule["resources"]) else rule
        for rule in CHART_RULES
    ]
    async with (
        user_with_rules(cluster, kube_api, rules, "dispatch-older") as kubeconfig,
        watching_as(cluster, namespace, kubeconfig, "first") as (adapter, stream),
    ):
        informers = adapter.supervisor.runtimes.informers.values()
        await until(lambda: all(i.last_failure for i in informers), "the runtime LISTs refused")
        await adapter.start(JobSpec(job_id="second"))
        while (await anext(stream)).job != "second":
            pass
    refusals = [getattr(i.last_failure, "status", None) for i in informers]
    assert refusals == [403, 403]
    assert not any(i.synced.is_set() for i in informers)


async def test_the_chart_rules_grant_no_secret(
    namespace: str, kube_api: client.ApiClient, restricted_kubeconfig: Path
) -> None:
    core: Any = client.CoreV1Api(kube_api)  # takes a plain dict as the body
    await core.create_namespaced_secret(
        namespace, {"metadata": {"name": "s3"}, "stringData": {"key": "value"}}
    )
    api = await config.new_client_from_config(config_file=str(restricted_kubeconfig))
    try:
        core = client.CoreV1Api(api)
        refusals: list[Any] = []
        for call in (
            core.read_namespaced_secret("s3", namespace),
            core.list_namespaced_secret(namespace),
            core.list_secret_for_all_namespaces(),
        ):
            with pytest.raises(ApiException) as refused:
                await call
            refusals.append(refused.value.status)
        assert refusals == [403, 403, 403]
    finally:
        await api.close()
    rules = CHART_RULES
    assert not [
        r for r in rules if "secrets" in r.get("resources", []) or "*" in r.get("resources", [])
    ]
