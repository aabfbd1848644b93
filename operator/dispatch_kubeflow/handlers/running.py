"""``dispatch-kubeflow run``: the operator, as kopf with this package's handlers and settings.

It is ``kopf run -m dispatch_kubeflow.handlers --standalone`` with the project's defaults: JSON
logs on stderr, the dispatch events as one JSON line each on the stream chosen with
``--events-to``, an optional liveness endpoint and optional Prometheus metrics
(``--metrics-address``). The cluster is found the way kopf finds it:
the pod's service account, else ``KUBECONFIG`` / ``~/.kube/config`` (or ``--kubeconfig``).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from typing import Final

from dispatch_kubeflow.metrics import address_argument, serve_metrics

LOG_LEVELS: Final = ("debug", "info", "warning", "error")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig to use (default: KUBECONFIG, ~/.kube/config)",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        action="append",
        default=[],
        metavar="NS",
        help="serve resources in this namespace (repeatable; a glob pattern is allowed)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="serve resources in every namespace (the default when no --namespace is given)",
    )
    parser.add_argument(
        "--liveness",
        metavar="URL",
        help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument(
        "--metrics-address",
        type=address_argument,
        metavar="HOST:PORT",
        help="serve Prometheus metrics on this address, e.g. 0.0.0.0:9090 (default: off)",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="info")
    parser.add_argument(
        "--log-format", choices=("json", "plain"), default="json", help="default: json"
    )
    parser.add_argument(
        "--job-events",
        choices=("all", "warnings", "none"),
        default="all",
        help="which dispatch events are also Kubernetes Events on their DispatchJob: all, only "
        "the Warning ones (evictions, node loss, restarts, vanishing, failures), or none; "
        "default all",
    )
    parser.add_argument(
        "--events-to",
        metavar="WHERE",
        default="stdout",
        help="dispatch events as JSON lines: stdout, stderr, none or a file path (default stdout)",
    )


def configure_logging(level: str, log_format: str) -> None:
    import kopf

    kopf.configure(
        debug=level == "debug",
        log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL,
        log_refkey="object",
    )
    logging.getLogger().setLevel(level.upper())


def run(args: argparse.Namespace) -> int:
    import kopf

    import dispatch_kubeflow.handlers  # noqa: F401  (registers the handlers)
    from dispatch_kubeflow.handlers.registry import EventLines

    server = None
    if args.metrics_address:
        try:
            server = serve_metrics(args.metrics_address)
        except OSError as error:
            print(f"dispatch-kubeflow run: cannot serve metrics on {args.metrics_address}: {error}",
                  file=sys.stderr)  # fmt: skip
            return 1
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    configure_logging(args.log_level, args.log_format)
    memo = kopf.Memo(
        event_lines=EventLines(args.events_to),
        metrics_server=server,
        job_events=args.job_events,
    )
    namespaces: list[str] = list(args.namespaces)
    # What is loaded by now lives as long as the process: the garbage collector's full passes
    # need not walk it (90,000 objects, most of them kubernetes_asyncio's models).
    gc.freeze()
    kopf.run(
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
        memo=memo,
    )
    return 0
