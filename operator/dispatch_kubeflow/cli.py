"""The ``dispatch-kubeflow`` command: one subcommand per job, each added by its own function.

``schema`` prints the settings JSON Schema (the bytes of ``schema.json``); ``validate`` checks a
settings document or a ``KubeflowAdapter`` manifest before it is used or applied, and prints the
settings as the adapter reads them. Exit status: 0 success, 1 refused, 2 bad usage or unreadable
input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeAlias

import yaml

from dispatch_kubeflow.constants import API_VERSION, KUBEFLOW_ADAPTER_KIND
from dispatch_kubeflow.schema import schema_bytes
from dispatch_kubeflow.settings import (
    InvalidSettings,
    Settings,
    json_pointer,
    parse_settings,
    parse_settings_object,
)

EXIT_OK: Final = 0
EXIT_REFUSED: Final = 1
EXIT_USAGE: Final = 2

PROG: Final = "dispatch-kubeflow"

if TYPE_CHECKING:
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
    sys.stdout.buffer.write(schema_bytes())
    sys.stdout.buffer.flush()
    return EXIT_OK


# --- validate -------------------------------------------------------------------------------------

_MANIFEST_KEYS: Final = frozenset({"apiVersion", "kind", "metadata", "spec", "status"})
_YAML_MERGE_TAG: Final = "tag:yaml.org,2002:merge"


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
    try:
        data = _read_input(args.file)
    except OSError as exc:
        print(f"{PROG} validate: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = load_settings_or_manifest(data)
    except InvalidSettings as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_REFUSED
    json.dump(validation_result(settings), sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
    return EXIT_OK


def _read_input(name: str) -> bytes:
    if name == "-":
        return sys.stdin.buffer.read()
    with open(name, "rb") as handle:
        return handle.read()


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
    if _is_settings_json(text):
        return parse_settings(data)
    return parse_manifest(text)


def _is_settings_json(text: str) -> bool:
    if not text.lstrip(" \t\r\n").startswith("{"):
        return False
    try:
        document = json.loads(text)
    except ValueError:
        return True  # broken JSON: the settings parser says what is wrong with it
    return not (isinstance(document, dict) and ({"apiVersion", "kind"} & document.keys()))


def parse_manifest(text: str) -> Settings:
    """The settings in a KubeflowAdapter manifest; refusals name pointers under ``/spec``."""
    manifest = _load_single_yaml(text)
    if not isinstance(manifest, dict):
        raise InvalidSettings("", "a KubeflowAdapter manifest must be a mapping")
    for key in manifest:
        if key not in _MANIFEST_KEYS:
            raise InvalidSettings(json_pointer(key), "unknown key")
    if manifest.get("apiVersion") != API_VERSION:
        raise InvalidSettings("/apiVersion", f"must be {API_VERSION!r}")
    if manifest.get("kind") != KUBEFLOW_ADAPTER_KIND:
        raise InvalidSettings("/kind", f"must be {KUBEFLOW_ADAPTER_KIND!r}")
    if "spec" not in manifest:
        raise InvalidSettings("/spec", "is required")
    return parse_settings_object(manifest["spec"], pointer="/spec")


def _load_single_yaml(text: str) -> Any:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise InvalidSettings("", "the manifest is empty")
        return _yaml_value(loader, node, "")
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark else ""
        raise InvalidSettings("", f"not valid YAML: {exc.problem}{where}") from None
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
                raise InvalidSettings(pointer, f"key {key!r} is not a string: quote it")
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
    # The controller owns its flags; this subcommand hands them over untouched, so that
    # `dispatch-kubeflow admission --help` shows the controller's own usage.
    parser = commands.add_parser(
        "admission",
        help="run dispatch-admission, the Kueue admission-check controller of the readmission gate",
        add_help=False,
    )
    parser.add_argument("arguments", nargs=argparse.REMAINDER)
    parser.set_defaults(handler=run_admission)


def run_admission(args: argparse.Namespace) -> int:
    from dispatch_kubeflow.admission import main as admission_main

    return admission_main(args.arguments)


# --- the command ----------------------------------------------------------------------------------

# Each adds one subcommand; its handler returns the exit status.
COMMANDS: Final[tuple[Callable[[SubParsers], None], ...]] = (
    add_schema_command,
    add_validate_command,
    add_run_command,
    add_admission_command,
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
    if arguments[:1] == ["admission"]:
        # argparse cannot pass options through a subcommand untouched, so the controller's own
        # parser gets them directly.
        return run_admission(argparse.Namespace(arguments=arguments[1:]))
    args = build_parser().parse_args(arguments)
    handler: Handler = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
