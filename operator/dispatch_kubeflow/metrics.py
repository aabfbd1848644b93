"""Prometheus metrics of the operator and of dispatch-admission, and the endpoint serving them.

Every label has a bounded set of values: namespaces, adapter names, runtimes (at most the
adapter's ``runtimes``), states, causes, event types, API verbs and resources, HTTP codes. No job
name or UID is ever a label.

The counters and histograms are process-wide (prometheus_client's default registry, which also
carries the process and Python collectors). What only the open adapters know (the watch backlog,
the informers' relists, the adapters' conditions) is read when scraped, from the sources the
operator hands ``watch_adapters``.

API requests are counted for every client of the process, the adapters' own connections
included, by wrapping ``kubernetes_asyncio``'s one request method (``count_api_requests``), the
one place all of them pass through.
"""

from __future__ import annotations

import argparse
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit
from wsgiref.simple_server import WSGIServer

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dispatch_kubeflow.clock import parse_time
from dispatch_kubeflow.constants import CheckState, EventType

PREFIX: Final = "dispatch_kubeflow_"
# Seconds: from a few hundred milliseconds (admission of a free cluster) to a day (a long run).
PHASE_BUCKETS: Final = (0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 86400)
LATENCY_BUCKETS: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
NO_CAUSE: Final = ""
UNKNOWN_RUNTIME: Final = ""
# Readmissions held at once whose start is remembered; older ones are forgotten first.
GATES_KEPT: Final = 4096

REGISTRY: Final = prometheus_client.REGISTRY
# A ``_created`` series per counter would double what is scraped and tell nothing here.
prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

JOBS_FINISHED: Final = prometheus_client.Counter(
    "dispatch_kubeflow_jobs_finished",
    "Attempts of DispatchJobs that finished (a Finished or Vanished event, or a refused start), "
    "by state and cause.",
    ["namespace", "adapter", "state", "cause", "runtime"],
)
EVENTS: Final = prometheus_client.Counter(
    "dispatch_kubeflow_events",
    "Dispatch events reported, by type and cause.",
    ["namespace", "adapter", "type", "cause"],
)


def _phase(name: str, documentation: str) -> prometheus_client.Histogram:
    """A histogram of one phase of an attempt, per namespace and runtime."""
    return prometheus_client.Histogram(
        name, documentation, ["namespace", "runtime"], buckets=PHASE_BUCKETS
    )


ADMISSION_WAIT: Final = _phase(
    "dispatch_kubeflow_job_admission_wait_seconds",
    "Time from an attempt's first Submitted (or its last Evicted) to the first Admitted after it.",
)
STARTUP: Final = _phase(
    "dispatch_kubeflow_job_startup_seconds",
    "Time from an attempt's Admitted to its Running event.",
)
RUN: Final = _phase(
    "dispatch_kubeflow_job_run_seconds",
    "Time from an attempt's Running to its Finished or Vanished event.",
)
EVENT_LATENCY: Final = prometheus_client.Histogram(
    "dispatch_kubeflow_event_latency_seconds",
    "Time from the upstream change being seen (a taint's timeAdded where the evidence has one, "
    "else the moment the watch derived the event) to the event's commit in the DispatchJob.",
    ["type"],
    buckets=LATENCY_BUCKETS,
)
API_REQUESTS: Final = prometheus_client.Counter(
    "dispatch_kubeflow_api_requests",
    "Requests to the Kubernetes API by verb, resource and HTTP code ('error' when no answer).",
    ["verb", "resource", "code"],
)
ADMISSION_DECISIONS: Final = prometheus_client.Counter(
    "dispatch_kubeflow_admission_decisions",
    "Admission check decisions written by dispatch-admission, by verdict.",
    ["verdict"],
)
GATE_HELD: Final = prometheus_client.Histogram(
    "dispatch_kubeflow_admission_gate_held_seconds",
    "Time a readmission was held Pending by dispatch-admission before Ready or Rejected.",
    buckets=PHASE_BUCKETS,
)
STARTS_PENDING: Final = prometheus_client.Gauge(
    "dispatch_kubeflow_starts_pending",
    "Starts of DispatchJobs handed over and not done: waiting for a place in flight, in flight, "
    "or waiting to be tried again.",
)
STOPS_PENDING: Final = prometheus_client.Gauge(
    "dispatch_kubeflow_stops_pending",
    "Stops of deleted DispatchJobs handed over and not done: waiting for a place in flight, in "
    "flight, or waiting to be tried again. Each holds its DispatchJob by the stop finalizer.",
)
LEADER: Final = prometheus_client.Gauge(
    "dispatch_kubeflow_admission_leader",
    "1 while this dispatch-admission replica holds the Lease, else 0.",
)

