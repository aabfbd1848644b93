"""dispatch-admission: the Kueue admission-check controller that holds the readmission gate.

Kueue evicts a Workload (preemption, node failure, pods-ready timeout) and, left alone, admits it
again as soon as quota allows. Dispatch wants to decide that itself: an evicted job may be retried,
moved, or given up. Kueue's two-phase admission gives it the hook. A ClusterQueue that lists our
AdmissionCheck admits nothing until this controller marks the check ``Ready`` on the Workload.

The rules (``decide``):

* A Workload's check is decided only while its entry is ``Pending`` and the Workload holds quota
  (``QuotaReserved=True``), is active, is not being evicted, and has not finished. A decision is
  final for that admission: Kueue itself resets every check to ``Pending`` when it evicts, which
  starts the next round. So the controller never changes a decision it made, and never writes one
  twice.
* The *eviction count* of a Workload (``eviction_count``) is the sum of
  ``status.schedulingStats.evictions[].count``, which Kueue increments in the same write that sets
  ``Evicted=True`` and resets the checks; at least 1 when an ``Evicted`` condition exists at all,
  at least ``status.requeueState.count``. A *first admission* is one with eviction count 0.
* A Workload not owned by a dispatch TrainJob (a TrainJob carrying the ``job`` label) is not held:
  ``Ready``.
* ``reject``: the TrainJob's ``dispatch.phpboyscout.uk/reject`` annotation, when not empty, makes
  the check ``Rejected`` with its value as the message. Kueue then deactivates the Workload.
* A first admission is ``Ready``.
* After an eviction the check stays ``Pending`` until the TrainJob's
  ``dispatch.phpboyscout.uk/readmit`` annotation holds a decimal integer at least the eviction
  count: the dispatch side readmits "the job as of its N-th eviction" by writing N. A later eviction
  raises the count and closes the gate again without anyone touching the annotation.

Decisions are written by server-side apply on ``workloads/status`` under this controller's own
field manager, with a body holding only this controller's entry of ``status.admissionChecks`` (a
list map keyed by ``name``, so other controllers' entries are not touched) and the
``resourceVersion`` the decision was made from: a write based on a stale view fails with a conflict
instead of overwriting what changed, which is what keeps two replicas in a takeover from deciding
one admission two ways.

Only the leader of the Lease ``kueue.admissionLease`` writes; every replica keeps its caches warm so
a standby decides at once when it takes over. The Lease is also the heartbeat the adapter reads.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import BaseModel, ConfigDict

from dispatch_kubeflow.constants import (
    ADMISSION_CHECK_ACTIVE,
    ADMISSION_CHECKS,
    ADMISSION_CONTROLLER_NAME,
    ADMISSION_FIELD_MANAGER,
    ANNOTATION_READMIT,
    ANNOTATION_REJECT,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_JOB,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    WORKLOAD_EVICTED,
    WORKLOAD_FINISHED,
    WORKLOAD_QUOTA_RESERVED,
    WORKLOADS,
    CheckState,
)
from dispatch_kubeflow.errors import ErrInvalid, ErrUnsupported
from dispatch_kubeflow.kube import connection
from dispatch_kubeflow.leader import (
    ApiLeaseStore,
    Clock,
    ElectionTiming,
    LeaderElector,
    default_identity,
    utc_now,
)
from dispatch_kubeflow.settings import Settings

log = logging.getLogger(__name__)

Obj = Mapping[str, Any]

APPLY_PATCH = "application/apply-patch+yaml"
KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
WRITTEN_KEPT = 1024
MAX_MESSAGE = 1024  # Kueue allows 32 KiB; a reason longer than this is a mistake, not a reason.


# What the controller decides: pure functions of the objects it sees.


@dataclass(frozen=True)
class Decision:
    """What this controller's entry on one Workload should say."""

    state: CheckState
    message: str


def _conditions(obj: Obj) -> list[Obj]:
    return list((obj.get("status") or {}).get("conditions") or [])


