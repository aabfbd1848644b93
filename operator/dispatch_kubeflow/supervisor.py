"""One LIST+WATCH per kind for the whole adapter, turned into dispatch events.

A job's story is spread over six kinds (TrainJobs, JobSets, pods, Kueue Workloads, nodes and the
admission Lease). Watching each per job would cost a connection per job; polling would miss
short-lived states and cost requests forever. So each kind gets exactly one ``kube.informer``
loop, and ``Supervisor`` indexes what they see by (job, attempt) (``index.JobIndex``),
re-derives a job whenever one of its objects (or a node one of its pods runs on) changes, and
hands the derivation to the exactly-once ``Reporter`` of ``reporting``. Until every informer has
listed once, nothing is derived: a job is judged from a complete picture, so a job that finished
while nothing watched gets its ``Finished`` and nothing spurious before it.

Where the reported records live is a ``ReportStore``; by default ``TrainJobAnnotationStore``
keeps each on its TrainJob, reading it from the informer's cache.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from kubernetes_asyncio import client

from dispatch_kubeflow.clock import SYSTEM_CLOCK, Clock
from dispatch_kubeflow.constants import (
    ANNOTATION_REPORTED,
    JOBSET_GROUP,
    JOBSET_VERSION,
    JOBSETS,
    KIND_JOBSET,
    KIND_LEASE,
    KIND_NODE,
    KIND_POD,
    KIND_TRAINJOB,
    KIND_WORKLOAD,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_ADAPTER,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_PROBE,
    LEASES,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    WORKLOADS,
    State,
)
from dispatch_kubeflow.derivation import derive, has_ended, pods_have_ended
from dispatch_kubeflow.errors import DispatchError
from dispatch_kubeflow.events import DerivedStatus, DispatchEvent, JobObservation
from dispatch_kubeflow.heartbeat import LeaseHeartbeat
from dispatch_kubeflow.index import (
    JobIndex,
    JobKey,
    job_key,
    loss_taints_of,
    pods_as_read,
    trim,
    trimmer,
)
from dispatch_kubeflow.kube.apierrors import (
    REQUEST_ERRORS,
    describe,
    to_dispatch_error,
)
from dispatch_kubeflow.kube.informer import (
    DEFAULT_WATCH_TIMEOUT,
    Change,
    IndexFn,
    Informer,
    ListFn,
    Synced,
    list_all,
    read_one,
)
from dispatch_kubeflow.kube.objects import (
    annotations_of,
    is_deleting,
    labels_of,
    name_of,
    uid_of,
)
from dispatch_kubeflow.kube.trainjobs import annotate_trainjob
from dispatch_kubeflow.kube.workloads import job_uid_label
from dispatch_kubeflow.reporting import (
    ListingReportStore,
    ReportedRecord,
    Reporter,
    ReportStore,
    Transition,
)
from dispatch_kubeflow.runtime_cache import RuntimeCache
from dispatch_kubeflow.settings import RuntimeRef, Settings
from dispatch_kubeflow.tasks import cancel_and_wait, gathered

log = logging.getLogger(__name__)

# The resource each watched kind is listed as, for saying which cannot be.
RESOURCES: dict[str, str] = {
    KIND_TRAINJOB: TRAINJOBS,
    KIND_JOBSET: JOBSETS,
    KIND_POD: "pods",
    KIND_NODE: "nodes",
    KIND_WORKLOAD: WORKLOADS,
    KIND_LEASE: LEASES,
}

# Changes applied before the affected jobs are derived, when more keep arriving.
FLUSH_EVERY = 100
# A failed commit is tried again after 1 s, doubling per failure of that job up to 30 s.
RETRY_FIRST = 1.0
RETRY_MAX = 30.0
# What a commit may raise: the apiserver's answer, the transport, or the store's own verdict.
COMMIT_ERRORS: tuple[type[BaseException], ...] = (*REQUEST_ERRORS, DispatchError)
# Record saves in flight at once when many jobs changed together.
SAVE_CONCURRENCY = 32
# Pod reads in flight at once (finished jobs whose pods the watch has not shown ended); they
# wait apart from the saves, so a burst of finishes does not hold up other jobs' commits.
READ_CONCURRENCY = 32
# Kinds whose changes wait while their job's task runs: the task ends on the job's objects as it
# saw them (a TrainJob created again under the same name is a new job only after that).
HELD_KINDS = frozenset({KIND_TRAINJOB, KIND_JOBSET, KIND_POD})


def _job_label(obj: Mapping[str, Any]) -> str | None:
    return labels_of(obj).get(LABEL_JOB)


# What each kind's cache is indexed by: a start finds its Workload by its TrainJob's uid, and a
# stop sees its job's objects go.
INDEXES: dict[str, IndexFn] = {
    KIND_TRAINJOB: _job_label,
    KIND_JOBSET: _job_label,
    KIND_POD: _job_label,
    KIND_WORKLOAD: job_uid_label,
}
# States the TrainJob's own condition ends a job in; its pods' end is what the Finished tells.
ENDED_BY_TRAINJOB = frozenset({State.SUCCEEDED, State.FAILED})


@dataclass(frozen=True)
class StopNoted:
    job: str


@dataclass(frozen=True)
class HeartbeatCheck:
    """The Lease timer woke: judge the gate now, from the latest Lease applied."""


@dataclass(frozen=True)
class Retry:
    """Derive a job again: saving its record failed last time."""

    key: JobKey


@dataclass(frozen=True)
class JobWorked:
    """A job's derivation (or the commit of what the consumer took of it) has ended."""

    job: str
    # Which task: one of an earlier, closed stream may still end after a new stream started.
    task: asyncio.Task[list[Transition]]


