"""metav1.Condition helpers: one entry per type, transitions only on status changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dispatch_kubeflow.handlers.conditions import (
    Condition,
    ConditionStatus,
    find_condition,
    parse_conditions,
    set_condition,
    to_wire,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)
T1 = T0 + timedelta(minutes=1)


def ready(status: ConditionStatus, reason: str = "Ready", message: str = "") -> Condition:
    return Condition(type="Ready", status=status, reason=reason, message=message)


def test_a_new_condition_gets_its_transition_time_in_rfc3339() -> None:
    conditions = set_condition([], ready("True"), now=T0)
    assert conditions[0].last_transition_time == "2026-01-02T03:04:05Z"


def test_same_status_keeps_the_transition_time_but_takes_the_new_message() -> None:
    first = set_condition([], ready("True", message="a"), now=T0)
    second = set_condition(first, ready("True", reason="StillReady", message="b"), now=T1)
    assert second[0].last_transition_time == "2026-01-02T03:04:05Z"
    assert (second[0].reason, second[0].message) == ("StillReady", "b")


def test_a_status_change_moves_the_transition_time() -> None:
    first = set_condition([], ready("True"), now=T0)
    second = set_condition(first, ready("False", reason="Lost"), now=T1)
    assert second[0].last_transition_time == "2026-01-02T03:05:05Z"
    assert len(second) == 1


def test_other_types_are_left_alone_and_order_is_kept() -> None:
    valid = Condition(type="Valid", status="True", reason="Parsed")
    conditions = set_condition(set_condition([], valid, now=T0), ready("False", "Waiting"), now=T1)
    assert [c.type for c in conditions] == ["Valid", "Ready"]
    assert find_condition(conditions, "Valid") == conditions[0]


def test_wire_form_is_metav1_shaped() -> None:
    condition = Condition(type="Ready", status="True", reason="Ready", observed_generation=3)
    (wire,) = to_wire(set_condition([], condition, now=T0))
    assert wire == {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "",
        "lastTransitionTime": "2026-01-02T03:04:05Z",
        "observedGeneration": 3,
    }
    assert parse_conditions([wire, {"junk": 1}]) == [Condition.model_validate(wire)]


@pytest.mark.parametrize("reason", ["", "has space", "9Lead", "trailing-"])
def test_a_reason_that_is_not_camel_case_is_refused(reason: str) -> None:
    with pytest.raises(ValueError, match="CamelCase"):
        Condition(type="Ready", status="True", reason=reason)
