"""What the end-to-end scenarios share: adapter settings, simulated ranks and an event log.

A scenario opens a real `Adapter` against the full stack, starts dispatch jobs whose simulated
ranks (see tests/cluster/fullstack/kwok-stages.yaml) end the way the scenario needs, and reads
the dispatch events the adapter's one watch per kind produces.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from dispatch_kubeflow.adapter import Adapter, AdapterConfig
from dispatch_kubeflow.constants import EventType
from dispatch_kubeflow.events import DispatchEvent
from dispatch_kubeflow.publish import encode
from dispatch_kubeflow.trainjob import EnvVar, JobSpec
from tests.cluster.fullstack.stack import EXAMPLE_RUNTIME_NAME

RUNTIME = {"kind": "ClusterTrainingRuntime", "name": EXAMPLE_RUNTIME_NAME}


def settings(
    kubeconfig: Path,
    namespace: str,
    kueue: Mapping[str, Any] | None = None,
    **extra: Any,
) -> str:
    """Adapter settings for `namespace` on the example runtime, as the JSON text users write."""
    document: dict[str, Any] = {
        "cluster": {"kubeconfig": str(kubeconfig)},
        "namespace": namespace,
        "runtimes": [RUNTIME],
        "timeouts": {"workload": "30s", "stopJob": "60s"},
        **extra,
    }
    if kueue is not None:
        document["kueue"] = dict(kueue)
    return json.dumps(document)


def job(
    job_id: str,
    *,
    outcome: str = "succeed",
    seconds: float = 1.0,
    exit_code: int | None = None,
    reason: str | None = None,
    published: str | None = None,
    **fields: Any,
) -> JobSpec:
    """A dispatch job whose ranks run `seconds` and then end as `outcome` says."""
    env = {"SIM_OUTCOME": outcome, "SIM_DURATION": f"{seconds}s"}
    if exit_code is not None:
        env["SIM_EXIT_CODE"] = str(exit_code)
    if reason is not None:
        env["SIM_REASON"] = reason
    if published is not None:
        # The bytes `publish` writes to the termination message for this record.
        env["SIM_MESSAGE"] = encode(published).decode()
    return JobSpec(
        job_id=job_id,
        env=tuple(EnvVar(name=k, value=v) for k, v in env.items()),
        **fields,
    )


class EventLog:
    """Every event of one adapter's watch, collected in the background."""

    def __init__(self, adapter: Adapter) -> None:
        self.adapter = adapter
        self.events: list[DispatchEvent] = []
        # time.monotonic() when each event arrived, by index in `events`.
        self.received: list[float] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _collect(self) -> None:
        async for event in self.adapter.watch():
            self.events.append(event)
            self.received.append(time.monotonic())
            self._changed.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._collect(), name="event-log")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def of(self, job_id: str) -> list[DispatchEvent]:
        return [event for event in self.events if event.job == job_id]

    async def wait_for(
        self, match: Callable[[DispatchEvent], bool], seconds: float, what: str
    ) -> DispatchEvent:
        deadline = time.monotonic() + seconds
        while True:
            for event in self.events:
                if match(event):
                    return event
            if self._task is not None and self._task.done():
                self._task.result()
                raise AssertionError(f"the watch ended before {what}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen = [(e.type, e.job, e.state, e.cause, e.reason) for e in self.events]
                raise AssertionError(f"no event {what} within {seconds:.0f} s; saw {seen}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 1.0))

    async def finished(self, job_id: str, seconds: float = 120.0) -> DispatchEvent:
        return await self.wait_for(
            lambda e: e.job == job_id and e.type == EventType.FINISHED,
            seconds,
            f"Finished for {job_id}",
        )

    def delivered(self, job_id: str) -> list[DispatchEvent]:
        """The job's events as a consumer keeps them: the library delivers at least once, and a
        transition delivered again (its commit failed, say while the apiserver restarted)
        carries the same id and the same content, so it is kept once."""
        kept: dict[str, DispatchEvent] = {}
        for event in self.of(job_id):
            assert event.id is not None, f"{job_id}: an event without an id: {event}"
            first = kept.setdefault(event.id, event)
            assert first == event, f"{job_id}: id {event.id} delivered as {first} and {event}"
        return list(kept.values())

    def assert_exactly_once(self, job_id: str) -> None:
        """No transition of the job was reported twice, once redeliveries (same id) are merged.

        An eviction or a restart starts a new round in which Admitted and Running may
        legitimately come again; within one round every (attempt, type, state, cause, reason)
        occurs once, and each attempt finishes at most once.
        """
        rounds: list[list[tuple[Any, ...]]] = [[]]
        for event in self.delivered(job_id):
            if event.type in (EventType.EVICTED, EventType.RESTARTED):
                rounds.append([])
            rounds[-1].append((event.attempt, event.type, event.state, event.cause, event.reason))
        for keys in rounds:
            repeated = [key for key, count in Counter(keys).items() if count > 1]
            ids = [e.id for e in self.delivered(job_id)]
            assert not repeated, f"{job_id}: reported more than once: {repeated} (ids {ids})"
        finished = Counter(
            e.attempt for e in self.delivered(job_id) if e.type == EventType.FINISHED
        )
        assert all(count == 1 for count in finished.values()), f"{job_id}: {finished}"


@contextlib.asynccontextmanager
async def open_adapter(settings_json: str, name: str) -> AsyncIterator[tuple[Adapter, EventLog]]:
    """Open an adapter (preflight probe included), start its event log, close both after."""
    adapter = await Adapter.open(AdapterConfig(settings=settings_json, adapter_name=name))
    log = EventLog(adapter)
    log.start()
    try:
        yield adapter, log
    finally:
        await log.stop()
        await adapter.close()
