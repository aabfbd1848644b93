"""The settings object as frozen pydantic models: types, defaults, and the rules across fields.

Pydantic does the model work (strict types, unknown keys, aliases, defaults); the rules on single
values come from ``names`` and the Go durations from ``gotime``; rules across fields (exclusive
cluster keys, duplicates, overlapping mounts, the publish route) are checked here once a model is
built, each raising ``InvalidSettings`` with its pointer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    PlainSerializer,
    PlainValidator,
    ValidationInfo,
    model_validator,
)
from pydantic.alias_generators import to_camel

from dispatch_kubeflow.constants import (
    ADMISSION_LEASE_NAME_DEFAULT,
    ADMISSION_LEASE_NAMESPACE_DEFAULT,
    GPU_RESOURCE_DEFAULT,
    PUBLISH_INIT_CONTAINER_DEFAULT,
)
from dispatch_kubeflow.gotime import Duration, DurationError, format_duration, parse_duration
from dispatch_kubeflow.settings.names import (
    check_container_name,
    check_dns_label,
    check_image,
    check_label_value,
    check_metadata_key,
    check_mount_path,
    check_not_empty,
    check_object_name,
    check_qualified_name,
    check_queue_name,
    first_overlap,
)
from dispatch_kubeflow.settings.refusals import (
    InvalidSettings,
    json_pointer,
    json_type,
    refuse,
    shown,
    too_many,
)

_DURATION_UNIT: Final = "(?:ns|us|\u00b5s|\u03bcs|ms|s|m|h)"
_ZERO_COMPONENT: Final = rf"(?:0+(?:\.0*)?|\.0+){_DURATION_UNIT}"
_FIRST_NONZERO_COMPONENT: Final = (
    rf"(?:0*[1-9][0-9]*(?:\.[0-9]*)?|0*\.0*[1-9][0-9]*){_DURATION_UNIT}"
)
_ANY_COMPONENT: Final = rf"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+){_DURATION_UNIT}"
# A Go duration with no sign but '+' and at least one non-zero digit: a positive duration.
# Unambiguous, so a backtracking engine (Python's re, V8) matches in linear time: components of
# zeros only, then the first with a non-zero digit, then any. Units end where digits begin.
POSITIVE_DURATION_PATTERN: Final = (
    rf"^\+?(?:{_ZERO_COMPONENT})*{_FIRST_NONZERO_COMPONENT}(?:{_ANY_COMPONENT})*$"
)
# Longer than any duration Go can hold written plainly (2562047h47m16.854775807s is 24).
DURATION_MAX: Final = 64
# The most entries of any list or map of the settings (runtimes, credentials, nodeLossTaints,
# labels, annotations): far more than a real adapter needs, and a bound on every parse.
ENTRIES_MAX: Final = 64


def _duration(value: object) -> Duration:
    """A positive Go duration string; a ``timedelta`` when a model is built in Python."""
    if isinstance(value, timedelta):
        duration = Duration.from_timedelta(value)
    elif isinstance(value, str):
        if len(value) > DURATION_MAX:
            refuse(f"must be a Go duration of at most {DURATION_MAX} characters, got {len(value)}")
        try:
            duration = parse_duration(value)
        except DurationError as exc:
            refuse(f"must be a Go duration such as 30s or 1h30m: {exc}")
    else:
        refuse(f'must be a Go duration string such as "30s", not {json_type(value)}')
    if duration.nanoseconds <= 0:
        text = value if isinstance(value, str) else str(duration)
        refuse(f"must be a positive duration, got {shown(text)}")
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


def _at_most_entries(value: Any) -> Any:
    """Refuse a list or map over ``ENTRIES_MAX`` before any of its entries is judged."""
    if isinstance(value, list | tuple | Mapping) and len(value) > ENTRIES_MAX:
        refuse(too_many(len(value), ENTRIES_MAX))
    return value


Bounded = BeforeValidator(_at_most_entries)
DnsLabel = Annotated[str, AfterValidator(check_dns_label)]
ContainerName = Annotated[str, AfterValidator(check_container_name)]
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
    Bounded,
    AfterValidator(FrozenMap),
    PlainSerializer(dict, return_type=dict[str, str]),
]
Annotations = Annotated[
    Mapping[MetadataKey, str],
    Bounded,
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
# The validation context of a settings document, whose keys are aliases only.
DOCUMENT_CONTEXT: Final = "settings document"


def _require_probe_runtime(value: object) -> object:
    if value is _NO_PROBE_RUNTIME:
        refuse("required when runtimes is absent or empty")
    return value


NODE_LOSS_WINDOW_DEFAULT: Final = "5m"
CALL_BOUND_MARGIN: Final = timedelta(seconds=5)


class Settings(_Frozen):
    namespace: DnsLabel
    cluster: Cluster = Cluster()
    runtimes: Annotated[tuple[RuntimeRef, ...], Bounded] = ()
    # The first of ``runtimes`` when not given.
    probe_runtime: Annotated[RuntimeRef, BeforeValidator(_require_probe_runtime)]
    kueue: Kueue | None = None
    labels: Labels = FrozenMap()
    annotations: Annotations = FrozenMap()
    gpu_resource: QualifiedName = GPU_RESOURCE_DEFAULT
    credentials: Annotated[tuple[Credential, ...], Bounded] = ()
    node_loss_window: GoDuration = parse_duration(NODE_LOSS_WINDOW_DEFAULT)
    node_loss_taints: Annotated[tuple[QualifiedName, ...], Bounded] = ()
    allow_rank_restart: bool = False
    timeouts: Timeouts = Timeouts()
    publish: Publish | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_probe_runtime(cls, data: Any, info: ValidationInfo) -> Any:
        # A document names keys by alias only; Python code may use the field name.
        names = (
            ("probeRuntime",)
            if info.context == DOCUMENT_CONTEXT
            else ("probeRuntime", "probe_runtime")
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
    overlap = first_overlap([c.mount_path for c in credentials])
    if overlap is not None:
        later, earlier = overlap
        path, other = credentials[later].mount_path, credentials[earlier].mount_path
        raise InvalidSettings(
            json_pointer("credentials", later, "mountPath"),
            f"{shown(path)} overlaps "
            f"{json_pointer('credentials', earlier, 'mountPath')} ({shown(other)})",
        )


def _check_publish(publish: Publish) -> None:
    if publish.init_container is not None and publish.via != "initContainer":
        raise InvalidSettings(
            json_pointer("publish", "initContainer"),
            f'is refused unless via is "initContainer" (via is {shown(publish.via)})',
        )