# The metrics read from the open adapters when scraped (see AdapterCollector).
BACKLOG_NAME: Final = "dispatch_kubeflow_watch_backlog"
RELISTS_NAME: Final = "dispatch_kubeflow_informer_relists"
ADAPTERS_NAME: Final = "dispatch_kubeflow_adapters"


# --- job events -------------------------------------------------------------------------------


def runtime_label(runtime: Mapping[str, Any] | None, default: str = UNKNOWN_RUNTIME) -> str:
    """The runtime label: the name of a runtime reference, else ``default``."""
    name = (runtime or {}).get("name")
    return name if isinstance(name, str) and name else default


def event_reported(namespace: str, adapter: str, event: Mapping[str, Any]) -> None:
    """Count one dispatch event of the adapter's stream."""
    EVENTS.labels(namespace, adapter, str(event.get("type")), event.get("cause") or NO_CAUSE).inc()


def job_events_committed(
    namespace: str,
    adapter: str,
    runtime: str,
    history: Sequence[Mapping[str, Any]],
    new: Sequence[Mapping[str, Any]],
    now: datetime,
) -> None:
    """Observe a transition committed to a DispatchJob: its finishes, phase times and latency.

    ``history`` is the DispatchJob's event history after the commit (oldest first), ``new`` the
    events the commit added to it.
    """
    for event in new:
        kind = str(event.get("type"))
        seen = _seen_at(event)
        if seen is not None:
            EVENT_LATENCY.labels(kind).observe(max((now - seen).total_seconds(), 0.0))
        if kind in (EventType.FINISHED, EventType.VANISHED):
            state = str(event.get("state"))
            cause = event.get("cause") or NO_CAUSE
            JOBS_FINISHED.labels(namespace, adapter, state, cause, runtime).inc()
        histogram = _PHASES.get(kind)
        took = phase_seconds(history, event) if histogram is not None else None
        if histogram is not None and took is not None:
            histogram.labels(namespace, runtime).observe(took)


def start_refused(namespace: str, adapter: str, runtime: str, state: str, cause: str) -> None:
    """Count an attempt that finished because its start was refused."""
    JOBS_FINISHED.labels(namespace, adapter, state, cause, runtime).inc()


# The histogram of the phase each event type ends.
_PHASES: Final[dict[str, prometheus_client.Histogram]] = {
    EventType.ADMITTED: ADMISSION_WAIT,
    EventType.RUNNING: STARTUP,
    EventType.FINISHED: RUN,
    EventType.VANISHED: RUN,
}
# Phase events are repeated for a new waiting cause (a second Submitted for NoCapacity, ...):
# a phase begins at the first of them.
_BEGINS: Final[dict[str, str]] = {
    EventType.ADMITTED: EventType.SUBMITTED,
    EventType.RUNNING: EventType.ADMITTED,
    EventType.FINISHED: EventType.RUNNING,
    EventType.VANISHED: EventType.RUNNING,
}
_IDENTITY: Final = ("type", "attempt", "time", "state", "cause", "reason")


def _time_of(event: Mapping[str, Any]) -> datetime | None:
    return parse_time(event.get("time"))


def _seen_at(event: Mapping[str, Any]) -> datetime | None:
    """When the change was seen upstream: a piece of evidence's own time, else the event's."""
    stamps = [
        parse_time(item.get("timeAdded"))
        for item in event.get("evidence") or ()
        if isinstance(item, Mapping)
    ]
    own = [stamp for stamp in stamps if stamp is not None]
    return min(own) if own else _time_of(event)


def _same(one: Mapping[str, Any], other: Mapping[str, Any]) -> bool:
    return all(one.get(key) == other.get(key) for key in _IDENTITY)


