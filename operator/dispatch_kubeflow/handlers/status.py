"""A DispatchJob's status, folded from the dispatch events of its job.

The fold is pure: given the current status and one event (in its wire form), it returns the next
status. The top-level ``state``/``cause``/``reason``/``message`` and the ``Admitted``/``Running``/
``Finished`` conditions follow the current attempt only; events of earlier attempts are kept in the
history but change nothing else. An event already in the history is ignored, so a replay after a
restart leaves the status as it was.

The status is bounded (``bound``): however long the upstream messages and evidence are, it stays
under ``STATUS_LIMIT`` bytes of JSON so the apiserver always stores it, and ``truncated`` says
what was cut.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from dispatch_kubeflow.constants import Cause, EventType, JobCondition, State
from dispatch_kubeflow.handlers.conditions import (
    Condition,
    is_reason,
    parse_conditions,
    set_conditions,
    status_of,
    to_wire,
)

HISTORY_LIMIT = 50
# A DispatchJob's whole status stays under this many bytes of JSON (etcd takes 1.5 MiB objects).
STATUS_LIMIT = 256 * 1024
MESSAGE_LIMIT = 4096
EVENT_MESSAGE_LIMIT = 1024
EVIDENCE_KEPT = 8
EVIDENCE_MESSAGE_LIMIT = 512
ELLIPSIS = "…"
TERMINAL_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.STOPPED})
# Reasons the fold itself writes when an event carries none.
REASON_SUBMITTED = "Submitted"
REASON_START_FAILED = "StartFailed"
# Admitted=False while an evicted job waits at the readmission gate.
REASON_HELD_AT_GATE = "HeldAtGate"

# The keys that identify one event; two events equal on them are the same report.
_IDENTITY = ("type", "attempt", "trainJob", "time", "state", "cause", "reason")


class DispatchJobStatus(BaseModel):
    """``status`` of a DispatchJob, as the operator writes it."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)

    attempt: int | None = None
    state: str | None = None
    cause: str | None = None
    reason: str | None = None
    message: str | None = None
    train_job: str | None = None
    observed_generation: int | None = None
    truncated: str | None = None
    conditions: list[Condition] = Field(default_factory=list)
    events: list[dict[str, Any]] = Field(default_factory=list)

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any] | None) -> DispatchJobStatus:
        raw = dict(raw or {})
        conditions = parse_conditions(raw.pop("conditions", None))
        known = {key: value for key, value in raw.items() if key in _WIRE_KEYS}
        return cls.model_validate({**known, "conditions": conditions})

    def to_wire(self) -> dict[str, Any]:
        body = self.model_dump(by_alias=True, mode="json", exclude={"conditions"})
        body["conditions"] = to_wire(self.conditions)
        return body

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL_STATES


_WIRE_KEYS = frozenset(
    field.alias or name
    for name, field in DispatchJobStatus.model_fields.items()
    if name != "conditions"
)


def event_identity(event: Mapping[str, Any]) -> tuple[Any, ...]:
    return tuple(event.get(key) for key in _IDENTITY)


def is_recorded(status: DispatchJobStatus, event: Mapping[str, Any]) -> bool:
    identity = event_identity(event)
    return any(event_identity(seen) == identity for seen in status.events)


def _condition(
    kind: str, value: bool | None, reason: str, message: str, generation: int | None
) -> Condition:
    return Condition(
        type=kind,
        status=status_of(value),
        reason=reason,
        message=message,
        observed_generation=generation,
    )


def held_at_gate_message(event: Mapping[str, Any]) -> str:
    """Why an evicted job waits at the readmission gate, and how it goes on."""
    what = f"evicted ({event.get('cause') or 'no cause'}"
    if event.get("reason"):
        what += f", {event.get('reason')}: {shorten(event.get('message') or '', 512)}"
    return (
        f"{what}); held at the readmission gate until spec.readmit is raised, spec.reject is "
        "set, or spec.recovery readmits it"
    )


def _conditions_for(
    event: Mapping[str, Any], generation: int | None, *, gate: bool
) -> list[Condition]:
    kind = str(event.get("type"))
    state = event.get("state")
    reason = str(event.get("reason") or kind)
    message = str(event.get("message") or "")
    if not is_reason(reason):
        reason = kind
    finished = kind in (EventType.FINISHED, EventType.VANISHED) or state in TERMINAL_STATES
    updates = [
        _condition(JobCondition.RUNNING, state == State.RUNNING, reason, message, generation),
        _condition(JobCondition.FINISHED, finished, reason, message, generation),
    ]
    if kind in (EventType.ADMITTED, EventType.RUNNING):
        updates.append(_condition(JobCondition.ADMITTED, True, reason, message, generation))
    elif kind == EventType.EVICTED and gate:
        held = held_at_gate_message(event)
        updates.append(
            _condition(JobCondition.ADMITTED, False, REASON_HELD_AT_GATE, held, generation)
        )
    elif kind in (EventType.EVICTED, EventType.SUBMITTED):
        updates.append(_condition(JobCondition.ADMITTED, False, reason, message, generation))
    return updates