def condition(obj: Obj, kind: str) -> Obj | None:
    return next((c for c in _conditions(obj) if c.get("type") == kind), None)


def condition_true(obj: Obj, kind: str) -> bool:
    found = condition(obj, kind)
    return found is not None and found.get("status") == "True"


def check_entry(workload: Obj, check: str) -> Obj | None:
    entries = (workload.get("status") or {}).get("admissionChecks") or []
    return next((e for e in entries if e.get("name") == check), None)


def eviction_count(workload: Obj) -> int:
    """How many times Kueue has evicted this Workload; 0 means it was never evicted.

    The value the dispatch side writes to ``dispatch.phpboyscout.uk/readmit`` to open the gate.
    """
    status = workload.get("status") or {}
    counted = sum(
        int(e.get("count") or 0) for e in (status.get("schedulingStats") or {}).get("evictions", [])
    )
    requeued = int((status.get("requeueState") or {}).get("count") or 0)
    seen = 1 if condition(workload, WORKLOAD_EVICTED) is not None else 0
    return max(counted, requeued, seen)


def owner_trainjob(workload: Obj) -> Obj | None:
    """The ownerReference to the TrainJob Kueue made this Workload for, if there is one."""
    for ref in (workload.get("metadata") or {}).get("ownerReferences") or []:
        group = str(ref.get("apiVersion", "")).split("/")[0]
        if ref.get("kind") == "TrainJob" and group == TRAINER_GROUP:
            return dict(ref)
    return None


