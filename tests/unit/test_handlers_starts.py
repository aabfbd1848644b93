"""A burst of DispatchJob creations: starts in flight are bounded, each creation handled once.

The burst (a dispatcher submitting thousands of jobs) must queue in the handler, not in the API
client's connection pool, where waiting counts against each request's timeout; and kopf's watch,
lagging behind the burst, must not hand a creation over a second time. kopf's own inventory
makes each job's memo (kopf has no public way to), so the gate is tested as kopf shares it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, cast

import kopf
import pytest
from kopf._core.reactor.inventory import ResourceMemories

from dispatch_kubeflow.handlers import jobs
from dispatch_kubeflow.handlers.serving import ADAPTERS_BY_NAME
from dispatch_kubeflow.handlers.startup import apply_settings
from dispatch_kubeflow.trainjob import JobSpec


class SlowAdapter:
    """An adapter whose starts take a while, counting how many run at once."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.started: list[str] = []

    async def start(self, job: JobSpec) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.01)
        self.running -= 1
        self.started.append(job.job_id)


class Registry:
    def __init__(self, adapter: SlowAdapter) -> None:
        self.adapter = adapter

    def get(self, _namespace: str, _name: str) -> SlowAdapter:
        return self.adapter


async def test_a_burst_of_creations_starts_at_most_starts_in_flight_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each DispatchJob's handlers get their own memo, as kopf's inventory makes them."""

    async def recorded(*_: Any, **__: Any) -> None:
        return None

    monkeypatch.setattr(jobs, "record_start", recorded)
    adapter = SlowAdapter()
    operator_memo = kopf.Memo(registry=Registry(adapter), api=None)
    jobs.share_starts_gate(operator_memo)
    memories = ResourceMemories()
    burst = 3 * jobs.STARTS_IN_FLIGHT

    async def created(index: int) -> None:
        meta = {"name": f"job{index}", "namespace": "team-a", "uid": f"u{index}"}
        body = cast(kopf.RawBody, {"metadata": meta})
        memo: Any = await memories.recall_memo(body, memobase=cast(Any, operator_memo))
        assert memo is not operator_memo
        await jobs.start_attempt(
            memo=memo,
            body=kopf.Body(body),
            name=f"job{index}",
            namespace="team-a",
            spec={"adapter": "a", "image": "trainer:1"},
            logger=logging.getLogger(__name__),
            **{ADAPTERS_BY_NAME: {}},
        )

    await asyncio.gather(*(created(index) for index in range(burst)))
    assert len(adapter.started) == burst
    assert adapter.most == jobs.STARTS_IN_FLIGHT


def test_kopf_skips_events_older_than_its_own_patch_for_up_to_a_minute() -> None:
    """The burst's watch lag stays under this, so no creation is handled twice."""
    settings = kopf.OperatorSettings()
    apply_settings(settings)
    assert settings.persistence.consistency_timeout == 60.0
