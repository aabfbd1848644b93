"""Status conditions in the shape of Kubernetes' metav1.Condition.

kopf has no helper for ``status.conditions``. The rules that make them useful to ``kubectl wait``
and to people are kept here: one entry per type, ``lastTransitionTime`` moves only when the status
changes, and every entry says which generation of the spec it describes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from dispatch_kubeflow.clock import format_time

ConditionStatus = Literal["True", "False", "Unknown"]

# metav1.Condition's reason rule: CamelCase, starts with a letter.
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
_MESSAGE_LIMIT = 32768


def is_reason(reason: str) -> bool:
    """Whether ``reason`` may be a condition's reason (CamelCase, starting with a letter)."""
    return _REASON.match(reason) is not None


def status_of(value: bool | None) -> ConditionStatus:
    if value is None:
        return "Unknown"
    return "True" if value else "False"


class Condition(BaseModel):
    """One metav1.Condition."""

    model_config = ConfigDict(frozen=True, alias_generator=to_camel, populate_by_name=True)

    type: str
    status: ConditionStatus
    reason: str
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int | None = Field(default=None, ge=0)

    @field_validator("reason")
    @classmethod
    def _reason_is_camel_case(cls, reason: str) -> str:
        if not is_reason(reason):
            raise ValueError(f"condition reason {reason!r} is not CamelCase")
        return reason

    @field_validator("message")
    @classmethod
    def _message_fits(cls, message: str) -> str:
        return message[:_MESSAGE_LIMIT]

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def parse_conditions(raw: Iterable[Any] | None) -> list[Condition]:
    """The conditions found in a status; entries that are not conditions are dropped."""
    parsed: list[Condition] = []
    for entry in raw or ():
        try:
            parsed.append(Condition.model_validate(entry))
        except ValueError:
            continue
    return parsed


def set_condition(
    conditions: Sequence[Condition], new: Condition, *, now: datetime
) -> list[Condition]:
    """Replace (or add) the condition of ``new.type``.

    ``lastTransitionTime`` is kept from the existing entry when the status is unchanged, so a
    reason or message update does not look like a transition.
    """
    result: list[Condition] = []
    replaced = False
    for existing in conditions:
        if existing.type != new.type:
            result.append(existing)
            continue
        replaced = True
        changed = existing.status != new.status or not existing.last_transition_time
        moment = format_time(now) if changed else existing.last_transition_time
        result.append(new.model_copy(update={"last_transition_time": moment}))
    if not replaced:
        result.append(new.model_copy(update={"last_transition_time": format_time(now)}))
    return result


def set_conditions(
    conditions: Sequence[Condition], updates: Iterable[Condition], *, now: datetime
) -> list[Condition]:
    result = list(conditions)
    for update in updates:
        result = set_condition(result, update, now=now)
    return result


def find_condition(conditions: Sequence[Condition], kind: str) -> Condition | None:
    return next((condition for condition in conditions if condition.type == kind), None)


def to_wire(conditions: Iterable[Condition]) -> list[dict[str, Any]]:
    return [condition.to_wire() for condition in conditions]
