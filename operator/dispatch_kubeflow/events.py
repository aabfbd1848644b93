"""Dispatch events and the models derivation works on.

A dispatch event (``DispatchEvent``) is one transition of one (job, attempt): Submitted,
Admitted, Running, Evicted, NodeLost, Restarted, Finished, Vanished, or the admission
controller's heartbeat. ``derivation`` turns what is watched of a job (``JobObservation``) into
a ``DerivedStatus``; ``reporting`` turns successive derived statuses into events, each once.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic.alias_generators import to_camel

from dispatch_kubeflow.constants import Cause, EventType, State


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, alias_generator=to_camel, populate_by_name=True, extra="forbid"
    )


class Taint(_Model):
    key: str
    value: str | None = None
    effect: str
    # When the taint was put on the node (Kubernetes stamps NoExecute taints): a taint removed
    # and put back is another loss.
    time_added: str | None = None


class Evidence(_Model):
    """One object and the condition, container state or taint a conclusion was drawn from."""

    kind: str
    name: str
    field: str | None = None
    type: str | None = None
    status: str | None = None
    reason: str | None = None
    message: str | None = None
    container: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    node: str | None = None
    taint_key: str | None = None
    effect: str | None = None
    time_added: str | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if value is not None}


class DispatchEvent(_Model):
    type: EventType
    # "<job>/<attempt>/<sequence>": the same transition always carries the same id, so a consumer
    # that may see it twice (at-least-once delivery) can tell.
    id: str | None = None
    job: str | None = None
    attempt: int | None = None
    train_job: str | None = None
    time: AwareDatetime
    state: State | None = None
    cause: Cause | None = None
    reason: str = ""
    message: str = ""
    evidence: tuple[Evidence, ...] = ()
    result: dict[str, Any] | None = None
    gate: Literal["open", "closed"] | None = None


class JobObservation(BaseModel):
    """Everything watched of one (job, attempt), as raw API objects."""

    model_config = ConfigDict(frozen=True)

    job: str
    attempt: int
    train_job: dict[str, Any] | None = None
    job_set: dict[str, Any] | None = None
    pods: tuple[dict[str, Any], ...] = ()
    workload: dict[str, Any] | None = None
    node_taints: Mapping[str, tuple[Taint, ...]] = Field(default_factory=dict)
    # Nodes the pods are bound to that no longer exist.
    deleted_nodes: frozenset[str] = frozenset()
    stopped: bool = False


class DerivedStatus(_Model):
    """What derivation concludes about one (job, attempt) at one moment."""

    state: State
    cause: Cause | None = None
    reason: str = ""
    message: str = ""
    evidence: tuple[Evidence, ...] = ()
    admitted: bool = False
    running: bool = False
    finished: bool = False
    restart_attempt: int = 0
    result: dict[str, Any] | None = None
    # The Workload's current Evicted=True condition, when there is one.
    eviction: Evidence | None = None
    # A token that differs for each distinct eviction (reason and transition time).
    eviction_token: str | None = None


def heartbeat_event(
    *,
    gate: Literal["open", "closed"],
    now: datetime,
    reason: str,
    message: str,
    evidence: tuple[Evidence, ...] = (),
) -> DispatchEvent:
    return DispatchEvent(
        type=EventType.ADMISSION_HEARTBEAT,
        time=now,
        gate=gate,
        reason=reason,
        message=message,
        evidence=evidence,
    )
