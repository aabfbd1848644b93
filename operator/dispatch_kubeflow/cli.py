"""The ``dispatch-kubeflow`` command: one subcommand per job, each added by its own function.

``schema`` prints the settings JSON Schema (the bytes of ``schema.json``); ``validate`` checks a
settings document or a ``KubeflowAdapter`` manifest before it is used or applied, and prints the
settings as the adapter reads them; ``status`` prints the adapters and jobs of a cluster. Exit
status: 0 success, 1 refused, 2 bad usage, input that cannot be read or output that cannot be
written, 3 an internal error (a fault in this program, never a verdict on the input), 130
interrupted. Every failure is one line on standard error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import yaml

from dispatch_kubeflow.constants import (
    ADMISSION_LEASE_NAME_DEFAULT,
    ADMISSION_LEASE_NAMESPACE_DEFAULT,
    API_VERSION,
    KUBEFLOW_ADAPTER_KIND,
)
from dispatch_kubeflow.errors import ErrUnsupported
from dispatch_kubeflow.kube.lazyclient import defer_client_imports
from dispatch_kubeflow.metrics import address_argument, serve_metrics
from dispatch_kubeflow.schema import schema_bytes
from dispatch_kubeflow.settings import (
    InvalidSettings,
    Settings,
    json_pointer,
    parse_settings_object,
)
from dispatch_kubeflow.settings.documents import MAX_DEPTH, decode_json, object_keys
from dispatch_kubeflow.settings.refusals import MESSAGE_MAX, cut, printable

EXIT_OK: Final = 0
EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2
EXIT_INTERNAL: Final = 3
EXIT_INTERRUPTED: Final = 130

PROG: Final = "dispatch-kubeflow"

if TYPE_CHECKING:
    from dispatch_kubeflow.admission.controller import AdmissionConfig
    from dispatch_kubeflow.settings import Cluster

    SubParsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

Handler = Callable[[argparse.Namespace], int]


# --- schema ---------------------------------------------------------------------------------------


def add_schema_command(commands: SubParsers) -> None:
    parser = commands.add_parser(
        "schema",
        help="print the settings JSON Schema",
        description="Print the settings object's JSON Schema (2020-12): the bytes of schema.json.",
    )
    parser.set_defaults(handler=run_schema)


def run_schema(_args: argparse.Namespace) -> int:
    return write_output(schema_bytes(), "schema")


# --- standard streams -----------------------------------------------------------------------------


def report(message: str) -> None:
    """One line on standard error, if there is one to write to."""
    stream = sys.stderr
    if stream is None:
        return
    try:
        stream.write(cut(printable(message), MESSAGE_MAX * 2) + "\n")
        stream.flush()
    except (OSError, ValueError):
        pass  # nowhere left to say it; the exit status still does


def write_output(data: bytes, command: str) -> int:
    """Write ``data`` to standard output; a failure (closed, full, a broken pipe) is exit 2."""
    try:
        stream = sys.stdout
        if stream is None:
            raise OSError("standard output is closed")
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            buffer.write(data)
            buffer.flush()
        else:
            stream.write(data.decode("utf-8"))
            stream.flush()
    except (OSError, ValueError) as exc:
        _discard_standard_output()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        report(f"{PROG} {command}: cannot write the output: {reason}")
        return EXIT_USAGE
    return EXIT_OK


def _discard_standard_output() -> None:
    """Point standard output at the null device, so the flush at exit fails no second time."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
    except (AttributeError, OSError, ValueError):
        pass  # no file descriptor behind it: nothing is flushed at exit either


# --- validate -------------------------------------------------------------------------------------

_MANIFEST_KEYS: Final = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})
_YAML_MERGE_TAG: Final = "tag:yaml.org,2002:merge"
# The most an apiserver accepts in one request; a settings document is a few kilobytes.
MAX_INPUT_BYTES: Final = 3 * 1024 * 1024
# A manifest holds the settings one level down, under spec, beside metadata and status.
MANIFEST_MAX_DEPTH: Final = MAX_DEPTH + 1
MANIFEST_MAX_CONTAINERS: Final = 10_000


