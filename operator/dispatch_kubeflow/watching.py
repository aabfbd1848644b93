"""One LIST+WATCH per kind for the whole adapter, turned into dispatch events.

A job's story is spread over six kinds (TrainJobs, JobSets, pods, Kueue Workloads, nodes and the
admission Lease). Watching each per job would cost a connection per job; polling would miss
short-lived states and cost requests forever. So each kind gets exactly one informer-style loop
(``Informer``): LIST (paged) for a consistent snapshot and its resourceVersion, then WATCH from
that resourceVersion with bookmarks, resuming from the last seen resourceVersion after a
disconnect, and relisting after HTTP 410 (the resourceVersion was compacted away). A relist is
reconciled against the cache: objects missing from the new list get a synthetic deletion. A
watch is never started without a resourceVersion.

``Supervisor`` indexes what the informers see by (job, attempt), re-derives a job whenever one
of its objects (or a node one of its pods runs on) changes, and hands the derivation to the
exactly-once ``Reporter`` of ``events``. Until every informer has listed once, nothing is
derived: a job is judged from a complete picture, so a job that finished while nothing watched
gets its ``Finished`` and nothing spurious before it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, Protocol, runtime_checkable

import aiohttp
from kubernetes_asyncio import client

from dispatch_kubeflow.constants import (
    ANNOTATION_REPORTED,
    BUILTIN_LOSS_TAINTS,
    EFFECT_NO_EXECUTE,
    JOBSET_GROUP,
    JOBSET_VERSION,
    JOBSETS,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_ADAPTER,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_KUEUE_JOB_UID,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    WORKLOADS,
)
from dispatch_kubeflow.derivation import derive
from dispatch_kubeflow.events import DispatchEvent, JobObservation, Taint
from dispatch_kubeflow.lease import Clock, LeaseHeartbeat, SystemClock
from dispatch_kubeflow.reporting import ReportedRecord, Reporter, ReportStore
from dispatch_kubeflow.settings import Settings

log = logging.getLogger(__name__)

KIND_TRAINJOB = "TrainJob"
KIND_JOBSET = "JobSet"
KIND_POD = "Pod"
KIND_WORKLOAD = "Workload"
KIND_NODE = "Node"
KIND_LEASE = "Lease"

LIST_PAGE = 500
# Changes applied before the affected jobs are derived, when more keep arriving.
FLUSH_EVERY = 100
DEFAULT_WATCH_TIMEOUT = timedelta(minutes=5)
BACKOFF_MAX = 30.0
SAVE_RETRY_DELAY = 1.0
# Record saves in flight at once when many jobs changed together.
SAVE_CONCURRENCY = 32

JobKey = tuple[str, int]
ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class Change:
    kind: str
    type: ChangeType
    obj: dict[str, Any]


@dataclass(frozen=True)
class Synced:
    """An informer finished a LIST and reconciled its cache with it."""

    kind: str


@dataclass(frozen=True)
class StopNoted:
    job: str


@dataclass(frozen=True)
class Retry:
    """Derive a job again: saving its record failed last time."""

    key: JobKey


QueueItem = Change | Synced | StopNoted | Retry | DispatchEvent


# --------------------------------------------------------------------------------------------
# Trimming: keep only the fields derivation reads, so 10,000 pods stay small in memory.


def _pick(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: obj[key] for key in keys if key in obj}


def _trim_metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    return _pick(
        obj.get("metadata") or {},
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "labels",
        "annotations",
        "ownerReferences",
        "deletionTimestamp",
    )


def trim(kind: str, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an object of ``kind`` that derivation and indexing read."""
    meta = _trim_metadata(obj)
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if kind == KIND_NODE:
        taints = [t for t in spec.get("taints") or [] if t.get("effect") == EFFECT_NO_EXECUTE]
        return {"metadata": _pick(meta, "name", "resourceVersion"), "spec": {"taints": taints}}
    if kind == KIND_POD:
        return {
            "metadata": _pick(
                meta, "name", "uid", "resourceVersion", "labels", "deletionTimestamp"
            ),
            "spec": _pick(spec, "nodeName"),
            "status": _pick(
                status,
                "phase",
                "reason",
                "message",
                "conditions",
                "containerStatuses",
                "initContainerStatuses",
            ),
        }
    if kind == KIND_LEASE:
        return {"metadata": meta, "spec": dict(spec)}
    if kind in (KIND_TRAINJOB, KIND_WORKLOAD):
        return {"metadata": meta, "spec": _pick(spec, "suspend", "active"), "status": status}
    return {"metadata": meta, "status": status}


