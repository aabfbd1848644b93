"""Reading raw API objects: conditions, metadata, owner references, times.

The project keeps objects as the JSON the apiserver sends (``Obj``), because derivation reads a
handful of fields of six kinds and full models would cost memory per pod. These readers never
raise on a malformed object: a missing or mistyped field reads as absent.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from dispatch_kubeflow.clock import parse_time

Obj = Mapping[str, Any]

STATUS_TRUE = "True"
STATUS_FALSE = "False"


def dig(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, or None as soon as a step is missing or not a mapping."""
    current: Any = obj
    for key in path:
        if not isinstance(current, Mapping):
            return None
        current = current.get(key)
    return current


def text(value: Any) -> str:
    """A field as a string; empty for absent values."""
    return "" if value is None else str(value)


def as_int(value: Any) -> int:
    """A field as an integer; 0 for absent or unreadable values."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def mappings(value: Any) -> Iterator[Mapping[str, Any]]:
    """The mapping entries of a list field, skipping anything else."""
    if isinstance(value, list):
        yield from (item for item in value if isinstance(item, Mapping))


def name_of(obj: Any) -> str:
    return text(dig(obj, "metadata", "name"))


def namespace_of(obj: Any) -> str:
    return text(dig(obj, "metadata", "namespace"))


def uid_of(obj: Any) -> str:
    return text(dig(obj, "metadata", "uid"))


def resource_version_of(obj: Any) -> str:
    return text(dig(obj, "metadata", "resourceVersion"))


def key_of(obj: Any) -> str:
    """``namespace/name``, or ``name`` for cluster-scoped objects: unique within one kind."""
    namespace = namespace_of(obj)
    return f"{namespace}/{name_of(obj)}" if namespace else name_of(obj)


def metadata_without_managed_fields(obj: Any) -> dict[str, Any]:
    """An object's metadata but its managedFields, which no reader here needs."""
    return {k: v for k, v in (dig(obj, "metadata") or {}).items() if k != "managedFields"}


def labels_of(obj: Any) -> Mapping[str, str]:
    labels = dig(obj, "metadata", "labels")
    return labels if isinstance(labels, Mapping) else {}


def annotations_of(obj: Any) -> Mapping[str, str]:
    annotations = dig(obj, "metadata", "annotations")
    return annotations if isinstance(annotations, Mapping) else {}


def is_deleting(obj: Any) -> bool:
    return dig(obj, "metadata", "deletionTimestamp") is not None


def conditions(obj: Any) -> list[Mapping[str, Any]]:
    return list(mappings(dig(obj, "status", "conditions")))


def condition(obj: Any, type_: str) -> Mapping[str, Any] | None:
    """The condition of ``type_`` in ``status.conditions``, if there is one."""
    return next((c for c in conditions(obj) if c.get("type") == type_), None)


def is_true(found: Mapping[str, Any] | None) -> bool:
    return found is not None and found.get("status") == STATUS_TRUE


def is_false(found: Mapping[str, Any] | None) -> bool:
    return found is not None and found.get("status") == STATUS_FALSE


def condition_true(obj: Any, type_: str) -> bool:
    return is_true(condition(obj, type_))


def transition_time(found: Mapping[str, Any] | None) -> datetime | None:
    return parse_time(found.get("lastTransitionTime")) if found is not None else None


def owner_reference(obj: Any, *, kind: str, group: str) -> Mapping[str, Any] | None:
    """The ownerReference to an object of ``kind`` in API ``group``, if there is one."""
    for ref in mappings(dig(obj, "metadata", "ownerReferences")):
        if ref.get("kind") == kind and text(ref.get("apiVersion")).split("/")[0] == group:
            return ref
    return None


def owner_uids(obj: Any) -> set[str]:
    return {text(ref.get("uid")) for ref in mappings(dig(obj, "metadata", "ownerReferences"))}
