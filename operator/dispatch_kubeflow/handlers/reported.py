"""Where the operator keeps how far each job has been reported: its DispatchJob's status.

The library keeps each (job, attempt)'s ``ReportedRecord`` in an annotation on the TrainJob, so
the record goes when the TrainJob goes, and a job whose objects all vanished while no adapter
watched could never be reported as ``Vanished``. In the operator every job has a DispatchJob,
which outlives its TrainJob (its finalizer holds it until ``stop_job`` is done), so the record
lives in the DispatchJob's ``status.reported``, one entry per attempt.

A transition is committed in one write: the record, the folded event history, the state and the
conditions go into the DispatchJob's status in one merge patch that carries the resourceVersion
it was computed from. The record and what a user sees can never disagree, and a write that
fails (a conflict that keeps coming, a policy that denies it, an apiserver that is down) leaves
both as they were, so the supervisor reports the same transition again later. The store watches
the DispatchJobs of its namespace (one ``kube.informer.Informer``), so a commit reads nothing:
only a conflict costs a GET. The Kubernetes Events that mirror dispatch events are posted once
their commit has succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Final

from kubernetes_asyncio import client

from dispatch_kubeflow import metrics
from dispatch_kubeflow.clock import SYSTEM_CLOCK, Clock
from dispatch_kubeflow.constants import (
    DISPATCH_JOB_KIND,
    DISPATCH_JOBS,
    GROUP,
    STATUS_REPORTED,
    VERSION,
    EventType,
    State,
)
from dispatch_kubeflow.errors import UnavailableError
from dispatch_kubeflow.events import DispatchEvent
from dispatch_kubeflow.handlers.kube import StatusChange, patch_status, read_object
from dispatch_kubeflow.handlers.status import DispatchJobStatus, fold_events
from dispatch_kubeflow.kube.apierrors import REQUEST_ERRORS, is_conflict, is_not_found
from dispatch_kubeflow.kube.informer import Change, Informer, Synced
from dispatch_kubeflow.kube.objects import dig, resource_version_of
from dispatch_kubeflow.reporting import ReportedRecord
from dispatch_kubeflow.tasks import cancel_and_wait

DEFAULT_TIMEOUT: Final = timedelta(seconds=30)
CONFLICT_RETRIES: Final = 10

JobKey = tuple[str, int]
# (DispatchJob body, Normal or Warning, reason, message): posts one Kubernetes Event.
PostEvent = Callable[[Mapping[str, Any], str, str, str], None]

log = logging.getLogger(__name__)

WARNING_TYPES: Final = frozenset(
    {EventType.EVICTED, EventType.NODE_LOST, EventType.VANISHED, EventType.RESTARTED}
)
WARNING_STATES: Final = frozenset({State.FAILED, State.UNKNOWN})


def status_of(body: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """A DispatchJob's status, from its whole body or from what ``slim`` keeps of it."""
    status = (body or {}).get("status")
    if isinstance(status, str):
        unpacked: Mapping[str, Any] = json.loads(status)
        return unpacked
    return status if isinstance(status, Mapping) else {}


def records_of(body: Mapping[str, Any] | None, adapter: str) -> dict[int, ReportedRecord]:
    """The readable records in a DispatchJob's status by attempt; none if not of ``adapter``."""
    if not body or dig(body, "spec", "adapter") != adapter:
        return {}
    stored = status_of(body).get(STATUS_REPORTED)
    records: dict[int, ReportedRecord] = {}
    for attempt, text in (stored or {}).items() if isinstance(stored, Mapping) else ():
        record = ReportedRecord.from_json(text) if isinstance(text, str) else None
        if record is not None and str(attempt).isdigit():
            records[int(attempt)] = record
    return records


SLIM_METADATA: Final = ("name", "namespace", "uid", "resourceVersion", "generation")
SLIM_SPEC: Final = ("adapter", "attempt", "runtime")