def _meta(obj: Mapping[str, Any], key: str) -> Any:
    return (obj.get("metadata") or {}).get(key)


def _name(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj, "name") or "")


def _rv(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj, "resourceVersion") or "")


def job_key(obj: Mapping[str, Any]) -> JobKey | None:
    labels = _meta(obj, "labels") or {}
    job, attempt = labels.get(LABEL_JOB), labels.get(LABEL_ATTEMPT)
    if not job or attempt is None:
        return None
    try:
        return str(job), int(attempt)
    except ValueError:
        return None


def _workload_owner_uids(workload: Mapping[str, Any]) -> set[str]:
    uids = {
        str(ref.get("uid"))
        for ref in _meta(workload, "ownerReferences") or []
        if ref.get("kind") == "TrainJob" and ref.get("uid")
    }
    label = (_meta(workload, "labels") or {}).get(LABEL_KUEUE_JOB_UID)
    if label:
        uids.add(str(label))
    return uids


def node_taints(node: Mapping[str, Any]) -> tuple[Taint, ...]:
    return tuple(
        Taint(key=str(t.get("key") or ""), value=t.get("value"), effect=str(t.get("effect")))
        for t in (node.get("spec") or {}).get("taints") or []
        if t.get("effect") == EFFECT_NO_EXECUTE
    )


# --------------------------------------------------------------------------------------------
# One kind: LIST + WATCH


ListFn = Callable[..., Awaitable[Any]]


class _Backoff:
    def __init__(self) -> None:
        self._delay = 0.0

    def reset(self) -> None:
        self._delay = 0.0

    async def sleep(self) -> None:
        self._delay = min(BACKOFF_MAX, max(0.5, self._delay * 2))
        await asyncio.sleep(self._delay * random.uniform(0.8, 1.2))


class _Gone(Exception):
    """HTTP 410: the resourceVersion is too old; relist."""


class _Failed(Exception):
    """A request failed in a way that a retry after a pause may fix."""


