"""Which KubeflowAdapter serves a DispatchJob, and why it does not yet.

A DispatchJob names its KubeflowAdapter (``spec.adapter``); the one that serves it has that name
and ``spec.namespace`` equal to the DispatchJob's namespace, wherever it lives itself. The open
adapters are in the ``AdapterRegistry``; this module keeps kopf's index of every KubeflowAdapter
the operator watches (its served namespace and its ``Ready`` condition, read from the watch, no
extra API call), so a DispatchJob whose adapter is missing or not Ready can say which, in its
``Admitted`` condition, until the adapter opens and the attempt starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, cast

import kopf

from dispatch_kubeflow.constants import (
    GROUP,
    KUBEFLOW_ADAPTERS,
    REASON_ADAPTER_NOT_FOUND,
    REASON_ADAPTER_NOT_READY,
    VERSION,
    AdapterCondition,
    JobCondition,
)
from dispatch_kubeflow.handlers.conditions import (
    Condition,
    find_condition,
    parse_conditions,
    set_condition,
    to_wire,
)

# kopf hands the index to handlers as the keyword argument of this name.
ADAPTERS_BY_NAME: Final = "adapters_by_name"


@dataclass(frozen=True)
class AdapterSighting:
    """One KubeflowAdapter as the operator's watch last saw it."""

    namespace: str
    name: str
    serves: str
    ready: str
    reason: str
    message: str

    @property
    def where(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def not_ready(self) -> str:
        """Why this adapter is not open, as its status tells."""
        if self.ready == "True":  # written by an earlier session; this one is still opening
            return "opening"
        return f"{self.reason}: {self.message}" if self.reason else "no status yet"


# kopf.Index[str, AdapterSighting] is one: each name to the KubeflowAdapters of that name.
AdaptersByName = Mapping[str, Iterable[AdapterSighting]]


def sighting_of(
    name: str, namespace: str | None, spec: Mapping[str, Any], status: Mapping[str, Any]
) -> AdapterSighting:
    """A KubeflowAdapter as the index keeps it: where it lives, what it serves, its Ready."""
    serves = spec.get("namespace")
    ready = find_condition(parse_conditions(status.get("conditions")), AdapterCondition.READY)
    return AdapterSighting(
        namespace=str(namespace),
        name=name,
        serves=serves if isinstance(serves, str) else "",
        ready=ready.status if ready else "Unknown",
        reason=ready.reason if ready else "",
        message=ready.message if ready else "",
    )


@kopf.index(GROUP, VERSION, KUBEFLOW_ADAPTERS, id=ADAPTERS_BY_NAME)
def adapters_by_name(
    name: str, namespace: str | None, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> dict[str, AdapterSighting]:
    """Every KubeflowAdapter the operator watches, by name."""
    return {name: sighting_of(name, namespace, spec, status)}


def adapters_seen(handler_kwargs: Mapping[str, Any]) -> AdaptersByName:
    """The index of KubeflowAdapters, which kopf passes every handler under its id."""
    return cast(AdaptersByName, handler_kwargs[ADAPTERS_BY_NAME])


def adapter_exists(index: AdaptersByName, namespace: str, adapter: str) -> bool:
    """Whether a KubeflowAdapter named ``adapter`` serving ``namespace`` is watched."""
    return any(seen.serves == namespace for seen in index.get(adapter, ()))


def why_not_serving(index: AdaptersByName, namespace: str, adapter: str) -> tuple[str, str]:
    """The reason and message of a DispatchJob in ``namespace`` whose ``adapter`` is not open."""
    seen: list[AdapterSighting] = list(index.get(adapter, ()))
    serving = [s for s in seen if s.serves == namespace]
    if serving:
        found = serving[0]
        return (
            REASON_ADAPTER_NOT_READY,
            f"KubeflowAdapter {found.where} serving namespace {namespace} is not Ready "
            f"({found.not_ready}); the attempt starts once it is",
        )
    message = f"no KubeflowAdapter named {adapter} serves namespace {namespace}"
    if seen:
        elsewhere = ", ".join(f"{s.where} serves {s.serves or '(none)'}" for s in seen)
        message += f" ({elsewhere})"
    return REASON_ADAPTER_NOT_FOUND, f"{message}; the attempt starts once one is Ready"


def waiting_conditions(
    status: Mapping[str, Any] | None,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: datetime,
) -> list[dict[str, Any]] | None:
    """``status.conditions`` with ``Admitted=False`` for why the job waits; None if it says so."""
    conditions = parse_conditions((status or {}).get("conditions"))
    current = find_condition(conditions, JobCondition.ADMITTED)
    said = (current.status, current.reason, current.message) if current else None
    if said == ("False", reason, message):
        return None
    waiting = Condition(
        type=JobCondition.ADMITTED,
        status="False",
        reason=reason,
        message=message,
        observed_generation=generation,
    )
    return to_wire(set_condition(conditions, waiting, now=now))
