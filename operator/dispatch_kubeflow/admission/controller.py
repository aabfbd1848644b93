"""One admission controller replica: always watching, deciding only while it leads.

Every replica keeps an informer of each kind it reads (its AdmissionCheck, the namespace's
Workloads and TrainJobs) warm, so a standby decides at once when it takes over the Lease
``kueue.admissionLease``; only the leader writes. The Lease is also the heartbeat the adapter
reads.

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
from dispatch_kubeflow.admission.decisions import active_apply_body, decide, workload_apply_body
from dispatch_kubeflow.clock import SYSTEM_CLOCK, Clock
from dispatch_kubeflow.constants import (
    ADMISSION_CHECKS,
    ADMISSION_CONTROLLER_NAME,
    ADMISSION_FIELD_MANAGER,
    APPLY_PATCH,
    KIND_ADMISSION_CHECK,
    KIND_TRAINJOB,
    KIND_WORKLOAD,
    KUEUE_GROUP,
    KUEUE_VERSION,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    WORKLOADS,
    CheckState,
)
from dispatch_kubeflow.errors import ErrInvalid
from dispatch_kubeflow.kube import connection
from dispatch_kubeflow.kube.apierrors import REQUEST_ERRORS, describe, is_conflict, is_not_found
from dispatch_kubeflow.kube.informer import Change, Informer, ListFn, Synced
from dispatch_kubeflow.kube.leaderelection import ElectionTiming, LeaderElector, default_identity
from dispatch_kubeflow.kube.leases import ApiLeaseStore
from dispatch_kubeflow.kube.objects import Obj, dig, name_of, uid_of
from dispatch_kubeflow.kube.workloads import eviction_count, owner_trainjob
from dispatch_kubeflow.settings import Settings

log = logging.getLogger(__name__)

WRITTEN_KEPT = 1024


class AdmissionConfig(BaseModel):
    """What one admission controller replica needs, taken from the adapter's settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str
    check: str
    lease_namespace: str
    lease_name: str
    identity: str
    timing: ElectionTiming = ElectionTiming()
    request_timeout: float = 30.0
    watch_timeout: int = 240  # a watch is re-opened from its last resourceVersion this often
    retry_backoff: float = 1.0

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        identity: str | None = None,
        timing: ElectionTiming | None = None,
    ) -> AdmissionConfig:
        kueue = settings.kueue
        if kueue is None or not kueue.admission_check:
            raise ErrInvalid(
                "admission: the settings have no kueue.admissionCheck; the admission controller "
                "needs the name of the AdmissionCheck it controls"
            )
        return cls(
            namespace=settings.namespace,
            check=kueue.admission_check,
            lease_namespace=kueue.admission_lease.namespace,
            lease_name=kueue.admission_lease.name,
            identity=identity or default_identity(),
            timing=timing or ElectionTiming(),
            request_timeout=settings.timeouts.request.total_seconds(),
        )


