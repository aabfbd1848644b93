"""The adapter's settings object: parsed strictly, typed, immutable, every default applied.

A settings document is one JSON object (or the ``spec`` of a ``KubeflowAdapter``). A value that
breaks a rule is refused with ``InvalidSettings`` (an ``ErrInvalid``) naming the JSON pointer of
the value and the rule, in one line. Nothing is coerced and nothing silently takes a default: an
unknown key, a duplicate key, a null, trailing data or a value of the wrong type is refused.

Pydantic does the model work (strict types, unknown keys, aliases, defaults); what it cannot do
(duplicate keys, nulls, JSON pointers, Go durations, rules across fields) is done here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Annotated, Any, Final, Literal, NoReturn

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from dispatch_kubeflow.constants import (
    ADMISSION_LEASE_NAME_DEFAULT,
    ADMISSION_LEASE_NAMESPACE_DEFAULT,
    GPU_RESOURCE_DEFAULT,
    PUBLISH_DIR,
    PUBLISH_INIT_CONTAINER_DEFAULT,
    RESERVED_PREFIXES,
)
from dispatch_kubeflow.errors import ErrInvalid
from dispatch_kubeflow.gotime import Duration, DurationError, format_duration, parse_duration

# Patterns shared with the JSON Schema (schema.py imports them): one spelling of every shape.
# They use only what both ECMA-262 (JSON Schema) and RE2 (the apiserver) understand.
DNS_LABEL_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN: Final = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_NAME_PART: Final = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_PREFIX_PART: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
QUALIFIED_NAME_PATTERN: Final = rf"^({_PREFIX_PART}/)?{_NAME_PART}$"
LABEL_VALUE_PATTERN: Final = rf"^({_NAME_PART})?$"


def _literal(text: str) -> str:
    """``text`` as a pattern; only '.' needs escaping in the names used here."""
    return text.replace(".", r"\.")


RESERVED_PREFIX_PATTERN: Final = (
    "^(" + "|".join(_literal(p.rstrip("/")) for p in RESERVED_PREFIXES) + ")/"
)
_DOMAIN_COMPONENT: Final = r"([A-Za-z0-9]|[A-Za-z0-9][-A-Za-z0-9]*[A-Za-z0-9])"
_PATH_COMPONENT: Final = r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*"
IMAGE_DIGEST_PATTERN: Final = (
    rf"^({_DOMAIN_COMPONENT}(\.{_DOMAIN_COMPONENT})*(:[0-9]+)?/)?"
    rf"{_PATH_COMPONENT}(/{_PATH_COMPONENT})*@sha256:[0-9a-f]{{64}}$"
)
_DURATION_UNIT: Final = "(ns|us|\u00b5s|\u03bcs|ms|s|m|h)"
_ANY_COMPONENT: Final = rf"([0-9]+(\.[0-9]*)?|\.[0-9]+){_DURATION_UNIT}"
_NONZERO_COMPONENT: Final = (
    rf"([0-9]*[1-9][0-9]*(\.[0-9]*)?|[0-9]*\.[0-9]*[1-9][0-9]*){_DURATION_UNIT}"
)
# A Go duration with no sign but '+' and at least one non-zero digit: a positive duration.
POSITIVE_DURATION_PATTERN: Final = (
    rf"^\+?({_ANY_COMPONENT})*{_NONZERO_COMPONENT}({_ANY_COMPONENT})*$"
)
MOUNT_PATH_PATTERN: Final = "^/"
PUBLISH_DIR_PATTERN: Final = "^" + _literal(PUBLISH_DIR) + "(/|$)"

LABEL_MAX: Final = 63
SUBDOMAIN_MAX: Final = 253

_DNS_LABEL = re.compile(DNS_LABEL_PATTERN.rstrip("$") + r"\Z")
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN.rstrip("$") + r"\Z")
_NAME = re.compile(_NAME_PART + r"\Z")
_QUALIFIED_NAME = re.compile(QUALIFIED_NAME_PATTERN.rstrip("$") + r"\Z")
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN.rstrip("$") + r"\Z")
_IMAGE = re.compile(IMAGE_DIGEST_PATTERN.rstrip("$") + r"\Z")

_SHOWN_MAX = 80


class InvalidSettings(ErrInvalid):
    """A settings document broke a rule. ``pointer`` is the RFC 6901 pointer of the value."""

    def __init__(self, pointer: str, rule: str) -> None:
        self.pointer = pointer
        self.rule = rule
        # A key may hold a newline; the message stays one line.
        shown = pointer if pointer.isprintable() else json.dumps(pointer, ensure_ascii=False)
        where = f" at {shown}" if pointer else ""
        super().__init__(f"invalid settings{where}: {rule}")

    def under(self, prefix: str) -> InvalidSettings:
        """The same refusal with its pointer inside ``prefix`` (e.g. ``/spec``)."""
        return InvalidSettings(prefix + self.pointer, self.rule)


def json_pointer(*parts: str | int) -> str:
    """RFC 6901: each reference token with ``~`` as ``~0`` and ``/`` as ``~1``."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def _shown(value: object) -> str:
    """A value as it would appear in JSON, on one line and not too long."""
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= _SHOWN_MAX else text[: _SHOWN_MAX - 4] + '..."'


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