QueueItem = Change | Synced | StopNoted | Retry | HeartbeatCheck | JobWorked


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
        annotations = annotations_of(train_job) if train_job else {}
        return ReportedRecord.from_json(annotations.get(ANNOTATION_REPORTED))

    # The record alone: the supervisor commits after the consumer has taken the events.
    effects_committed = False

    async def commit(
        self, job: str, attempt: int, record: ReportedRecord, events: Sequence[DispatchEvent]
    ) -> None:
        """One merge patch; a TrainJob deleted meanwhile needs no record.

        The patch names the TrainJob's uid: a record of a TrainJob deleted and created again
        under its name never lands on the new one, which is a new job with no record yet.
        """
        train_job = self._lookup(job, attempt)
        if train_job is None:
            return
        self.requests += 1
        await annotate_trainjob(
            self._api,
            self._namespace,
            train_job,
            {ANNOTATION_REPORTED: record.to_json()},
            request_timeout=self._timeout,
        )


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
        self._clock: Clock = clock or SYSTEM_CLOCK
        self._watch_timeout = watch_timeout
        self._index = JobIndex()
        self._custom = client.CustomObjectsApi(api_client)
        self._store: ReportStore = store or TrainJobAnnotationStore(
            self._custom,
            settings.namespace,
            lambda job, attempt: self._index.train_jobs.get((job, attempt)),
            settings.timeouts.request,
        )
        self._reporter = Reporter(self._store)
        self._loss_taints = loss_taints_of(settings)
        # job -> UIDs of its TrainJobs when stop_job's deletion was accepted: a TrainJob created
        # later (the same job id used again) is not stopped.
        self._stopped: dict[str, set[str]] = {}
        # job -> UIDs of its TrainJobs while stop_job's deletion is under way.
        self._stopping: dict[str, set[str]] = {}
        self._finished: set[JobKey] = set()
        self._failures: dict[JobKey, int] = {}
        # Transitions the consumer has taken whose commit failed: committed again on retry,
        # never delivered again by this supervisor.
        self._taken: dict[JobKey, Transition] = {}
        # job -> attempt -> the UID of its TrainJob.
        self._uids: dict[str, dict[int, str]] = {}
        self._queue: asyncio.Queue[QueueItem] = asyncio.Queue()
        # TrainJob uid -> starts waiting for Kueue's Workload of it (``workload_of``).
        self._workload_waiters: dict[str, list[asyncio.Future[dict[str, Any]]]] = {}
        # stop_jobs waiting for the watch to show their objects gone (``until_gone``).
        self._gone_waiters: set[asyncio.Event] = set()
        self._watching = False
        self.informers: list[Informer] = []
        self.runtimes = RuntimeCache(
            api_client,
            settings.namespace,
            watch_timeout=watch_timeout,
            request_timeout=settings.timeouts.request,
        )
        self._heartbeat: LeaseHeartbeat | None = None
        self._pod_reads = 0
        self._read_gate = asyncio.Semaphore(READ_CONCURRENCY)
        # The latest stream's jobs at work and the changes held for them (``held``).
        self._working: Mapping[str, object] = {}
        self._held_changes: Mapping[str, Sequence[Change]] = {}

    @property
    def store(self) -> ReportStore:
        return self._store

    def requests(self) -> int:
        """API requests made so far by the informers and the store."""
        count = sum(i.requests for i in self.informers) + self._pod_reads + self.runtimes.requests
        return count + int(getattr(self._store, "requests", 0))

    def watch_problems(self) -> list[DispatchError]:
        """Why each watched kind whose last LIST failed cannot be listed; empty when all can.

        Until every kind has listed once nothing is derived, so these are what hold the events.
        """
        problems: list[DispatchError] = []
        for informer in self.informers:
            failure = informer.last_failure
            if failure is None:
                continue
            resource = RESOURCES.get(informer.kind, informer.kind.lower())
            what = f"cannot list {resource}"
            problems.append(to_dispatch_error(what, failure, verb="list", resource=resource))
        return problems

    def held(self) -> dict[str, int]:
        """How many entries each per-job structure holds: zero once every job is gone."""
        return {
            **self._index.held(),
            "records": self._reporter.held(),
            "finished": len(self._finished),
            "failures": len(self._failures),
            "taken": len(self._taken),
            "uids": sum(len(attempts) for attempts in self._uids.values()),
            "stops": len(self._stopped) + len(self._stopping),
            "working": len(self._working),
            "held_changes": sum(len(changes) for changes in self._held_changes.values()),
        }

    def note_stopping(self, job: str) -> None:
        """stop_job is deleting ``job``: an attempt whose TrainJob goes meanwhile was stopped."""
        self._stopping.setdefault(job, set()).update(self._uids_of(job))

    def note_stop_refused(self, job: str) -> None:
        """The deletion was refused: nothing was stopped, the job ends as it really ends."""
        self._stopping.pop(job, None)

    def backlog(self) -> int:
        """Watched changes and timers queued and not yet taken up."""
        return self._queue.qsize()

    def note_stopped(self, job: str) -> None:
        """stop_job's deletion was accepted: ``job``'s attempts end as Stopped, not Vanished."""
        uids = self._stopping.pop(job, set()) | self._uids_of(job)
        self._stopped.setdefault(job, set()).update(uids)
        self._queue.put_nowait(StopNoted(job))

    def _uids_of(self, job: str) -> set[str]:
        return set(self._uids.get(job, {}).values())

    def trainjob_uids(self, job: str) -> set[str]:
        """The uids of every TrainJob of ``job`` the watch has seen and not yet forgotten."""
        return self._uids_of(job) | self._stopping.get(job, set()) | self._stopped.get(job, set())

    def _is_stopped(self, key: JobKey) -> bool:
        train_job = self._index.train_jobs.get(key)
        stopped = self._stopped.get(key[0])
        if stopped is not None and (train_job is None or uid_of(train_job) in stopped):
            return True
        # A deletion under way stops only what is already going.
        stopping = self._stopping.get(key[0])
        if stopping is None:
            return False
        return train_job is None or (is_deleting(train_job) and uid_of(train_job) in stopping)

    def _note_train_job(self, change: Change) -> None:
        """A TrainJob with a new UID for a known (job, attempt) is a new job: forget the old."""
        key = job_key(change.obj)
        uid = uid_of(change.obj)
        if key is None or not uid or change.type == "DELETED":
            return
        attempts = self._uids.setdefault(key[0], {})
        previous = attempts.get(key[1])
        attempts[key[1]] = uid
        if previous is not None and previous != uid:
            self._finished.discard(key)
            self._reporter.forget(*key)

    def _selector(self) -> str:
        # The preflight probe's TrainJob (and its JobSet and pods) is the adapter's own, not a job.
        return f"{LABEL_ADAPTER}={self.adapter_name},!{LABEL_PROBE}"

    def cached_runtime(self, ref: RuntimeRef) -> dict[str, Any] | None:
        """The runtime ``ref`` names as this supervisor's runtime watch has it, or None."""
        return self.runtimes.get(ref)

    async def workload_of(self, trainjob_uid: str, within: timedelta) -> dict[str, Any] | None:
        """Kueue's Workload of a TrainJob, as this supervisor's Workload watch sees it.

        None when none is seen within ``within``. ``LookupError`` when the watch cannot answer
        (it is not running, has not listed, or its last LIST failed): ask the apiserver instead.
        """
        informer = self._serving_informer(KIND_WORKLOAD)
        found = informer.indexed(trainjob_uid)
        if found:
            return found[0]
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._workload_waiters.setdefault(trainjob_uid, []).append(waiter)
        try:
            async with asyncio.timeout(within.total_seconds()):
                return await waiter
        except TimeoutError:
            return None
        finally:
            waiters = self._workload_waiters.get(trainjob_uid, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._workload_waiters.pop(trainjob_uid, None)

    def _serving_informer(self, kind: str) -> Informer:
        """The informer of ``kind``; ``LookupError`` unless it runs, has listed, and can list."""
        informer = next((i for i in self.informers if i.kind == kind), None)
        if not self._watching or informer is None or not informer.fresh:
            raise LookupError(f"the {kind} watch is not serving")
        return informer

    async def until_gone(self, job: str, trainjob_uids: set[str], within: timedelta) -> None:
        """Wait until this supervisor's watch shows nothing of ``job`` left, at most ``within``.

        Nothing left: no TrainJob, JobSet or pod labelled with the job, and (in Kueue mode) no
        Workload of a TrainJob with one of ``trainjob_uids`` or of one the watch shows.
        Returns at ``within`` too: the caller reads back and names what remains.
        ``LookupError`` when the watch cannot answer, or stops answering meanwhile.
        """
        uids = set(trainjob_uids)
        woken = asyncio.Event()
        self._gone_waiters.add(woken)
        try:
            async with asyncio.timeout(within.total_seconds()):
                while self._left_on_watch(job, uids):
                    woken.clear()
                    await woken.wait()
        except TimeoutError:
            return
        finally:
            self._gone_waiters.discard(woken)

    def _left_on_watch(self, job: str, uids: set[str]) -> bool:
        kinds = (KIND_TRAINJOB, KIND_JOBSET, KIND_POD)
        informers = {kind: self._serving_informer(kind) for kind in kinds}
        uids |= {uid_of(t) for t in informers[KIND_TRAINJOB].indexed(job)} - {""}
        if any(informer.indexed(job) for informer in informers.values()):
            return True
        if self._settings.kueue is None:
            return False
        workloads = self._serving_informer(KIND_WORKLOAD)
        return any(workloads.indexed(uid) for uid in uids)

    def _wake_gone_waiters(self) -> None:
        for woken in self._gone_waiters:
            woken.set()

    def _stop_workload_waiters(self) -> None:
        for waiters in self._workload_waiters.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_exception(LookupError("the Workload watch stopped"))

    async def _seen(self, change: Change | Synced) -> None:
        """What an informer emits: waiters woken, then the change queued for derivation."""
        if isinstance(change, Change) and change.type == "DELETED":
            self._wake_gone_waiters()
        elif isinstance(change, Change) and change.kind == KIND_WORKLOAD:
            uid = job_uid_label(change.obj)
            for waiter in self._workload_waiters.get(uid or "", []):
                if not waiter.done():
                    waiter.set_result(change.obj)
        await self._queue.put(change)

    def _informer(self, kind: str, list_fn: ListFn) -> Informer:
        return Informer(
            kind,
            list_fn,
            self._seen,
            trim=trimmer(kind),
            watch_timeout=self._watch_timeout,
            request_timeout=self._settings.timeouts.request,
            index=INDEXES.get(kind),
        )

    def _informers(self) -> list[Informer]:
        ns = self._settings.namespace
        core = client.CoreV1Api(self._api)
        custom = self._custom

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
            self._informer(
                KIND_TRAINJOB,
                custom_list(TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS, label_selector=selector),
            ),
            self._informer(
                KIND_JOBSET,
                custom_list(JOBSET_GROUP, JOBSET_VERSION, JOBSETS, label_selector=selector),
            ),
            self._informer(
                KIND_POD, core_list(core.list_namespaced_pod, ns, label_selector=selector)
            ),
            self._informer(KIND_NODE, core_list(core.list_node)),
        ]
        kueue = self._settings.kueue
        if kueue is not None:
            informers.append(
                self._informer(KIND_WORKLOAD, custom_list(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS))
            )
            lease = kueue.admission_lease
            coordination = client.CoordinationV1Api(self._api)
            informers.append(
                self._informer(
                    KIND_LEASE,
                    core_list(
                        coordination.list_namespaced_lease,
                        lease.namespace,
                        field_selector=f"metadata.name={lease.name}",
                    ),
                )
            )
            self._heartbeat = LeaseHeartbeat(
                namespace=lease.namespace, name=lease.name, clock=self._clock
            )
        return informers

    async def events(self) -> AsyncGenerator[DispatchEvent, None]:
        """Every dispatch event of the adapter, forever; each job transition exactly once."""
        self.informers = self._informers()
        tasks = [asyncio.create_task(i.run(), name=f"watch-{i.kind}") for i in self.informers]
        tasks.append(asyncio.create_task(self.runtimes.run(), name="watch-runtimes"))
        self._watching = True
        if self._heartbeat is not None:
            tasks.append(asyncio.create_task(self._heartbeat.run_timer(self._wake_heartbeat)))
        pending_sync = {i.kind for i in self.informers}
        dirty: set[JobKey] = set()
        unflushed = 0
        # One task a job derives it (and, with a store that records after delivery, commits
        # what the consumer took): a slow write holds its own job, never the others.
        working: dict[str, asyncio.Task[list[Transition]]] = {}
        committing: set[str] = set()  # jobs whose task commits transitions already delivered
        held: dict[str, list[Change]] = {}  # changes of a job whose task runs, in order
        self._working, self._held_changes = working, held
        gate = asyncio.Semaphore(SAVE_CONCURRENCY)
        self._read_gate = asyncio.Semaphore(READ_CONCURRENCY)
        # A transition whose events the consumer has all been handed, not yet committed.
        delivered: Transition | None = None
        # The transitions of the job being handed on that the consumer has taken.
        taken: list[Transition] = []
        try:
            while True:
                item = await self._next(tasks)
                if isinstance(item, JobWorked):
                    if working.get(item.job) is item.task:
                        transitions = working.pop(item.job).result()
                        committing.discard(item.job)
                        for transition in transitions:
                            last = len(transition.events) - 1
                            for n, dispatched in enumerate(transition.events):
                                if n == last and not self._reporter.effects_committed:
                                    delivered = transition
                                yield dispatched
                            if delivered is not None:
                                # The consumer took every event and asked for more: they count.
                                taken.append(delivered)
                                delivered = None
                        if taken:
                            self._work(item.job, working, self._commit_taken(taken, gate))
                            committing.add(item.job)
                            taken = []
                        else:
                            for change in held.pop(item.job, ()):
                                dirty |= self._apply(change)
                            unflushed = FLUSH_EVERY  # the job is idle again: derive it now
                elif isinstance(item, HeartbeatCheck):
                    event = self._heartbeat.check() if self._heartbeat is not None else None
                    if event is not None:
                        yield event
                elif isinstance(item, Synced):
                    pending_sync.discard(item.kind)
                    if item.kind == KIND_LEASE:
                        event = self._observe_lease()
                        if event is not None:
                            yield event
                    if not pending_sync:
                        dirty |= self._index.job_keys() | await self._unfinished_in_store()
                elif isinstance(item, Retry):
                    dirty.add(item.key)
                elif isinstance(item, StopNoted):
                    dirty |= {k for k in self._index.job_keys() if k[0] == item.job}
                elif item.kind == KIND_LEASE:
                    event = self._observe_lease()
                    if event is not None:
                        yield event
                elif (busy := self._busy_job(item, working)) is not None:
                    held.setdefault(busy, []).append(item)
                else:
                    dirty |= self._apply(item)
                    unflushed += 1
                # Whatever the item, dirty jobs are derived once nothing more is waiting (or
                # after a long burst): an item that is not a change must never leave them be.
                if dirty and not pending_sync and (self._queue.empty() or unflushed >= FLUSH_EVERY):
                    unflushed = 0
                    dirty = self._derive_idle_jobs(dirty, working, gate)
        finally:
            self._watching = False
            self._stop_workload_waiters()
            self._wake_gone_waiters()
            await cancel_and_wait(*tasks)
            commits = [working.pop(job) for job in committing if job in working]
            # Derivations not yet handed on: nothing of them was delivered.
            await cancel_and_wait(*working.values())
            if delivered is not None:
                # Closed or cancelled after taking the whole transition: it was delivered.
                taken.append(delivered)
            await asyncio.gather(
                *(self._commit_on_close(t) for t in taken), self._commits_on_close(commits)
            )

    def _apply(self, change: Change) -> set[JobKey]:
        """Record a watched change; the jobs it may affect."""
        if change.kind == KIND_TRAINJOB:
            self._note_train_job(change)
        return self._index.apply(change)

    @staticmethod
    def _busy_job(change: Change, working: Mapping[str, object]) -> str | None:
        """The job whose running task this change must wait for, if any."""
        if change.kind not in HELD_KINDS:
            return None
        key = job_key(change.obj)
        return key[0] if key is not None and key[0] in working else None

    def _derive_idle_jobs(
        self,
        dirty: set[JobKey],
        working: dict[str, asyncio.Task[list[Transition]]],
        gate: asyncio.Semaphore,
    ) -> set[JobKey]:
        """Start deriving each dirty job that has no task under way; the rest stay dirty."""
        by_job: dict[str, list[JobKey]] = {}
        left: set[JobKey] = set()
        for key in dirty:
            if key[0] in working:
                left.add(key)
            else:
                by_job.setdefault(key[0], []).append(key)
        for job, keys in by_job.items():
            self._work(job, working, self._report_job(sorted(keys), gate))
        return left

    def _work(
        self,
        job: str,
        working: dict[str, asyncio.Task[list[Transition]]],
        work: Coroutine[Any, Any, list[Transition]],
    ) -> None:
        task = asyncio.create_task(work, name=f"report {job}")
        working[job] = task
        task.add_done_callback(lambda done: self._queue.put_nowait(JobWorked(job, done)))

    async def _next(self, tasks: list[asyncio.Task[None]]) -> QueueItem:
        getter = asyncio.ensure_future(self._queue.get())
        try:
            done, _ = await asyncio.wait({getter, *tasks}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getter.done():
                getter.cancel()  # else it waits on the queue for ever, the watch closed or not
        if getter in done:
            return getter.result()
        for task in done:
            task.result()  # a watch loop only ends by raising: surface it
        raise RuntimeError("a watch loop ended")

    async def _wake_heartbeat(self) -> None:
        await self._queue.put(HeartbeatCheck())

    def _observe_lease(self) -> DispatchEvent | None:
        if self._heartbeat is None:
            return None
        informer = next(i for i in self.informers if i.kind == KIND_LEASE)
        return self._heartbeat.observe(
            informer.get(self._heartbeat.name, self._heartbeat.namespace)
        )

    async def _unfinished_in_store(self) -> set[JobKey]:
        if isinstance(self._store, ListingReportStore):
            return set(await self._store.unfinished())
        return set()

    async def _report_job(self, keys: list[JobKey], gate: asyncio.Semaphore) -> list[Transition]:
        """Derive and report one job's attempts in order; their commits share ``gate``.

        One attempt's failure (a commit the apiserver refuses, or anything else) costs that
        attempt a retry and never the others' transitions.
        """
        transitions: list[Transition] = []
        for key in keys:
            try:
                transition = await self._report(key, gate)
            except Exception:
                log.exception("deriving %s failed", key)
                self._retry_later(key)
                continue
            if transition is not None:
                transitions.append(transition)
        return transitions

    async def _report(self, key: JobKey, gate: asyncio.Semaphore) -> Transition | None:
        """Derive ``key`` and report what is new. Its writes take a slot of ``gate``; a read of
        its pods waits apart (``READ_CONCURRENCY``), so reads never hold other jobs' writes."""
        if self._index.is_forgotten(key):
            return None
        taken = self._taken.get(key)
        if taken is not None:
            async with gate:
                committed = await self._commit(taken)
            if not committed:
                return None  # tried again later; its events are not delivered again
            del self._taken[key]
        if key in self._finished:
            self._forget_if_gone(key)
            return None
        obs = self._index.observation(key, stopped=self._is_stopped(key))
        status = derive(obs, loss_taints=self._loss_taints)
        if status.state in ENDED_BY_TRAINJOB and not pods_have_ended(obs):
            try:
                obs = await self._with_pods_read(obs)
            except DispatchError as error:
                log.warning("reading the pods of %s failed: %s", key, error)
                self._retry_later(key)
                return None
            status = derive(obs, loss_taints=self._loss_taints)
        async with gate:
            return await self._transition_committed(key, status)

    async def _transition_committed(self, key: JobKey, status: DerivedStatus) -> Transition | None:
        """The transition to ``status``, committed first when the store records before delivery."""
        train_job = self._index.train_jobs.get(key)
        transition = await self._reporter.next_transition(
            job=key[0],
            attempt=key[1],
            train_job=name_of(train_job) if train_job else f"{key[0]}-{key[1]}",
            status=status,
            now=self._clock.now(),
        )
        if transition is None:
            return None
        if self._reporter.effects_committed and not await self._commit(transition):
            return None
        return transition

    async def _with_pods_read(self, obs: JobObservation) -> JobObservation:
        """``obs`` with the job's pods as the apiserver has them now.

        A read without a resourceVersion is a quorum read: whatever the kubelet wrote of a pod
        before Trainer wrote the TrainJob's end is in it, however far the pod watch lags. Each
        pod seen not ended is read by name (a GET costs the same in any namespace); when none
        is seen at all, the attempt's pods are listed by their labels.
        """
        if obs.pods:
            names = [name_of(pod) for pod in obs.pods if not has_ended(pod)]
            found = await gathered(*(self._read_pod(obs, name) for name in names))
            read = dict(zip(names, found, strict=True))
        else:
            read = {name_of(pod): pod for pod in await self._list_pods(obs)}
        return obs.model_copy(update={"pods": pods_as_read(obs.pods, read)})

    async def _read_pod(self, obs: JobObservation, name: str) -> dict[str, Any] | None:
        """The pod ``name`` of the job's attempt as the apiserver has it; None when gone."""
        core = client.CoreV1Api(self._api)
        self._pod_reads += 1
        async with self._read_gate:
            pod = await read_one(
                partial(core.read_namespaced_pod, name, self._settings.namespace),
                what=f"read pod {name} of job {obs.job} attempt {obs.attempt}",
                resource="pods",
                request_timeout=self._settings.timeouts.request,
            )
        if pod is None or job_key(pod) != (obs.job, obs.attempt):
            return None  # gone, or a pod of something else under its name
        return trim(KIND_POD, pod)

    async def _list_pods(self, obs: JobObservation) -> list[dict[str, Any]]:
        selector = f"{self._selector()},{LABEL_JOB}={obs.job},{LABEL_ATTEMPT}={obs.attempt}"
        core = client.CoreV1Api(self._api)
        namespace = self._settings.namespace
        self._pod_reads += 1
        async with self._read_gate:
            listing = await list_all(
                partial(core.list_namespaced_pod, namespace, label_selector=selector),
                what=f"list the pods of job {obs.job} attempt {obs.attempt}",
                request_timeout=self._settings.timeouts.request,
                trim=trimmer(KIND_POD),
            )
        return listing.items

    async def _commit(self, transition: Transition) -> bool:
        """Store the transition; on failure, derive the job again later. True when stored.

        Whatever the store raises costs this transition a retry, never the stream: a store's
        own fault is logged with its traceback and tried again like an apiserver's refusal.
        """
        key = (transition.job, transition.attempt)
        try:
            await self._reporter.commit(transition)
        except COMMIT_ERRORS as error:
            # Nothing counts as reported until the store holds it.
            log.warning("committing the transition of %s failed: %s", key, describe(error))
            self._retry_later(key)
            return False
        except Exception:
            log.exception("committing the transition of %s failed", key)
            self._retry_later(key)
            return False
        self._failures.pop(key, None)
        if transition.record.finished:
            self._finished.add(key)
            self._forget_if_gone(key)
        return True

    async def _commit_taken(
        self, transitions: Sequence[Transition], gate: asyncio.Semaphore
    ) -> list[Transition]:
        """Commit what the consumer took of one job; a failed commit is kept and retried,
        never delivered again. Returns nothing more to hand on."""
        for transition in transitions:
            async with gate:
                if not await self._commit(transition):
                    self._taken[(transition.job, transition.attempt)] = transition
        return []

    async def _commits_on_close(self, commits: Sequence[asyncio.Task[list[Transition]]]) -> None:
        """Let the commits of delivered transitions finish, within one request's time."""
        if not commits:
            return
        timeout = self._settings.timeouts.request.total_seconds()
        _, unfinished = await asyncio.wait(commits, timeout=timeout)
        if unfinished:
            log.warning(
                "%d delivered transition(s) not committed when the watch closed: they come again",
                len(unfinished),
            )
            await cancel_and_wait(*unfinished)

    async def _commit_on_close(self, transition: Transition) -> None:
        timeout = self._settings.timeouts.request.total_seconds()
        try:
            async with asyncio.timeout(timeout):
                await self._commit(transition)
        except (TimeoutError, RuntimeError) as error:  # RuntimeError: the loop is closing
            log.warning(
                "the transition of %s was delivered but not committed (%s): it comes again",
                (transition.job, transition.attempt),
                describe(error),
            )

    def _retry_later(self, key: JobKey) -> None:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = min(RETRY_MAX, RETRY_FIRST * 2**failures)
        asyncio.get_running_loop().call_later(delay, self._queue.put_nowait, Retry(key))

    def _forget_if_gone(self, key: JobKey) -> None:
        """A finished job whose objects are all gone is forgotten: nothing of it is kept."""
        if not self._index.all_gone(key):
            return
        self._index.forget(key)
        self._finished.discard(key)
        self._failures.pop(key, None)
        self._reporter.forget(*key)
        job, attempt = key
        attempts = self._uids.get(job, {})
        uid = attempts.pop(attempt, None)
        if attempts:
            for marks in (self._stopped, self._stopping):
                if uid is not None and job in marks:
                    marks[job].discard(uid)
        else:
            self._uids.pop(job, None)
            self._stopped.pop(job, None)
            self._stopping.pop(job, None)