def phase_seconds(history: Sequence[Mapping[str, Any]], event: Mapping[str, Any]) -> float | None:
    """Seconds of the phase ``event`` ends, from the attempt's history; None when not timed.

    The phase runs from the first event that begins it in the event's admission cycle (since the
    attempt's last Evicted, else since it was submitted; an eviction also begins the next
    admission wait). A repeat of a phase event (the same type again in the cycle) ends nothing.
    """
    attempt = event.get("attempt")
    ours = [e for e in history if e.get("attempt") == attempt]
    at = max((k for k, e in enumerate(ours) if _same(e, event)), default=len(ours))
    before = ours[:at]
    evictions = [k for k, e in enumerate(before) if e.get("type") == EventType.EVICTED]
    cycle = before[evictions[-1] :] if evictions else before
    kind = str(event.get("type"))
    if any(e.get("type") == kind for e in cycle):
        return None
    begins = {_BEGINS[kind], EventType.EVICTED} if kind == EventType.ADMITTED else {_BEGINS[kind]}
    begin = next((_time_of(e) for e in cycle if e.get("type") in begins), None)
    end = _time_of(event)
    if begin is None or end is None or end < begin:
        return None
    return (end - begin).total_seconds()


# --- what the open adapters know --------------------------------------------------------------

# An open adapter as the collector reads it: a Supervisor under ``.supervisor``.
AdapterSource = Callable[[], Mapping[tuple[str, str], Any]]


@dataclass
class _AdapterState:
    sources: list[AdapterSource]
    conditions: dict[tuple[str, str], dict[str, str]]
    lock: threading.Lock


_STATE: Final = _AdapterState([], {}, threading.Lock())


def watch_adapters(source: AdapterSource) -> Callable[[], None]:
    """Read the open adapters ``source`` returns when scraped; the result stops reading them."""
    with _STATE.lock:
        _STATE.sources.append(source)

    def forget() -> None:
        with _STATE.lock:
            if source in _STATE.sources:
                _STATE.sources.remove(source)

    return forget


def adapter_conditions(namespace: str, name: str, conditions: Iterable[Mapping[str, Any]]) -> None:
    """The conditions a KubeflowAdapter's status now has."""
    current = {str(c.get("type")): str(c.get("status")) for c in conditions}
    with _STATE.lock:
        _STATE.conditions[(namespace, name)] = current


def adapter_gone(namespace: str, name: str) -> None:
    with _STATE.lock:
        _STATE.conditions.pop((namespace, name), None)


class AdapterCollector(Collector):
    """The watch backlog and relists of each open adapter, and the adapters by condition."""

    def collect(self) -> Iterator[Metric]:
        backlog = GaugeMetricFamily(
            BACKLOG_NAME,
            "Watched changes and timers queued in an adapter's watch and not yet taken up.",
            labels=["namespace", "adapter"],
        )
        relists = CounterMetricFamily(
            RELISTS_NAME,
            "LISTs an open adapter's informers made after their first (after HTTP 410 or a "
            "failed watch), by kind.",
            labels=["namespace", "adapter", "kind"],
        )
        adapters = GaugeMetricFamily(
            ADAPTERS_NAME,
            "KubeflowAdapters served by this operator, by condition and its status.",
            labels=["condition", "status"],
        )
        with _STATE.lock:
            sources = list(_STATE.sources)
            conditions = [dict(c) for c in _STATE.conditions.values()]
        for source in sources:
            for (namespace, name), adapter in sorted(source().items()):
                supervisor = adapter.supervisor
                backlog.add_metric([namespace, name], supervisor.backlog())
                for informer in supervisor.informers:
                    lists = max(informer.relists - 1, 0)
                    relists.add_metric([namespace, name, informer.kind], lists)
        counts: dict[tuple[str, str], int] = {}
        for found in conditions:
            for kind, status in found.items():
                counts[(kind, status)] = counts.get((kind, status), 0) + 1
        for (kind, status), count in sorted(counts.items()):
            adapters.add_metric([kind, status], count)
        yield from (backlog, relists, adapters)

    def describe(self) -> Iterator[Metric]:
        return self.collect()


REGISTRY.register(AdapterCollector())


# --- dispatch-admission -----------------------------------------------------------------------


class _HeldGates:
    """When each held readmission (Workload UID, evictions) was first decided Pending."""

    def __init__(self) -> None:
        self._since: OrderedDict[tuple[str, int], datetime] = OrderedDict()

    def decided(self, uid: str, evictions: int, state: str, now: datetime) -> float | None:
        key = (uid, evictions)
        if state == CheckState.PENDING:
            self._since.setdefault(key, now)
            while len(self._since) > GATES_KEPT:
                self._since.popitem(last=False)
            return None
        since = self._since.pop(key, None)
        return None if since is None else max((now - since).total_seconds(), 0.0)


_HELD: Final = _HeldGates()