def _refuse(rule: str) -> NoReturn:
    raise PydanticCustomError("settings_rule", "{rule}", {"rule": rule})


# --- Rules on single values -------------------------------------------------------------------


def check_dns_label(value: str, what: str = "an RFC 1123 label") -> str:
    if len(value) > LABEL_MAX or not _DNS_LABEL.match(value):
        _refuse(
            f"must be {what} (at most 63 characters of a-z, 0-9 and '-', beginning and ending "
            f"with a letter or digit), got {_shown(value)}"
        )
    return value


def check_object_name(value: str) -> str:
    if len(value) > SUBDOMAIN_MAX or not _DNS_SUBDOMAIN.match(value):
        _refuse(
            "must be a Kubernetes object name (an RFC 1123 subdomain: at most 253 characters of "
            "a-z, 0-9, '-' and '.', each dot-separated part beginning and ending with a letter "
            f"or digit), got {_shown(value)}"
        )
    return value


def check_queue_name(value: str) -> str:
    if len(value) > LABEL_MAX or not _DNS_SUBDOMAIN.match(value):
        _refuse(
            "must be an object name that is also a label value (at most 63 characters of a-z, "
            "0-9, '-' and '.', each dot-separated part beginning and ending with a letter or "
            f"digit), got {_shown(value)}"
        )
    return value


