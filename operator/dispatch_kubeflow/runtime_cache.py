"""The runtimes a start may name, as one watch of each runtime kind sees them.

A start checks its runtime against the runtime rules (``runtimes``). Reading the runtime for
every start costs the apiserver a request per job, for objects that change once in a while; so
the supervisor keeps a LIST+WATCH of the adapter's TrainingRuntimes and of the
ClusterTrainingRuntimes, and a start reads its runtime from there (``starting.checked_runtime``
says when it still asks the apiserver). The watches are not the supervisor's job kinds: their
changes derive nothing, and a runtime kind that cannot be listed holds no event back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from kubernetes_asyncio import client

from dispatch_kubeflow.constants import (
    CLUSTER_TRAINING_RUNTIMES,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINING_RUNTIMES,
)
from dispatch_kubeflow.kube.informer import Change, Informer, Synced
from dispatch_kubeflow.kube.objects import metadata_without_managed_fields
from dispatch_kubeflow.settings import RuntimeRef
from dispatch_kubeflow.tasks import cancel_and_wait, gathered

KIND_TRAINING_RUNTIME = "TrainingRuntime"
KIND_CLUSTER_TRAINING_RUNTIME = "ClusterTrainingRuntime"


def _without_managed_fields(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {**obj, "metadata": metadata_without_managed_fields(obj)}


async def _nothing_to_derive(_change: Change | Synced) -> None:
    return None


class RuntimeCache:
    """The TrainingRuntimes of ``namespace`` and the ClusterTrainingRuntimes, watched."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        *,
        watch_timeout: timedelta,
        request_timeout: timedelta,
    ) -> None:
        custom = client.CustomObjectsApi(api_client)
        self._namespace = namespace

        async def list_namespaced(**options: Any) -> Any:
            return await custom.list_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, namespace, TRAINING_RUNTIMES, **options
            )

        async def list_cluster_wide(**options: Any) -> Any:
            return await custom.list_cluster_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, CLUSTER_TRAINING_RUNTIMES, **options
            )

        self.informers = {
            kind: Informer(
                kind,
                list_fn,
                _nothing_to_derive,
                trim=_without_managed_fields,
                watch_timeout=watch_timeout,
                request_timeout=request_timeout,
            )
            for kind, list_fn in (
                (KIND_TRAINING_RUNTIME, list_namespaced),
                (KIND_CLUSTER_TRAINING_RUNTIME, list_cluster_wide),
            )
        }
        self._running = False

    @property
    def requests(self) -> int:
        return sum(informer.requests for informer in self.informers.values())

    async def run(self) -> None:
        """Watch both kinds until cancelled."""
        tasks = [
            asyncio.create_task(informer.run(), name=f"watch-{kind}")
            for kind, informer in self.informers.items()
        ]
        self._running = True
        try:
            await gathered(*tasks)
        finally:
            self._running = False
            await cancel_and_wait(*tasks)

    def get(self, ref: RuntimeRef) -> dict[str, Any] | None:
        """The runtime as last watched; None when the watch has not got it or is not serving."""
        informer = self.informers.get(ref.kind)
        if not self._running or informer is None or not informer.fresh:
            return None
        namespace = self._namespace if ref.kind == KIND_TRAINING_RUNTIME else None
        return informer.get(ref.name, namespace)
