"""kopf's settings for this operator, applied at startup.

kopf's bookkeeping (progress, the last handled spec, the finalizer) goes under the project's own
prefix instead of kopf's default, so the objects carry one vendor's annotations. The operator runs
standalone: one replica (the chart's Deployment is `Recreate`), no peering objects to grant.

The Prometheus metrics are served when an address is given: ``metrics_address`` in the memo
(``dispatch-kubeflow run --metrics-address``) or ``DISPATCH_KUBEFLOW_METRICS_ADDRESS`` under
plain ``kopf run``. The served endpoint's port is put back in the memo as ``metrics_port``.
"""

from __future__ import annotations

import os
from typing import Any, Final

import kopf

from dispatch_kubeflow import metrics
from dispatch_kubeflow.constants import FINALIZER, GROUP
from dispatch_kubeflow.handlers.bookkeeping import (
    DIFFBASE_KEY,
    DispatchJobDiffBase,
    ProgressStorage,
)
from dispatch_kubeflow.handlers.jobs import share_handed_over, starts_of, stops_of
from dispatch_kubeflow.handlers.kube import connection_info, kopf_session, open_api_client
from dispatch_kubeflow.handlers.registry import (
    EVENTS_TO_ENV,
    JOB_EVENTS_ENV,
    AdapterRegistry,
    EventLines,
    job_events_choice,
)

METRICS_ADDRESS_ENV: Final = "DISPATCH_KUBEFLOW_METRICS_ADDRESS"
# A watch request ends server-side before the client gives up on it, so kopf re-watches cleanly.
WATCH_SERVER_TIMEOUT: Final = 300
WATCH_CLIENT_TIMEOUT: Final = 330
CONNECT_TIMEOUT: Final = 30
REQUEST_TIMEOUT: Final = 60
# How long kopf skips the events older than its own last patch of an object. kopf's default (5 s)
# is shorter than its watch can lag behind a burst of thousands of DispatchJobs: an event from
# before the patch that marked a change handled (in kopf's annotation) then arrives later, and
# the change is handled a second time.
CONSISTENCY_TIMEOUT: Final = 60.0
# How long kopf keeps an object's worker once its events stop. Each idle worker holds the last
# event's whole DispatchJob; kopf's default (5 s) keeps one for every job with an event in the
# last 5 s, which in a burst is most of them. A new event starts a new worker, at little cost.
WORKER_IDLE: Final = 1.0


def apply_settings(settings: kopf.OperatorSettings) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.consistency_timeout = CONSISTENCY_TIMEOUT
    settings.queueing.idle_timeout = WORKER_IDLE
    settings.persistence.progress_storage = ProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = DispatchJobDiffBase(prefix=GROUP, key=DIFFBASE_KEY)
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT
    settings.watching.connect_timeout = CONNECT_TIMEOUT
    settings.networking.request_timeout = REQUEST_TIMEOUT
    settings.peering.standalone = True
    settings.posting.level = 20  # INFO and above become Kubernetes Events
    settings.execution.max_workers = 4


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    apply_settings(settings)
    if "registry" not in memo:
        memo.registry = AdapterRegistry()
    if "event_lines" not in memo:
        memo.event_lines = EventLines(os.environ.get(EVENTS_TO_ENV))
    if "job_events" not in memo:
        memo.job_events = job_events_choice(os.environ.get(JOB_EVENTS_ENV))
    if "api" not in memo:
        memo.api = await open_api_client()
    share_handed_over(memo)
    serve_metrics(memo)


def serve_metrics(memo: kopf.Memo) -> None:
    """Serve the metrics, reading the open adapters of this operator, if an address is given.

    ``dispatch-kubeflow run`` binds the server before kopf starts (``metrics_server`` in the
    memo), so a port in use is a plain error; under ``kopf run`` it is bound here.
    """
    server: metrics.MetricsServer | None = memo.get("metrics_server")
    address = memo.get("metrics_address") or os.environ.get(METRICS_ADDRESS_ENV)
    if server is None and address:
        try:
            server = metrics.serve_metrics(address)
        except OSError as error:  # a port in use is not fixed by retrying: stop the operator
            raise kopf.PermanentError(f"cannot serve metrics on {address}: {error}") from error
        memo.metrics_server = server
    if server is None or "metrics_unwatch" in memo:
        return
    registry: AdapterRegistry = memo.registry
    memo.metrics_port = server.port
    memo.metrics_unwatch = metrics.watch_adapters(lambda: dict(registry.adapters))


@kopf.on.login()
async def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.AiohttpSession:
    return kopf_session(await connection_info(settings))


@kopf.on.cleanup()
async def release(memo: kopf.Memo, **_: Any) -> None:
    if "starts" in memo:  # before the API client they use is closed
        await starts_of(memo).close()
        await stops_of(memo).close()
    api = memo.pop("api", None)
    if api is not None:
        await api.close()
    lines = memo.get("event_lines")
    if lines is not None:
        lines.close()
    unwatch = memo.pop("metrics_unwatch", None)
    if unwatch is not None:
        unwatch()
    server = memo.pop("metrics_server", None)
    if server is not None:
        server.close()


@kopf.on.probe(id="adapters")
def served_adapters(memo: kopf.Memo, **_: Any) -> int:
    """How many adapters are open and watching; shown on the liveness endpoint."""
    registry = memo.get("registry")
    return len(registry.adapters) if registry is not None else 0
