"""A burst of DispatchJob creations: handed over, bounded in flight, withdrawn by deletion.

A burst (a dispatcher submitting thousands of jobs) must queue as the operator's own small tasks,
not as kopf's workers, and not in the API client's connection pool, where waiting counts against
each request's timeout; kopf's watch, lagging behind the burst, must not hand a creation over a
second time. kopf's own inventory makes each job's memo (kopf has no public way to), so the
starts are tested as kopf shares them. Retries run on fake loop time (looptime).
"""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any, cast

import kopf
import pytest
from kopf._core.reactor.inventory import ResourceMemories

from dispatch_kubeflow import metrics
from dispatch_kubeflow.errors import OutcomeUnknownError, RuntimeUnsupportedError
from dispatch_kubeflow.handlers import jobs
from dispatch_kubeflow.handlers.serving import ADAPTERS_BY_NAME, AdapterSighting
from dispatch_kubeflow.handlers.starts import STARTS_IN_FLIGHT, Starts
from dispatch_kubeflow.handlers.startup import apply_settings
from dispatch_kubeflow.trainjob import JobSpec

NAMESPACE = "team-a"
LOG = logging.getLogger(__name__)
SIGHTING = AdapterSighting("dispatch-system", "a", NAMESPACE, "True", "Ready", "")


class SlowAdapter:
    """An adapter whose starts take a while (or until released), counting how many run at once."""

    def __init__(self, *, held: bool = False) -> None:
        self.running = 0
        self.most = 0
        self.tried: list[str] = []
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.release = asyncio.Event()
        if not held:
            self.release.set()
        self.failures: list[BaseException] = []
        self.settings = SimpleNamespace(runtimes=[SimpleNamespace(name="torch-distributed")])

    async def start(self, job: JobSpec) -> None:
        self.tried.append(job.job_id)
        if self.failures:
            raise self.failures.pop(0)
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.01)
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(job.job_id)
            raise
        finally:
            self.running -= 1
        self.started.append(job.job_id)


class Registry:
    def __init__(self, adapter: SlowAdapter) -> None:
        self.adapter = adapter

    def get(self, _namespace: str, _name: str) -> SlowAdapter:
        return self.adapter


class Recorded:
    """``record_start`` and ``kopf.warn``, written down instead of sent."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, int, str | None, Any]] = []
        self.warnings: list[tuple[str, str]] = []

    async def record_start(self, _api: Any, _namespace: str, name: str, **kwargs: Any) -> None:
        self.starts.append((name, kwargs["attempt"], kwargs["train_job"], kwargs.get("refused")))

    def warn(self, body: Any, *, reason: str, message: str) -> None:
        self.warnings.append((body["metadata"]["name"], reason))


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    recorded = Recorded()
    monkeypatch.setattr(jobs, "record_start", recorded.record_start)
    monkeypatch.setattr(kopf, "warn", recorded.warn)
    return recorded


class Operator:
    """The operator's memo, and each DispatchJob's copy of it as kopf's inventory makes it."""

    def __init__(self, adapter: SlowAdapter) -> None:
        self.memo = kopf.Memo(registry=Registry(adapter), api=None)
        jobs.share_starts(self.memo)
        self.memories = ResourceMemories()

    @property
    def starts(self) -> Starts:
        return jobs.starts_of(self.memo)

    async def job_memo(self, body: kopf.RawBody) -> Any:
        memo: Any = await self.memories.recall_memo(body, memobase=cast(Any, self.memo))
        assert memo is not self.memo
        return memo

    async def create(self, name: str, **spec: Any) -> None:
        body = job_body(name, **spec)
        await handler(jobs.start_job)(
            memo=await self.job_memo(body),
            body=kopf.Body(body),
            name=name,
            namespace=NAMESPACE,
            spec=body["spec"],
            logger=LOG,
            **{ADAPTERS_BY_NAME: {}},
        )

    async def delete(self, name: str) -> None:
        body = job_body(name)
        await handler(jobs.stop_job)(
            spec=kopf.Spec(kopf.Body(body)),
            status=kopf.Status(kopf.Body(body)),
            name=name,
            namespace=NAMESPACE,
            memo=await self.job_memo(body),
            logger=LOG,
            **{ADAPTERS_BY_NAME: {"a": [SIGHTING]}},
        )


