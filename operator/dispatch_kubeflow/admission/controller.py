"""One admission controller replica: always watching, deciding only while it leads.

One controller decides one AdmissionCheck cluster-wide: every Workload that carries the check,
in every namespace. Every replica keeps an informer of each kind it reads (its AdmissionCheck,
the KubeflowAdapters, and every namespace's Workloads and TrainJobs) warm, so a standby decides at
once when it takes over its Lease; only the leader writes. The Lease is also the heartbeat the
adapters read, so the adapters of the check must name it as their ``kueue.admissionLease``.

The KubeflowAdapters whose ``kueue.admissionCheck`` names the check say which namespaces are
dispatch's (``serving``): their Workloads go through the gate, every other Workload is made
``Ready`` at once.

Decisions (``decisions.decide``) are written by server-side apply on ``workloads/status`` under
this controller's own field manager, with the ``resourceVersion`` the decision was made from: a
write based on a stale view fails with a conflict instead of overwriting what changed, which is
what keeps two replicas in a takeover from deciding one admission two ways.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kubernetes_asyncio import client
from pydantic import BaseModel, ConfigDict

from dispatch_kubeflow import metrics
from dispatch_kubeflow.admission.decisions import (
    ACTIVE_MESSAGE,
    active_apply_body,
    decide,
    workload_apply_body,
)
from dispatch_kubeflow.admission.health import serving_health
from dispatch_kubeflow.admission.serving import (
    Serving,
    invalid_adapters,
    lease_mismatches,
    serving_of,
)
from dispatch_kubeflow.clock import SYSTEM_CLOCK, Clock
from dispatch_kubeflow.constants import (
    ADMISSION_CHECKS,
    ADMISSION_CONTROLLER_NAME,
    ADMISSION_FIELD_MANAGER,
    ADMISSION_LEASE_NAME_DEFAULT,
    ADMISSION_LEASE_NAMESPACE_DEFAULT,
    ANNOTATION_READMIT,
    ANNOTATION_REJECT,
    APPLY_PATCH,
    GROUP,
    KIND_ADMISSION_CHECK,
    KIND_TRAINJOB,
    KIND_WORKLOAD,
    KUBEFLOW_ADAPTER_KIND,
    KUBEFLOW_ADAPTERS,
    KUEUE_GROUP,
    KUEUE_VERSION,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    VERSION,
    WORKLOADS,
    CheckState,
)
from dispatch_kubeflow.kube import connection
from dispatch_kubeflow.kube.apierrors import REQUEST_ERRORS, describe, is_conflict, is_not_found
from dispatch_kubeflow.kube.informer import Change, Informer, ListFn, Synced, Trim
from dispatch_kubeflow.kube.leaderelection import ElectionTiming, LeaderElector
from dispatch_kubeflow.kube.leases import ApiLeaseStore
from dispatch_kubeflow.kube.objects import (
    Obj,
    dig,
    key_of,
    metadata_without_managed_fields,
    name_of,
    namespace_of,
    uid_of,
)
from dispatch_kubeflow.kube.workloads import eviction_count, owner_trainjob
from dispatch_kubeflow.settings import Cluster
from dispatch_kubeflow.tasks import stop_if_cancelled

log = logging.getLogger(__name__)

WRITTEN_KEPT = 1024


class AdmissionConfig(BaseModel):
    """What one admission controller replica needs: its check, its Lease, who it is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    check: str
    lease_namespace: str = ADMISSION_LEASE_NAMESPACE_DEFAULT
    lease_name: str = ADMISSION_LEASE_NAME_DEFAULT
    identity: str
    timing: ElectionTiming = ElectionTiming()
    request_timeout: float = 30.0
    watch_timeout: int = 240  # a watch is re-opened from its last resourceVersion this often
    retry_backoff: float = 1.0

    @property
    def lease(self) -> tuple[str, str]:
        return (self.lease_namespace, self.lease_name)


@dataclass(frozen=True)
class Written:
    """One decision this replica wrote, for the record (and for tests)."""

    workload: str
    uid: str
    evictions: int
    state: CheckState
    namespace: str = ""


