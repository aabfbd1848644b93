"""The one LIST+WATCH against the real kube-apiserver: paging, expired continue tokens, the
wait for one object, and the relist after 410.

ConfigMaps stand in for every kind: the informer reads raw JSON and knows nothing of kinds. A
continue token or a resourceVersion is made too old the way production sees it, by compacting
etcd (``ControlPlane.compact_etcd``, which also restarts kube-apiserver so its watch cache
forgets the old versions).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client, config

from dispatch_kubeflow.errors import ForbiddenError, UnavailableError
from dispatch_kubeflow.kube.connection import connect
from dispatch_kubeflow.kube.informer import Change, Informer, Synced, list_all, wait_for
from dispatch_kubeflow.kube.objects import key_of, name_of
from dispatch_kubeflow.settings import Cluster
from tests.cluster.controlplane import ControlPlane

LABEL = "test.dispatch.example/informer"
WAIT = 30.0


class ConfigMaps:
    """A list call for the labelled ConfigMaps of one namespace that records what it was asked.

    ``hold_watches`` makes the next watch requests wait for ``release``; ``use`` swaps the
    client (one whose connections died with a restarted apiserver).
    """

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.calls: list[dict[str, Any]] = []
        self.listed = asyncio.Event()
        self.held = asyncio.Event()
        self.released = asyncio.Event()
        self._holding = False

    def use(self, api: client.ApiClient) -> None:
        self.api = api

    def hold_watches(self) -> None:
        self._holding = True
        self.released.clear()

    def release(self) -> None:
        self._holding = False
        self.released.set()

    async def __call__(self, **options: Any) -> Any:
        self.calls.append(options)
        if options.get("watch") and self._holding:
            self.held.set()
            await self.released.wait()
        response = await client.CoreV1Api(self.api).list_namespaced_config_map(
            self.namespace, label_selector=LABEL, **options
        )
        if not options.get("watch"):
            self.listed.set()
        return response

    def lists(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if not c.get("watch")]

    def watches(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c.get("watch")]


async def create(api: client.ApiClient, namespace: str, name: str, labelled: bool = True) -> None:
    labels = {LABEL: "yes"} if labelled else {}
    await client.CoreV1Api(api).create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name, labels=labels))
    )


async def delete(api: client.ApiClient, namespace: str, name: str) -> None:
    await client.CoreV1Api(api).delete_namespaced_config_map(name, namespace)


async def compact(cluster: ControlPlane, api: client.ApiClient, namespace: str) -> None:
    """Move etcd's revision past every version seen so far (with an object nobody watches),
    then compact it and restart kube-apiserver."""
    await create(api, namespace, f"bump-{secrets.token_hex(3)}", labelled=False)
    await asyncio.to_thread(cluster.compact_etcd)


@pytest.fixture
async def fresh_api(cluster: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """A second admin client, for after a restart of kube-apiserver."""
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield api
    finally:
        await api.close()


# ---------------------------------------------------------------------------------------------
# list_all


async def test_list_all_follows_every_page(kube_api: client.ApiClient, namespace: str) -> None:
    names = [f"cm-{i}" for i in range(5)]
    for name in names:
        await create(kube_api, namespace, name)
    listing = ConfigMaps(kube_api, namespace)
    listed = await list_all(listing, what="configmaps", page_size=2)
    assert sorted(name_of(item) for item in listed.items) == names
    assert int(listed.resource_version) > 0
    assert [c.get("_continue") is not None for c in listing.calls] == [False, True, True]
    assert all(c["limit"] == 2 for c in listing.calls)


async def test_list_all_starts_over_when_the_continue_token_expires(
    cluster: ControlPlane, kube_api: client.ApiClient, fresh_api: client.ApiClient, namespace: str
) -> None:
    for name in ("a", "b", "c"):
        await create(kube_api, namespace, name)
    listing = ConfigMaps(kube_api, namespace)

    async def expiring(**options: Any) -> Any:
        if options.get("_continue") and len(listing.calls) == 1:
            # The first page was read; its token dies before the second page is asked for.
            await compact(cluster, kube_api, namespace)
            await create(fresh_api, namespace, "d")
            listing.use(fresh_api)
        return await listing(**options)

    listed = await list_all(expiring, what="configmaps", page_size=1)
    assert sorted(name_of(item) for item in listed.items) == ["a", "b", "c", "d"]
    continued = [c.get("_continue") is not None for c in listing.calls]
    assert continued[:3] == [False, True, False]  # page 1, its expired token, a fresh list
    # Started over once, then paged to the end (the page count depends on what else the
    # namespace holds: the controller-manager may add its kube-root-ca.crt at any time).
    assert continued[2:].count(False) == 1
    assert len(listing.calls) >= 2 + 4


# ---------------------------------------------------------------------------------------------
# wait_for


async def test_wait_for_finds_an_object_the_list_shows(
    kube_api: client.ApiClient, namespace: str
) -> None:
    await create(kube_api, namespace, "there")
    listing = ConfigMaps(kube_api, namespace)
    found = await wait_for(
        listing, lambda o: name_of(o) == "there", what="waiting", within=timedelta(seconds=10)
    )
    assert found is not None
    assert key_of(found) == f"{namespace}/there"
    assert len(listing.lists()) == 1


async def test_wait_for_finds_an_object_the_watch_shows(
    kube_api: client.ApiClient, namespace: str
) -> None:
    listing = ConfigMaps(kube_api, namespace)
    # Far longer than WAIT: the object is returned when the watch shows it, not at the deadline.
    within = timedelta(seconds=10 * WAIT)
    waiting = asyncio.create_task(
        wait_for(listing, lambda o: name_of(o) == "later", what="waiting", within=within)
    )
    await asyncio.wait_for(listing.listed.wait(), WAIT)
    await create(kube_api, namespace, "later")
    found = await asyncio.wait_for(waiting, WAIT)
    assert found is not None
    assert name_of(found) == "later"
    assert listing.watches()
    assert listing.watches()[0]["resource_version"]  # watched from the list's version


async def test_wait_for_is_none_when_nothing_comes_in_time(
    kube_api: client.ApiClient, namespace: str
) -> None:
    await create(kube_api, namespace, "other")
    listing = ConfigMaps(kube_api, namespace)
    loop = asyncio.get_running_loop()
    began = loop.time()
    found = await wait_for(
        listing, lambda o: name_of(o) == "never", what="waiting", within=timedelta(seconds=1)
    )
    assert found is None
    assert 1 <= loop.time() - began < 5


async def test_wait_for_raises_when_the_apiserver_cannot_be_reached(
    cluster: ControlPlane, kube_api: client.ApiClient, namespace: str
) -> None:
    """Not seeing the cluster is not seeing nothing: no LIST succeeded, so no None."""
    listing = ConfigMaps(kube_api, namespace)
    await asyncio.to_thread(cluster.stop_apiserver)
    try:
        with pytest.raises(UnavailableError, match=r"^waiting for the configmap: "):
            await wait_for(
                listing,
                lambda _: True,
                what="waiting for the configmap",
                within=timedelta(seconds=2),
            )
    finally:
        await asyncio.to_thread(cluster.start_apiserver)
    assert len(listing.lists()) >= 2  # it kept trying until the time was up


async def test_wait_for_names_the_verb_a_forbidden_list_needed(
    cluster: ControlPlane, namespace: str
) -> None:
    kubeconfig = cluster.kubeconfig_for("informer-nobody")
    api = await connect(
        Cluster(kubeconfig=str(kubeconfig)), token=None, request_timeout=timedelta(seconds=10)
    )
    try:
        with pytest.raises(ForbiddenError, match="forbidden") as refused:
            await wait_for(
                ConfigMaps(api, namespace),
                lambda _: True,
                what="waiting for the configmap",
                within=timedelta(seconds=2),
            )
    finally:
        await api.close()
    assert refused.value.verb == "list"


# ---------------------------------------------------------------------------------------------
# Informer


async def test_the_informer_relists_after_410_and_reconciles_what_it_missed(
    cluster: ControlPlane, kube_api: client.ApiClient, fresh_api: client.ApiClient, namespace: str
) -> None:
    """While its watch is down, one object is deleted and one created, and the version it
    would resume from is compacted away: the relist reports both, the deletion synthesised."""
    for name in ("kept", "gone"):
        await create(kube_api, namespace, name)
    seen: list[Change | Synced] = []
    synced_twice = asyncio.Event()
    watched = asyncio.Event()

    async def emit(item: Change | Synced) -> None:
        seen.append(item)
        if sum(isinstance(i, Synced) for i in seen) == 2:
            synced_twice.set()
        if isinstance(item, Change) and name_of(item.obj) == "watched":
            watched.set()

    listing = ConfigMaps(kube_api, namespace)
    informer = Informer("ConfigMap", listing, emit, backoff_ceiling=1.0)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), WAIT)
        assert set(informer.cache) == {f"{namespace}/kept", f"{namespace}/gone"}
        listing.hold_watches()
        await compact(cluster, kube_api, namespace)  # the restart ends the watch
        await asyncio.wait_for(listing.held.wait(), WAIT)
        await delete(fresh_api, namespace, "gone")
        await create(fresh_api, namespace, "new")
        listing.use(fresh_api)
        before = len(seen)
        listing.release()
        await asyncio.wait_for(synced_twice.wait(), WAIT)
        after = [(c.type, name_of(c.obj)) for c in seen[before:] if isinstance(c, Change)]
        assert sorted(after) == [("ADDED", "new"), ("DELETED", "gone")]
        assert informer.relists == 2
        assert set(informer.cache) == {f"{namespace}/kept", f"{namespace}/new"}
        # And it watches again from the new list's version.
        await create(fresh_api, namespace, "watched")
        await asyncio.wait_for(watched.wait(), WAIT)
        assert f"{namespace}/watched" in informer.cache
        assert informer.relists == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