class Informer:
    """LIST then WATCH one kind forever, keeping a cache by name and emitting changes.

    ``list_fn`` is a kubernetes_asyncio list call with its positional arguments and selectors
    bound; raw JSON is read (``_preload_content=False``) so no model classes are built.
    """

    def __init__(
        self,
        kind: str,
        list_fn: ListFn,
        emit: Callable[[QueueItem], Awaitable[None]],
        *,
        watch_timeout: timedelta = DEFAULT_WATCH_TIMEOUT,
        request_timeout: timedelta = timedelta(seconds=30),
    ) -> None:
        self.kind = kind
        self._list_fn = list_fn
        self._emit = emit
        self._watch_timeout = int(watch_timeout.total_seconds())
        self._request_timeout = request_timeout.total_seconds()
        self.cache: dict[str, dict[str, Any]] = {}
        self.requests = 0
        self.relists = 0

    async def run(self) -> None:
        backoff = _Backoff()
        while True:
            try:
                rv = await self._relist()
                backoff.reset()
                await self._watch(rv)
            except _Gone:
                log.info("%s: resourceVersion expired, relisting", self.kind)
            except _Failed as error:
                log.warning("%s: %s; retrying", self.kind, error)
                await backoff.sleep()

    async def _relist(self) -> str:
        items, rv = await self._list()
        self.relists += 1
        fresh = {_name(item): item for item in items}
        for name in [n for n in self.cache if n not in fresh]:
            await self._emit(Change(self.kind, "DELETED", self.cache.pop(name)))
        for name, item in fresh.items():
            previous = self.cache.get(name)
            self.cache[name] = item
            if previous is None:
                await self._emit(Change(self.kind, "ADDED", item))
            elif _rv(previous) != _rv(item):
                await self._emit(Change(self.kind, "MODIFIED", item))
        await self._emit(Synced(self.kind))
        return rv

    async def _list(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": LIST_PAGE}
            if token:
                kwargs["_continue"] = token
            try:
                body = await self._request_json(**kwargs)
            except _Gone:
                if token is None:
                    raise
                items, token = [], None  # the continue token expired: start over
                continue
            items.extend(trim(self.kind, item) for item in body.get("items") or [])
            metadata = body.get("metadata") or {}
            token = metadata.get("continue") or None
            if token is None:
                rv = metadata.get("resourceVersion")
                if not rv:
                    raise _Failed("LIST returned no resourceVersion")
                return items, str(rv)

    async def _request_json(self, **kwargs: Any) -> dict[str, Any]:
        self.requests += 1
        try:
            response = await self._list_fn(
                _preload_content=False, _request_timeout=self._request_timeout, **kwargs
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise _Failed(f"LIST failed: {error!r}") from error
        try:
            if response.status == 410:
                raise _Gone()
            data = await response.read()
            if response.status != 200:
                raise _Failed(f"LIST answered HTTP {response.status}: {data[:200]!r}")
            body = json.loads(data)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise _Failed(f"LIST failed: {error!r}") from error
        finally:
            response.release()
        if not isinstance(body, dict):
            raise _Failed("LIST returned no object")
        return body

    async def _watch(self, rv: str) -> None:
        """Watch from ``rv``, resuming from the last seen resourceVersion; return only via _Gone."""
        backoff = _Backoff()
        while True:
            try:
                rv = await self._watch_once(rv)
                backoff.reset()
            except _Failed as error:
                log.info("%s: watch interrupted (%s); resuming from %s", self.kind, error, rv)
                await backoff.sleep()

    async def _watch_once(self, rv: str) -> str:
        self.requests += 1
        timeout = aiohttp.ClientTimeout(
            sock_connect=self._request_timeout, sock_read=self._watch_timeout + 30
        )
        try:
            response = await self._list_fn(
                watch=True,
                resource_version=rv,
                allow_watch_bookmarks=True,
                timeout_seconds=self._watch_timeout,
                _preload_content=False,
                _request_timeout=timeout,
            )
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise _Failed(repr(error)) from error
        try:
            if response.status == 410:
                raise _Gone()
            if response.status != 200:
                data = await response.read()
                raise _Failed(f"WATCH answered HTTP {response.status}: {data[:200]!r}")
            while line := await response.content.readline():
                rv = await self._handle_line(line, rv)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise _Failed(repr(error)) from error
        finally:
            response.release()
        return rv

    async def _handle_line(self, line: bytes, rv: str) -> str:
        event = json.loads(line)
        type_, obj = event.get("type"), event.get("object") or {}
        if type_ == "ERROR":
            if obj.get("code") == 410:
                raise _Gone()
            raise _Failed(f"watch error {obj.get('code')}: {obj.get('message')}")
        new_rv = _rv(obj) or rv
        if type_ == "BOOKMARK":
            return new_rv
        if type_ not in ("ADDED", "MODIFIED", "DELETED"):
            return new_rv
        item = trim(self.kind, obj)
        if type_ == "DELETED":
            self.cache.pop(_name(item), None)
        else:
            self.cache[_name(item)] = item
        await self._emit(Change(self.kind, type_, item))
        return new_rv


# --------------------------------------------------------------------------------------------
# Where the last reported record lives


@runtime_checkable
class ListingReportStore(ReportStore, Protocol):
    """A store that can also name the jobs it holds unfinished records of.

    A store outside the TrainJob (the DispatchJob status) implements this, so that a job whose
    objects all vanished while nothing watched still gets its ``Vanished``.
    """

    async def unfinished(self) -> list[JobKey]: ...


class TrainJobAnnotationStore:
    """Keeps the record as an annotation on the TrainJob itself.

    Reads come from the informer's cache (the LIST after a restart carries the annotation), so
    loading costs no request; each save is one merge patch. The record dies with the TrainJob,
    which is why a job deleted while nothing watched cannot be reported as ``Vanished`` by this
    store.
    """

    def __init__(
        self,
        api: client.CustomObjectsApi,
        namespace: str,
        lookup: Callable[[str, int], Mapping[str, Any] | None],
        request_timeout: timedelta = timedelta(seconds=30),
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._lookup = lookup
        self._timeout = request_timeout.total_seconds()
        self.requests = 0

    async def load(self, job: str, attempt: int) -> ReportedRecord | None:
        train_job = self._lookup(job, attempt)
        annotations = (_meta(train_job, "annotations") or {}) if train_job else {}
        return ReportedRecord.from_json(annotations.get(ANNOTATION_REPORTED))

    async def save(self, job: str, attempt: int, record: ReportedRecord) -> None:
        train_job = self._lookup(job, attempt)
        if train_job is None:
            return
        self.requests += 1
        body = {"metadata": {"annotations": {ANNOTATION_REPORTED: record.to_json()}}}
        # The typed stub omits _content_type; without it a dict body goes out as a JSON patch.
        patch: Callable[..., Awaitable[Any]] = self._api.patch_namespaced_custom_object
        try:
            await patch(
                TRAINER_GROUP,
                TRAINER_VERSION,
                self._namespace,
                TRAINJOBS,
                _name(train_job),
                body,
                _content_type="application/merge-patch+json",
                _request_timeout=self._timeout,
            )
        except client.ApiException as error:
            if error.status != 404:
                raise


# --------------------------------------------------------------------------------------------
# The index of everything watched, by (job, attempt)


@dataclass
class _Index:
    train_jobs: dict[JobKey, dict[str, Any]] = field(default_factory=dict)
    train_job_keys_by_uid: dict[str, JobKey] = field(default_factory=dict)
    job_sets: dict[JobKey, dict[str, Any]] = field(default_factory=dict)
    pods: defaultdict[JobKey, dict[str, dict[str, Any]]] = field(
        default_factory=lambda: defaultdict(dict)
    )
    pod_keys: dict[str, JobKey] = field(default_factory=dict)
    workloads_by_owner: dict[str, dict[str, Any]] = field(default_factory=dict)
    nodes: dict[str, tuple[Taint, ...]] = field(default_factory=dict)
    keys_by_node: defaultdict[str, set[JobKey]] = field(default_factory=lambda: defaultdict(set))
    # Deleted nodes that pods of a job are bound to (NodeLost for those jobs).
    deleted_nodes: set[str] = field(default_factory=set)

    def job_keys(self) -> set[JobKey]:
        return set(self.train_jobs) | set(self.job_sets) | {k for k, v in self.pods.items() if v}

    def apply(self, change: Change) -> set[JobKey]:
        """Record a change; return the jobs it may affect."""
        handler = {
            KIND_TRAINJOB: self._train_job,
            KIND_JOBSET: self._job_set,
            KIND_POD: self._pod,
            KIND_WORKLOAD: self._workload,
            KIND_NODE: self._node,
        }.get(change.kind)
        return handler(change) if handler else set()

    def _train_job(self, change: Change) -> set[JobKey]:
        key = job_key(change.obj)
        if key is None:
            return set()
        uid = str(_meta(change.obj, "uid") or "")
        if change.type == "DELETED":
            self.train_jobs.pop(key, None)
        else:
            self.train_jobs[key] = change.obj
            if uid:
                self.train_job_keys_by_uid[uid] = key
        return {key}

    def _job_set(self, change: Change) -> set[JobKey]:
        key = job_key(change.obj)
        if key is None:
            return set()
        if change.type == "DELETED":
            self.job_sets.pop(key, None)
        else:
            self.job_sets[key] = change.obj
        return {key}

    def _pod(self, change: Change) -> set[JobKey]:
        key = job_key(change.obj)
        if key is None:
            return set()
        name = _name(change.obj)
        pod = change.obj
        if change.type == "DELETED" and _meta(pod, "deletionTimestamp") is None:
            # A deleted pod stays as evidence (a taint-manager deletion says NodeLost); marking
            # it deleted keeps it out of "running".
            pod = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "deleted"}}
        self.pods[key][name] = pod
        self.pod_keys[name] = key
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            self.keys_by_node[node].add(key)
        return {key}

    def _workload(self, change: Change) -> set[JobKey]:
        affected: set[JobKey] = set()
        for uid in _workload_owner_uids(change.obj):
            if change.type == "DELETED":
                self.workloads_by_owner.pop(uid, None)
            else:
                self.workloads_by_owner[uid] = change.obj
            key = self.train_job_keys_by_uid.get(uid)
            if key is not None:
                affected.add(key)
        return affected

    def _node(self, change: Change) -> set[JobKey]:
        name = _name(change.obj)
        deleted = change.type == "DELETED"
        taints = () if deleted else node_taints(change.obj)
        was_deleted = name in self.deleted_nodes
        if deleted and self.keys_by_node.get(name):
            self.deleted_nodes.add(name)
        elif not deleted:
            self.deleted_nodes.discard(name)
        if self.nodes.get(name, ()) == taints and was_deleted == (name in self.deleted_nodes):
            return set()
        if taints:
            self.nodes[name] = taints
        else:
            self.nodes.pop(name, None)
        return set(self.keys_by_node.get(name, ()))

    def observation(self, key: JobKey, stopped: bool) -> JobObservation:
        train_job = self.train_jobs.get(key)
        uid = str(_meta(train_job, "uid") or "") if train_job else ""
        pods = tuple(self.pods.get(key, {}).values())
        nodes = {(p.get("spec") or {}).get("nodeName") for p in pods}
        # Built without validation: the objects came from the API and copying them per
        # derivation would dominate the cost of a busy watch.
        return JobObservation.model_construct(
            job=key[0],
            attempt=key[1],
            train_job=train_job,
            job_set=self.job_sets.get(key),
            pods=pods,
            workload=self.workloads_by_owner.get(uid) if uid else None,
            node_taints={n: self.nodes[n] for n in nodes if n and n in self.nodes},
            deleted_nodes=frozenset(n for n in nodes if n in self.deleted_nodes),
            stopped=stopped,
        )

    def forget(self, key: JobKey) -> None:
        """Drop a finished job whose objects are all gone."""
        for pod_name in self.pods.pop(key, {}):
            self.pod_keys.pop(pod_name, None)
        for keys in self.keys_by_node.values():
            keys.discard(key)
        self.deleted_nodes = {n for n in self.deleted_nodes if self.keys_by_node.get(n)}


# --------------------------------------------------------------------------------------------
# The supervisor


class Supervisor:
    """Watches everything of one adapter and yields its dispatch events, each transition once.

    ``store`` keeps the last reported record of each job (default: an annotation on the
    TrainJob). ``clock`` stamps events and drives the Lease timer.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        settings: Settings,
        adapter_name: str = "default",
        store: ReportStore | None = None,
        clock: Clock | None = None,
        *,
        watch_timeout: timedelta = DEFAULT_WATCH_TIMEOUT,
    ) -> None:
        self._api = api_client
        self._settings = settings
        self.adapter_name = adapter_name
        self._clock: Clock = clock or SystemClock()
        self._watch_timeout = watch_timeout
        self._index = _Index()
        self._custom = client.CustomObjectsApi(api_client)
        self._store: ReportStore = store or TrainJobAnnotationStore(
            self._custom,
            settings.namespace,
            lambda job, attempt: self._index.train_jobs.get((job, attempt)),
            settings.timeouts.request,
        )
        self._reporter = Reporter(self._store)
        self._loss_taints = loss_taints_of(settings)
        # job -> UIDs of its TrainJobs when stop_job was called: a TrainJob created later (the
        # same job id used again) is not stopped.
        self._stopped: dict[str, set[str]] = {}
        self._finished: set[JobKey] = set()
        self._uids: dict[JobKey, str] = {}
        self._queue: asyncio.Queue[QueueItem] = asyncio.Queue()
        self.informers: list[Informer] = []
        self._heartbeat: LeaseHeartbeat | None = None
        self._lease_cache: Informer | None = None

    @property
    def store(self) -> ReportStore:
        return self._store

    def requests(self) -> int:
        """API requests made so far by the informers and the store."""
        count = sum(i.requests for i in self.informers)
        return count + int(getattr(self._store, "requests", 0))

    def note_stopped(self, job: str) -> None:
        """stop_job was called for ``job``: its attempts end as Stopped, not Vanished."""
        uids = {uid for key, uid in self._uids.items() if key[0] == job}
        self._stopped.setdefault(job, set()).update(uids)
        self._queue.put_nowait(StopNoted(job))

    def _is_stopped(self, key: JobKey) -> bool:
        uids = self._stopped.get(key[0])
        if uids is None:
            return False
        train_job = self._index.train_jobs.get(key)
        return train_job is None or str(_meta(train_job, "uid") or "") in uids

    def _note_train_job(self, change: Change) -> None:
        """A TrainJob with a new UID for a known (job, attempt) is a new job: forget the old."""
        key = job_key(change.obj)
        uid = str(_meta(change.obj, "uid") or "")
        if key is None or not uid or change.type == "DELETED":
            return
        previous = self._uids.get(key)
        self._uids[key] = uid
        if previous is not None and previous != uid:
            self._finished.discard(key)
            self._reporter.forget(*key)

    def _selector(self) -> str:
        return f"{LABEL_ADAPTER}={self.adapter_name}"

    def _informers(self) -> list[Informer]:
        ns = self._settings.namespace
        core = client.CoreV1Api(self._api)
        custom = self._custom
        emit = self._queue.put
        timeouts = {
            "watch_timeout": self._watch_timeout,
            "request_timeout": self._settings.timeouts.request,
        }

        def custom_list(group: str, version: str, plural: str, **selectors: Any) -> ListFn:
            async def call(**kwargs: Any) -> Any:
                return await custom.list_namespaced_custom_object(
                    group, version, ns, plural, **selectors, **kwargs
                )

            return call

        def core_list(fn: Callable[..., Awaitable[Any]], *args: Any, **selectors: Any) -> ListFn:
            async def call(**kwargs: Any) -> Any:
                return await fn(*args, **selectors, **kwargs)

            return call

        selector = self._selector()
        informers = [
            Informer(
                KIND_TRAINJOB,
                custom_list(TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS, label_selector=selector),
                emit,
                **timeouts,
            ),
            Informer(
                KIND_JOBSET,
                custom_list(JOBSET_GROUP, JOBSET_VERSION, JOBSETS, label_selector=selector),
                emit,
                **timeouts,
            ),
            Informer(
                KIND_POD,
                core_list(core.list_namespaced_pod, ns, label_selector=selector),
                emit,
                **timeouts,
            ),
            Informer(KIND_NODE, core_list(core.list_node), emit, **timeouts),
        ]
        kueue = self._settings.kueue
        if kueue is not None:
            informers.append(
                Informer(
                    KIND_WORKLOAD,
                    custom_list(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS),
                    emit,
                    **timeouts,
                )
            )
            lease = kueue.admission_lease
            coordination = client.CoordinationV1Api(self._api)
            informers.append(
                Informer(
                    KIND_LEASE,
                    core_list(
                        coordination.list_namespaced_lease,
                        lease.namespace,
                        field_selector=f"metadata.name={lease.name}",
                    ),
                    emit,
                    **timeouts,
                )
            )
            self._heartbeat = LeaseHeartbeat(
                namespace=lease.namespace, name=lease.name, clock=self._clock
            )
        return informers

    async def events(self) -> AsyncIterator[DispatchEvent]:
        """Every dispatch event of the adapter, forever; each job transition exactly once."""
        self.informers = self._informers()
        tasks = [asyncio.create_task(i.run(), name=f"watch-{i.kind}") for i in self.informers]
        if self._heartbeat is not None:
            tasks.append(asyncio.create_task(self._heartbeat.run_timer(self._queue.put)))
        pending_sync = {i.kind for i in self.informers}
        dirty: set[JobKey] = set()
        unflushed = 0
        try:
            while True:
                item = await self._next(tasks)
                if isinstance(item, DispatchEvent):
                    yield item
                    continue
                if isinstance(item, Synced):
                    pending_sync.discard(item.kind)
                    if item.kind == KIND_LEASE:
                        event = self._observe_lease()
                        if event is not None:
                            yield event
                    if pending_sync:
                        continue
                    dirty |= self._index.job_keys() | await self._unfinished_in_store()
                elif isinstance(item, Retry):
                    dirty.add(item.key)
                elif isinstance(item, StopNoted):
                    dirty |= {k for k in self._index.job_keys() if k[0] == item.job}
                elif item.kind == KIND_LEASE:
                    event = self._observe_lease()
                    if event is not None:
                        yield event
                    continue
                else:
                    if item.kind == KIND_TRAINJOB:
                        self._note_train_job(item)
                    dirty |= self._index.apply(item)
                unflushed += 1
                if pending_sync or (not self._queue.empty() and unflushed < FLUSH_EVERY):
                    continue  # coalesce a burst of changes before deriving
                keys, dirty, unflushed = sorted(dirty), set(), 0
                for events in await self._report_all(keys):
                    for event in events:
                        yield event
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _next(self, tasks: list[asyncio.Task[None]]) -> QueueItem:
        getter = asyncio.ensure_future(self._queue.get())
        done, _ = await asyncio.wait({getter, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            return getter.result()
        getter.cancel()
        for task in done:
            task.result()  # a watch loop only ends by raising: surface it
        raise RuntimeError("a watch loop ended")

    def _observe_lease(self) -> DispatchEvent | None:
        if self._heartbeat is None:
            return None
        informer = next(i for i in self.informers if i.kind == KIND_LEASE)
        return self._heartbeat.observe(informer.cache.get(self._heartbeat.name))

    async def _unfinished_in_store(self) -> set[JobKey]:
        if isinstance(self._store, ListingReportStore):
            return set(await self._store.unfinished())
        return set()

    async def _report_all(self, keys: list[JobKey]) -> list[list[DispatchEvent]]:
        """Derive and report many jobs at once: their record saves go out concurrently."""
        gate = asyncio.Semaphore(SAVE_CONCURRENCY)

        async def one(key: JobKey) -> list[DispatchEvent]:
            async with gate:
                return await self._report(key)

        return list(await asyncio.gather(*(one(key) for key in keys)))

    async def _report(self, key: JobKey) -> list[DispatchEvent]:
        if key in self._finished:
            self._forget_if_gone(key)
            return []
        obs = self._index.observation(key, stopped=self._is_stopped(key))
        status = derive(obs, loss_taints=self._loss_taints)
        train_job = self._index.train_jobs.get(key)
        try:
            events = await self._reporter.report(
                job=key[0],
                attempt=key[1],
                train_job=_name(train_job) if train_job else f"{key[0]}-{key[1]}",
                status=status,
                now=self._clock.now(),
            )
        except (client.ApiException, aiohttp.ClientError, TimeoutError, OSError) as error:
            # Nothing counts as reported until the store holds it: try again shortly.
            log.warning("saving the reported record of %s failed: %r", key, error)
            loop = asyncio.get_running_loop()
            loop.call_later(SAVE_RETRY_DELAY, self._queue.put_nowait, Retry(key))
            return []
        record = await self._reporter.record_of(*key)
        if record is not None and record.finished:
            self._finished.add(key)
            self._forget_if_gone(key)
        return events

    def _forget_if_gone(self, key: JobKey) -> None:
        if key in self._index.train_jobs or key in self._index.job_sets:
            return
        if any(
            _meta(p, "deletionTimestamp") is None for p in self._index.pods.get(key, {}).values()
        ):
            return
        self._index.forget(key)


def loss_taints_of(settings: Settings) -> frozenset[str]:
    """The taint keys that mean a node is lost, for ``derive``."""
    return frozenset(BUILTIN_LOSS_TAINTS) | frozenset(settings.node_loss_taints)
