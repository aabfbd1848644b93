"""Where the operator keeps how far each job has been reported: its DispatchJob's status.

The library keeps each (job, attempt)'s ``ReportedRecord`` in an annotation on the TrainJob, so the
record goes when the TrainJob goes, and a job whose objects all vanished while no adapter watched
could never be reported as ``Vanished``. In the operator every job has a DispatchJob, which outlives
its TrainJob (its finalizer holds it until ``stop_job`` is done), so the record lives in the
DispatchJob's ``status.reported``, one entry per attempt. The store can also list the DispatchJobs
with unfinished records (``ListingReportStore``), so a restarted supervisor checks those jobs even
when nothing of them is left to watch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Final

from kubernetes_asyncio import client

from dispatch_kubeflow.constants import DISPATCH_JOBS, GROUP, STATUS_REPORTED, VERSION
from dispatch_kubeflow.handlers.kube import read_object, update_status
from dispatch_kubeflow.kube.informer import list_all
from dispatch_kubeflow.reporting import ReportedRecord

DEFAULT_TIMEOUT: Final = timedelta(seconds=30)

JobKey = tuple[str, int]

log = logging.getLogger(__name__)


def records_of(body: Mapping[str, Any] | None, adapter: str) -> dict[int, ReportedRecord]:
    """The readable records in a DispatchJob's status by attempt; none if not of ``adapter``."""
    if not body or (body.get("spec") or {}).get("adapter") != adapter:
        return {}
    stored = (body.get("status") or {}).get(STATUS_REPORTED) or {}
    records: dict[int, ReportedRecord] = {}
    for attempt, text in stored.items():
        record = ReportedRecord.from_json(text) if isinstance(text, str) else None
        if record is not None and str(attempt).isdigit():
            records[int(attempt)] = record
    return records


def record_patch(attempt: int, record: ReportedRecord) -> dict[str, Any]:
    """The status merge patch that sets one attempt's record and leaves the others alone."""
    return {STATUS_REPORTED: {str(attempt): record.to_json()}}


class DispatchJobStatusStore:
    """A ``ListingReportStore`` over the DispatchJobs one adapter serves in its namespace.

    Writes are status-subresource merge patches carrying the resourceVersion they were computed
    from (``kube.update_status``). A record for a job without a DispatchJob of this adapter (it
    was deleted, or the job was started through the library) is dropped with a log line: there is
    nothing to fold its events into either. Each request is bounded by ``request_timeout``; a
    timeout or an API error reaches the supervisor, which counts nothing as reported and retries.
    ``unfinished`` lists page by page through ``kube.informer.list_all``, whose failures are the
    error family's.
    """

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        adapter_name: str,
        request_timeout: timedelta = DEFAULT_TIMEOUT,
    ) -> None:
        self._api = api
        self._namespace = namespace
        self._adapter = adapter_name
        self._request_timeout = request_timeout
        self._timeout = request_timeout.total_seconds()
        # Records seen by the last ``unfinished`` listing, each handed out once by ``load``, so
        # a restart reads every record with one LIST instead of a GET per job.
        self._listed: dict[JobKey, ReportedRecord] = {}
        self.requests = 0

    async def load(self, job: str, attempt: int) -> ReportedRecord | None:
        listed = self._listed.pop((job, attempt), None)
        if listed is not None:
            return listed
        self.requests += 1
        async with asyncio.timeout(self._timeout):
            body = await read_object(self._api, DISPATCH_JOBS, self._namespace, job)
        return records_of(body, self._adapter).get(attempt)

    async def save(self, job: str, attempt: int, record: ReportedRecord) -> None:
        served: dict[str, bool] = {}

        async def change(current: dict[str, Any]) -> dict[str, Any] | None:
            self.requests += 1
            if (current.get("spec") or {}).get("adapter") != self._adapter:
                served["other"] = True
                return None
            if records_of(current, self._adapter).get(attempt) == record:
                return None
            self.requests += 1
            return record_patch(attempt, record)

        async with asyncio.timeout(self._timeout):
            written = await update_status(self._api, DISPATCH_JOBS, self._namespace, job, change)
        if written is None or served:
            log.info(
                "no DispatchJob %s of adapter %s in %s: the reported record of attempt %s "
                "is dropped",
                job,
                self._adapter,
                self._namespace,
                attempt,
            )

    async def unfinished(self) -> list[JobKey]:
        """Every (job, attempt) of this adapter's DispatchJobs whose record is not finished."""
        self._listed = {}
        listing = await list_all(
            self._list_page,
            what=f"list the DispatchJobs in {self._namespace}",
            request_timeout=self._request_timeout,
        )
        for item in listing.items:
            name = str(item["metadata"]["name"])
            for attempt, record in records_of(item, self._adapter).items():
                self._listed[(name, attempt)] = record
        return sorted(key for key, record in self._listed.items() if not record.finished)

    async def _list_page(self, **options: Any) -> Any:
        self.requests += 1
        return await client.CustomObjectsApi(self._api).list_namespaced_custom_object(
            GROUP, VERSION, self._namespace, DISPATCH_JOBS, **options
        )