def handler(decorated: object) -> Any:
    """A kopf handler, to call as kopf calls it (kopf's decorators type it as theirs)."""
    return decorated


def job_body(name: str, **spec: Any) -> kopf.RawBody:
    return cast(
        kopf.RawBody,
        {
            "apiVersion": "dispatch.kubeflow.org/v1alpha1",
            "kind": "DispatchJob",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}"},
            "spec": {"adapter": "a", "image": "trainer:1", **spec},
        },
    )


class StoppingAdapter(SlowAdapter):
    def __init__(self, *, held: bool = False) -> None:
        super().__init__(held=held)
        self.stopped: list[str] = []

    async def stop_job(self, job_id: str) -> None:
        self.stopped.append(job_id)


class StoppingRegistry(Registry):
    async def wait_for(self, _namespace: str, _name: str, _within: float) -> SlowAdapter:
        return self.adapter


async def test_a_burst_of_creations_is_handed_over_and_starts_at_most_starts_in_flight_at_once(
    recorded: Recorded,
) -> None:
    adapter = SlowAdapter(held=True)
    operator = Operator(adapter)
    burst = 3 * STARTS_IN_FLIGHT
    pending_before = pending()

    # Every creation handler returns while the starts wait: none holds a kopf worker.
    await asyncio.gather(*(operator.create(f"job{index}") for index in range(burst)))
    assert len(operator.starts) == burst
    assert pending() == pending_before + burst
    await asyncio.sleep(0.05)
    assert adapter.running == STARTS_IN_FLIGHT
    assert adapter.started == []

    adapter.release.set()
    await operator.starts.join()
    assert sorted(adapter.started) == sorted(f"job{index}" for index in range(burst))
    assert adapter.most == STARTS_IN_FLIGHT
    assert len(recorded.starts) == burst
    assert all(train_job == f"{name}-1" for name, _, train_job, _ in recorded.starts)
    assert len(operator.starts) == 0
    assert pending() == pending_before


def pending() -> float:
    value = metrics.REGISTRY.get_sample_value("dispatch_kubeflow_starts_pending")
    assert value is not None
    return value


async def test_a_creation_handled_twice_is_started_once(recorded: Recorded) -> None:
    adapter = SlowAdapter(held=True)
    operator = Operator(adapter)
    await operator.create("twice")
    await operator.create("twice")
    adapter.release.set()
    await operator.starts.join()
    assert adapter.tried == ["twice"]
    assert [name for name, *_ in recorded.starts] == ["twice"]


async def test_a_deletion_withdraws_a_queued_start_and_cancels_one_in_flight_before_stopping(
    recorded: Recorded,
) -> None:
    adapter = StoppingAdapter(held=True)
    operator = Operator(adapter)
    operator.memo.registry = StoppingRegistry(adapter)
    names = [f"job{index}" for index in range(STARTS_IN_FLIGHT + 1)]
    for name in names:
        await operator.create(name)
    await asyncio.sleep(0.05)
    in_flight, queued = names[0], names[-1]
    assert adapter.running == STARTS_IN_FLIGHT
    assert queued not in adapter.tried

    await operator.delete(queued)
    await operator.delete(in_flight)
    assert adapter.stopped == [queued, in_flight]
    # The in-flight start ended before its job was stopped; the queued one never ran.
    assert adapter.cancelled == [in_flight]
    assert not operator.starts.holds((NAMESPACE, queued))
    assert not operator.starts.holds((NAMESPACE, in_flight))

    adapter.release.set()
    await operator.starts.join()
    assert queued not in adapter.tried
    assert sorted(adapter.started) == sorted(names[1:-1])
    assert {name for name, *_ in recorded.starts} == set(names[1:-1])


