"""Smoke tests of the test control plane: the kinds the operator uses behave as on a cluster.

They run against the real etcd + kube-apiserver of the `cluster` fixture with the upstream
Trainer and Kueue CRDs installed, and check the properties other tests rely on: create, watch,
patch and delete work for each kind; a watch can resume across an apiserver restart; RBAC is
enforced for a restricted identity; a watch from a compacted resourceVersion gets 410 Gone.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypedDict, TypeVar

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow import constants
from tests.cluster import binaries
from tests.cluster.controlplane import ControlPlane
from tests.conftest import running_control_plane

EVENT_TIMEOUT = 20.0
MERGE_PATCH = "application/merge-patch+json"

ListFn = Callable[..., Awaitable[Any]]
T = TypeVar("T")


class Where(TypedDict):
    """Where a namespaced custom object lives: the keyword arguments of CustomObjectsApi."""

    group: str
    version: str
    namespace: str
    plural: str


async def merge_patch(method: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
    """A generated ``patch_*`` call sending ``body`` as a JSON merge patch.

    The generated stubs omit the client's ``_content_type``; without it a dict body goes out as a
    JSON patch.
    """
    return await method(*args, _content_type=MERGE_PATCH, **kwargs)


def meta(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    owner_references: list[client.V1OwnerReference] | None = None,
) -> client.V1ObjectMeta:
    return client.V1ObjectMeta(name=name, labels=labels, owner_references=owner_references)


def new_lease(name: str, holder: str, duration: int | None = None) -> client.V1Lease:
    spec = client.V1LeaseSpec(holder_identity=holder, lease_duration_seconds=duration)
    return client.V1Lease(metadata=meta(name), spec=spec)


def _rv(obj: Any) -> str:
    metadata = obj["metadata"] if isinstance(obj, dict) else obj.metadata
    version: str = (
        metadata["resourceVersion"] if isinstance(metadata, dict) else metadata.resource_version
    )
    return version


def _raw_name(event: dict[str, Any]) -> str:
    name: str = event["raw_object"]["metadata"]["name"]
    return name


async def _watch_events(
    list_fn: ListFn, resource_version: str, count: int, **kwargs: Any
) -> list[dict[str, Any]]:
    """The first `count` events of a watch from `resource_version` (raises on an ERROR event)."""
    events: list[dict[str, Any]] = []
    stream = watch.Watch()
    try:
        async with asyncio.timeout(EVENT_TIMEOUT):
            async for event in stream.stream(
                list_fn, resource_version=resource_version, timeout_seconds=30, **kwargs
            ):
                events.append(event)
                if len(events) == count:
                    break
    finally:
        await stream.close()
    return events


def _summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(event["type"], _raw_name(event)) for event in events]


async def _crud_watch(
    list_fn: ListFn,
    list_kwargs: Mapping[str, Any],
    create: Callable[[], Awaitable[Any]],
    patch: Callable[[], Awaitable[Any]],
    delete: Callable[[], Awaitable[Any]],
    name: str,
) -> list[dict[str, Any]]:
    """Create, patch and delete one object while watching its kind; return the watch events."""
    start = _rv(await list_fn(**list_kwargs))
    watcher = asyncio.create_task(_watch_until_deleted(list_fn, start, **list_kwargs))
    created = await create()
    patched = await patch()
    assert int(_rv(patched)) > int(_rv(created))
    await delete()
    events = await watcher
    summary = _summary(events)
    # Controllers of the shared control plane may write too (the node-lifecycle controller
    # taints a Node with no kubelet), so more than one MODIFIED can stand between the two.
    assert summary[0] == ("ADDED", name)
    assert summary[-1] == ("DELETED", name)
    assert summary[1:-1]
    assert set(summary[1:-1]) == {("MODIFIED", name)}
    return events


async def _watch_until_deleted(
    list_fn: ListFn, resource_version: str, **kwargs: Any
) -> list[dict[str, Any]]:
    """The events of a watch from `resource_version` up to and including the first DELETED."""
    events: list[dict[str, Any]] = []
    stream = watch.Watch()
    try:
        async with asyncio.timeout(EVENT_TIMEOUT):
            async for event in stream.stream(
                list_fn, resource_version=resource_version, timeout_seconds=30, **kwargs
            ):
                events.append(event)
                if event["type"] == "DELETED":
                    break
    finally:
        await stream.close()
    return events


def _trainjob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{constants.TRAINER_GROUP}/{constants.TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 2}},
    }


def _workload(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{constants.KUEUE_GROUP}/{constants.KUEUE_VERSION}",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {
            "queueName": "user-queue",
            "podSets": [
                {
                    "name": "node",
                    "count": 2,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [{"name": "node", "image": "busybox:1.37"}],
                        }
                    },
                }
            ],
        },
    }


async def test_server_reports_the_pinned_kubernetes_version(kube_api: client.ApiClient) -> None:
    info = await client.VersionApi(kube_api).get_code()
    assert info.git_version == binaries.kubernetes_version()
    assert (info.major, info.minor) == ("1", binaries.kubernetes_version().split(".")[1])


async def test_trainjob_create_watch_patch_delete(
    kube_api: client.ApiClient, namespace: str
) -> None:
    api = client.CustomObjectsApi(kube_api)
    where: Where = {
        "group": constants.TRAINER_GROUP,
        "version": constants.TRAINER_VERSION,
        "namespace": namespace,
        "plural": constants.TRAINJOBS,
    }
    events = await _crud_watch(
        api.list_namespaced_custom_object,
        where,
        lambda: api.create_namespaced_custom_object(body=_trainjob("smoke"), **where),
        lambda: merge_patch(
            api.patch_namespaced_custom_object,
            name="smoke",
            body={"spec": {"suspend": True}},
            **where,
        ),
        lambda: api.delete_namespaced_custom_object(name="smoke", **where),
        "smoke",
    )
    assert events[1]["raw_object"]["spec"]["suspend"] is True
    assert events[1]["raw_object"]["spec"]["trainer"]["numNodes"] == 2


async def test_workload_v1beta2_create_watch_patch_delete(
    kube_api: client.ApiClient, namespace: str
) -> None:
    api = client.CustomObjectsApi(kube_api)
    where: Where = {
        "group": constants.KUEUE_GROUP,
        "version": constants.KUEUE_VERSION,
        "namespace": namespace,
        "plural": constants.WORKLOADS,
    }
    events = await _crud_watch(
        api.list_namespaced_custom_object,
        where,
        lambda: api.create_namespaced_custom_object(body=_workload("smoke"), **where),
        lambda: merge_patch(
            api.patch_namespaced_custom_object,
            name="smoke",
            body={"spec": {"active": False}},
            **where,
        ),
        lambda: api.delete_namespaced_custom_object(name="smoke", **where),
        "smoke",
    )
    assert events[0]["raw_object"]["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert events[1]["raw_object"]["spec"]["active"] is False


async def test_workload_v1beta1_is_not_served(kube_api: client.ApiClient, namespace: str) -> None:
    """Kueue converts v1beta1 with a webhook that does not run here, so only v1beta2 is served."""
    api = client.CustomObjectsApi(kube_api)
    with pytest.raises(ApiException) as refused:
        await api.list_namespaced_custom_object(
            constants.KUEUE_GROUP, "v1beta1", namespace, constants.WORKLOADS
        )
    assert refused.value.status == 404


async def test_lease_create_watch_patch_delete(kube_api: client.ApiClient, namespace: str) -> None:
    api = client.CoordinationV1Api(kube_api)
    events = await _crud_watch(
        api.list_namespaced_lease,
        {"namespace": namespace},
        lambda: api.create_namespaced_lease(namespace, new_lease("smoke", "a", duration=15)),
        lambda: merge_patch(
            api.patch_namespaced_lease, "smoke", namespace, {"spec": {"holderIdentity": "b"}}
        ),
        lambda: api.delete_namespaced_lease("smoke", namespace),
        "smoke",
    )
    assert events[1]["raw_object"]["spec"]["holderIdentity"] == "b"


async def test_node_create_watch_patch_delete(kube_api: client.ApiClient, namespace: str) -> None:
    api = client.CoreV1Api(kube_api)
    name = f"node-{namespace}"
    selector = {"field_selector": f"metadata.name={name}"}
    node = client.V1Node(metadata=meta(name, labels={"smoke": "yes"}))
    taint = {"key": constants.TAINT_UNREACHABLE, "effect": "NoExecute"}
    events = await _crud_watch(
        api.list_node,
        selector,
        lambda: api.create_node(node),
        lambda: merge_patch(api.patch_node, name, {"spec": {"taints": [taint]}}),
        lambda: api.delete_node(name),
        name,
    )
    assert any(taint in (e["raw_object"]["spec"].get("taints") or []) for e in events[1:-1])


async def _watch_resuming(
    list_fn: ListFn,
    resource_version: str,
    seen: asyncio.Queue[dict[str, Any]],
    connections: list[str],
    **kwargs: Any,
) -> None:
    """Watch the way kopf and client-go informers do, forever.

    When the connection drops, watch again from the last resourceVersion seen. If the server
    answers 410 Gone (a restarted apiserver's watch cache starts after that version), LIST
    again, report each object that changed meanwhile as MODIFIED, and watch from the list's
    resourceVersion. `connections` records each "watch from <rv>" and "relist".
    """
    versions: dict[str, str] = {}
    while True:
        connections.append(f"watch from {resource_version}")
        stream = watch.Watch()
        try:
            async for event in stream.stream(
                list_fn, resource_version=resource_version, timeout_seconds=60, **kwargs
            ):
                resource_version = _rv(event["raw_object"])
                versions[_raw_name(event)] = resource_version
                await seen.put(event)
        except ApiException as error:
            if error.status != 410:
                raise
            connections.append("relist")
            listing = await list_fn(**kwargs)
            for item in listing.items:
                raw = kube_dict(item)
                if versions.get(raw["metadata"]["name"]) != raw["metadata"]["resourceVersion"]:
                    versions[raw["metadata"]["name"]] = raw["metadata"]["resourceVersion"]
                    await seen.put({"type": "MODIFIED", "raw_object": raw})
            resource_version = _rv(listing)
        except (TimeoutError, aiohttp.ClientError, ConnectionError):
            await asyncio.sleep(0.1)
        finally:
            await stream.close()


def kube_dict(model: Any) -> dict[str, Any]:
    raw: dict[str, Any] = client.ApiClient().sanitize_for_serialization(model)
    return raw


async def _next_event(seen: asyncio.Queue[dict[str, Any]]) -> tuple[str, str, str]:
    async with asyncio.timeout(EVENT_TIMEOUT):
        event = await seen.get()
    return event["type"], _raw_name(event), event["raw_object"]["spec"]["holderIdentity"]


@pytest.fixture
async def lease_api(cluster: ControlPlane) -> AsyncIterator[client.CoordinationV1Api]:
    """A Lease client of its own, so its connections see the apiserver go away."""
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield client.CoordinationV1Api(api)
    finally:
        await api.close()


async def test_watch_continues_across_apiserver_restart(
    cluster: ControlPlane, lease_api: client.CoordinationV1Api, namespace: str
) -> None:
    start = _rv(await lease_api.list_namespaced_lease(namespace))
    seen: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    connections: list[str] = []
    watcher = asyncio.create_task(
        _watch_resuming(
            lease_api.list_namespaced_lease, start, seen, connections, namespace=namespace
        )
    )
    try:
        await lease_api.create_namespaced_lease(namespace, new_lease("before", "a"))
        assert await _next_event(seen) == ("ADDED", "before", "a")

        cluster.stop_apiserver()
        cluster.start_apiserver()

        await merge_patch(
            lease_api.patch_namespaced_lease, "before", namespace, {"spec": {"holderIdentity": "b"}}
        )
        assert await _next_event(seen) == ("MODIFIED", "before", "b")
        # The stream really broke and was established again.
        assert len(connections) > 1, connections
        # etcd kept the data across the restart.
        lease = await lease_api.read_namespaced_lease("before", namespace)
        assert lease.spec.holder_identity == "b"
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def once_authorized(request: Callable[[], Awaitable[T]]) -> T:
    """``request``'s answer once RBAC allows it: the authorizer reads bindings from an informer,
    so a binding just made takes a moment to count."""
    async with asyncio.timeout(EVENT_TIMEOUT):
        while True:
            try:
                return await request()
            except ApiException as error:
                if error.status != 403:
                    raise
                await asyncio.sleep(0.1)


async def test_restricted_identity_gets_only_what_its_role_grants(
    cluster: ControlPlane, kube_api: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube_api)
    await core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=meta("token"), string_data={"k": "v"})
    )
    await core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=meta("settings"))
    )
    rbac = client.RbacAuthorizationV1Api(kube_api)
    reader = client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["get", "list"])
    await rbac.create_namespaced_role(
        namespace, client.V1Role(metadata=meta("configmap-reader"), rules=[reader])
    )
    await rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=meta("configmap-reader"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="configmap-reader"
            ),
            subjects=[
                client.RbacV1Subject(
                    api_group="rbac.authorization.k8s.io", kind="Group", name="smoke-readers"
                )
            ],
        ),
    )

    restricted = await config.new_client_from_config(
        config_file=str(cluster.kubeconfig_for("smoke-user", ["smoke-readers"]))
    )
    try:
        as_user = client.CoreV1Api(restricted)
        config_map = await once_authorized(
            partial(as_user.read_namespaced_config_map, "settings", namespace)
        )
        assert config_map.metadata.name == "settings"

        with pytest.raises(ApiException) as refused:
            await as_user.read_namespaced_secret("token", namespace)
        assert refused.value.status == 403
        # The stub says bytes; the client hands over the decoded text.
        assert "smoke-user" in str(refused.value.body)
        with pytest.raises(ApiException) as refused_elsewhere:
            await as_user.list_namespaced_config_map("default")
        assert refused_elsewhere.value.status == 403
    finally:
        await restricted.close()


async def test_a_service_account_token_authenticates_as_the_account_with_its_role(
    cluster: ControlPlane, kube_api: client.ApiClient, namespace: str
) -> None:
    """The benchmarks' identities are ServiceAccount tokens, as a cluster's controllers' are."""
    reader = client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["list"])
    role = f"{namespace}-reader"
    await client.RbacAuthorizationV1Api(kube_api).create_cluster_role(
        client.V1ClusterRole(metadata=meta(role), rules=[reader])
    )
    kubeconfig = cluster.kubeconfig_for_service_account(namespace, "token-user", role)
    assert "token" in yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]
    api = await config.new_client_from_config(config_file=str(kubeconfig))
    try:
        review = await client.AuthenticationV1Api(api).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:token-user"
        as_account = client.CoreV1Api(api)
        await once_authorized(partial(as_account.list_namespaced_config_map, namespace))
        with pytest.raises(ApiException) as refused:
            await as_account.create_namespaced_config_map(
                namespace, client.V1ConfigMap(metadata=meta("written"))
            )
        assert refused.value.status == 403
    finally:
        await api.close()