def qualified_name_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes qualified name (``[prefix/]name``), or None."""
    prefix, slash, name = value.rpartition("/")
    if slash and not prefix:
        return "the prefix before '/' must not be empty"
    if slash and "/" in prefix:
        return "at most one '/' is allowed"
    if not name:
        return "the name part must not be empty"
    if len(name) > LABEL_MAX:
        return f"the name part is {len(name)} characters, more than 63"
    if not _NAME.match(name):
        return (
            "the name part must be A-Z, a-z, 0-9, '-', '_' and '.', beginning and ending with "
            "a letter or digit"
        )
    if slash and len(prefix) > SUBDOMAIN_MAX:
        return f"the prefix is {len(prefix)} characters, more than 253"
    if slash and not _DNS_SUBDOMAIN.match(prefix):
        return "the prefix must be an RFC 1123 subdomain (a-z, 0-9, '-' and '.')"
    return None


def _is_qualified_name(value: str) -> bool:
    if not _QUALIFIED_NAME.match(value):
        return False
    prefix, _, name = value.rpartition("/")
    return len(name) <= LABEL_MAX and len(prefix) <= SUBDOMAIN_MAX


def check_qualified_name(value: str) -> str:
    if not _is_qualified_name(value):
        problem = qualified_name_problem(value)
        _refuse(f"must be a qualified name ([prefix/]name): {problem}, got {_shown(value)}")
    return value


def check_metadata_key(value: str) -> str:
    check_qualified_name(value)
    if value.startswith(RESERVED_PREFIXES):
        prefix = next(p for p in RESERVED_PREFIXES if value.startswith(p))
        _refuse(
            f"key {_shown(value)} uses the reserved prefix {_shown(prefix)}, which dispatch, "
            "Kueue, Trainer and JobSet read"
        )
    return value


def check_label_value(value: str) -> str:
    if len(value) > LABEL_MAX or not _LABEL_VALUE.match(value):
        _refuse(
            "must be a label value (empty, or at most 63 characters of A-Z, a-z, 0-9, '-', '_' "
            f"and '.', beginning and ending with a letter or digit), got {_shown(value)}"
        )
    return value


def check_not_empty(value: str) -> str:
    if not value:
        _refuse("must not be empty: omit the key for the current context")
    return value


def go_path_clean(path: str) -> str:
    """Go's ``path.Clean``: the shortest path equivalent to ``path`` by purely lexical rules."""
    if not path:
        return "."
    rooted = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(part)
    joined = "/".join(parts)
    if rooted:
        return "/" + joined
    return joined or "."


def paths_overlap(a: str, b: str) -> bool:
    """Whether one clean absolute path is, is inside, or contains the other."""
    if a == b:
        return True
    inner, outer = (a, b) if len(a) > len(b) else (b, a)
    return inner.startswith(outer.rstrip("/") + "/")


def check_mount_path(value: str) -> str:
    if not value.startswith("/"):
        _refuse(f"must be an absolute path, got {_shown(value)}")
    clean = go_path_clean(value)
    if clean != value:
        _refuse(f"must be a clean path ({_shown(clean)}, not {_shown(value)})")
    if value == "/":
        _refuse('must not be "/"')
    if paths_overlap(value, PUBLISH_DIR):
        _refuse(f"{_shown(value)} overlaps {PUBLISH_DIR}, where the publish binary is mounted")
    return value


def check_image(value: str) -> str:
    if not _IMAGE.match(value):
        _refuse(
            "must be an image reference pinned by digest (name@sha256: and 64 lower-case hex "
            f"digits), got {_shown(value)}"
        )
    return value


def _duration(value: object) -> Duration:
    """A positive Go duration string; a ``timedelta`` when a model is built in Python."""
    if isinstance(value, timedelta):
        duration = Duration.from_timedelta(value)
    elif isinstance(value, str):
        try:
            duration = parse_duration(value)
        except DurationError as exc:
            _refuse(f"must be a Go duration such as 30s or 1h30m: {exc}")
    else:
        _refuse(f'must be a Go duration string such as "30s", not {_json_type(value)}')
    if duration.nanoseconds <= 0:
        shown = value if isinstance(value, str) else str(duration)
        _refuse(f"must be a positive duration, got {_shown(shown)}")
    return duration