class AdmissionController:
    """One replica: always watching, deciding only while it leads."""

    def __init__(
        self,
        api: client.ApiClient,
        cfg: AdmissionConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        elector: LeaderElector | None = None,
    ) -> None:
        self.cfg = cfg
        # Typed as Any: the generated client's signatures omit the ``_content_type`` it accepts.
        self._objects: Any = client.CustomObjectsApi(api)
        self._clock = clock
        self.elector = elector or LeaderElector(
            ApiLeaseStore(api, cfg.lease_namespace, cfg.lease_name, cfg.request_timeout),
            cfg.identity,
            cfg.timing,
            clock=clock,
        )
        self.checks = self._informer(KIND_ADMISSION_CHECK, self._list_checks)
        self.adapters = self._informer(KUBEFLOW_ADAPTER_KIND, self._list_adapters, trim_adapter)
        self.workloads = self._informer(KIND_WORKLOAD, self._list_workloads, trim_workload)
        self.trainjobs = self._informer(KIND_TRAINJOB, self._list_trainjobs, trim_trainjob)
        self.informers = (self.checks, self.adapters, self.workloads, self.trainjobs)
        # The most recent decisions this replica wrote (for logs and tests); bounded.
        self.written: deque[Written] = deque(maxlen=WRITTEN_KEPT)
        # The KubeflowAdapters of this check, and the namespaces they serve.
        self.servings: list[Serving] = []
        self.served: frozenset[str] = frozenset()
        self._problems: list[str] = []
        self._dirty: set[str] = set()  # keys (namespace/name) of Workloads to decide again
        self._check_dirty = True
        self._wake = asyncio.Event()

    def is_ready(self) -> bool:
        """Leading, or standing by with every informer listed and none failing to list."""
        return self.elector.is_leader() or all(i.fresh for i in self.informers)

    def health(self) -> dict[str, Any]:
        """What the readiness endpoint reports."""
        return {
            "ready": self.is_ready(),
            "leading": self.elector.is_leader(),
            "synced": {i.kind: i.fresh for i in self.informers},
            "served": sorted(self.served),
        }

    # Running.

    async def run(self) -> None:
        """Watch the three kinds and campaign for the Lease until cancelled."""
        watching = [
            asyncio.create_task(self._keep_watching(informer), name=f"watch-{informer.kind}")
            for informer in self.informers
        ]
        try:
            await self.elector.run(self.lead)
        finally:
            for task in watching:
                task.cancel()
            await asyncio.gather(*watching, return_exceptions=True)

    async def lead(self) -> None:
        """The leader's work: decide everything once, then whatever changes."""
        metrics.LEADER.set(1)
        try:
            for informer in self.informers:
                await informer.synced.wait()
            self._check_dirty = True
            self._dirty.update(self.workloads.cache)
            while True:
                self._wake.clear()
                await self._reconcile_dirty()
                await self._wake.wait()
        finally:
            metrics.LEADER.set(0)

    # Watching.

    def _informer(self, kind: str, list_fn: ListFn, trim: Trim = dict) -> Informer:
        return Informer(
            kind,
            list_fn,
            self._noticed,
            trim=trim,
            watch_timeout=timedelta(seconds=self.cfg.watch_timeout),
            request_timeout=timedelta(seconds=self.cfg.request_timeout),
            backoff_ceiling=self.cfg.retry_backoff,
        )

    async def _list_checks(self, **kwargs: Any) -> Any:
        return await self._objects.list_cluster_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            ADMISSION_CHECKS,
            field_selector=f"metadata.name={self.cfg.check}",
            **kwargs,
        )

    async def _list_adapters(self, **kwargs: Any) -> Any:
        return await self._objects.list_cluster_custom_object(
            GROUP, VERSION, KUBEFLOW_ADAPTERS, **kwargs
        )

    async def _list_workloads(self, **kwargs: Any) -> Any:
        return await self._objects.list_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, **kwargs
        )

    async def _list_trainjobs(self, **kwargs: Any) -> Any:
        return await self._objects.list_cluster_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS, **kwargs
        )

    async def _keep_watching(self, informer: Informer) -> None:
        """Run ``informer``; a failure it does not handle itself starts it over with a LIST."""
        while True:
            try:
                await informer.run()
            except Exception:
                stop_if_cancelled()
                log.exception("admission: watching %s failed; listing again", informer.kind)
            await asyncio.sleep(self.cfg.retry_backoff)

    async def _noticed(self, change: Change | Synced) -> None:
        """Mark what ``change`` may have changed the decision of, and wake the leader."""
        if change.kind == KIND_ADMISSION_CHECK:
            self._check_dirty = True
        elif change.kind == KUBEFLOW_ADAPTER_KIND:
            self._adapters_changed()
        elif isinstance(change, Synced):
            self._dirty.update(self.workloads.cache)
        elif change.kind == KIND_WORKLOAD:
            self._dirty.add(key_of(change.obj))
        else:
            self._dirty.update(self._workloads_of(change.obj))
        self._wake.set()

    def _workloads_of(self, trainjob: Obj) -> set[str]:
        namespace, name = namespace_of(trainjob), name_of(trainjob)
        return {
            key
            for key, workload in self.workloads.cache.items()
            if namespace_of(workload) == namespace and dig(owner_trainjob(workload), "name") == name
        }

    def _adapters_changed(self) -> None:
        """Read the KubeflowAdapters again; decide again the Workloads of each namespace whose
        serving changed."""
        servings = [
            found
            for adapter in self.adapters.cache.values()
            if (found := serving_of(adapter, self.cfg.check)) is not None
        ]
        served = frozenset(s.namespace for s in servings)
        moved = served ^ self.served
        self.servings, self.served = servings, served
        if moved:
            log.info("admission: namespaces served by this check: %s", ", ".join(sorted(served)))
            self._dirty.update(
                key for key, w in self.workloads.cache.items() if namespace_of(w) in moved
            )
        problems = lease_mismatches(servings, self.cfg.lease) + invalid_adapters(servings)
        if problems != self._problems:
            for problem in problems:
                log.warning("admission: %s", problem)
            self._problems = problems
            self._check_dirty = True

    def active_message(self) -> str:
        """The AdmissionCheck's ``Active`` message: what this controller does, and what is wrong
        with the adapters of the check."""
        return "; ".join([ACTIVE_MESSAGE, *self._problems])

    # Deciding.

    async def _reconcile_dirty(self) -> None:
        if self._check_dirty:
            self._check_dirty = False
            await self._reconcile_admission_check()
        while self._dirty:
            name = self._dirty.pop()
            try:
                await self._reconcile_workload(name)
            except Exception:
                # A Workload this code cannot read must not stop the decisions on all the others.
                log.exception("admission: deciding Workload %s failed", name)

    def _later(self, name: str | None) -> None:
        """Try again after the backoff: ``name`` is a Workload's key, None the AdmissionCheck."""

        def again() -> None:
            if name is None:
                self._check_dirty = True
            else:
                self._dirty.add(name)
            self._wake.set()

        asyncio.get_running_loop().call_later(self.cfg.retry_backoff, again)

    async def _reconcile_admission_check(self) -> None:
        found = self.checks.get(self.cfg.check)
        if found is None:
            log.warning("admission: AdmissionCheck %s does not exist", self.cfg.check)
            return
        controller = dig(found, "spec", "controllerName")
        if controller != ADMISSION_CONTROLLER_NAME:
            log.warning(
                "admission: AdmissionCheck %s has controllerName %r, not %r; leaving it alone",
                self.cfg.check,
                controller,
                ADMISSION_CONTROLLER_NAME,
            )
            return
        body = active_apply_body(found, self._clock.now(), self.active_message())
        if body is None or not self.elector.is_leader():
            return
        try:
            await self._objects.patch_cluster_custom_object_status(
                KUEUE_GROUP,
                KUEUE_VERSION,
                ADMISSION_CHECKS,
                self.cfg.check,
                body,
                field_manager=ADMISSION_FIELD_MANAGER,
                force=True,
                _content_type=APPLY_PATCH,
                _request_timeout=self.cfg.request_timeout,
            )
            log.info("admission: AdmissionCheck %s is Active", self.cfg.check)
        except REQUEST_ERRORS as error:
            log.warning(
                "admission: cannot mark AdmissionCheck %s Active: %s",
                self.cfg.check,
                describe(error),
            )
            self._later(None)

    def _owner_in_view(self, workload: Obj) -> tuple[bool, Obj | None]:
        """(ready to decide, owning TrainJob). Not ready while the owner is not watched yet."""
        ref = owner_trainjob(workload)
        if ref is None:
            return True, None
        trainjob = self.trainjobs.get(str(ref.get("name", "")), namespace_of(workload))
        if trainjob is None or uid_of(trainjob) != ref.get("uid"):
            return False, None
        return True, trainjob

    async def _reconcile_workload(self, key: str) -> None:
        workload = self.workloads.cache.get(key)
        if workload is None:
            return
        name, namespace = name_of(workload), namespace_of(workload)
        served = namespace in self.served
        trainjob = None
        if served:
            ready, trainjob = self._owner_in_view(workload)
            if not ready:
                return  # the TrainJob's own event brings this Workload back
        decision = decide(workload, trainjob, self.cfg.check, served=served)
        if decision is None or not self.elector.is_leader():
            return
        body = workload_apply_body(workload, self.cfg.check, decision, self._clock.now())
        try:
            await self._objects.patch_namespaced_custom_object_status(
                KUEUE_GROUP,
                KUEUE_VERSION,
                namespace,
                WORKLOADS,
                name,
                body,
                field_manager=ADMISSION_FIELD_MANAGER,
                force=True,
                _content_type=APPLY_PATCH,
                _request_timeout=self.cfg.request_timeout,
            )
        except REQUEST_ERRORS as error:
            if is_not_found(error) or is_conflict(error):
                # Gone, or changed since we looked: the watch brings the new version, if any.
                log.debug("admission: Workload %s moved on before the decision: %s", key, error)
                return
            log.warning("admission: cannot decide Workload %s: %s", key, describe(error))
            self._later(key)
            return
        self.written.append(
            Written(name, uid_of(workload), eviction_count(workload), decision.state, namespace)
        )
        metrics.admission_decided(
            uid_of(workload), eviction_count(workload), decision.state, self._clock.now()
        )
        log.info(
            "admission: Workload %s check %s %s (%s)",
            key,
            self.cfg.check,
            decision.state,
            decision.message,
        )


