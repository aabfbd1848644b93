"""``dispatch-kubeflow status``: the KubeflowAdapters and DispatchJobs, summed up for people.

Two tables, like ``kueuectl list workload``: the adapters (what each serves, its mode, Ready and
AdmissionHealthy; with a namespace, those living in it and those serving it) and the jobs
(state, cause, attempt, age, and the time the current attempt has waited for admission: so far
while it waits, else how long its last admission took). Rows are sorted by namespace and name
and columns aligned; ``-o json`` gives the same rows as JSON, times in seconds. Everything is
read in one LIST per kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from http import HTTPStatus
from typing import Any, Final

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.clock import parse_time
from dispatch_kubeflow.constants import (
    DISPATCH_JOBS,
    GROUP,
    KUBEFLOW_ADAPTERS,
    VERSION,
    AdapterCondition,
    EventType,
    JobCondition,
)
from dispatch_kubeflow.kube.connection import connect
from dispatch_kubeflow.kube.objects import dig

NONE: Final = "-"
REQUEST_TIMEOUT: Final = timedelta(seconds=30)


@dataclass(frozen=True)
class Where:
    """The cluster to read (a ``ClusterLocation``): a kubeconfig and context, or in-cluster."""

    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False


@dataclass(frozen=True)
class AdapterRow:
    namespace: str
    name: str
    serves: str | None
    mode: str | None
    ready: str | None
    admission_healthy: str | None
    age_seconds: float | None


@dataclass(frozen=True)
class JobRow:
    namespace: str
    name: str
    adapter: str | None
    state: str | None
    cause: str | None
    attempt: int | None
    age_seconds: float | None
    admitted: str | None
    # Seconds the current attempt has waited for admission (so far, or until admitted).
    admission_wait_seconds: float | None


@dataclass(frozen=True)
class Summary:
    adapters: list[AdapterRow]
    jobs: list[JobRow]


def _seconds(since: datetime | None, until: datetime) -> float | None:
    return None if since is None else max((until - since).total_seconds(), 0.0)


def _condition(body: Mapping[str, Any], kind: str) -> str | None:
    for entry in dig(body, "status", "conditions") or ():
        if isinstance(entry, Mapping) and entry.get("type") == kind:
            status = entry.get("status")
            return status if isinstance(status, str) else None
    return None


def _created(body: Mapping[str, Any]) -> datetime | None:
    return parse_time(dig(body, "metadata", "creationTimestamp"))


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def adapter_row(body: Mapping[str, Any], now: datetime) -> AdapterRow:
    return AdapterRow(
        namespace=str(dig(body, "metadata", "namespace")),
        name=str(dig(body, "metadata", "name")),
        serves=_text(dig(body, "spec", "namespace")),
        mode=_text(dig(body, "status", "mode")),
        ready=_condition(body, AdapterCondition.READY),
        admission_healthy=_condition(body, AdapterCondition.ADMISSION_HEALTHY),
        age_seconds=_seconds(_created(body), now),
    )


def admission_wait(body: Mapping[str, Any], now: datetime) -> float | None:
    """Seconds the current attempt waited for admission: until now, or until it was admitted.

    The wait starts at the attempt's first Submitted or its last Evicted event (the
    DispatchJob's creation when no event has come yet) and ends at the Admitted or Running event
    after it. None for a finished attempt that was never admitted, or a job that has not started.
    """
    attempt = dig(body, "status", "attempt")
    events = [
        e
        for e in dig(body, "status", "events") or ()
        if isinstance(e, Mapping) and e.get("attempt") == attempt
    ]
    started: datetime | None = None
    admitted: datetime | None = None
    for event in events:
        kind = event.get("type")
        # A repeated Submitted (a new waiting cause) goes on with the same wait.
        if kind == EventType.EVICTED or (kind == EventType.SUBMITTED and started is None):
            started, admitted = parse_time(event.get("time")), None
        elif kind in (EventType.ADMITTED, EventType.RUNNING) and admitted is None:
            admitted = parse_time(event.get("time"))
    if started is None and not events and attempt is not None:
        started = _created(body)
    if admitted is not None and started is not None:
        return _seconds(started, admitted)
    if _condition(body, JobCondition.FINISHED) == "True":
        return None
    return _seconds(started, now)


def job_row(body: Mapping[str, Any], now: datetime) -> JobRow:
    attempt = dig(body, "status", "attempt") or dig(body, "spec", "attempt")
    return JobRow(
        namespace=str(dig(body, "metadata", "namespace")),
        name=str(dig(body, "metadata", "name")),
        adapter=_text(dig(body, "spec", "adapter")),
        state=_text(dig(body, "status", "state")),
        cause=_text(dig(body, "status", "cause")),
        attempt=attempt if isinstance(attempt, int) else None,
        age_seconds=_seconds(_created(body), now),
        admitted=_condition(body, JobCondition.ADMITTED),
        admission_wait_seconds=admission_wait(body, now),
    )


def summarize(
    adapters: Sequence[Mapping[str, Any]], jobs: Sequence[Mapping[str, Any]], now: datetime
) -> Summary:
    """The rows of both tables, sorted by namespace and name."""
    return Summary(
        adapters=sorted(
            (adapter_row(a, now) for a in adapters), key=lambda r: (r.namespace, r.name)
        ),
        jobs=sorted((job_row(j, now) for j in jobs), key=lambda r: (r.namespace, r.name)),
    )


# --- reading ----------------------------------------------------------------------------------


async def _list(api: client.ApiClient, plural: str, namespace: str | None) -> list[dict[str, Any]]:
    objects = client.CustomObjectsApi(api)
    if namespace is None:
        found = await objects.list_cluster_custom_object(GROUP, VERSION, plural)
    else:
        found = await objects.list_namespaced_custom_object(GROUP, VERSION, namespace, plural)
    return list(found.get("items") or [])


def in_or_serving(adapter: Mapping[str, Any], namespace: str) -> bool:
    """Whether a KubeflowAdapter lives in ``namespace`` or serves it."""
    return namespace in (dig(adapter, "metadata", "namespace"), dig(adapter, "spec", "namespace"))


async def _adapters(api: client.ApiClient, namespace: str | None) -> list[dict[str, Any]]:
    """The adapters of ``namespace``: those living there and those serving it from elsewhere.

    Those serving it from elsewhere need a cluster-wide LIST; without the right to it, only the
    namespace's own are shown.
    """
    if namespace is None:
        return await _list(api, KUBEFLOW_ADAPTERS, None)
    try:
        every = await _list(api, KUBEFLOW_ADAPTERS, None)
    except ApiException as error:
        if error.status != HTTPStatus.FORBIDDEN:
            raise
        return await _list(api, KUBEFLOW_ADAPTERS, namespace)
    return [adapter for adapter in every if in_or_serving(adapter, namespace)]


async def read_summary(where: Where, namespace: str | None, now: datetime) -> Summary:
    """One LIST of each kind in ``namespace`` (every namespace for None), summed up."""
    api = await connect(where, token=None, request_timeout=REQUEST_TIMEOUT)
    try:
        adapters = await _adapters(api, namespace)
        jobs = await _list(api, DISPATCH_JOBS, namespace)
    finally:
        await api.close()
    return summarize(adapters, jobs, now)


# --- rendering --------------------------------------------------------------------------------


def human_duration(seconds: float | None) -> str:
    """Like kubectl's ages: 45s, 3m20s, 5h2m, 3d4h."""
    if seconds is None:
        return NONE
    whole = int(seconds)
    if whole < 120:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m{secs}s" if minutes < 10 and secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes}m" if hours < 8 and minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h" if days < 8 and hours else f"{days}d"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by three spaces, as kubectl prints them."""
    widths = [max(len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [
        "   ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return NONE if value is None or value == "" else str(value)


ADAPTER_HEADERS: Final = (
    "NAMESPACE",
    "ADAPTER",
    "SERVES",
    "MODE",
    "READY",
    "ADMISSION-HEALTHY",
    "AGE",
)
JOB_HEADERS: Final = (
    "NAMESPACE", "JOB", "ADAPTER", "STATE", "CAUSE", "ATTEMPT", "AGE", "ADMITTED",
    "WAITED-FOR-ADMISSION",
)  # fmt: skip


def render_text(summary: Summary) -> str:
    """Both tables, adapters first; a table with no rows says so."""
    adapters = [
        (r.namespace, r.name, _cell(r.serves), _cell(r.mode), _cell(r.ready),
         _cell(r.admission_healthy), human_duration(r.age_seconds))
        for r in summary.adapters
    ]  # fmt: skip
    jobs = [
        (r.namespace, r.name, _cell(r.adapter), _cell(r.state), _cell(r.cause), _cell(r.attempt),
         human_duration(r.age_seconds), _cell(r.admitted), human_duration(r.admission_wait_seconds))
        for r in summary.jobs
    ]  # fmt: skip
    adapter_table = table(ADAPTER_HEADERS, adapters) if adapters else "No KubeflowAdapters found."
    job_table = table(JOB_HEADERS, jobs) if jobs else "No DispatchJobs found."
    return f"{adapter_table}\n\n{job_table}\n"


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def render_json(summary: Summary) -> dict[str, Any]:
    """The rows as JSON: camelCase keys, ages and waits in whole seconds."""

    def row(item: AdapterRow | JobRow) -> dict[str, Any]:
        fields = asdict(item)
        for key, value in fields.items():
            if key.endswith("_seconds") and value is not None:
                fields[key] = int(value)
        return {_camel(key): value for key, value in fields.items()}

    return {
        "adapters": [row(r) for r in summary.adapters],
        "jobs": [row(r) for r in summary.jobs],
    }