class FrozenMap(Mapping[str, str]):
    """An immutable, hashable string-to-string mapping (labels, annotations)."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | None = None) -> None:
        self._items: dict[str, str] = dict(items or {})

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


DnsLabel = Annotated[str, AfterValidator(check_dns_label)]
ContainerName = Annotated[str, AfterValidator(lambda v: check_dns_label(v, "a container name"))]
ObjectName = Annotated[str, AfterValidator(check_object_name)]
QueueName = Annotated[str, AfterValidator(check_queue_name)]
QualifiedName = Annotated[str, AfterValidator(check_qualified_name)]
MetadataKey = Annotated[str, AfterValidator(check_metadata_key)]
LabelValue = Annotated[str, AfterValidator(check_label_value)]
NonEmpty = Annotated[str, AfterValidator(check_not_empty)]
MountPath = Annotated[str, AfterValidator(check_mount_path)]
DigestImage = Annotated[str, AfterValidator(check_image)]
GoDuration = Annotated[
    timedelta,
    PlainValidator(_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
Labels = Annotated[
    Mapping[MetadataKey, LabelValue],
    AfterValidator(FrozenMap),
    PlainSerializer(dict, return_type=dict[str, str]),
]
Annotations = Annotated[
    Mapping[MetadataKey, str],
    AfterValidator(FrozenMap),
    PlainSerializer(dict, return_type=dict[str, str]),
]


# --- The models ---------------------------------------------------------------------------------


class _Frozen(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )


class RuntimeRef(_Frozen):
    kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"]
    name: ObjectName


class Cluster(_Frozen):
    kubeconfig: str | None = None
    context: NonEmpty | None = None
    in_cluster: bool = False


class AdmissionLease(_Frozen):
    namespace: DnsLabel
    name: ObjectName


class Kueue(_Frozen):
    local_queue: QueueName
    priority_class: QueueName | None = None
    admission_check: ObjectName | None = None
    admission_lease: AdmissionLease = AdmissionLease(
        namespace=ADMISSION_LEASE_NAMESPACE_DEFAULT, name=ADMISSION_LEASE_NAME_DEFAULT
    )


class Credential(_Frozen):
    secret_name: ObjectName
    mount_path: MountPath


_TIMEOUT_DEFAULTS: Final = {
    "request": "30s",
    "apiserverRequest": "60s",
    "workload": "60s",
    "stopJob": "10m",
}


class Timeouts(_Frozen):
    request: GoDuration = parse_duration(_TIMEOUT_DEFAULTS["request"])
    apiserver_request: GoDuration = parse_duration(_TIMEOUT_DEFAULTS["apiserverRequest"])
    workload: GoDuration = parse_duration(_TIMEOUT_DEFAULTS["workload"])
    stop_job: GoDuration = parse_duration(_TIMEOUT_DEFAULTS["stopJob"])


class Publish(_Frozen):
    image: DigestImage
    via: Literal["imageVolume", "initContainer"] = "imageVolume"
    # PUBLISH_INIT_CONTAINER_DEFAULT under via=initContainer when not given; None otherwise.
    init_container: ContainerName | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_init_container(cls, data: Any) -> Any:
        if (
            isinstance(data, Mapping)
            and data.get("via") == "initContainer"
            and "initContainer" not in data
            and "init_container" not in data
        ):
            return {**data, "initContainer": PUBLISH_INIT_CONTAINER_DEFAULT}
        return data


class Declarations(_Frozen):
    node_loss_window: GoDuration
    call_bound: GoDuration
    polled_loss: tuple[str, ...] = ()


_NO_PROBE_RUNTIME: Final = object()
_DOCUMENT: Final = "settings document"  # validation context: keys are aliases only


def _require_probe_runtime(value: object) -> object:
    if value is _NO_PROBE_RUNTIME:
        _refuse("required when runtimes is absent or empty")
    return value


NODE_LOSS_WINDOW_DEFAULT: Final = "5m"
CALL_BOUND_MARGIN: Final = timedelta(seconds=5)


class Settings(_Frozen):
    namespace: DnsLabel
    cluster: Cluster = Cluster()
    runtimes: tuple[RuntimeRef, ...] = ()
    # The first of ``runtimes`` when not given.
    probe_runtime: Annotated[RuntimeRef, BeforeValidator(_require_probe_runtime)]
    kueue: Kueue | None = None
    labels: Labels = FrozenMap()
    annotations: Annotations = FrozenMap()
    gpu_resource: QualifiedName = GPU_RESOURCE_DEFAULT
    credentials: tuple[Credential, ...] = ()
    node_loss_window: GoDuration = parse_duration(NODE_LOSS_WINDOW_DEFAULT)
    node_loss_taints: tuple[QualifiedName, ...] = ()
    allow_rank_restart: bool = False
    timeouts: Timeouts = Timeouts()
    publish: Publish | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_probe_runtime(cls, data: Any, info: ValidationInfo) -> Any:
        # A document names keys by alias only; Python code may use the field name.
        names = (
            ("probeRuntime",) if info.context == _DOCUMENT else ("probeRuntime", "probe_runtime")
        )
        if not isinstance(data, Mapping) or any(name in data for name in names):
            return data
        runtimes = data.get("runtimes", ())
        if isinstance(runtimes, list | tuple):
            return {**data, "probeRuntime": runtimes[0] if runtimes else _NO_PROBE_RUNTIME}
        return data  # runtimes of the wrong type: refused with its own pointer

    @model_validator(mode="after")
    def _check_across_fields(self) -> Settings:
        _check_cluster(self.cluster)
        _check_unique("runtimes", self.runtimes)
        _check_unique("nodeLossTaints", self.node_loss_taints)
        _check_credentials(self.credentials)
        if self.publish is not None:
            _check_publish(self.publish)
        return self

    @property
    def kueue_mode(self) -> bool:
        return self.kueue is not None

    @property
    def readmission_gate(self) -> Literal["yes", "no"]:
        return "yes" if self.kueue is not None and self.kueue.admission_check else "no"

    def declarations(self) -> Declarations:
        request = Duration.from_timedelta(self.timeouts.apiserver_request)
        margin = Duration.from_timedelta(CALL_BOUND_MARGIN)
        return Declarations(
            node_loss_window=self.node_loss_window,
            call_bound=Duration(request.nanoseconds + margin.nanoseconds),
        )

    def to_document(self) -> dict[str, Any]:
        """The settings as a JSON object: camelCase keys, every default, Go duration strings.

        The result is itself a valid settings document that parses back to equal settings.
        """
        document: dict[str, Any] = self.model_dump(mode="json", by_alias=True, exclude_none=True)
        return document


def _check_cluster(cluster: Cluster) -> None:
    if cluster.in_cluster and (cluster.kubeconfig is not None or cluster.context is not None):
        raise InvalidSettings(
            json_pointer("cluster", "inCluster"),
            "inCluster: true is refused together with kubeconfig or context",
        )


def _check_unique(key: str, items: tuple[Any, ...]) -> None:
    seen: dict[Any, int] = {}
    for index, item in enumerate(items):
        if item in seen:
            raise InvalidSettings(
                json_pointer(key, index), f"duplicates {json_pointer(key, seen[item])}"
            )
        seen[item] = index


def _check_credentials(credentials: tuple[Credential, ...]) -> None:
    for later, credential in enumerate(credentials):
        for earlier in range(later):
            other = credentials[earlier].mount_path
            if paths_overlap(credential.mount_path, other):
                raise InvalidSettings(
                    json_pointer("credentials", later, "mountPath"),
                    f"{_shown(credential.mount_path)} overlaps "
                    f"{json_pointer('credentials', earlier, 'mountPath')} ({_shown(other)})",
                )


def _check_publish(publish: Publish) -> None:
    if publish.init_container is not None and publish.via != "initContainer":
        raise InvalidSettings(
            json_pointer("publish", "initContainer"),
            f'is refused unless via is "initContainer" (via is {_shown(publish.via)})',
        )


# --- From text to Settings --------------------------------------------------------------------


class _Pairs(list[tuple[str, Any]]):
    """A JSON object as decoded, every key kept, so duplicates can be found with their pointer."""


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _decode_json(data: str | bytes) -> Any:
    if isinstance(data, bytes | bytearray):
        try:
            data = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidSettings("", f"not UTF-8 text (byte {exc.start})") from None
    try:
        return json.loads(data, object_pairs_hook=_Pairs, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        if exc.msg == "Extra data":
            rule = (
                f"trailing data after the settings object at line {exc.lineno} column {exc.colno}"
            )
        else:
            rule = f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        raise InvalidSettings("", rule) from None
    except ValueError as exc:
        raise InvalidSettings("", f"not valid JSON: {exc}") from None


def plain_document(value: Any) -> Any:
    """Check a decoded document for duplicate keys, nulls and non-string keys; freeze arrays.

    Objects become dicts, arrays become tuples. Everything else is left for the models to judge.
    """
    path: list[str | int] = []  # where the walk is; turned into a pointer only on refusal
    try:
        return _plain(value, path)
    except _Refusal as refusal:
        raise InvalidSettings(json_pointer(*path), refusal.rule) from None


class _Refusal(Exception):
    def __init__(self, rule: str) -> None:
        self.rule = rule


def _plain(value: Any, path: list[str | int]) -> Any:
    if value is None:
        raise _Refusal("null is not allowed: omit the key for its default")
    if isinstance(value, str):
        if not value.isascii():
            _check_encodable(value)
        return value
    if isinstance(value, _Pairs):
        return _plain_object(value, path)
    if isinstance(value, dict | Mapping):  # dict first: the ABC check is slow
        return _plain_object(list(value.items()), path)
    if isinstance(value, list | tuple):
        items = []
        for index, item in enumerate(value):
            path.append(index)
            items.append(_plain(item, path))
            path.pop()
        return tuple(items)
    return value


def _check_encodable(value: str) -> None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Refusal("not valid Unicode (a lone surrogate)") from None


def _plain_object(pairs: list[tuple[Any, Any]], path: list[str | int]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, item in pairs:
        if not isinstance(key, str):
            raise _Refusal(f"key {_shown(key)} is not a string")
        path.append(key)
        if key in result:
            raise _Refusal(f"duplicate key {_shown(key)}")
        result[key] = _plain(item, path)
        path.pop()
    return result


_TYPE_RULES: Final = {
    "string_type": "must be a string",
    "bool_type": "must be a boolean",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "dict_type": "must be an object",
    "mapping_type": "must be an object",
    "tuple_type": "must be an array",
    "list_type": "must be an array",
}


def _error_rule(error: Any) -> str:
    kind = error["type"]
    if kind == "settings_rule":
        return str(error["ctx"]["rule"])
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "unknown key"
    if kind in _TYPE_RULES:
        return f"{_TYPE_RULES[kind]}, not {_json_type(error['input'])}"
    if kind == "literal_error":
        return f"must be one of {error['ctx']['expected']}, got {_shown(error['input'])}"
    return str(error["msg"])


def _error_pointer(loc: tuple[str | int, ...]) -> str:
    # A map key's own error carries a trailing "[key]"; the pointer is that of the key's entry.
    parts = loc[:-1] if loc and loc[-1] == "[key]" else loc
    return json_pointer(*parts)


def parse_settings_object(document: Any, *, pointer: str = "") -> Settings:
    """Validate an already-decoded settings object (e.g. a manifest's ``spec``).

    ``pointer`` is where the object sits in its own document (``/spec``); every refusal names a
    pointer under it.
    """
    try:
        plain = plain_document(document)
        if not isinstance(plain, dict):
            raise InvalidSettings("", f"must be an object, not {_json_type(document)}")
        return Settings.model_validate(plain, by_alias=True, by_name=False, context=_DOCUMENT)
    except InvalidSettings as exc:
        raise exc.under(pointer) from None
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidSettings(pointer + _error_pointer(first["loc"]), _error_rule(first)) from None


def parse_settings(data: str | bytes) -> Settings:
    """Parse a settings document, JSON text, refusing whatever the settings rules refuse."""
    return parse_settings_object(_decode_json(data))


__all__ = [
    "PUBLISH_INIT_CONTAINER_DEFAULT",
    "AdmissionLease",
    "Cluster",
    "Credential",
    "Declarations",
    "FrozenMap",
    "InvalidSettings",
    "Kueue",
    "Publish",
    "RuntimeRef",
    "Settings",
    "Timeouts",
    "json_pointer",
    "parse_settings",
    "parse_settings_object",
]
