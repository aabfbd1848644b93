"""Which adapter serves a DispatchJob, why it does not yet, and when an attempt may start."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from dispatch_kubeflow.constants import STATUS_REPORTED
from dispatch_kubeflow.handlers.jobs import never_started, waits_for_current
from dispatch_kubeflow.handlers.registry import AdapterRegistry
from dispatch_kubeflow.handlers.serving import (
    AdapterSighting,
    adapter_exists,
    sighting_of,
    waiting_conditions,
    why_not_serving,
)
from dispatch_kubeflow.handlers.status import DispatchJobStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LATER = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)


def sighting(serves: str, ready: str = "False", namespace: str = "ops") -> AdapterSighting:
    reason = "InvalidSettings" if ready == "False" else "Watching"
    return AdapterSighting(
        namespace=namespace, name="a", serves=serves, ready=ready, reason=reason, message="m"
    )


def test_the_index_reads_served_namespace_and_ready_condition() -> None:
    status = {
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "ProbeFailed",
                "message": "no runtime",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ]
    }
    spec = {"namespace": "team-a"}
    assert sighting_of("a", "ops", spec, status) == AdapterSighting(
        namespace="ops",
        name="a",
        serves="team-a",
        ready="False",
        reason="ProbeFailed",
        message="no runtime",
    )


def test_an_adapter_without_status_is_indexed_as_not_ready_yet() -> None:
    spec = {"namespace": "team-a"}
    status: dict[str, Any] = {}
    seen = sighting_of("a", "ops", spec, status)
    assert (seen.ready, seen.reason) == ("Unknown", "")
    reason, message = why_not_serving({"a": [seen]}, "team-a", "a")
    assert reason == "AdapterNotReady"
    assert "(no status yet)" in message


def test_no_adapter_of_that_name_is_not_found_naming_adapter_and_namespace() -> None:
    reason, message = why_not_serving({}, "team-a", "a")
    assert reason == "AdapterNotFound"
    assert message.startswith("no KubeflowAdapter named a serves namespace team-a")
    assert not adapter_exists({}, "team-a", "a")


def test_an_adapter_of_that_name_serving_elsewhere_is_not_found_and_said_where() -> None:
    index = {"a": [sighting("team-b")]}
    reason, message = why_not_serving(index, "team-a", "a")
    assert reason == "AdapterNotFound"
    assert "(ops/a serves team-b)" in message
    assert not adapter_exists(index, "team-a", "a")


def test_an_adapter_that_serves_the_namespace_but_is_not_open_says_its_ready_reason() -> None:
    index = {"a": [sighting("team-a")]}
    reason, message = why_not_serving(index, "team-a", "a")
    assert reason == "AdapterNotReady"
    assert "KubeflowAdapter ops/a serving namespace team-a is not Ready (InvalidSettings: m)" in (
        message
    )
    assert adapter_exists(index, "team-a", "a")


def test_an_adapter_ready_in_an_earlier_session_and_not_open_yet_is_opening() -> None:
    reason, message = why_not_serving({"a": [sighting("team-a", ready="True")]}, "team-a", "a")
    assert reason == "AdapterNotReady"
    assert "is not Ready (opening)" in message


def test_the_waiting_condition_is_written_once_and_moves_on_a_new_reason() -> None:
    first = waiting_conditions(None, "AdapterNotFound", "none", generation=1, now=NOW)
    assert first is not None
    (admitted,) = first
    assert (admitted["type"], admitted["status"], admitted["reason"]) == (
        "Admitted",
        "False",
        "AdapterNotFound",
    )
    assert admitted["observedGeneration"] == 1
    status = {"conditions": first}
    assert waiting_conditions(status, "AdapterNotFound", "none", generation=1, now=LATER) is None
    moved = waiting_conditions(status, "AdapterNotReady", "opening", generation=1, now=LATER)
    assert moved is not None
    assert moved[0]["reason"] == "AdapterNotReady"
    # Still False: not a transition.
    assert moved[0]["lastTransitionTime"] == admitted["lastTransitionTime"]


@pytest.mark.parametrize(
    ("state", "waits"),
    [
        ("Pending", True),
        ("Running", True),
        ("Succeeded", False),
        ("Failed", False),
        ("Stopped", False),
        ("Unknown", False),  # Vanished: nothing of it is left to finish
    ],
)
def test_a_raised_attempt_waits_only_for_a_live_attempt(state: str, waits: bool) -> None:
    status = DispatchJobStatus(attempt=1, state=state)
    assert waits_for_current(status, 2) is waits


def test_a_raised_attempt_never_waits_for_itself_or_for_no_attempt() -> None:
    assert not waits_for_current(DispatchJobStatus(), 2)
    assert not waits_for_current(DispatchJobStatus(attempt=2, state="Running"), 2)


def test_a_job_never_started_has_no_attempt_and_no_reported_position() -> None:
    assert never_started(None)
    assert never_started({"conditions": []})
    assert not never_started({"attempt": 1, "state": "Failed"})
    assert not never_started({STATUS_REPORTED: {"1": "{}"}})


async def test_waiting_for_an_adapter_returns_it_as_soon_as_it_is_published() -> None:
    registry = AdapterRegistry()
    adapter = object()
    waiter = asyncio.ensure_future(registry.wait_for("team-a", "a", within=30.0))
    await asyncio.sleep(0)
    await registry.publish("team-b", "a", object())
    assert not waiter.done()
    await registry.publish("team-a", "a", adapter)
    assert await asyncio.wait_for(waiter, 1.0) is adapter


async def test_waiting_for_an_adapter_that_does_not_open_gives_up_with_none() -> None:
    registry = AdapterRegistry()
    assert await registry.wait_for("team-a", "a", within=0.01) is None
