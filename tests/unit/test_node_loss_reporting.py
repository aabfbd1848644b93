"""Issue 12 item 5: each distinct node loss (node, taint key, time added) is reported once.

Node loss is reported as soon as it is seen (SPEC §6: always within ``nodeLossWindow``), so a
second loss in the same admission must not wait for the job to fail.
"""

from __future__ import annotations

import json

from dispatch_kubeflow.constants import TAINT_UNREACHABLE, Cause, EventType
from dispatch_kubeflow.derivation import derive
from dispatch_kubeflow.events import JobObservation, Taint
from dispatch_kubeflow.reporting import MemoryStore, ReportedRecord, Reporter
from tests.unit.test_events import ADMITTED, pod, workload
from tests.unit.test_events_tracking import LOSS, NOW, obs

PODS = (pod("p-a", node="n1"), pod("p-b", node="n2"))


def on(**taints: str) -> JobObservation:
    """The job running on n1 and n2, each node named tainted unreachable at the time given."""
    return obs(
        workload=workload(ADMITTED),
        pods=PODS,
        node_taints={
            node: (Taint(key=TAINT_UNREACHABLE, effect="NoExecute", time_added=added),)
            for node, added in taints.items()
        },
    )


async def lost_nodes(reporter: Reporter, observation: JobObservation) -> list[list[str | None]]:
    """The nodes each NodeLost event reported names, newly lost first."""
    events = await reporter.report(
        job="j1",
        attempt=1,
        train_job="j1-1",
        status=derive(observation, loss_taints=LOSS),
        now=NOW,
    )
    return [[e.node for e in ev.evidence] for ev in events if ev.type is EventType.NODE_LOST]


async def test_item5_node_a_lost_and_back_then_node_b_lost_is_two_node_lost_events() -> None:
    reporter = Reporter(MemoryStore())
    assert await lost_nodes(reporter, on()) == []
    assert await lost_nodes(reporter, on(n1="2026-01-01T00:01:00Z")) == [["n1"]]
    assert await lost_nodes(reporter, on(n1="2026-01-01T00:01:00Z")) == []
    assert await lost_nodes(reporter, on()) == []  # n1 is back
    assert await lost_nodes(reporter, on(n2="2026-01-01T00:03:00Z")) == [["n2"]]
    assert await lost_nodes(reporter, on(n2="2026-01-01T00:03:00Z")) == []


async def test_item5_the_same_node_tainted_again_is_another_loss() -> None:
    reporter = Reporter(MemoryStore())
    assert await lost_nodes(reporter, on(n1="2026-01-01T00:01:00Z")) == [["n1"]]
    assert await lost_nodes(reporter, on()) == []
    assert await lost_nodes(reporter, on(n1="2026-01-01T00:04:00Z")) == [["n1"]]


async def test_item5_a_second_node_lost_while_the_first_still_is_names_the_new_one_first() -> None:
    reporter = Reporter(MemoryStore())
    first = "2026-01-01T00:01:00Z"
    assert await lost_nodes(reporter, on(n1=first)) == [["n1"]]
    assert await lost_nodes(reporter, on(n1=first, n2="2026-01-01T00:02:00Z")) == [["n2", "n1"]]
    assert await lost_nodes(reporter, on(n2="2026-01-01T00:02:00Z")) == []  # n1 back: no loss


async def test_item5_a_restarted_reporter_repeats_no_loss_and_the_record_stays_short() -> None:
    store = MemoryStore()
    both = on(n1="2026-01-01T00:01:00Z", n2="2026-01-01T00:02:00Z")
    assert await lost_nodes(Reporter(store), both) == [["n1", "n2"]]
    record = store.records[("j1", 1)]
    assert len(record.to_json()) < 100
    assert await lost_nodes(Reporter(store), both) == []


async def test_item5_a_record_from_before_losses_were_kept_repeats_nothing() -> None:
    # Written by the release that kept one NodeLost per "<epoch>/<restart attempt>".
    older = ReportedRecord.from_json(
        json.dumps({"s": True, "a": 0, "r": 0, "n": "0/0", "c": "0.0.R:NodeLost", "q": 4})
    )
    assert older is not None
    store = MemoryStore()
    store.records[("j1", 1)] = older
    reporter = Reporter(store)
    assert await lost_nodes(reporter, on(n1="2026-01-01T00:01:00Z")) == []
    assert await lost_nodes(reporter, on()) == []
    assert await lost_nodes(reporter, on(n2="2026-01-01T00:03:00Z")) == [["n2"]]
    assert "n" not in json.loads(store.records[("j1", 1)].to_json())


async def test_item5_a_loss_the_record_has_not_seen_is_reported_with_its_cause() -> None:
    reporter = Reporter(MemoryStore())
    events = await reporter.report(
        job="j1",
        attempt=1,
        train_job="j1-1",
        status=derive(on(n1="2026-01-01T00:01:00Z"), loss_taints=LOSS),
        now=NOW,
    )
    lost = [e for e in events if e.type is EventType.NODE_LOST]
    assert [(e.cause, e.reason, e.evidence[0].time_added) for e in lost] == [
        (Cause.NODE_LOST, TAINT_UNREACHABLE, "2026-01-01T00:01:00Z")
    ]
