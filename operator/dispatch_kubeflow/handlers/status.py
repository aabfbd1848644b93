"""A DispatchJob's status, folded from the dispatch events of its job.

The fold is pure: given the current status and one event (in its wire form), it returns the next
status. The top-level ``state``/``cause``/``reason``/``message`` and the ``Admitted``/``Running``/
``Finished`` conditions follow the current attempt only; events of earlier attempts are kept in the
history but change nothing else. An event already in the history is ignored, so a replay after a
restart leaves the status as it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from dispatch_kubeflow.constants import EventType, JobCondition, State
from dispatch_kubeflow.handlers.conditions import (
    Condition,
    is_reason,
    parse_conditions,
    set_conditions,
    status_of,
    to_wire,
)

HISTORY_LIMIT = 50
TERMINAL_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.STOPPED})
# Reasons the fold itself writes when an event carries none.
REASON_SUBMITTED = "Submitted"
REASON_START_FAILED = "StartFailed"

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


def _conditions_for(event: Mapping[str, Any], generation: int | None) -> list[Condition]:
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
) -> DispatchJobStatus:
    """The status after ``event``; ``attempt`` is the attempt the DispatchJob's spec asks for."""
    if is_recorded(status, event):
        return status
    events = [*status.events, dict(event)][-HISTORY_LIMIT:]
    if event.get("attempt") != attempt:
        return status.model_copy(update={"events": events})
    update: dict[str, Any] = {
        "events": events,
        "attempt": attempt,
        "state": event.get("state"),
        "cause": event.get("cause"),
        "reason": event.get("reason"),
        "message": event.get("message"),
        "train_job": event.get("trainJob") or status.train_job,
        "observed_generation": generation,
        "conditions": set_conditions(
            status.conditions, _conditions_for(event, generation), now=now
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
            "cause": None,
            "reason": reason,
            "message": message,
            "observed_generation": generation,
            "conditions": set_conditions(status.conditions, updates, now=now),
        }
    )