def fold_event(
    status: DispatchJobStatus,
    event: Mapping[str, Any],
    *,
    attempt: int,
    generation: int | None,
    now: datetime,
    gate: bool = False,
) -> DispatchJobStatus:
    """The status after ``event``; ``attempt`` is the attempt the DispatchJob's spec asks for.

    ``gate``: the adapter has a readmission gate, so an eviction holds the job there.
    """
    if is_recorded(status, event):
        return status
    events = [*status.events, bounded_event(event)][-HISTORY_LIMIT:]
    if event.get("attempt") != attempt:
        return status.model_copy(update={"events": events})
    update: dict[str, Any] = {
        "events": events,
        "attempt": attempt,
        "state": event.get("state"),
        "cause": event.get("cause"),
        "reason": event.get("reason"),
        "message": shorten(event.get("message"), MESSAGE_LIMIT),
        "train_job": event.get("trainJob") or status.train_job,
        "observed_generation": generation,
        "conditions": set_conditions(
            status.conditions, _conditions_for(event, generation, gate=gate), now=now
        ),
    }
    return status.model_copy(update=update)


def begin_attempt(
    status: DispatchJobStatus,
    *,
    attempt: int,
    train_job: str | None,
    generation: int | None,
    now: datetime,
) -> DispatchJobStatus:
    """The status once ``attempt`` has been handed to the adapter and its TrainJob exists."""
    if status.attempt == attempt and status.state is not None:
        return status.model_copy(update={"train_job": train_job or status.train_job})
    message = f"attempt {attempt} submitted"
    updates = [
        _condition(JobCondition.ADMITTED, None, REASON_SUBMITTED, message, generation),
        _condition(JobCondition.RUNNING, False, REASON_SUBMITTED, message, generation),
        _condition(JobCondition.FINISHED, False, REASON_SUBMITTED, message, generation),
    ]
    return status.model_copy(
        update={
            "attempt": attempt,
            "state": State.PENDING.value,
            "cause": None,
            "reason": REASON_SUBMITTED,
            "message": message,
            "train_job": train_job,
            "observed_generation": generation,
            "conditions": set_conditions(status.conditions, updates, now=now),
        }
    )


def refuse_attempt(
    status: DispatchJobStatus,
    *,
    attempt: int,
    reason: str,
    message: str,
    cause: Cause,
    generation: int | None,
    now: datetime,
) -> DispatchJobStatus:
    """The status when the adapter refused to start ``attempt``: finished, failed, why."""
    updates = [
        _condition(JobCondition.ADMITTED, False, reason, message, generation),
        _condition(JobCondition.RUNNING, False, reason, message, generation),
        _condition(JobCondition.FINISHED, True, reason, message, generation),
    ]
    return status.model_copy(
        update={
            "attempt": attempt,
            "state": State.FAILED.value,
            "cause": cause.value,
            "reason": reason,
            "message": message,
            "observed_generation": generation,
            "conditions": set_conditions(status.conditions, updates, now=now),
        }
    )


def fold_events(
    status: DispatchJobStatus,
    events: Sequence[Mapping[str, Any]],
    *,
    attempt: int,
    generation: int | None,
    now: datetime,
    gate: bool = False,
) -> tuple[DispatchJobStatus, list[Mapping[str, Any]]]:
    """The bounded status after ``events``, and those of them that were new to it."""
    new: list[Mapping[str, Any]] = []
    for event in events:
        if is_recorded(status, event):
            continue
        status = fold_event(
            status, event, attempt=attempt, generation=generation, now=now, gate=gate
        )
        new.append(event)
    return bound(status), new


def shorten(text: Any, limit: int) -> Any:
    """``text`` cut to ``limit`` characters with an ellipsis; other values as they are."""
    if not isinstance(text, str) or len(text) <= limit:
        return text
    return text[: limit - len(ELLIPSIS)] + ELLIPSIS


def bounded_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """The event as the history keeps it: its message and evidence cut to a bounded size."""
    kept = dict(event)
    kept["message"] = shorten(event.get("message"), EVENT_MESSAGE_LIMIT)
    evidence = event.get("evidence")
    if isinstance(evidence, list):
        kept["evidence"] = [
            {**item, "message": shorten(item.get("message"), EVIDENCE_MESSAGE_LIMIT)}
            if isinstance(item, Mapping) and "message" in item
            else item
            for item in evidence[:EVIDENCE_KEPT]
        ]
    return kept


def _size(status: DispatchJobStatus) -> int:
    return len(json.dumps(status.to_wire(), separators=(",", ":")))


def bound(status: DispatchJobStatus) -> DispatchJobStatus:
    """``status`` with its oldest history dropped until it fits ``STATUS_LIMIT``, and why."""
    if _size(status) <= STATUS_LIMIT:
        return status
    events = list(status.events)
    dropped = 0
    while events and _size(status.model_copy(update={"events": events})) > STATUS_LIMIT:
        events.pop(0)
        dropped += 1
    note = (
        f"the {dropped} oldest events were dropped from the history to keep the status under "
        f"{STATUS_LIMIT // 1024} KiB"
    )
    return status.model_copy(update={"events": events, "truncated": note})
