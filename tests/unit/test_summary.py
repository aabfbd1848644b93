"""``dispatch-kubeflow status``'s rows and rendering, from DispatchJob and adapter bodies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dispatch_kubeflow import summary

NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)


def at(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def job(status: dict[str, Any] | None, created: float = 1000, name: str = "j") -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": at(created)},
        "spec": {"adapter": "a", "attempt": 1},
    }
    if status is not None:
        body["status"] = status
    return body


def finished() -> dict[str, Any]:
    return {"type": "Finished", "status": "True"}


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (None, None),  # not started: no attempt in the status yet
        ({"attempt": 1}, 1000),  # started, no event yet: since the DispatchJob was created
        ({"attempt": 1, "events": [{"type": "Submitted", "attempt": 1, "time": at(30)}]}, 30),
        (
            {"attempt": 1, "events": [
                {"type": "Submitted", "attempt": 1, "time": at(100)},
                {"type": "Admitted", "attempt": 1, "time": at(93)},
                {"type": "Running", "attempt": 1, "time": at(90)},
            ]},
            7,
        ),
        (
            {"attempt": 1, "events": [
                {"type": "Submitted", "attempt": 1, "time": at(100)},
                {"type": "Admitted", "attempt": 1, "time": at(93)},
                {"type": "Evicted", "attempt": 1, "time": at(50)},
            ]},
            50,  # evicted: waiting again, since the eviction
        ),
        (
            {"attempt": 1, "events": [
                {"type": "Submitted", "attempt": 1, "time": at(100)},
                {"type": "Submitted", "attempt": 1, "time": at(60), "cause": "NoCapacity"},
            ]},
            100,  # a new waiting cause goes on with the same wait
        ),
        (
            {"attempt": 1, "conditions": [finished()], "events": [
                {"type": "Submitted", "attempt": 1, "time": at(100)},
                {"type": "Finished", "attempt": 1, "time": at(10)},
            ]},
            None,  # ended without ever being admitted
        ),
    ],
)  # fmt: skip
def test_admission_wait_of_the_current_attempt(
    status: dict[str, Any] | None, expected: float | None
) -> None:
    assert summary.admission_wait(job(status), NOW) == expected


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (0, "0s"), (119, "119s"), (200, "3m20s"), (900, "15m"), (3 * 3600 + 120, "3h2m"),
     (10 * 3600 + 5, "10h"), (3 * 86400 + 3600, "3d1h"), (30 * 86400, "30d")],
)  # fmt: skip
def test_durations_read_like_kubectl_ages(seconds: float | None, text: str) -> None:
    assert summary.human_duration(seconds) == text


def test_rows_are_sorted_by_namespace_and_name_and_columns_aligned() -> None:
    jobs = [job({"attempt": 1, "state": "Running"}, name=n) for n in ("zeta", "alpha")]
    jobs.append({**job({"attempt": 3, "state": "Failed", "cause": "OutOfMemory"}, name="m")})
    jobs[-1]["metadata"]["namespace"] = "a-team"
    text = summary.render_text(summary.summarize([], jobs, NOW))
    none, table = text.rstrip("\n").split("\n\n")
    assert none == "No KubeflowAdapters found."
    header, *rows = table.splitlines()
    assert [(r.split()[0], r.split()[1]) for r in rows] == [
        ("a-team", "m"),
        ("ns", "alpha"),
        ("ns", "zeta"),
    ]
    cause = header.index("CAUSE")
    assert [row[cause:].split()[0] for row in rows] == ["OutOfMemory", "-", "-"]


def test_json_rows_have_camel_case_keys_and_whole_seconds() -> None:
    data = summary.render_json(summary.summarize([], [job({"attempt": 1})], NOW))
    (row,) = data["jobs"]
    assert row["ageSeconds"] == 1000
    assert row["admissionWaitSeconds"] == 1000
    assert set(row) == {
        "namespace", "name", "adapter", "state", "cause", "attempt", "ageSeconds", "admitted",
        "admissionWaitSeconds",
    }  # fmt: skip


def test_a_namespace_has_the_adapters_living_in_it_and_those_serving_it() -> None:
    def adapter(lives: str, serves: str) -> dict[str, Any]:
        return {"metadata": {"namespace": lives}, "spec": {"namespace": serves}}

    assert summary.in_or_serving(adapter("team-a", "team-a"), "team-a")
    assert summary.in_or_serving(adapter("dispatch-system", "team-a"), "team-a")
    assert summary.in_or_serving(adapter("team-a", "team-b"), "team-a")
    assert not summary.in_or_serving(adapter("dispatch-system", "team-b"), "team-a")