def _readmitted_up_to(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    return int(text) if text.isdigit() else None


def decide(workload: Obj, trainjob: Obj | None, check: str) -> Decision | None:
    """The decision for ``check`` on ``workload``, or None when there is nothing to write.

    ``trainjob`` is the dispatch TrainJob that owns the Workload, or None when the Workload has no
    TrainJob owner at all (the caller waits when the owner exists but is not in view yet).
    """
    entry = check_entry(workload, check)
    if entry is None or entry.get("state") != CheckState.PENDING:
        return None
    if not condition_true(workload, WORKLOAD_QUOTA_RESERVED):
        return None
    if condition_true(workload, WORKLOAD_FINISHED) or condition_true(workload, WORKLOAD_EVICTED):
        return None  # an eviction in progress is decided at the requeue, when quota is reserved
    if (workload.get("spec") or {}).get("active") is False:
        return None
    decision = _decide_pending(workload, trainjob)
    if decision.state == CheckState.PENDING and decision.message == entry.get("message"):
        return None
    return decision


def _decide_pending(workload: Obj, trainjob: Obj | None) -> Decision:
    labels = ((trainjob or {}).get("metadata") or {}).get("labels") or {}
    if trainjob is None or LABEL_JOB not in labels:
        return Decision(CheckState.READY, "not a dispatch job: not held by the readmission gate")
    name = trainjob["metadata"]["name"]
    annotations = trainjob["metadata"].get("annotations") or {}
    reason = (annotations.get(ANNOTATION_REJECT) or "").strip()
    if reason:
        return Decision(CheckState.REJECTED, reason[:MAX_MESSAGE])
    evictions = eviction_count(workload)
    if evictions == 0:
        return Decision(CheckState.READY, "first admission")
    raw = annotations.get(ANNOTATION_READMIT)
    readmitted = _readmitted_up_to(raw)
    if readmitted is not None and readmitted >= evictions:
        return Decision(CheckState.READY, f"readmitted by dispatch after eviction {evictions}")
    if raw is not None and readmitted is None:
        return Decision(
            CheckState.PENDING,
            f"held after eviction {evictions}: annotation {ANNOTATION_READMIT} on TrainJob "
            f"{name} is {raw[:64]!r}, not a decimal eviction count",
        )
    return Decision(
        CheckState.PENDING,
        f"held after eviction {evictions}: waiting for dispatch to readmit TrainJob {name} "
        f"({ANNOTATION_READMIT}: {evictions!r})",
    )


def format_time(when: datetime) -> str:
    """metav1.Time: RFC 3339 in UTC, whole seconds."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def workload_apply_body(
    workload: Obj, check: str, decision: Decision, now: datetime
) -> dict[str, Any]:
    """The server-side apply body of one decision: only our entry, and the version it rests on.

    ``lastTransitionTime`` moves only when the state does.
    """
    entry = check_entry(workload, check) or {}
    moved = entry.get("state") != decision.state or not entry.get("lastTransitionTime")
    metadata = workload["metadata"]
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "resourceVersion": metadata["resourceVersion"],
        },
        "status": {
            "admissionChecks": [
                {
                    "name": check,
                    "state": str(decision.state),
                    "message": decision.message,
                    "lastTransitionTime": format_time(now)
                    if moved
                    else entry["lastTransitionTime"],
                }
            ]
        },
    }


def active_apply_body(admission_check: Obj, now: datetime) -> dict[str, Any] | None:
    """The apply body that marks our AdmissionCheck ``Active=True``, or None when it already is."""
    metadata = admission_check["metadata"]
    generation = metadata.get("generation")
    current = condition(admission_check, ADMISSION_CHECK_ACTIVE)
    if (
        current is not None
        and current.get("status") == "True"
        and current.get("observedGeneration") == generation
    ):
        return None
    already_true = current is not None and current.get("status") == "True"
    active: dict[str, Any] = {
        "type": ADMISSION_CHECK_ACTIVE,
        "status": "True",
        "reason": "Active",
        "message": f"{ADMISSION_CONTROLLER_NAME} is deciding this check",
        "lastTransitionTime": current["lastTransitionTime"]
        if already_true and current is not None
        else format_time(now),
    }
    if generation is not None:
        active["observedGeneration"] = generation
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": "AdmissionCheck",
        "metadata": {"name": metadata["name"]},
        "status": {"conditions": [active]},
    }


# The controller: mirrors of three kinds, and a leader that writes what ``decide`` says.


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


class Mirror:
    """The objects of one kind as last listed and watched."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.objects: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()

    def replace(self, items: Sequence[dict[str, Any]]) -> None:
        self.objects = {item["metadata"]["name"]: item for item in items}
        self.synced.set()

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if event_type == "DELETED":
            self.objects.pop(name, None)
        else:
            self.objects[name] = obj


ListCall = Callable[..., Awaitable[Any]]


class AdmissionController:
    """One replica: always mirroring, deciding only while it leads."""

    def __init__(
        self,
        api: client.ApiClient,
        cfg: AdmissionConfig,
        *,
        clock: Clock = utc_now,
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
        self.checks = Mirror("AdmissionCheck")
        self.workloads = Mirror("Workload")
        self.trainjobs = Mirror("TrainJob")
        # The most recent decisions this replica wrote (for logs and tests); bounded.
        self.written: deque[Written] = deque(maxlen=WRITTEN_KEPT)
        self._dirty: set[str] = set()
        self._check_dirty = True
        self._wake = asyncio.Event()

    # Running.

    async def run(self) -> None:
        """Mirror the three kinds and campaign for the Lease until cancelled."""
        mirrors = [
            asyncio.create_task(self._mirror(self.checks, self._list_checks), name="mirror-checks"),
            asyncio.create_task(
                self._mirror(self.workloads, self._list_workloads), name="mirror-workloads"
            ),
            asyncio.create_task(
                self._mirror(self.trainjobs, self._list_trainjobs), name="mirror-trainjobs"
            ),
        ]
        try:
            await self.elector.run(self.lead)
        finally:
            for task in mirrors:
                task.cancel()
            await asyncio.gather(*mirrors, return_exceptions=True)

    async def lead(self) -> None:
        """The leader's work: decide everything once, then whatever changes."""
        for mirror in (self.checks, self.workloads, self.trainjobs):
            await mirror.synced.wait()
        self._check_dirty = True
        self._dirty.update(self.workloads.objects)
        while True:
            self._wake.clear()
            await self._reconcile_dirty()
            await self._wake.wait()

    # Listing and watching.

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

    async def _mirror(self, mirror: Mirror, list_call: ListCall) -> None:
        """LIST, then WATCH from the list's resourceVersion; relist on 410 or any failure."""
        while True:
            try:
                listing = await list_call(_request_timeout=self.cfg.request_timeout)
                mirror.replace(listing.get("items") or [])
                self._relisted(mirror)
                version = listing["metadata"]["resourceVersion"]
                while True:
                    version = await self._watch(mirror, list_call, version)
            except ApiException as exc:
                if exc.status == 410:
                    log.info("admission: %s watch expired; listing again", mirror.kind)
                    continue
                log.warning("admission: cannot list or watch %s: %s", mirror.kind, exc)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                log.warning("admission: cannot list or watch %s: %s", mirror.kind, exc)
            except Exception:
                log.exception("admission: watching %s failed; listing again", mirror.kind)
            await asyncio.sleep(self.cfg.retry_backoff)

    async def _watch(self, mirror: Mirror, list_call: ListCall, version: str) -> str:
        """One watch request; returns the resourceVersion to continue from."""
        stream = watch.Watch()
        try:
            async for event in stream.stream(
                list_call,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=self.cfg.watch_timeout,
                _request_timeout=self.cfg.watch_timeout + 30,
            ):
                obj = event["raw_object"]
                version = obj["metadata"]["resourceVersion"]
                if event["type"] == "BOOKMARK":
                    continue
                mirror.apply(event["type"], obj)
                self._changed(mirror, obj)
        finally:
            await stream.close()
        return version

    def _relisted(self, mirror: Mirror) -> None:
        if mirror is self.checks:
            self._check_dirty = True
        else:
            self._dirty.update(self.workloads.objects)
        self._wake.set()

    def _changed(self, mirror: Mirror, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if mirror is self.checks:
            self._check_dirty = True
        elif mirror is self.workloads:
            self._dirty.add(name)
        else:
            self._dirty.update(
                wl_name
                for wl_name, wl in self.workloads.objects.items()
                if (owner_trainjob(wl) or {}).get("name") == name
            )
        self._wake.set()

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
        found = self.checks.objects.get(self.cfg.check)
        if found is None:
            log.warning("admission: AdmissionCheck %s does not exist", self.cfg.check)
            return
        controller = (found.get("spec") or {}).get("controllerName")
        if controller != ADMISSION_CONTROLLER_NAME:
            log.warning(
                "admission: AdmissionCheck %s has controllerName %r, not %r; leaving it alone",
                self.cfg.check,
                controller,
                ADMISSION_CONTROLLER_NAME,
            )
            return
        body = active_apply_body(found, self._clock())
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
        except (ApiException, aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("admission: cannot mark AdmissionCheck %s Active: %s", self.cfg.check, exc)
            self._later(None)

    def _owner_in_view(self, workload: Obj) -> tuple[bool, Obj | None]:
        """(ready to decide, owning TrainJob). Not ready while the owner is not mirrored yet."""
        ref = owner_trainjob(workload)
        if ref is None:
            return True, None
        trainjob = self.trainjobs.objects.get(ref.get("name", ""))
        if trainjob is None or trainjob["metadata"].get("uid") != ref.get("uid"):
            return False, None
        return True, trainjob

    async def _reconcile_workload(self, name: str) -> None:
        workload = self.workloads.objects.get(name)
        if workload is None:
            return
        ready, trainjob = self._owner_in_view(workload)
        if not ready:
            return  # the TrainJob's own event brings this Workload back
        decision = decide(workload, trainjob, self.cfg.check)
        if decision is None or not self.elector.is_leader():
            return
        body = workload_apply_body(workload, self.cfg.check, decision, self._clock())
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
        except ApiException as exc:
            if exc.status in (404, 409):
                # Gone, or changed since we looked: the watch brings the new version, if any.
                log.debug("admission: Workload %s moved on before the decision: %s", name, exc)
                return
            log.warning("admission: cannot decide Workload %s: %s", name, exc)
            self._later(name)
            return
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("admission: cannot decide Workload %s: %s", name, exc)
            self._later(name)
            return
        evictions = eviction_count(workload)
        self.written.append(
            Written(name, workload["metadata"].get("uid", ""), evictions, decision.state)
        )
        log.info(
            "admission: Workload %s check %s %s (%s)",
            name,
            self.cfg.check,
            decision.state,
            decision.message,
        )


# Entry points.


async def connect(settings: Settings) -> client.ApiClient:
    """An API client for ``settings.cluster``, each request bounded by ``timeouts.request``."""
    return await connection.connect(
        settings.cluster, token=None, request_timeout=settings.timeouts.request
    )


async def run_admission(
    settings: Settings,
    *,
    identity: str | None = None,
    timing: ElectionTiming | None = None,
    api: client.ApiClient | None = None,
) -> None:
    """Run one admission controller replica until cancelled; release the Lease on the way out."""
    cfg = AdmissionConfig.from_settings(settings, identity=identity, timing=timing)
    owned = api is None
    api_client = api if api is not None else await connect(settings)
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


def load_settings(path: Path) -> Settings:
    """A settings JSON document, or a KubeflowAdapter manifest (YAML or JSON) whose spec it is."""
    from dispatch_kubeflow.settings import parse_settings, parse_settings_object

    text = path.read_text(encoding="utf-8")
    try:
        return parse_settings(text)
    except ErrInvalid:
        try:
            document = yaml.safe_load(text)
        except yaml.YAMLError:
            raise
        if isinstance(document, dict) and document.get("kind") == "KubeflowAdapter":
            return parse_settings_object(document.get("spec"), pointer="/spec")
        raise


def _seconds(value: str) -> timedelta:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be above zero")
    return timedelta(seconds=seconds)


def build_parser() -> argparse.ArgumentParser:
    defaults = ElectionTiming()
    parser = argparse.ArgumentParser(
        prog="dispatch-kubeflow admission",
        description="Run the Kueue admission-check controller that holds dispatch's "
        "readmission gate.",
    )
    parser.add_argument(
        "--settings",
        type=Path,
        required=True,
        help="a settings JSON document, or a KubeflowAdapter manifest",
    )
    parser.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or None,
        help="this replica's Lease holder identity (default: $POD_NAME, else host name + UUID)",
    )
    parser.add_argument(
        "--lease-duration",
        type=_seconds,
        default=defaults.lease_duration,
        help="seconds a Lease lasts without renewal (default 15)",
    )
    parser.add_argument(
        "--renew-deadline",
        type=_seconds,
        default=defaults.renew_deadline,
        help="seconds the leader keeps trying to renew before it stops deciding (default 10)",
    )
    parser.add_argument(
        "--retry-period",
        type=_seconds,
        default=defaults.retry_period,
        help="seconds between attempts to take or renew the Lease (default 2)",
    )
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default INFO)")
    return parser


async def _run_until_signalled(settings: Settings, args: argparse.Namespace) -> None:
    timing = ElectionTiming(
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
    )
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await run_admission(settings, identity=args.identity, timing=timing)


def main(argv: Sequence[str] | None = None) -> int:
    """``dispatch-kubeflow admission`` and ``python -m dispatch_kubeflow.admission``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=str(args.log_level).upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = load_settings(args.settings)
        timing_check = ElectionTiming(
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
        )
        AdmissionConfig.from_settings(settings, identity=args.identity, timing=timing_check)
    except (OSError, ErrInvalid, ValueError, yaml.YAMLError) as exc:
        print(f"dispatch-kubeflow admission: {args.settings}: {exc}", file=sys.stderr)
        return 2
    try:
        asyncio.run(_run_until_signalled(settings, args))
    except ErrUnsupported as exc:
        print(f"dispatch-kubeflow admission: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
