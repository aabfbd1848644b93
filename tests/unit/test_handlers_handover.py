"""A burst of DispatchJob creations: handed over, bounded in flight, withdrawn by deletion.

A burst (a dispatcher submitting thousands of jobs) must queue as the operator's own small tasks,
not as kopf's workers, and not in the API client's connection pool, where waiting counts against
each request's timeout; kopf's watch, lagging behind the burst, must not hand a creation over a
second time. kopf's own inventory makes each job's memo (kopf has no public way to), so the
starts are tested as kopf shares them. Retries run on fake loop time (looptime).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import weakref
from types import SimpleNamespace
from typing import Any, cast

import kopf
import pytest
from kopf._core.engines import posting
from kopf._core.reactor.inventory import ResourceMemories

from dispatch_kubeflow import metrics
from dispatch_kubeflow.constants import STOP_FINALIZER
from dispatch_kubeflow.errors import OutcomeUnknownError, RuntimeUnsupportedError
from dispatch_kubeflow.handlers import jobs
from dispatch_kubeflow.handlers.handover import (
    POSTING_VARS,
    STARTS_IN_FLIGHT,
    STOPS_IN_FLIGHT,
    HandedOver,
)
from dispatch_kubeflow.handlers.serving import ADAPTERS_BY_NAME, AdapterSighting
from dispatch_kubeflow.handlers.startup import apply_settings
from dispatch_kubeflow.trainjob import JobSpec
from tests.unit.cancelling import FailsWhenCancelled

NAMESPACE = "team-a"
LOG = logging.getLogger(__name__)
SIGHTING = AdapterSighting("dispatch-system", "a", NAMESPACE, "True", "Ready", "")


class InFlight:
    """Calls that take a while (or until released), counting how many run at once."""

    def __init__(self, *, held: bool) -> None:
        self.now = 0
        self.most = 0
        self.release = asyncio.Event()
        if not held:
            self.release.set()

    async def run(self) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.01)
            await self.release.wait()
        finally:
            self.now -= 1


class SlowAdapter:
    """An adapter whose starts take a while (or until released)."""

    def __init__(self, *, held: bool = False) -> None:
        self.starts = InFlight(held=held)
        self.tried: list[str] = []
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.failures: list[BaseException] = []
        self.settings = SimpleNamespace(runtimes=[SimpleNamespace(name="torch-distributed")])

    async def start(self, job: JobSpec) -> None:
        self.tried.append(job.job_id)
        if self.failures:
            raise self.failures.pop(0)
        try:
            await self.starts.run()
        except asyncio.CancelledError:
            self.cancelled.append(job.job_id)
            raise
        self.started.append(job.job_id)


class Registry:
    def __init__(self, adapter: SlowAdapter) -> None:
        self.adapter = adapter

    def get(self, _namespace: str, _name: str) -> SlowAdapter:
        return self.adapter


class Recorded:
    """``record_start``, ``kopf.warn`` and finalizer writes, written down instead of sent."""

    def __init__(self) -> None:
        self.starts: list[tuple[str, int, str | None, Any]] = []
        self.warnings: list[tuple[str, str]] = []
        self.finalizers: dict[str, list[str]] = {}
        self.order: list[tuple[str, str]] = []  # ("held" | "released" | "started", job)

    async def change_finalizers(
        self, _api: Any, _plural: str, _namespace: str, name: str, change: Any, **_: Any
    ) -> bool:
        before = self.finalizers.get(name, [])
        ops = change({"finalizers": before, "resourceVersion": "1"})
        after = list(before)
        for op in ops or ():
            if op["op"] == "add":
                after = op["value"]
            elif op["op"] == "remove":
                del after[int(op["path"].rsplit("/", 1)[1])]
        self.finalizers[name] = after
        if STOP_FINALIZER in after and STOP_FINALIZER not in before:
            self.order.append(("held", name))
        if STOP_FINALIZER in before and STOP_FINALIZER not in after:
            self.order.append(("released", name))
        return True

    async def record_start(self, _api: Any, _namespace: str, name: str, **kwargs: Any) -> None:
        self.starts.append((name, kwargs["attempt"], kwargs["train_job"], kwargs.get("refused")))
        self.order.append(("started", name))

    def warn(self, body: Any, *, reason: str, message: str) -> None:
        self.warnings.append((body["metadata"]["name"], reason))


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Recorded:
    recorded = Recorded()
    monkeypatch.setattr(jobs, "record_start", recorded.record_start)
    monkeypatch.setattr(jobs, "change_finalizers", recorded.change_finalizers)
    monkeypatch.setattr(kopf, "warn", recorded.warn)
    return recorded


class Operator:
    """The operator's memo, and each DispatchJob's copy of it as kopf's inventory makes it."""

    def __init__(self, adapter: SlowAdapter) -> None:
        self.memo = kopf.Memo(registry=Registry(adapter), api=None)
        jobs.share_handed_over(self.memo)
        self.memories = ResourceMemories()

    @property
    def starts(self) -> HandedOver:
        return jobs.starts_of(self.memo)

    @property
    def stops(self) -> HandedOver:
        return jobs.stops_of(self.memo)

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

    async def delete(self, name: str, *, status: dict[str, Any] | None = None, **seen: Any) -> None:
        """Hand the deleted job's stop over, as kopf calls the handler for each of its events."""
        body = deleted_body(name, status)
        await handler(jobs.hand_over_stop)(
            type="MODIFIED",
            body=kopf.Body(body),
            status=kopf.Status(kopf.Body(body)),
            memo=await self.job_memo(body),
            logger=LOG,
            **{ADAPTERS_BY_NAME: seen.get("adapters", {"a": [SIGHTING]})},
        )

    async def delete_and_wait(self, name: str, **kwargs: Any) -> None:
        await self.delete(name, **kwargs)
        await self.stops.join()


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