def admission_decided(uid: str, evictions: int, state: str, now: datetime) -> None:
    """Count a decision written on a Workload; a held readmission's end is timed."""
    ADMISSION_DECISIONS.labels(state).inc()
    if evictions > 0:
        held = _HELD.decided(uid, evictions, state, now)
        if held is not None:
            GATE_HELD.observe(held)


# --- API requests -----------------------------------------------------------------------------

_MUTATING: Final = {"POST": "create", "PUT": "update", "PATCH": "patch"}


def request_labels(method: str, url: str, query: Any) -> tuple[str, str]:
    """(verb, resource) of a request to the Kubernetes API, as the apiserver names them."""
    path = [part for part in urlsplit(url).path.split("/") if part]
    if path[:1] == ["api"]:
        rest_of = path[2:]
    elif path[:1] == ["apis"]:
        rest_of = path[3:]
    else:
        return method.lower(), "other"
    if len(rest_of) >= 3 and rest_of[0] == "namespaces":
        rest_of = rest_of[2:]
    resource = "/".join([rest_of[0], *rest_of[2:3]]) if rest_of else "other"
    named = len(rest_of) >= 2
    return _verb(method, named, _is_watch(url, query)), resource


def _is_watch(url: str, query: Any) -> bool:
    params: list[tuple[str, Any]] = []
    if isinstance(query, Mapping):
        params = list(query.items())
    elif isinstance(query, Iterable) and not isinstance(query, str | bytes):
        params = [tuple(item) for item in query if isinstance(item, tuple | list)]
    params += [(k, v) for k, vs in parse_qs(urlsplit(url).query).items() for v in vs]
    return any(key == "watch" and str(value).lower() in ("true", "1") for key, value in params)


def _verb(method: str, named: bool, watch: bool) -> str:
    if method == "GET":
        return "watch" if watch else ("get" if named else "list")
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return _MUTATING.get(method, method.lower())


def count_api_requests() -> None:
    """Count every request of every ``kubernetes_asyncio`` client in the process (once)."""
    # Imported here: the CLI's commands that talk to no cluster import this module too.
    from kubernetes_asyncio.client import rest
    from kubernetes_asyncio.client.exceptions import ApiException

    original = rest.RESTClientObject.request
    if getattr(original, "counted", False):
        return

    @functools.wraps(original)
    async def request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        query = kwargs.get("query_params", args[0] if args else None)
        verb, resource = request_labels(method.upper(), url, query)
        code = "error"
        try:
            response = await original(self, method, url, *args, **kwargs)
            code = str(getattr(response, "status", "error"))
            return response
        except ApiException as error:
            code = str(error.status or "error")
            raise
        finally:
            API_REQUESTS.labels(verb, resource, code).inc()

    request.counted = True  # type: ignore[attr-defined]
    rest.RESTClientObject.request = request  # type: ignore[method-assign]


# --- serving ----------------------------------------------------------------------------------


@dataclass
class MetricsServer:
    """The HTTP endpoint serving ``/metrics`` (any path answers), in a thread of its own."""

    server: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def parse_address(address: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port`` or ``:port`` (every interface); ``ValueError`` otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"metrics address {address!r} is not HOST:PORT")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


def address_argument(value: str) -> str:
    """``value`` if it is HOST:PORT (the type of a ``--metrics-address`` flag)."""
    try:
        parse_address(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return value


def serve_metrics(address: str) -> MetricsServer:
    """Serve the metrics on ``address`` (port 0 picks a free one), counting API requests."""
    host, port = parse_address(address)
    count_api_requests()
    server, thread = prometheus_client.start_http_server(port, addr=host, registry=REGISTRY)
    return MetricsServer(server, thread)


def exported_names() -> frozenset[str]:
    """Every series name the project's own metrics expose (``_total``, ``_bucket``, ...)."""
    names = {BACKLOG_NAME, RELISTS_NAME + "_total", ADAPTERS_NAME}
    for metric in (
        JOBS_FINISHED,
        EVENTS,
        ADMISSION_WAIT,
        STARTUP,
        RUN,
        EVENT_LATENCY,
        API_REQUESTS,
        ADMISSION_DECISIONS,
        GATE_HELD,
        LEADER,
    ):
        for family in metric.describe():
            names |= _series_of(family.name, family.type)
    return frozenset(names)


def _series_of(name: str, kind: str) -> set[str]:
    if kind == "counter":
        return {name + "_total"}
    if kind == "histogram":
        return {name + "_bucket", name + "_sum", name + "_count"}
    return {name}