async def run_admission(
    cfg: AdmissionConfig,
    *,
    cluster: Cluster | None = None,
    api: client.ApiClient | None = None,
    health_address: str | None = None,
) -> None:
    """Run one admission controller replica until cancelled; release the Lease on the way out.

    Without ``api`` it connects to ``cluster`` (by default the kubeconfig loading rules, or the
    pod's service account in a pod). With ``health_address`` it serves ``/healthz`` and
    ``/readyz`` there.
    """
    owned = api is None
    api_client = (
        api
        if api is not None
        else await connection.connect(
            cluster or Cluster(),
            token=None,
            request_timeout=timedelta(seconds=cfg.request_timeout),
        )
    )
    try:
        log.info(
            "admission: %s controls AdmissionCheck %s in every namespace, Lease %s/%s",
            cfg.identity,
            cfg.check,
            cfg.lease_namespace,
            cfg.lease_name,
        )
        controller = AdmissionController(api_client, cfg)
        async with serving_health(health_address, controller.health):
            await controller.run()
    finally:
        if owned:
            await api_client.close()


# What the informers keep of each object: what the decisions and the serving read, no more.


def trim_adapter(obj: Obj) -> dict[str, Any]:
    return {"metadata": metadata_without_managed_fields(obj), "spec": obj.get("spec")}


def trim_workload(obj: Obj) -> dict[str, Any]:
    active = dig(obj, "spec", "active")
    return {
        "metadata": metadata_without_managed_fields(obj),
        "spec": {} if active is None else {"active": active},
        "status": obj.get("status") or {},
    }


def trim_trainjob(obj: Obj) -> dict[str, Any]:
    metadata = metadata_without_managed_fields(obj)
    annotations = metadata.get("annotations") or {}
    kept = (ANNOTATION_READMIT, ANNOTATION_REJECT)
    metadata["annotations"] = {k: v for k, v in annotations.items() if k in kept}
    return {"metadata": metadata}
