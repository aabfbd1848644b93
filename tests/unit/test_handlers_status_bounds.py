"""A DispatchJob's status stays bounded whatever its job reports."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from dispatch_kubeflow.handlers.status import (
    EVENT_MESSAGE_LIMIT,
    EVIDENCE_KEPT,
    EVIDENCE_MESSAGE_LIMIT,
    HISTORY_LIMIT,
    MESSAGE_LIMIT,
    STATUS_LIMIT,
    DispatchJobStatus,
    bound,
    bounded_event,
    fold_events,
    shorten,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
HUGE = "x" * 100_000


def big_event(sequence: int) -> dict[str, Any]:
    return {
        "type": "Restarted",
        "job": "j1",
        "attempt": 1,
        "time": f"2026-01-02T03:{sequence // 60:02d}:{sequence % 60:02d}Z",
        "state": "Running",
        "reason": f"Restart{sequence}",
        "message": HUGE,
        "evidence": [{"kind": "Pod", "name": f"p{i}", "message": HUGE} for i in range(100)],
        "result": {"note": "y" * 4000},
    }


def size(status: DispatchJobStatus) -> int:
    return len(json.dumps(status.to_wire(), separators=(",", ":")))


def test_shorten_keeps_short_text_and_cuts_long_text_with_an_ellipsis() -> None:
    assert shorten("short", 10) == "short"
    assert shorten(None, 10) is None
    cut = shorten("abcdefghijkl", 10)
    assert len(cut) == 10
    assert cut.endswith("…")


def test_an_event_keeps_a_bounded_message_and_bounded_evidence() -> None:
    kept = bounded_event(big_event(0))
    assert len(kept["message"]) == EVENT_MESSAGE_LIMIT
    assert len(kept["evidence"]) == EVIDENCE_KEPT
    assert all(len(e["message"]) == EVIDENCE_MESSAGE_LIMIT for e in kept["evidence"])
    assert kept["reason"] == "Restart0"


def test_folding_many_huge_events_stays_under_the_limit_and_says_what_was_cut() -> None:
    status, new = fold_events(
        DispatchJobStatus(), [big_event(i) for i in range(120)], attempt=1, generation=1, now=T0
    )
    assert len(new) == 120
    assert size(status) <= STATUS_LIMIT
    assert len(status.message or "") == MESSAGE_LIMIT
    assert status.events[-1]["reason"] == "Restart119"
    assert len(status.events) < HISTORY_LIMIT
    assert status.truncated is not None
    assert "oldest events were dropped" in status.truncated


def test_a_small_status_is_left_alone() -> None:
    status, _ = fold_events(
        DispatchJobStatus(),
        [{"type": "Submitted", "job": "j1", "attempt": 1, "time": "t", "state": "Pending"}],
        attempt=1,
        generation=1,
        now=T0,
    )
    assert bound(status) == status
    assert status.truncated is None


def test_events_already_in_the_history_are_not_new() -> None:
    first, new = fold_events(DispatchJobStatus(), [big_event(1)], attempt=1, generation=1, now=T0)
    again, new_again = fold_events(first, [big_event(1)], attempt=1, generation=1, now=T0)
    assert len(new) == 1
    assert new_again == []
    assert again.events == first.events