async def test_watch_from_compacted_resource_version_gets_410(
    cluster: ControlPlane, namespace: str
) -> None:
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        leases = client.CoordinationV1Api(api)
        old = _rv(await leases.create_namespaced_lease(namespace, new_lease("old", "a")))
        for holder in ("b", "c"):
            await merge_patch(
                leases.patch_namespaced_lease,
                "old",
                namespace,
                {"spec": {"holderIdentity": holder}},
            )
        assert cluster.compact_etcd() > int(old)
    finally:
        await api.close()

    # A new client: the old one's pooled connections died with the restarted apiserver.
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        leases = client.CoordinationV1Api(api)
        with pytest.raises(ApiException) as gone:
            await _watch_events(leases.list_namespaced_lease, old, 1, namespace=namespace)
        assert gone.value.status == 410
        # etcd itself no longer has that revision: an exact read of it is refused too.
        with pytest.raises(ApiException) as compacted:
            await leases.list_namespaced_lease(
                namespace, resource_version=old, resource_version_match="Exact"
            )
        assert compacted.value.status == 410
        latest = _rv(await leases.list_namespaced_lease(namespace))
        assert int(latest) > int(old)
    finally:
        await api.close()


@pytest.fixture
def private_plane(
    control_plane_binaries: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    """A control plane of this test's own: controllers started here must not reach other tests.

    Started like the session's (owned by this process, stopped at exit and by a later session
    should this one be killed), and built first, which makes its tests `cluster` tests.
    """
    yield from running_control_plane(tmp_path_factory, "control-plane-private", install_crds=False)


async def test_controller_manager_collects_garbage(private_plane: ControlPlane) -> None:
    private_plane.start_controller_manager()
    private_plane.start_controller_manager()  # idempotent
    api = await config.new_client_from_config(config_file=str(private_plane.kubeconfig))
    try:
        core = client.CoreV1Api(api)
        owner = await core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=meta("owner"))
        )
        owned_by = client.V1OwnerReference(
            api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
        )
        await core.create_namespaced_config_map(
            "default", client.V1ConfigMap(metadata=meta("dependent", owner_references=[owned_by]))
        )
        await core.delete_namespaced_config_map("owner", "default")
        async with asyncio.timeout(EVENT_TIMEOUT):
            while True:
                names = {
                    cm.metadata.name
                    for cm in (await core.list_namespaced_config_map("default")).items
                }
                if "dependent" not in names:
                    break
                await asyncio.sleep(0.2)
    finally:
        await api.close()