def deleted_body(name: str, status: dict[str, Any] | None = None) -> kopf.RawBody:
    body = job_body(name)
    body["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    body["metadata"]["finalizers"] = [STOP_FINALIZER]
    if status is not None:
        body["status"] = status
    return body


class StoppingAdapter(SlowAdapter):
    def __init__(self, *, held: bool = False, stops_held: bool = False) -> None:
        super().__init__(held=held)
        self.stops = InFlight(held=stops_held)
        self.stopped: list[str] = []
        self.stop_failures: list[BaseException] = []

    async def stop_job(self, job_id: str) -> None:
        if self.stop_failures:
            raise self.stop_failures.pop(0)
        await self.stops.run()
        self.stopped.append(job_id)


class StoppingRegistry(Registry):
    async def wait_for(self, _namespace: str, _name: str, _within: float) -> SlowAdapter:
        return self.adapter


def stopping(adapter: StoppingAdapter, recorded: Recorded, *held: str) -> Operator:
    """An operator whose adapter is open at once, and the jobs ``held`` by the stop finalizer."""
    operator = Operator(adapter)
    operator.memo.registry = StoppingRegistry(adapter)
    for name in held:
        recorded.finalizers[name] = [STOP_FINALIZER]
    return operator


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
    assert adapter.starts.now == STARTS_IN_FLIGHT
    assert adapter.started == []

    adapter.starts.release.set()
    await operator.starts.join()
    assert sorted(adapter.started) == sorted(f"job{index}" for index in range(burst))
    assert adapter.starts.most == STARTS_IN_FLIGHT
    assert len(recorded.starts) == burst
    assert all(train_job == f"{name}-1" for name, _, train_job, _ in recorded.starts)
    assert len(operator.starts) == 0
    assert pending() == pending_before


def pending(gauge: str = "dispatch_kubeflow_starts_pending") -> float:
    value = metrics.REGISTRY.get_sample_value(gauge)
    assert value is not None
    return value


async def test_a_creation_puts_the_stop_finalizer_on_before_it_starts(recorded: Recorded) -> None:
    operator = Operator(SlowAdapter())
    await operator.create("held")
    await operator.starts.join()
    assert recorded.order == [("held", "held"), ("started", "held")]
    assert recorded.finalizers["held"] == [STOP_FINALIZER]


async def test_a_burst_of_deletions_is_handed_over_and_stops_at_most_stops_in_flight_at_once(
    recorded: Recorded,
) -> None:
    """Every deletion's handler returns at once; each job is released only once it is stopped."""
    adapter = StoppingAdapter(stops_held=True)
    burst = [f"job{index}" for index in range(3 * STOPS_IN_FLIGHT)]
    operator = stopping(adapter, recorded, *burst)
    pending_before = pending("dispatch_kubeflow_stops_pending")

    await asyncio.gather(*(operator.delete(name) for name in burst))
    assert len(operator.stops) == len(burst)
    assert pending("dispatch_kubeflow_stops_pending") == pending_before + len(burst)
    await asyncio.sleep(0.05)
    assert adapter.stops.now == STOPS_IN_FLIGHT
    assert not [entry for entry in recorded.order if entry[0] == "released"]

    adapter.stops.release.set()
    await operator.stops.join()
    assert sorted(adapter.stopped) == sorted(burst)
    assert adapter.stops.most == STOPS_IN_FLIGHT
    assert all(recorded.finalizers[name] == [] for name in burst)
    assert pending("dispatch_kubeflow_stops_pending") == pending_before


async def test_the_events_of_a_job_already_stopped_do_not_stop_it_again(
    recorded: Recorded,
) -> None:
    """kopf lags behind a burst: the job's events from before its release come after it."""
    adapter = StoppingAdapter()
    operator = stopping(adapter, recorded, "late")
    await operator.delete("late")
    await operator.delete("late")  # while its stop is handed over
    await operator.stops.join()
    await operator.delete_and_wait("late")  # after it is done
    assert adapter.stopped == ["late"]
    assert [entry for entry in recorded.order if entry[0] == "released"] == [("released", "late")]


@pytest.mark.looptime(start=0)
async def test_a_stop_that_fails_is_tried_again_and_holds_the_job_until_it_succeeds(
    recorded: Recorded,
) -> None:
    adapter = StoppingAdapter()
    adapter.stop_failures = [OutcomeUnknownError("TrainJob/kept-1 remains"), RuntimeError("boom")]
    operator = stopping(adapter, recorded, "kept")
    loop = asyncio.get_running_loop()
    began = loop.time()
    await operator.delete("kept")
    await asyncio.sleep(jobs.RETRY_UNKNOWN + 1)
    assert recorded.finalizers["kept"] == [STOP_FINALIZER]
    await operator.stops.join()
    assert adapter.stopped == ["kept"]
    assert recorded.finalizers["kept"] == []
    assert loop.time() - began >= jobs.RETRY_UNKNOWN + jobs.RETRY_FAILED


class FailingWhenCancelled(StoppingAdapter):
    """An adapter whose first stop, cancelled, ends with an outcome unknown instead: a read-back's
    request failing (the client closed) as its stop is cancelled, both as the operator stops."""

    def __init__(self) -> None:
        super().__init__()
        self.reading_back = FailsWhenCancelled(
            OutcomeUnknownError("reading the job's objects: Connector is closed.")
        )

    async def stop_job(self, job_id: str) -> None:
        self.tried.append(job_id)
        await self.reading_back()


@pytest.mark.looptime(start=0)
async def test_a_stop_that_fails_as_it_is_cancelled_is_not_tried_again(
    recorded: Recorded,
) -> None:
    """Closing the stops ends each, even one whose cancellation arrived as a failure."""
    adapter = FailingWhenCancelled()
    operator = stopping(adapter, recorded, "held")
    await operator.delete("held")
    await asyncio.sleep(0.05)
    async with asyncio.timeout(jobs.RETRY_UNKNOWN * 3):
        await operator.stops.close()
    assert adapter.tried == ["held"]
    assert recorded.finalizers["held"] == [STOP_FINALIZER]


async def test_a_job_never_started_whose_adapter_does_not_exist_is_released_without_a_stop(
    recorded: Recorded,
) -> None:
    adapter = StoppingAdapter()
    operator = Operator(adapter)
    recorded.finalizers["orphan"] = [STOP_FINALIZER]
    await operator.delete_and_wait("orphan", adapters={})
    assert adapter.stopped == []
    assert recorded.order == [("released", "orphan")]


async def test_closing_the_stops_leaves_each_job_held(recorded: Recorded) -> None:
    """The next operator's first listing brings the deleted jobs back, still held."""
    adapter = StoppingAdapter(stops_held=True)
    operator = stopping(adapter, recorded, "held")
    await operator.delete("held")
    await asyncio.sleep(0.05)
    await operator.stops.close()
    assert len(operator.stops) == 0
    assert recorded.finalizers["held"] == [STOP_FINALIZER]


async def test_a_creation_handled_twice_is_started_once(recorded: Recorded) -> None:
    adapter = SlowAdapter(held=True)
    operator = Operator(adapter)
    await operator.create("twice")
    await operator.create("twice")
    adapter.starts.release.set()
    await operator.starts.join()
    assert adapter.tried == ["twice"]
    assert [name for name, *_ in recorded.starts] == ["twice"]


async def test_a_deletion_withdraws_a_queued_start_and_cancels_one_in_flight_before_stopping(
    recorded: Recorded,
) -> None:
    adapter = StoppingAdapter(held=True)
    operator = stopping(adapter, recorded)
    names = [f"job{index}" for index in range(STARTS_IN_FLIGHT + 1)]
    for name in names:
        await operator.create(name)
    await asyncio.sleep(0.05)
    in_flight, queued = names[0], names[-1]
    assert adapter.starts.now == STARTS_IN_FLIGHT
    assert queued not in adapter.tried

    await operator.delete_and_wait(queued)
    await operator.delete_and_wait(in_flight)
    assert adapter.stopped == [queued, in_flight]
    # The in-flight start ended before its job was stopped; the queued one never ran.
    assert adapter.cancelled == [in_flight]
    assert not operator.starts.holds((NAMESPACE, queued))
    assert not operator.starts.holds((NAMESPACE, in_flight))

    adapter.starts.release.set()
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
    adapter.starts.release.set()
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

    def __init__(self, registry: Registry, reopened: SlowAdapter, error: Exception) -> None:
        super().__init__()
        self.registry = registry
        self.reopened = reopened
        self.error = error

    async def start(self, job: JobSpec) -> None:
        self.tried.append(job.job_id)
        self.registry.adapter = self.reopened
        raise self.error


@pytest.mark.looptime(start=0)
@pytest.mark.parametrize(
    "error",
    [RuntimeError("Session is closed"), OutcomeUnknownError("Connector is closed.")],
    ids=["failed", "outcome-unknown"],
)
async def test_a_start_whose_adapter_closed_under_it_is_tried_again_at_once_on_the_new_one(
    recorded: Recorded, error: Exception
) -> None:
    """Whatever the failure: a request of a closed adapter's client says nothing of the job."""
    reopened = SlowAdapter()
    operator = Operator(reopened)
    closing = Reopening(operator.memo.registry, reopened, error)
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


def test_kopf_lets_an_idle_objects_worker_go_within_a_second() -> None:
    """An idle worker holds the last DispatchJob it handled: in a burst, one per job would."""
    settings = kopf.OperatorSettings()
    default = settings.queueing.idle_timeout
    apply_settings(settings)
    assert settings.queueing.idle_timeout == 1.0 < default


class Cause:
    """What kopf's context holds while a handler runs (its cause: the body, the patch)."""


HANDLER_ONLY: contextvars.ContextVar[Cause] = contextvars.ContextVar("handler_only")


async def test_handed_over_work_keeps_nothing_of_the_handlers_context_but_posting() -> None:
    """Work waiting for its turn must not keep the handler's context (kopf's cause in it), by
    its task or by its done callback; where kopf posts Kubernetes Events stays visible to it."""
    handed = HandedOver("stop", STOPS_IN_FLIGHT, metrics.STOPS_PENDING)
    turn = asyncio.Event()
    queue: asyncio.Queue[Any] = asyncio.Queue()
    seen: list[tuple[Cause | None, Any]] = []

    async def work() -> None:
        await turn.wait()
        seen.append((HANDLER_ONLY.get(None), posting.event_queue_var.get(None)))

    def handler() -> None:
        posting.event_queue_var.set(queue)  # as kopf sets it for each object
        HANDLER_ONLY.set(Cause())
        handed.hand_over((NAMESPACE, "job"), work)

    handlers_context = contextvars.copy_context()
    handlers_context.run(handler)
    cause = weakref.ref(handlers_context[HANDLER_ONLY])
    del handlers_context
    gc.collect()
    assert cause() is None, "the waiting work keeps the handler's cause"
    turn.set()
    await handed.join()
    assert seen == [(None, queue)]


def test_the_posting_variables_kept_are_kopfs() -> None:
    """kopf keeps them in its private posting module: an upgrade that renames them fails here."""
    names = {
        value.name for value in vars(posting).values() if isinstance(value, contextvars.ContextVar)
    }
    assert names >= POSTING_VARS