def slim(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the store reads of a DispatchJob, kept instead of the whole body.

    A DispatchJob's managedFields and kopf's annotations outweigh the rest of it several times;
    the store needs the identity an Event names, the spec fields that route and label a
    transition, and the status it folds into (read with ``status_of``). The status is kept as
    its compact JSON: as objects, its history of events takes four times the memory, and it is
    read only when a transition of that job is committed.
    """
    metadata, spec = body.get("metadata") or {}, body.get("spec") or {}
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {key: metadata[key] for key in SLIM_METADATA if key in metadata},
        "spec": {key: spec[key] for key in SLIM_SPEC if key in spec},
        "status": json.dumps(status_of(body), separators=(",", ":")),
    }


def record_patch(attempt: int, record: ReportedRecord) -> dict[str, Any]:
    """The status merge patch that sets one attempt's record and leaves the others alone."""
    return {STATUS_REPORTED: {str(attempt): record.to_json()}}


def event_kind(event: Mapping[str, Any]) -> str:
    """Normal or Warning, for the Kubernetes Event mirroring a dispatch event."""
    if event.get("type") in WARNING_TYPES or event.get("state") in WARNING_STATES:
        return "Warning"
    return "Normal"


def event_message(event: Mapping[str, Any]) -> str:
    head = f"attempt {event.get('attempt')}: {event.get('state')}"
    if event.get("cause"):
        head += f" ({event['cause']})"
    detail = event.get("message") or event.get("reason") or ""
    return f"{head}: {detail}" if detail else head


class KeyedLocks:
    """One lock per key, kept only while it is held or awaited."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key) or (asyncio.Lock(), 0)
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        return len(self._locks)


def _ignore(_body: Mapping[str, Any], _kind: str, _reason: str, _message: str) -> None:
    return None


class DispatchJobStatusStore:
    """A ``ListingReportStore`` over the DispatchJobs one adapter serves in its namespace.

    ``commit`` folds a transition's events and its record into the DispatchJob's status in one
    write (see the module docstring). A transition of a job without a DispatchJob of this adapter
    (it was deleted, or the job was started through the library) is dropped with a log line:
    there is nothing to fold it into. A failed write raises, and nothing counts as reported.
    """

    # The status holds the events' effect with the record: commit before handing them on.
    effects_committed = True

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        adapter_name: str,
        request_timeout: timedelta = DEFAULT_TIMEOUT,
        *,
        post_event: PostEvent = _ignore,
        clock: Clock = SYSTEM_CLOCK,
        default_runtime: str = metrics.UNKNOWN_RUNTIME,
        gate: bool = False,
    ) -> None:
        self._api = api
        self._gate = gate
        self._namespace = namespace
        self._adapter = adapter_name
        self._request_timeout = request_timeout
        self._post_event = post_event
        self._clock = clock
        self._default_runtime = default_runtime
        self._informer = Informer(
            DISPATCH_JOB_KIND,
            self._list_page,
            self._noted,
            trim=slim,
            request_timeout=request_timeout,
        )
        self._task: asyncio.Task[None] | None = None
        self._writing = KeyedLocks()
        self._closed = False
        self.requests = 0
        self.writes = 0

    # The DispatchJobs in view.

    async def _noted(self, _change: Change | Synced) -> None:
        return None

    async def _list_page(self, **options: Any) -> Any:
        self.requests += 1
        return await client.CustomObjectsApi(self._api).list_namespaced_custom_object(
            GROUP, VERSION, self._namespace, DISPATCH_JOBS, **options
        )

    async def _in_view(self) -> Informer:
        """The informer, started on first use and listed at least once."""
        if self.closed:
            raise UnavailableError(f"the DispatchJob status store of {self._adapter} is closed")
        if self._task is None:
            self._task = asyncio.create_task(
                self._informer.run(), name=f"watch DispatchJobs in {self._namespace}"
            )
        if not self._informer.synced.is_set():
            try:
                async with asyncio.timeout(self._request_timeout.total_seconds()):
                    await self._informer.synced.wait()
            except TimeoutError:
                failure = self._informer.last_failure
                raise UnavailableError(
                    f"cannot list the DispatchJobs in {self._namespace}: "
                    f"{failure or 'no answer in time'}"
                ) from None
        return self._informer

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    def _ours(self, body: Mapping[str, Any] | None) -> bool:
        return body is not None and dig(body, "spec", "adapter") == self._adapter

    # ReportStore.

    async def load(self, job: str, attempt: int) -> ReportedRecord | None:
        informer = await self._in_view()
        return records_of(informer.get(job, self._namespace), self._adapter).get(attempt)

    async def unfinished(self) -> list[JobKey]:
        """Every (job, attempt) of this adapter's DispatchJobs whose record is not finished."""
        informer = await self._in_view()
        return sorted(
            (str(dig(body, "metadata", "name")), attempt)
            for body in informer.cache.values()
            for attempt, record in records_of(body, self._adapter).items()
            if not record.finished
        )

    async def commit(
        self, job: str, attempt: int, record: ReportedRecord, events: Sequence[DispatchEvent]
    ) -> None:
        wire = [event.model_dump(mode="json", by_alias=True) for event in events]
        new: list[Mapping[str, Any]] = []

        async def change(current: dict[str, Any]) -> Mapping[str, Any] | None:
            if not self._ours(current):
                return None
            patch, new[:] = self._status_patch(current, attempt, record, wire)
            return patch

        written = await self.update(job, change)
        if written is None:
            log.info(
                "no DispatchJob %s of adapter %s in %s: %d event(s) of attempt %s dropped",
                job,
                self._adapter,
                self._namespace,
                len(wire),
                attempt,
            )
            return
        self._observe(written, new)
        for event in new:
            self._post_event(
                written, event_kind(event), str(event.get("type")), event_message(event)
            )

    async def update(self, job: str, change: StatusChange) -> dict[str, Any] | None:
        """Write the status patch ``change`` makes of the job's DispatchJob as it is now.

        The DispatchJob is read from the watch's cache, and from the apiserver only after a
        conflict: the patch carries the resourceVersion it was made from. One job's writes
        through the store go one at a time, so a start recorded as the supervisor commits the
        job's first transition reads what that commit wrote instead of conflicting with it.
        Returns the DispatchJob as written; None when it does not exist or ``change`` writes
        nothing.
        """
        informer = await self._in_view()
        async with self._writing.hold(job):
            return await self._update(informer, job, change)

    async def _update(
        self, informer: Informer, job: str, change: StatusChange
    ) -> dict[str, Any] | None:
        current = informer.get(job, self._namespace)
        for _ in range(CONFLICT_RETRIES):
            if current is None:
                current = await self._read(job)
            if current is None:
                return None
            patch = await change({**current, "status": dict(status_of(current))})
            if patch is None:
                return None
            try:
                written = await self._write(job, patch, resource_version_of(current))
            except REQUEST_ERRORS as error:
                if is_not_found(error):
                    current = None
                    continue
                if not is_conflict(error):
                    raise
                current = await self._read(job)
                continue
            informer.cache[f"{self._namespace}/{job}"] = slim(written)
            return written
        raise UnavailableError(
            f"DispatchJob {job} in {self._namespace}: its status kept changing under the writer"
        )

    def _observe(self, written: Mapping[str, Any], new: Sequence[Mapping[str, Any]]) -> None:
        history = dig(written, "status", "events")
        metrics.job_events_committed(
            self._namespace,
            self._adapter,
            metrics.runtime_label(dig(written, "spec", "runtime"), self._default_runtime),
            history if isinstance(history, list) else [],
            new,
            self._clock.now(),
        )

    def _status_patch(
        self,
        current: Mapping[str, Any],
        attempt: int,
        record: ReportedRecord,
        events: Sequence[Mapping[str, Any]],
    ) -> tuple[dict[str, Any], list[Mapping[str, Any]]]:
        status, new = fold_events(
            DispatchJobStatus.from_wire(status_of(current)),
            events,
            attempt=int(dig(current, "spec", "attempt") or 1),
            generation=dig(current, "metadata", "generation"),
            now=self._clock.now(),
            gate=self._gate,
        )
        return {**status.to_wire(), **record_patch(attempt, record)}, new

    async def _read(self, job: str) -> dict[str, Any] | None:
        self.requests += 1
        async with asyncio.timeout(self._request_timeout.total_seconds()):
            return await read_object(self._api, DISPATCH_JOBS, self._namespace, job)

    async def _write(
        self, job: str, patch: Mapping[str, Any], resource_version: str
    ) -> dict[str, Any]:
        self.requests += 1
        self.writes += 1
        async with asyncio.timeout(self._request_timeout.total_seconds()):
            return await patch_status(
                self._api,
                DISPATCH_JOBS,
                self._namespace,
                job,
                patch,
                resource_version=resource_version,
            )