async def test_a_raised_attempt_waits_for_the_start_handed_over_before_it(
    recorded: Recorded,
) -> None:
    adapter = SlowAdapter(held=True)
    operator = Operator(adapter)
    await operator.create("raised")
    body = job_body("raised", attempt=2)
    with pytest.raises(kopf.TemporaryError, match="attempt 2 waits"):
        await handler(jobs.raise_attempt)(
            old=1,
            new=2,
            status=kopf.Status(kopf.Body(body)),
            memo=await operator.job_memo(body),
            body=kopf.Body(body),
            spec=body["spec"],
            name="raised",
            namespace=NAMESPACE,
            logger=LOG,
            **{ADAPTERS_BY_NAME: {}},
        )
    adapter.release.set()
    await operator.starts.join()
    assert adapter.tried == ["raised"]


@pytest.mark.looptime(start=0)
async def test_a_handed_over_start_whose_outcome_is_unknown_is_tried_again(
    recorded: Recorded,
) -> None:
    adapter = SlowAdapter()
    adapter.failures = [OutcomeUnknownError("the apiserver went away"), RuntimeError("boom")]
    operator = Operator(adapter)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await operator.create("retried")
    await operator.starts.join()
    assert adapter.tried == ["retried"] * 3
    assert adapter.started == ["retried"]
    assert loop.time() - began >= jobs.RETRY_UNKNOWN + jobs.RETRY_FAILED
    assert [(name, train_job) for name, _, train_job, _ in recorded.starts] == [
        ("retried", "retried-1")
    ]


class Reopening(SlowAdapter):
    """An adapter whose settings changed during a start: the operator reopens it, closing this."""

    def __init__(self, registry: Registry, reopened: SlowAdapter) -> None:
        super().__init__()
        self.registry = registry
        self.reopened = reopened

    async def start(self, job: JobSpec) -> None:
        self.tried.append(job.job_id)
        self.registry.adapter = self.reopened
        raise RuntimeError("Session is closed")


@pytest.mark.looptime(start=0)
async def test_a_start_whose_adapter_closed_under_it_is_tried_again_at_once_on_the_new_one(
    recorded: Recorded,
) -> None:
    reopened = SlowAdapter()
    operator = Operator(reopened)
    closing = Reopening(operator.memo.registry, reopened)
    operator.memo.registry.adapter = closing
    loop = asyncio.get_running_loop()
    began = loop.time()
    await operator.create("moved")
    await operator.starts.join()
    assert (closing.tried, reopened.started) == (["moved"], ["moved"])
    assert loop.time() - began < jobs.RETRY_UNKNOWN
    assert [name for name, *_ in recorded.starts] == ["moved"]


async def test_a_handed_over_start_the_adapter_refuses_is_recorded_with_its_cause(
    recorded: Recorded,
) -> None:
    adapter = SlowAdapter()
    adapter.failures = [RuntimeUnsupportedError("runtime torch is not in the adapter's runtimes")]
    operator = Operator(adapter)
    await operator.create("refused")
    await operator.starts.join()
    assert adapter.started == []
    [(name, attempt, train_job, refusal)] = recorded.starts
    assert (name, attempt, train_job) == ("refused", 1, None)
    assert (refusal.reason, refusal.cause) == (jobs.REASON_UNSUPPORTED, "RuntimeUnsupported")
    assert recorded.warnings == [("refused", jobs.REASON_UNSUPPORTED)]


async def test_closing_the_starts_cancels_every_one_left(recorded: Recorded) -> None:
    adapter = SlowAdapter(held=True)
    operator = Operator(adapter)
    for index in range(STARTS_IN_FLIGHT + 5):
        await operator.create(f"job{index}")
    await asyncio.sleep(0.05)
    await operator.starts.close()
    assert len(operator.starts) == 0
    assert len(adapter.cancelled) == STARTS_IN_FLIGHT
    assert recorded.starts == []


def test_kopf_skips_events_older_than_its_own_patch_for_up_to_a_minute() -> None:
    """The burst's watch lag stays under this, so no creation is handled twice."""
    settings = kopf.OperatorSettings()
    apply_settings(settings)
    assert settings.persistence.consistency_timeout == 60.0