@dataclass(frozen=True)
class Written:
    """One decision this replica wrote, for the record (and for tests)."""

    workload: str
    uid: str
    evictions: int
    state: CheckState


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
        self.workloads = self._informer(KIND_WORKLOAD, self._list_workloads)
        self.trainjobs = self._informer(KIND_TRAINJOB, self._list_trainjobs)
        # The most recent decisions this replica wrote (for logs and tests); bounded.
        self.written: deque[Written] = deque(maxlen=WRITTEN_KEPT)
        self._dirty: set[str] = set()
        self._check_dirty = True
        self._wake = asyncio.Event()

    # Running.

    async def run(self) -> None:
        """Watch the three kinds and campaign for the Lease until cancelled."""
        watching = [
            asyncio.create_task(self._keep_watching(informer), name=f"watch-{informer.kind}")
            for informer in (self.checks, self.workloads, self.trainjobs)
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
            for informer in (self.checks, self.workloads, self.trainjobs):
                await informer.synced.wait()
            self._check_dirty = True
            self._dirty.update(self._workload_names())
            while True:
                self._wake.clear()
                await self._reconcile_dirty()
                await self._wake.wait()
        finally:
            metrics.LEADER.set(0)

    # Watching.

    def _informer(self, kind: str, list_fn: ListFn) -> Informer:
        return Informer(
            kind,
            list_fn,
            self._noticed,
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

    async def _list_workloads(self, **kwargs: Any) -> Any:
        return await self._objects.list_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, self.cfg.namespace, WORKLOADS, **kwargs
        )

    async def _list_trainjobs(self, **kwargs: Any) -> Any:
        return await self._objects.list_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, self.cfg.namespace, TRAINJOBS, **kwargs
        )

    async def _keep_watching(self, informer: Informer) -> None:
        """Run ``informer``; a failure it does not handle itself starts it over with a LIST."""
        while True:
            try:
                await informer.run()
            except Exception:
                log.exception("admission: watching %s failed; listing again", informer.kind)
            await asyncio.sleep(self.cfg.retry_backoff)

    async def _noticed(self, change: Change | Synced) -> None:
        """Mark what ``change`` may have changed the decision of, and wake the leader."""
        if change.kind == KIND_ADMISSION_CHECK:
            self._check_dirty = True
        elif isinstance(change, Synced):
            self._dirty.update(self._workload_names())
        elif change.kind == KIND_WORKLOAD:
            self._dirty.add(name_of(change.obj))
        else:
            self._dirty.update(self._workloads_of(name_of(change.obj)))
        self._wake.set()

    def _workload_names(self) -> set[str]:
        return {name_of(workload) for workload in self.workloads.cache.values()}

    def _workloads_of(self, trainjob: str) -> set[str]:
        return {
            name_of(workload)
            for workload in self.workloads.cache.values()
            if dig(owner_trainjob(workload), "name") == trainjob
        }

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
        """Try again after the backoff: ``name`` is a Workload, None the AdmissionCheck."""

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
        body = active_apply_body(found, self._clock.now())
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
        trainjob = self.trainjobs.get(str(ref.get("name", "")), self.cfg.namespace)
        if trainjob is None or uid_of(trainjob) != ref.get("uid"):
            return False, None
        return True, trainjob

    async def _reconcile_workload(self, name: str) -> None:
        workload = self.workloads.get(name, self.cfg.namespace)
        if workload is None:
            return
        ready, trainjob = self._owner_in_view(workload)
        if not ready:
            return  # the TrainJob's own event brings this Workload back
        decision = decide(workload, trainjob, self.cfg.check)
        if decision is None or not self.elector.is_leader():
            return
        body = workload_apply_body(workload, self.cfg.check, decision, self._clock.now())
        try:
            await self._objects.patch_namespaced_custom_object_status(
                KUEUE_GROUP,
                KUEUE_VERSION,
                self.cfg.namespace,
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
                log.debug("admission: Workload %s moved on before the decision: %s", name, error)
                return
            log.warning("admission: cannot decide Workload %s: %s", name, describe(error))
            self._later(name)
            return
        self.written.append(
            Written(name, uid_of(workload), eviction_count(workload), decision.state)
        )
        metrics.admission_decided(
            uid_of(workload), eviction_count(workload), decision.state, self._clock.now()
        )
        log.info(
            "admission: Workload %s check %s %s (%s)",
            name,
            self.cfg.check,
            decision.state,
            decision.message,
        )


async def run_admission(
    settings: Settings,
    *,
    identity: str | None = None,
    timing: ElectionTiming | None = None,
    api: client.ApiClient | None = None,
) -> None:
    """Run one admission controller replica until cancelled; release the Lease on the way out.

    Without ``api`` it connects to ``settings.cluster``, each request bounded by
    ``timeouts.request``.
    """
    cfg = AdmissionConfig.from_settings(settings, identity=identity, timing=timing)
    owned = api is None
    api_client = (
        api
        if api is not None
        else await connection.connect(
            settings.cluster, token=None, request_timeout=settings.timeouts.request
        )
    )
    try:
        log.info(
            "admission: %s controls AdmissionCheck %s for namespace %s, Lease %s/%s",
            cfg.identity,
            cfg.check,
            cfg.namespace,
            cfg.lease_namespace,
            cfg.lease_name,
        )
        await AdmissionController(api_client, cfg).run()
    finally:
        if owned:
            await api_client.close()