def add_validate_command(commands: SubParsers) -> None:
    parser = commands.add_parser(
        "validate",
        help="check a settings document or a KubeflowAdapter manifest",
        description=(
            "Check a settings document (JSON) or a KubeflowAdapter manifest (YAML or JSON; its "
            "spec is the settings). On success print {settings, declarations} as JSON with every "
            "default applied and exit 0; on refusal print the one-line error and exit 1. Errors "
            "in a manifest name pointers under /spec."
        ),
    )
    parser.add_argument("file", metavar="FILE", help="the document to check, - for stdin")
    parser.set_defaults(handler=run_validate)


def run_validate(args: argparse.Namespace) -> int:
    name = "standard input" if args.file == "-" else args.file
    try:
        data = _read_input(args.file)
    except OSError as exc:
        report(f"{PROG} validate: cannot read {name}: {exc.strerror or exc}")
        return EXIT_USAGE
    try:
        if len(data) > MAX_INPUT_BYTES:
            raise InvalidSettings(
                "", f"the document is larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB"
            )
        settings = load_settings_or_manifest(data)
    except InvalidSettings as exc:
        report(str(exc))
        return EXIT_REFUSED
    result = json.dumps(validation_result(settings), indent=2, ensure_ascii=False) + "\n"
    return write_output(result.encode("utf-8"), "validate")


def _read_input(name: str) -> bytes:
    """At most one byte more than ``MAX_INPUT_BYTES`` of the file, or of stdin for ``-``."""
    if name != "-":
        with open(name, "rb") as handle:
            return handle.read(MAX_INPUT_BYTES + 1)
    stream = sys.stdin
    if stream is None:
        raise OSError("it is closed")
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        data: bytes = buffer.read(MAX_INPUT_BYTES + 1)
        return data
    return str(stream.read(MAX_INPUT_BYTES + 1)).encode("utf-8", "surrogateescape")


def validation_result(settings: Settings) -> dict[str, Any]:
    """What ``validate`` prints: the settings as read, and the declarations they give."""
    return {
        "settings": settings.to_document(),
        "declarations": settings.declarations().model_dump(mode="json", by_alias=True),
    }


