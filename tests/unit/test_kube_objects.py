"""The object readers: a missing or mistyped field reads as absent, never as an exception."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from dispatch_kubeflow.kube.objects import (
    annotations_of,
    as_int,
    condition,
    condition_true,
    conditions,
    dig,
    is_deleting,
    is_false,
    is_true,
    key_of,
    labels_of,
    mappings,
    name_of,
    namespace_of,
    owner_reference,
    owner_uids,
    resource_version_of,
    text,
    transition_time,
    uid_of,
)

POD: dict[str, Any] = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "resourceVersion": "42",
        "labels": {"a": "1"},
        "annotations": {"b": "2"},
        "ownerReferences": [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u-job"},
            {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "s", "uid": "u-s"},
            "not a reference",
        ],
    },
    "status": {
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T12:00:00Z"},
            {"type": "PodScheduled", "status": "False"},
            "not a condition",
        ]
    },
}


def test_dig_walks_mappings_and_stops_at_anything_else() -> None:
    assert dig(POD, "metadata", "labels", "a") == "1"
    assert dig(POD, "metadata", "missing", "a") is None
    assert dig(POD, "metadata", "name", "deeper") is None  # a string is not walked into
    assert dig(None, "metadata") is None
    assert dig(POD) is POD


def test_scalars_read_as_absent_when_missing_or_unreadable() -> None:
    assert (text(None), text(3)) == ("", "3")
    assert (as_int("7"), as_int(None), as_int("seven"), as_int([1])) == (7, 0, 0, 0)
    assert list(mappings([{"a": 1}, "b", 2, {"c": 3}])) == [{"a": 1}, {"c": 3}]
    assert list(mappings({"a": 1})) == []


def test_metadata_readers() -> None:
    assert (name_of(POD), namespace_of(POD), uid_of(POD)) == ("p", "ns", "u-1")
    assert resource_version_of(POD) == "42"
    assert (labels_of(POD), annotations_of(POD)) == ({"a": "1"}, {"b": "2"})
    assert (name_of({}), labels_of({"metadata": {"labels": ["x"]}})) == ("", {})
    assert annotations_of({"metadata": {"annotations": None}}) == {}


def test_the_cache_key_is_namespace_slash_name_or_the_name_of_a_cluster_object() -> None:
    assert key_of(POD) == "ns/p"
    assert key_of({"metadata": {"name": "node-1"}}) == "node-1"


def test_an_object_is_deleting_once_it_has_a_deletion_timestamp() -> None:
    assert not is_deleting(POD)
    assert is_deleting({"metadata": {"deletionTimestamp": "2026-01-01T12:00:00Z"}})


def test_conditions_are_read_by_type() -> None:
    assert [c["type"] for c in conditions(POD)] == ["Ready", "PodScheduled"]
    ready = condition(POD, "Ready")
    assert is_true(ready)
    assert not is_false(ready)
    assert is_false(condition(POD, "PodScheduled"))
    assert condition(POD, "Missing") is None
    assert not is_true(None)
    assert not is_false(None)
    assert condition_true(POD, "Ready")
    assert not condition_true(POD, "PodScheduled")
    assert conditions({"status": {"conditions": "broken"}}) == []


def test_a_transition_time_is_read_in_utc() -> None:
    assert transition_time(condition(POD, "Ready")) == datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert transition_time(condition(POD, "PodScheduled")) is None
    assert transition_time(None) is None


@pytest.mark.parametrize(
    ("kind", "group", "uid"),
    [("JobSet", "jobset.x-k8s.io", "u-s"), ("Job", "batch", "u-job"), ("Job", "jobset", None)],
)
def test_an_owner_reference_is_found_by_kind_and_api_group(
    kind: str, group: str, uid: str | None
) -> None:
    found = owner_reference(POD, kind=kind, group=group)
    assert (found["uid"] if found else None) == uid


def test_owner_uids_lists_every_owner() -> None:
    assert owner_uids(POD) == {"u-job", "u-s"}
    assert owner_uids({}) == set()
