"""stop_job (SPEC §3): delete every TrainJob of a job, then read back until nothing is left.

Deleting the TrainJobs is enough: the garbage collector takes their JobSets, pods and Workloads
after them (background propagation, so the TrainJob goes at once). Whether it has is only known
by reading back, so ``stop`` repeats ``finding.objects_of`` until nothing of the job is left
(selecting the Workloads by the uids of every TrainJob the stop deleted, read, or was told of by
the watch), and past the bound names what remains and what holds it. While the adapter's watch
serves, ``stop_job`` reads back when the watch shows the job's objects gone (or every
``WATCHED_POLL``, should the watch lag), so a stop costs one read-back however long its pods take
to terminate; otherwise it reads back quickly at first, then slower, so a quick stop costs few
requests. ``start`` deletes through ``delete_trainjobs`` too, when
Kueue makes no Workload for its TrainJob.

``stop_job`` tells the watch what it is doing, so the job's end is reported truly: the watch may
call an attempt Stopped only once the deletion is accepted. Before that (``note_stopping``) an
attempt whose TrainJob is already gone counts as stopped, because the delete is under way; a
refused delete (``note_stop_refused``) leaves the job as it was, to end as it really ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Protocol

from kubernetes_asyncio import client

from dispatch_kubeflow.constants import TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS
from dispatch_kubeflow.errors import DispatchError, OutcomeUnknownError
from dispatch_kubeflow.finding import objects_of, uids_of
from dispatch_kubeflow.gotime import format_duration
from dispatch_kubeflow.kube.apierrors import REQUEST_ERRORS, to_dispatch_error
from dispatch_kubeflow.scope import Scope
from dispatch_kubeflow.trainjob import job_selector

# The read-backs start fast and slow down, so a quick stop costs few requests.
FIRST_POLL = 0.05
LONGEST_POLL = 1.0
# With the watch serving, the longest a stop waits on it before reading back anyway.
WATCHED_POLL = timedelta(seconds=10)


class StopNotes(Protocol):
    """What the watch is told of a stop_job (``Supervisor`` implements it)."""

    def note_stopping(self, job: str) -> None: ...

    def note_stop_refused(self, job: str) -> None: ...

    def note_stopped(self, job: str) -> None: ...

    def trainjob_uids(self, job: str) -> set[str]: ...

    async def until_gone(self, job: str, trainjob_uids: set[str], within: timedelta) -> None:
        """Return once the watch shows nothing of ``job`` left, or after ``within``;
        ``LookupError`` when the watch cannot answer."""
        ...


async def stop_job(scope: Scope, notes: StopNotes, job_id: str, within: timedelta) -> None:
    """``stop``, telling the watch when the deletion is under way, accepted, or refused.

    A refused delete raises and leaves no mark; a delete whose outcome is unknown (a timeout, a
    5xx) may still have happened, so what goes after it still counts as stopped.
    """
    notes.note_stopping(job_id)
    try:
        deleted = await delete_trainjobs(scope, job_selector(scope.adapter_name, job_id))
    except OutcomeUnknownError:
        raise
    except DispatchError:
        notes.note_stop_refused(job_id)
        raise
    notes.note_stopped(job_id)
    await wait_until_gone(scope, job_id, within, deleted | notes.trainjob_uids(job_id), notes)


async def stop(scope: Scope, job_id: str, within: timedelta) -> None:
    """Delete the job's TrainJobs; ``ErrOutcomeUnknown`` naming what remains after ``within``."""
    deleted = await delete_trainjobs(scope, job_selector(scope.adapter_name, job_id))
    await wait_until_gone(scope, job_id, within, deleted)


async def wait_until_gone(
    scope: Scope,
    job_id: str,
    within: timedelta,
    known_uids: set[str] | None = None,
    watch: StopNotes | None = None,
) -> None:
    """Read back until nothing of the job is left; past ``within``, name what remains.

    ``known_uids`` (TrainJobs of the job, perhaps gone) grows with every TrainJob read back, so a
    Workload that outlives its TrainJob is still found. With ``watch`` serving, each read-back
    waits until the watch shows the job gone; the read-backs are never closer together than
    without it.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within.total_seconds()
    pause = FIRST_POLL
    uids = set(known_uids or ())
    read_at: float | None = None
    while True:
        await _until_gone_on_watch(watch, job_id, uids, deadline - loop.time())
        if read_at is not None:
            await asyncio.sleep(max(0.0, min(read_at + pause, deadline) - loop.time()))
            pause = min(pause * 2, LONGEST_POLL)
        objects = await objects_of(scope, job_id, uids)
        read_at = loop.time()
        uids |= uids_of(objects.trainjobs)
        if objects.empty():
            return
        if loop.time() >= deadline:
            raise OutcomeUnknownError(
                f"stop_job {job_id}: after {format_duration(within)} these remain: "
                + ", ".join(objects.described())
            )


async def _until_gone_on_watch(
    watch: StopNotes | None, job_id: str, uids: set[str], left: float
) -> None:
    if watch is None or left <= 0:
        return
    with contextlib.suppress(LookupError):
        await watch.until_gone(job_id, uids, min(WATCHED_POLL, timedelta(seconds=left)))


async def delete_trainjobs(scope: Scope, selector: str, *, field: bool = False) -> set[str]:
    """Delete the TrainJobs a label selector (or, with ``field``, a field selector) picks.

    Returns the uids of the TrainJobs the apiserver says it deleted.
    """
    options = client.V1DeleteOptions(propagation_policy="Background")
    try:
        deleted = await scope.custom.delete_collection_namespaced_custom_object(
            TRAINER_GROUP,
            TRAINER_VERSION,
            scope.namespace,
            TRAINJOBS,
            body=options,
            field_selector=selector if field else "",
            label_selector="" if field else selector,
        )
    except REQUEST_ERRORS as error:
        raise to_dispatch_error(
            f"deleting TrainJobs ({selector})", error, verb="deletecollection", resource=TRAINJOBS
        ) from None
    items = deleted.get("items") if isinstance(deleted, dict) else None
    return uids_of(items if isinstance(items, list) else ())