def load_settings_or_manifest(data: bytes) -> Settings:
    """A JSON settings document, or a KubeflowAdapter manifest (YAML or JSON) whose spec is one.

    JSON text whose top level has neither ``apiVersion`` nor ``kind`` is a settings document and
    is parsed exactly as the adapter parses settings; anything else is read as a manifest.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSettings("", f"not UTF-8 text (byte {exc.start})") from None
    if not text.lstrip(" \t\r\n").startswith("{"):
        return parse_manifest(text)
    # Broken JSON: the settings parser says what is wrong with it. A manifest may hold more
    # objects than settings do (metadata, managedFields, status), and one more level.
    document = decode_json(
        text, max_depth=MANIFEST_MAX_DEPTH, max_containers=MANIFEST_MAX_CONTAINERS
    )
    if {"apiVersion", "kind"} & object_keys(document):
        return parse_manifest(text)
    return parse_settings_object(document)


def parse_manifest(text: str) -> Settings:
    """The settings in a KubeflowAdapter manifest; refusals name pointers under ``/spec``."""
    manifest = _load_single_yaml(text)
    if not isinstance(manifest, dict):
        raise InvalidSettings("", "a KubeflowAdapter manifest must be a mapping")
    for key in manifest:
        if key not in _MANIFEST_KEYS:
            raise InvalidSettings(json_pointer(key), "unknown key")
    if not isinstance(manifest.get("metadata", {}), dict):
        raise InvalidSettings("/metadata", "must be a mapping")
    if manifest.get("apiVersion") != API_VERSION:
        raise InvalidSettings("/apiVersion", f"must be {API_VERSION!r}")
    if manifest.get("kind") != KUBEFLOW_ADAPTER_KIND:
        raise InvalidSettings("/kind", f"must be {KUBEFLOW_ADAPTER_KIND!r}")
    if "spec" not in manifest:
        raise InvalidSettings("/spec", "is required")
    return parse_settings_object(manifest["spec"], pointer="/spec")


class ManifestLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases and nesting past ``MANIFEST_MAX_DEPTH``.

    A manifest needs no aliases, and refusing them is what keeps an alias bomb (a few hundred
    bytes that expand to millions of nodes) and a recursive alias from being expanded at all.
    Depth is counted before the composer recurses into a collection.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            raise InvalidSettings(
                "",
                f"YAML aliases (*{event.anchor}) are not supported: a manifest needs none"
                f"{_where(event.start_mark)}",
            )
        collection = isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent)
        if collection:
            self.depth += 1
            if self.depth > MANIFEST_MAX_DEPTH:
                raise InvalidSettings(
                    "",
                    f"nested more than {MANIFEST_MAX_DEPTH} levels deep{_where(event.start_mark)}",
                )
        try:
            return super().compose_node(parent, index)
        finally:
            if collection:
                self.depth -= 1

    def construct_integer(self, node: yaml.ScalarNode) -> int | Decimal:
        """An integer; one too long for ``int()`` (never a settings value) as a ``Decimal``."""
        try:
            return self.construct_yaml_int(node)
        except ValueError:
            try:
                return Decimal(str(node.value).replace("_", ""))
            except ArithmeticError:
                return Decimal("Infinity")


ManifestLoader.add_constructor("tag:yaml.org,2002:int", ManifestLoader.construct_integer)


def _where(mark: Any) -> str:
    return f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""


def _load_single_yaml(text: str) -> Any:
    loader = ManifestLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise InvalidSettings("", "the manifest is empty")
        return _yaml_value(loader, node, "")
    except yaml.MarkedYAMLError as exc:
        raise InvalidSettings(
            "", f"not valid YAML: {exc.problem}{_where(exc.problem_mark)}"
        ) from None
    except yaml.YAMLError as exc:
        raise InvalidSettings("", f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def _yaml_value(loader: yaml.SafeLoader, node: yaml.Node, pointer: str) -> Any:
    """A YAML node as plain data, refusing duplicate and non-string keys with their pointer."""
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _YAML_MERGE_TAG:
                raise InvalidSettings(pointer, "YAML merge keys (<<) are not supported")
            key = loader.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                shown = cut(printable(repr(key)), 80)
                raise InvalidSettings(pointer, f"key {shown} is not a string: quote it")
            where = pointer + json_pointer(key)
            if key in result:
                raise InvalidSettings(where, f"duplicate key {json.dumps(key)}")
            result[key] = _yaml_value(loader, value_node, where)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_yaml_value(loader, item, f"{pointer}/{i}") for i, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


# --- run ------------------------------------------------------------------------------------------


def add_run_command(commands: SubParsers) -> None:
    from dispatch_kubeflow.handlers.running import add_run_arguments

    parser = commands.add_parser(
        "run",
        help="run the operator (kopf) against the current kubeconfig or in-cluster",
        description="Run the KubeflowAdapter and DispatchJob operator on kopf.",
    )
    add_run_arguments(parser)
    parser.set_defaults(handler=run_operator)


def run_operator(args: argparse.Namespace) -> int:
    from dispatch_kubeflow.handlers.running import run

    return run(args)


# --- admission ----------------------------------------------------------------------------------


def add_admission_command(commands: SubParsers) -> None:
    parser = commands.add_parser(
        "admission",
        help="run dispatch-admission, the Kueue admission-check controller of the readmission gate",
        description="Run the Kueue admission-check controller that holds dispatch's "
        "readmission gate: one per AdmissionCheck, for every namespace. The namespaces whose "
        "Workloads it holds are those served by the KubeflowAdapters whose kueue.admissionCheck "
        "names the check; every other Workload that carries the check is made Ready at once.",
    )
    parser.add_argument(
        "--admission-check",
        required=True,
        metavar="NAME",
        help="the AdmissionCheck this controller decides (its controllerName must be "
        "dispatch.phpboyscout.uk/admission)",
    )
    parser.add_argument(
        "--lease-namespace",
        default=ADMISSION_LEASE_NAMESPACE_DEFAULT,
        metavar="NS",
        help="namespace of the leader-election Lease, the heartbeat the adapters read "
        f"(default {ADMISSION_LEASE_NAMESPACE_DEFAULT}, as the settings' kueue.admissionLease)",
    )
    parser.add_argument(
        "--lease-name",
        default=ADMISSION_LEASE_NAME_DEFAULT,
        metavar="NAME",
        help=f"name of that Lease (default {ADMISSION_LEASE_NAME_DEFAULT})",
    )
    parser.add_argument(
        "--kubeconfig",
        metavar="PATH",
        help="kubeconfig to use (default: in a pod its service account, else KUBECONFIG, "
        "~/.kube/config)",
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context to use")
    parser.add_argument(
        "--request-timeout",
        type=_seconds,
        default=timedelta(seconds=30),
        help="seconds each non-streaming API request may take (default 30)",
    )
    parser.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or None,
        help="this replica's Lease holder identity (default: $POD_NAME, else host name + UUID)",
    )
    # Unset flags take ElectionTiming's defaults, so the defaults live in one place.
    parser.add_argument(
        "--lease-duration",
        type=_seconds,
        help="seconds a Lease lasts without renewal (default 15)",
    )
    parser.add_argument(
        "--renew-deadline",
        type=_seconds,
        help="seconds the leader keeps trying to renew before it stops deciding (default 10)",
    )
    parser.add_argument(
        "--retry-period",
        type=_seconds,
        help="seconds between attempts to take or renew the Lease (default 2)",
    )
    parser.add_argument("--log-level", default="INFO", help="Python logging level (default INFO)")
    parser.add_argument(
        "--log-format",
        choices=("json", "plain"),
        default="json",
        help="logs on stderr as JSON lines, as the operator's, or plain text (default json)",
    )
    parser.add_argument(
        "--health-address",
        type=address_argument,
        metavar="HOST:PORT",
        help="serve /healthz (liveness) and /readyz (readiness: leading, or standing by with "
        "every watch listed) on this address, e.g. 0.0.0.0:8081 (default: off)",
    )
    parser.add_argument(
        "--metrics-address",
        type=address_argument,
        metavar="HOST:PORT",
        help="serve Prometheus metrics on this address, e.g. 0.0.0.0:9090 (default: off)",
    )
    parser.set_defaults(handler=run_admission)


def _seconds(value: str) -> timedelta:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be above zero")
    return timedelta(seconds=seconds)


def admission_config(args: argparse.Namespace) -> AdmissionConfig:
    """The replica's configuration from the flags; ``ValueError`` names a bad one."""
    from dispatch_kubeflow.admission.controller import AdmissionConfig
    from dispatch_kubeflow.kube.leaderelection import ElectionTiming, default_identity
    from dispatch_kubeflow.settings import AdmissionLease
    from dispatch_kubeflow.settings.names import check_object_name

    flags = {
        "lease_duration": args.lease_duration,
        "renew_deadline": args.renew_deadline,
        "retry_period": args.retry_period,
    }
    timing = ElectionTiming(**{k: v for k, v in flags.items() if v is not None})
    try:
        check = check_object_name(args.admission_check)
    except ValueError as exc:
        raise ValueError(f"--admission-check: {exc}") from None
    try:
        lease = AdmissionLease(namespace=args.lease_namespace, name=args.lease_name)
    except ValueError as exc:
        raise ValueError(f"--lease-namespace/--lease-name: {_first_error(exc)}") from None
    return AdmissionConfig(
        check=check,
        lease_namespace=lease.namespace,
        lease_name=lease.name,
        identity=args.identity or default_identity(),
        timing=timing,
        request_timeout=args.request_timeout.total_seconds(),
    )


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        return f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"
    return str(exc)


