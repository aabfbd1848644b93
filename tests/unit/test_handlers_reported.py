"""The operator's report store: its record format in the DispatchJob status, and its wiring."""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta
from typing import Any, cast

import pytest

from dispatch_kubeflow.constants import STATUS_REPORTED
from dispatch_kubeflow.errors import UnavailableError
from dispatch_kubeflow.handlers import crds
from dispatch_kubeflow.handlers.adapters import AdapterSession
from dispatch_kubeflow.handlers.registry import AdapterRegistry, EventLines
from dispatch_kubeflow.handlers.reported import (
    DispatchJobStatusStore,
    KeyedLocks,
    record_patch,
    records_of,
    slim,
    status_of,
)
from dispatch_kubeflow.reporting import ListingReportStore, ReportedRecord
from dispatch_kubeflow.settings import parse_settings_object

RUNNING = ReportedRecord(submitted=True, admitted=0, running=0)
DONE = ReportedRecord(submitted=True, finished=True)


def dispatch_job(adapter: str, reported: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {"name": "train"},
        "spec": {"adapter": adapter},
        "status": {STATUS_REPORTED: reported},
    }


def test_records_are_read_per_attempt() -> None:
    body = dispatch_job("a", {"1": DONE.to_json(), "2": RUNNING.to_json()})
    assert records_of(body, "a") == {1: DONE, 2: RUNNING}


def test_a_dispatchjob_of_another_adapter_holds_no_record_for_this_one() -> None:
    body = dispatch_job("b", {"1": RUNNING.to_json()})
    assert records_of(body, "a") == {}
    assert records_of(None, "a") == {}


def test_an_unreadable_entry_counts_as_nothing_reported() -> None:
    body = dispatch_job("a", {"1": "not json", "x": RUNNING.to_json(), "2": 7})
    assert records_of(body, "a") == {}


def test_the_patch_sets_one_attempt_and_round_trips() -> None:
    patch = record_patch(3, RUNNING)
    assert patch == {STATUS_REPORTED: {"3": RUNNING.to_json()}}
    assert records_of(dispatch_job("a", patch[STATUS_REPORTED]), "a") == {3: RUNNING}


def test_the_store_keeps_what_it_reads_and_drops_the_bookkeeping() -> None:
    identity = {
        "name": "train",
        "namespace": "team",
        "uid": "u-1",
        "resourceVersion": "42",
        "generation": 3,
    }
    bookkeeping = {
        "labels": {"team": "a"},
        "annotations": {"kopf.zalando.org/last-handled-configuration": "{}" * 500},
        "managedFields": [{"manager": "kopf", "fieldsV1": {"f:status": {}}}] * 10,
        "finalizers": ["dispatch/finalizer"],
    }
    head = {"apiVersion": "dispatch.example/v1", "kind": "DispatchJob"}
    routing = {"adapter": "a", "attempt": 2, "runtime": {"name": "torch"}}
    status = {STATUS_REPORTED: {"2": RUNNING.to_json()}, "events": [{"type": "Running"}]}
    whole = {
        **head,
        "metadata": {**identity, **bookkeeping},
        "spec": {**routing, "image": "x"},
        "status": status,
    }
    kept = slim(whole)
    assert {**kept, "status": status_of(kept)} == {
        **head,
        "metadata": identity,
        "spec": routing,
        "status": status,
    }
    assert records_of(kept, "a") == records_of(whole, "a") == {2: RUNNING}


def test_the_store_keeps_the_status_packed_in_a_quarter_of_its_memory() -> None:
    events = [
        {"type": kind, "attempt": 1, "job": "train", "id": f"train/1/{n}", "evidence": []}
        for n, kind in enumerate(("Submitted", "Admitted", "Running", "Finished"), 1)
    ]
    whole = dispatch_job("a", {"1": DONE.to_json()})
    whole["status"]["events"] = events
    kept = slim(whole)
    assert status_of(kept) == whole["status"]
    assert status_of(slim(kept)) == whole["status"], "slimming what the store keeps changes it"
    assert deep_size(kept["status"]) * 4 < deep_size(whole["status"])


def deep_size(value: Any) -> int:
    size = sys.getsizeof(value)
    if isinstance(value, dict):
        return size + sum(deep_size(k) + deep_size(v) for k, v in value.items())
    if isinstance(value, list):
        return size + sum(deep_size(item) for item in value)
    return size


def test_the_crd_keeps_the_records_as_strings_by_attempt() -> None:
    (version,) = crds.dispatchjob_crd()["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert status["properties"][STATUS_REPORTED]["additionalProperties"] == {"type": "string"}


def test_the_operator_opens_its_adapters_with_the_dispatchjob_store() -> None:
    settings = parse_settings_object(
        {
            "namespace": "team-a",
            "runtimes": [{"kind": "ClusterTrainingRuntime", "name": "r"}],
        },
        pointer="/spec",
    )
    session = AdapterSession(
        api=None,  # type: ignore[arg-type]
        name="adapter",
        namespace="dispatch-system",
        generation=1,
        spec={},
        registry=AdapterRegistry(),
        event_lines=EventLines(None),
        post_event=lambda *_: None,
        logger=logging.getLogger("test"),
    )
    config = session.adapter_config(settings)
    assert isinstance(config.store, DispatchJobStatusStore)
    assert isinstance(config.store, ListingReportStore)
    assert config.adapter_name == "adapter"


async def test_one_keys_holders_go_one_at_a_time_and_other_keys_beside_them() -> None:
    locks = KeyedLocks()
    order: list[str] = []

    async def hold(key: str, name: str) -> None:
        async with locks.hold(key):
            order.append(f"{name} in")
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            order.append(f"{name} out")

    await asyncio.gather(hold("a", "a1"), hold("a", "a2"), hold("b", "b1"))
    assert order.index("a1 out") < order.index("a2 in")
    assert order.index("b1 in") < order.index("a1 out")
    assert len(locks) == 0


async def test_a_closed_store_writes_nothing_and_starts_no_watch_again() -> None:
    """A start that ends after its adapter closed records itself without the store."""
    store = DispatchJobStatusStore(cast(Any, None), "ns", "ad", timedelta(seconds=1))
    await store.close()
    assert store.closed

    async def change(_current: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("nothing is read from a closed store")

    with pytest.raises(UnavailableError, match="closed"):
        await store.update("job", change)
    assert store._task is None