def run_admission(args: argparse.Namespace) -> int:
    """Run one replica until SIGTERM or SIGINT; exit 2 for bad flags, 1 when the cluster cannot
    be reached."""
    # Imported here: the other commands need no API client.
    from dispatch_kubeflow.admission.logs import configure_logging
    from dispatch_kubeflow.settings import Cluster

    try:
        cfg = admission_config(args)
        configure_logging(args.log_level, args.log_format)
    except ValueError as exc:
        report(f"{PROG} admission: {exc}")
        return EXIT_USAGE
    cluster = Cluster(kubeconfig=args.kubeconfig, context=args.context)
    try:
        server = serve_metrics(args.metrics_address) if args.metrics_address else None
    except OSError as exc:
        report(f"{PROG} admission: cannot serve metrics on {args.metrics_address}: {exc}")
        return EXIT_REFUSED
    try:
        asyncio.run(_admit_until_signalled(cfg, cluster, args.health_address))
    except ErrUnsupported as exc:
        report(f"{PROG} admission: {exc}")
        return EXIT_REFUSED
    finally:
        if server is not None:
            server.close()
    return EXIT_OK


async def _admit_until_signalled(
    cfg: AdmissionConfig, cluster: Cluster, health_address: str | None
) -> None:
    from dispatch_kubeflow.admission.controller import run_admission as run_replica

    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(signum, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await run_replica(cfg, cluster=cluster, health_address=health_address)


# --- status -------------------------------------------------------------------------------------


def add_status_command(commands: SubParsers) -> None:
    parser = commands.add_parser(
        "status",
        help="print the KubeflowAdapters and DispatchJobs: state, cause, attempt, age, wait",
        description="Print a table of the KubeflowAdapters and DispatchJobs found: each job's "
        "state, cause, attempt, age and the time its attempt waited for admission.",
    )
    parser.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help="only this namespace (default: every namespace)",
    )
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="default: table"
    )
    parser.add_argument(
        "--kubeconfig", metavar="PATH", help="kubeconfig (default: KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.set_defaults(handler=run_status)


def run_status(args: argparse.Namespace) -> int:
    """Exit 0 with the tables, 1 when the cluster cannot be reached or read."""
    from kubernetes_asyncio.client.exceptions import ApiException

    from dispatch_kubeflow.clock import utc_now
    from dispatch_kubeflow.summary import Where, read_summary, render_json, render_text

    where = Where(kubeconfig=args.kubeconfig, context=args.context)
    try:
        summary = asyncio.run(read_summary(where, args.namespace, utc_now()))
    except (ErrUnsupported, ApiException, OSError) as exc:
        report(f"{PROG} status: {str(exc).strip() or type(exc).__name__}")
        return EXIT_REFUSED
    if args.output == "json":
        data = json.dumps(render_json(summary), indent=2) + "\n"
        return write_output(data.encode(), "status")
    return write_output(render_text(summary).encode(), "status")


# --- the command ----------------------------------------------------------------------------------

# Each adds one subcommand; its handler returns the exit status.
COMMANDS: Final[tuple[Callable[[SubParsers], None], ...]] = (
    add_schema_command,
    add_validate_command,
    add_run_command,
    add_admission_command,
    add_status_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run Kubeflow Trainer jobs for a job dispatcher, and check its settings.",
    )
    commands = parser.add_subparsers(metavar="COMMAND", required=True)
    for add_command in COMMANDS:
        add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    # Before any command imports kubernetes_asyncio (or kopf, which imports it): about 30 MiB of
    # generated client code the programs never use stays unloaded.
    defer_client_imports()
    try:
        # Building the parser imports the operator's modules (for run's options): a fault there
        # is an internal error too.
        args = build_parser().parse_args(arguments)
        handler: Handler = args.handler
        return handler(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as exc:
        # A fault of this program, not a verdict on the input: its own exit status, one line.
        report(f"{PROG}: internal error ({type(exc).__name__}: {exc}); please report it")
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
