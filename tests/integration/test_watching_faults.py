"""Issue 12 on the real kube-apiserver: the watch keeps its truth when the cluster misbehaves.

The test plays Trainer, JobSet, Kueue and the kubelet as ``test_watching`` does (its ``World``
and ``Watcher``), and checks what the supervisor reports.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow import constants
from dispatch_kubeflow.adapter import Adapter
from dispatch_kubeflow.constants import Cause, EventType, State
from dispatch_kubeflow.errors import DispatchError, UnavailableError
from dispatch_kubeflow.events import DispatchEvent
from dispatch_kubeflow.reporting import MemoryStore
from dispatch_kubeflow.trainjob import JobSpec
from tests.integration.policies import DenyingPolicy
from tests.integration.test_adapter import adapter, runtime
from tests.integration.test_operator import eventually
from tests.integration.test_watching import (
    Watcher,
    World,
    clock,
    cond,
    queued_job,
    running,
    terminated,
    ts,
    watcher,
    world,
)

__all__ = ["adapter", "clock", "runtime", "watcher", "world"]  # fixtures used from elsewhere


def at(type_: str, when: datetime, status: str = "True", reason: str = "", msg: str = "") -> Any:
    """A condition that changed at ``when``, a real instant (pods' creation times are real)."""
    return {**cond(type_, status, reason or type_, msg), "lastTransitionTime": ts(when)}


async def wait_until_past(instant: datetime) -> None:
    """The apiserver stamps creationTimestamp in whole seconds of this machine's clock."""
    remaining = (instant - datetime.now(UTC)).total_seconds()
    if remaining > 0:
        await asyncio.sleep(remaining)


async def test_item4_a_readmitted_job_failing_with_exit_1_is_program_error(
    world: World, watcher: Watcher
) -> None:
    wl = await queued_job(world, watcher, "readm")
    admitted_at = datetime.now(UTC).replace(microsecond=0)
    await world.workload_status(wl, conditions=[at("Admitted", admitted_at)])
    await watcher.wait_event("readm", EventType.ADMITTED)
    await world.trainjob_spec("readm", suspend=False)
    await world.pod("readm", "readm-old")
    await world.pod_status(
        "readm-old",
        phase="Pending",
        conditions=[cond("PodScheduled", "False", "Unschedulable", "0/3 nodes are available")],
    )
    await watcher.wait_for(
        lambda e: e.job == "readm" and e.cause is Cause.NO_CAPACITY, "NoCapacity while admitted"
    )

    # Kueue evicts: the job is suspended and its pod deleted; the restart attempt stays 0.
    evicted_at = datetime.now(UTC).replace(microsecond=0)
    await world.workload_status(
        wl,
        conditions=[
            at("Admitted", evicted_at, "False", "NoReservation"),
            at("Evicted", evicted_at, reason="Preempted", msg="Preempted to accommodate"),
        ],
    )
    await watcher.wait_event("readm", EventType.EVICTED)
    await world.trainjob_spec("readm", suspend=True)
    old = await world.core.read_namespaced_pod("readm-old", world.ns)
    await world.core.delete_namespaced_pod("readm-old", world.ns, grace_period_seconds=0)

    # Readmitted a second after the old pod was created (Kueue resets Evicted to False).
    readmitted_at = old.metadata.creation_timestamp.astimezone(UTC) + timedelta(seconds=1)
    readmitted_at = max(readmitted_at, evicted_at)
    await world.workload_status(
        wl,
        conditions=[
            at("Admitted", readmitted_at),
            at("Evicted", readmitted_at, "False", "QuotaReserved", "Previously: Preempted"),
        ],
    )
    await watcher.wait_until(
        lambda: watcher.of("readm").count(EventType.ADMITTED) >= 2, "readmission"
    )
    await wait_until_past(readmitted_at)
    await world.trainjob_spec("readm", suspend=False)
    await world.pod("readm", "readm-new")
    await world.pod_status("readm-new", phase="Running", containerStatuses=[running()])
    await watcher.wait_event("readm", EventType.RUNNING)
    await world.pod_status("readm-new", phase="Failed", containerStatuses=[terminated(1)])
    await world.trainjob_status("readm", conditions=[cond("Failed", reason="FailedJobs")])

    finished = await watcher.wait_event("readm", EventType.FINISHED)
    assert (finished.state, finished.cause) == (State.FAILED, Cause.PROGRAM_ERROR)
    assert [(e.name, e.exit_code) for e in finished.evidence] == [("readm-new", 1)]


async def test_item5_node_a_lost_and_back_then_node_b_lost_gives_two_node_lost_events(
    world: World, watcher: Watcher, namespace: str
) -> None:
    node_a, node_b = f"a-{namespace}"[:63], f"b-{namespace}"[:63]
    await world.node(node_a)
    await world.node(node_b)
    await world.trainjob("twice")
    for name, node in (("twice-a", node_a), ("twice-b", node_b)):
        await world.pod("twice", name, node=node)
        await world.pod_status(name, phase="Running", containerStatuses=[running()])
    await watcher.wait_event("twice", EventType.RUNNING)

    def unreachable(since: datetime) -> dict[str, str]:
        return {"key": constants.TAINT_UNREACHABLE, "effect": "NoExecute", "timeAdded": ts(since)}

    now = datetime.now(UTC)
    await world.taint(node_a, unreachable(now))
    await watcher.wait_event("twice", EventType.NODE_LOST)
    await world.taint(node_a)  # back
    await world.taint(node_b, unreachable(now + timedelta(seconds=1)))
    await watcher.wait_until(
        lambda: watcher.of("twice").count(EventType.NODE_LOST) == 2, "the second NodeLost"
    )
    await watcher.settle(world, "barrier")

    lost = [e for e in watcher.events if e.job == "twice" and e.type is EventType.NODE_LOST]
    assert [(e.cause, e.evidence[0].node) for e in lost] == [
        (Cause.NODE_LOST, node_a),
        (Cause.NODE_LOST, node_b),
    ]
    assert watcher.of("twice").count(EventType.NODE_LOST) == 2


async def test_item2_a_library_consumer_that_dies_after_taking_events_gets_them_again(
    kube_api: Any, namespace: str, world: World
) -> None:
    """The library's default store commits once the consumer asks for more: a consumer that took
    an event and died before that gets it again from the next adapter, with the same id."""
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    settings = make_settings(namespace, kueue=False)
    await world.trainjob("dies")
    first = Supervisor(kube_api, settings, ADAPTER).events()
    taken = await asyncio.wait_for(anext(first), 30)
    assert (taken.job, taken.type) == ("dies", EventType.SUBMITTED)
    # The consumer "dies" here: it never asks for the next event and never closes the stream
    # (``first`` is kept referenced, so nothing closes it for it).
    second = Supervisor(kube_api, settings, ADAPTER).events()
    try:
        again = await asyncio.wait_for(anext(second), 30)
        assert (again.job, again.type, again.id) == ("dies", EventType.SUBMITTED, taken.id)
        assert again.id == "dies/1/1"
    finally:
        await second.aclose()
        await first.aclose()


async def test_a_library_consumer_that_closes_after_taking_a_batch_has_it_all_committed(
    kube_api: Any, namespace: str, world: World
) -> None:
    """A taken transition is committed once the consumer asks for more; a consumer that takes
    the first two and closes the stream before that still has both of them recorded, and a new
    stream from the same supervisor goes on with the next job."""
    from dispatch_kubeflow.constants import ANNOTATION_REPORTED
    from dispatch_kubeflow.reporting import ReportedRecord
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    settings = make_settings(namespace, kueue=False)
    jobs = ["batch-a", "batch-b"]
    for job in jobs:
        await world.trainjob(job, suspend=True)  # both there before the first LIST: one batch
    supervisor = Supervisor(kube_api, settings, ADAPTER)
    stream = supervisor.events()
    taken = [await asyncio.wait_for(anext(stream), 30) for _ in jobs]
    assert sorted((e.job, e.type) for e in taken) == [(j, EventType.SUBMITTED) for j in jobs]
    await stream.aclose()
    again = supervisor.events()
    try:
        await world.trainjob("batch-c", suspend=True)
        following = await asyncio.wait_for(anext(again), 30)
        assert (following.job, following.type) == ("batch-c", EventType.SUBMITTED)
    finally:
        await again.aclose()
    for job in jobs:
        trainjob = await world.custom.get_namespaced_custom_object(name=f"{job}-1", **world._tj)
        annotations = trainjob["metadata"].get("annotations") or {}
        record = ReportedRecord.from_json(annotations.get(ANNOTATION_REPORTED))
        assert record is not None, (job, annotations)
        assert record.submitted, (job, record)


class CommittedFirstStore(MemoryStore):
    """Records kept with the events' effect, so committed before they are handed on, as the
    operator's DispatchJob status store does."""

    effects_committed = True


class HangingCommits:
    """Wraps a supervisor's store: while ``jobs`` is set, a commit of one of them waits for
    ``released`` (``hanging`` says one does), then writes as the store would."""

    def __init__(self, store: Any) -> None:
        self.jobs: set[str] = set()
        self.released, self.hanging = asyncio.Event(), asyncio.Event()
        self._write = store.commit
        store.commit = self._commit

    async def _commit(self, job: str, attempt: int, record: Any, events: Any) -> None:
        if job in self.jobs:
            self.hanging.set()
            await self.released.wait()
        await self._write(job, attempt, record, events)


@pytest.mark.parametrize(
    "committed_first", [False, True], ids=["annotation-store", "effects-store"]
)
async def test_a_hanging_commit_holds_only_its_own_jobs_events(
    kube_api: Any, namespace: str, world: World, committed_first: bool
) -> None:
    """While one job's record write hangs, another job's events are still delivered; once the
    write ends, the first job is derived again and goes on, and every record is written. With
    the annotation store the write that hangs is the taken Submitted's, after delivery; with a
    store that commits first it is the Finished's, before delivery."""
    from dispatch_kubeflow.constants import ANNOTATION_REPORTED
    from dispatch_kubeflow.reporting import ReportedRecord
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    settings = make_settings(namespace, kueue=False)
    supervisor = Supervisor(
        kube_api, settings, ADAPTER, store=CommittedFirstStore() if committed_first else None
    )
    store: Any = supervisor.store
    commits = HangingCommits(store)
    stream = supervisor.events()
    try:
        await world.trainjob("slow", suspend=True)
        first = await asyncio.wait_for(anext(stream), 30)
        assert (first.job, first.type) == ("slow", EventType.SUBMITTED)
        commits.jobs.add("slow")
        following = asyncio.ensure_future(anext(stream))  # takes "slow"'s Submitted
        await world.trainjob_status("slow", conditions=[cond("Complete", reason="JobsCompleted")])
        await asyncio.wait_for(commits.hanging.wait(), 10)
        await world.trainjob("quick", suspend=True)
        second = await asyncio.wait_for(following, 10)
        assert (second.job, second.type) == ("quick", EventType.SUBMITTED)
        held = supervisor.held()
        assert held["working"] == 1, held  # "slow" only
        # The Complete came after the write began only when that write is the taken Submitted's.
        assert held["held_changes"] == (0 if committed_first else 1), held
        commits.released.set()
        third = await asyncio.wait_for(anext(stream), 30)
        assert (third.job, third.type, third.state) == ("slow", EventType.FINISHED, State.SUCCEEDED)
    finally:
        commits.released.set()
        await stream.aclose()
    for job, finished in (("slow", True), ("quick", False)):
        if committed_first:
            record = store.records.get((job, 1))
        else:
            trainjob = await world.custom.get_namespaced_custom_object(name=f"{job}-1", **world._tj)
            annotations = trainjob["metadata"]["annotations"]
            record = ReportedRecord.from_json(annotations[ANNOTATION_REPORTED])
        assert record is not None, job
        assert record.submitted, record
        assert record.finished is finished, record


async def test_a_write_still_hanging_when_the_stream_closes_is_given_up_and_comes_again(
    kube_api: Any, namespace: str, world: World
) -> None:
    """A taken transition whose write still hangs when the stream closes gets one request
    timeout, then is given up: the close ends, and the next stream delivers it again, same id."""
    from dispatch_kubeflow.settings.models import Timeouts
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    timeout = 2.0
    settings = make_settings(namespace, kueue=False).model_copy(
        update={"timeouts": Timeouts.model_validate({"request": f"{timeout:.0f}s"})}
    )
    supervisor = Supervisor(kube_api, settings, ADAPTER)
    commits = HangingCommits(supervisor.store)
    stream = supervisor.events()
    await world.trainjob("stuck", suspend=True)
    first = await asyncio.wait_for(anext(stream), 30)
    assert (first.job, first.type) == ("stuck", EventType.SUBMITTED)
    commits.jobs.add("stuck")
    following = asyncio.ensure_future(anext(stream))  # takes the Submitted: its write hangs
    await asyncio.wait_for(commits.hanging.wait(), 10)
    loop = asyncio.get_running_loop()
    closing = loop.time()
    following.cancel()  # the consumer goes away while the write hangs
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(following, 10 * timeout)
    assert loop.time() - closing >= timeout * 0.9  # the write was given its time
    commits.jobs.clear()
    again = supervisor.events()
    try:
        repeated = await asyncio.wait_for(anext(again), 30)
    finally:
        await again.aclose()
    assert (repeated.job, repeated.type, repeated.id) == ("stuck", EventType.SUBMITTED, first.id)


async def test_a_job_id_used_again_while_its_finished_write_hangs_is_a_new_job(
    kube_api: Any, namespace: str, world: World
) -> None:
    """The TrainJob of a job id used again arrives while the write of the old one's Finished
    hangs: the new TrainJob waits for that write, then is a new job with its own Submitted."""
    from dispatch_kubeflow.constants import KIND_TRAINJOB
    from dispatch_kubeflow.kube.objects import uid_of
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    supervisor = Supervisor(kube_api, make_settings(namespace, kueue=False), ADAPTER)
    commits = HangingCommits(supervisor.store)
    stream = supervisor.events()
    try:
        await world.trainjob("again", suspend=True)
        first = await asyncio.wait_for(anext(stream), 30)
        assert (first.job, first.type) == ("again", EventType.SUBMITTED)
        supervisor.note_stopped("again")
        await world.delete_trainjob("again")
        finished = await asyncio.wait_for(anext(stream), 30)
        assert (finished.type, finished.cause) == (EventType.FINISHED, Cause.STOPPED)
        commits.jobs.add("again")
        following = asyncio.ensure_future(anext(stream))  # takes the Finished: its write hangs
        await asyncio.wait_for(commits.hanging.wait(), 10)
        created = await world.trainjob("again", suspend=True)
        trainjobs = next(i for i in supervisor.informers if i.kind == KIND_TRAINJOB)

        async def seen_and_taken_up() -> bool:
            cached = trainjobs.get("again-1", namespace)
            return (
                cached is not None
                and uid_of(cached) == uid_of(created)
                and not (supervisor.backlog())
            )

        await eventually(seen_and_taken_up, "the new TrainJob taken off the queue")
        for _ in range(10):  # the supervisor's loop, woken by that change, runs before the write
            await asyncio.sleep(0)
        commits.jobs.clear()
        commits.released.set()
        again = await asyncio.wait_for(following, 30)
        assert (again.job, again.type, again.attempt) == ("again", EventType.SUBMITTED, 1)
    finally:
        commits.released.set()
        await stream.aclose()


async def test_item7_a_refused_stop_job_reports_nothing_and_the_job_ends_as_it_ends(
    adapter: Adapter, kube_api: Any, namespace: str, world: World
) -> None:
    """stop_job whose delete the apiserver refuses is an error and no event; the job then ends
    as it really ends (here: Succeeded), not Stopped."""
    watcher = Watcher(adapter.supervisor).start()
    try:
        await adapter.start(JobSpec(job_id="held"))
        await watcher.wait_event("held", EventType.SUBMITTED)
        await adapter.start(JobSpec(job_id="settled"))
        await watcher.wait_event("settled", EventType.SUBMITTED)
        before = watcher.of("held")
        async with DenyingPolicy(
            kube_api,
            namespace,
            group=constants.TRAINER_GROUP,
            version=constants.TRAINER_VERSION,
            resources=[constants.TRAINJOBS],
            operations=["DELETE"],
            expression="false",
            message="deleting TrainJobs is refused by this test",
        ) as policy:
            await until_delete_refused(world, policy)
            with pytest.raises(DispatchError, match="refused by this test"):
                await adapter.stop_job("held")
            await adapter.start(JobSpec(job_id="barrier"))
            await watcher.wait_event("barrier", EventType.SUBMITTED)
            assert watcher.of("held") == before  # no Stopped, no event at all
        await world.trainjob_status("held", conditions=[cond("Complete", reason="JobsCompleted")])
        finished = await watcher.wait_event("held", EventType.FINISHED)
        assert (finished.state, finished.cause) == (State.SUCCEEDED, None)
        assert watcher.of("held") == [*before, EventType.FINISHED]
    finally:
        await watcher.stop()


async def test_item7_stopped_is_reported_once_the_delete_is_accepted(
    adapter: Adapter, world: World
) -> None:
    watcher = Watcher(adapter.supervisor).start()
    try:
        await adapter.start(JobSpec(job_id="ends"))
        await watcher.wait_event("ends", EventType.SUBMITTED)
        await adapter.stop_job("ends")
        finished = await watcher.wait_event("ends", EventType.FINISHED)
        assert (finished.state, finished.cause) == (State.STOPPED, Cause.STOPPED)
        await adapter.start(JobSpec(job_id="barrier"))
        await watcher.wait_event("barrier", EventType.SUBMITTED)
        assert watcher.of("ends").count(EventType.FINISHED) == 1
        assert EventType.VANISHED not in watcher.of("ends")
    finally:
        await watcher.stop()


async def until_delete_refused(world: World, policy: DenyingPolicy) -> None:
    """Wait until the policy is in force: deleting a TrainJob (dry run) is refused."""
    await world.trainjob("probe-delete")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while loop.time() < deadline:
        try:
            await world.custom.delete_namespaced_custom_object(
                name="probe-delete-1", dry_run="All", **world._tj
            )
        except ApiException as error:
            if policy.refused(error):
                return
            raise
        await asyncio.sleep(0.2)
    raise AssertionError("the policy refusing TrainJob deletes was not in force within 30s")


async def test_item13_a_finished_job_whose_objects_are_gone_is_forgotten(
    world: World, watcher: Watcher
) -> None:
    """Nothing of a finished, deleted job stays in memory; its id used again is a new job."""
    jobs = ["done0", "done1", "stopped"]
    for job in jobs:
        await world.trainjob(job)
        await world.pod(job, f"{job}-p0")
    for job in jobs[:2]:
        await world.pod_status(f"{job}-p0", phase="Succeeded", containerStatuses=[terminated(0)])
        await world.trainjob_status(job, conditions=[cond("Complete", reason="JobsCompleted")])
        await watcher.wait_event(job, EventType.FINISHED)
    watcher.supervisor.note_stopping("stopped")
    watcher.supervisor.note_stopped("stopped")
    for job in jobs:
        await world.delete_trainjob(job)
        await world.core.delete_namespaced_pod(f"{job}-p0", world.ns)
    await watcher.wait_event("stopped", EventType.FINISHED)

    async def emptied() -> bool:
        return not any(watcher.supervisor.held().values())

    await eventually(emptied, "the supervisor to keep nothing of finished, deleted jobs")

    await world.trainjob("done0")
    await watcher.wait_until(
        lambda: watcher.of("done0").count(EventType.SUBMITTED) == 2, "done0 submitted again"
    )


class FailingCommits(MemoryStore):
    """The in-memory store, whose first ``failures`` commits raise ``error``."""

    def __init__(self, failures: int, error: Exception) -> None:
        super().__init__()
        self.failures = failures
        self.error = error
        self.tried = 0

    async def commit(self, job: str, attempt: int, record: Any, events: Any) -> None:
        self.tried += 1
        if self.failures:
            self.failures -= 1
            raise self.error
        await super().commit(job, attempt, record, events)


@pytest.mark.parametrize(
    "error",
    [
        UnavailableError("the apiserver is not answering (this test)"),
        RuntimeError("a fault of the store's own (this test)"),
    ],
    ids=["apiserver-unavailable", "store-fault"],
)
async def test_a_taken_transition_whose_commit_fails_is_committed_again_not_redelivered(
    kube_api: Any, namespace: str, world: World, error: Exception
) -> None:
    """Whatever a store raises when it commits what the consumer took, the stream goes on, the
    transition is committed again, and it is never delivered twice."""
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    store = FailingCommits(failures=3, error=error)
    supervisor = Supervisor(kube_api, make_settings(namespace, kueue=False), ADAPTER, store=store)
    watcher = Watcher(supervisor).start()
    try:
        await world.trainjob("flaky")
        await watcher.wait_event("flaky", EventType.SUBMITTED)

        async def committed() -> bool:
            return ("flaky", 1) in store.records

        await eventually(committed, "the Submitted transition committed after 3 failures")
        assert store.tried == 4
        await world.trainjob_status("flaky", conditions=[cond("Complete", reason="Done")])
        await watcher.wait_event("flaky", EventType.FINISHED)
        await watcher.settle(world, "barrier")
        assert watcher.of("flaky")[0] == EventType.SUBMITTED
        assert watcher.of("flaky").count(EventType.SUBMITTED) == 1
        assert supervisor.held()["taken"] == 0
    finally:
        await watcher.stop()


class TrailingQueue(asyncio.Queue[Any]):
    """A supervisor's queue in which every watched change is followed at once by an item that
    is no change (the Lease timer waking), as happens when the two arrive together."""

    async def put(self, item: Any) -> None:
        from dispatch_kubeflow.kube.informer import Change
        from dispatch_kubeflow.supervisor import HeartbeatCheck

        await super().put(item)
        if isinstance(item, Change):
            await super().put(HeartbeatCheck())


async def test_a_change_followed_by_an_item_that_is_no_change_is_still_derived(
    kube_api: Any, namespace: str, world: World
) -> None:
    """A change held back to be derived with the ones after it is derived even when what comes
    after it is not a change: the job is not left until something else happens to change."""
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    store = CommittedFirstStore()  # no commit after delivery: a job is idle once handed on
    supervisor = Supervisor(kube_api, make_settings(namespace, kueue=False), ADAPTER, store=store)
    supervisor._queue = TrailingQueue()
    stream = supervisor.events()
    try:
        for job in ("first", "trail"):  # "first": every kind has listed before "trail" comes
            await world.trainjob(job, suspend=True)
            submitted = await asyncio.wait_for(anext(stream), 10)
            assert (submitted.job, submitted.type) == (job, EventType.SUBMITTED)
        await world.trainjob_status("trail", conditions=[cond("Complete", reason="JobsCompleted")])
        finished = await asyncio.wait_for(anext(stream), 10)
        assert (finished.job, finished.type, finished.state) == (
            "trail",
            EventType.FINISHED,
            State.SUCCEEDED,
        )
    finally:
        await stream.aclose()


class LaggingPodWatch(asyncio.Queue[Any]):
    """A supervisor's queue that holds back the pod watch's changes while ``lagging`` is set,
    as a pod watch that is slow, or relisting after a drop, does; ``catch_up`` lets them in."""

    def __init__(self) -> None:
        super().__init__()
        self.lagging = False
        self.held: list[Any] = []

    async def put(self, item: Any) -> None:
        from dispatch_kubeflow.kube.informer import Change

        if self.lagging and isinstance(item, Change) and item.kind == constants.KIND_POD:
            self.held.append(item)
            return
        await super().put(item)

    async def catch_up(self) -> None:
        self.lagging = False
        for item in self.held:
            await super().put(item)
        self.held.clear()


def lagging(supervisor: Any) -> tuple[LaggingPodWatch, Watcher]:
    """``supervisor`` watched through a ``LaggingPodWatch``, and a ``Watcher`` of its events."""
    queue = LaggingPodWatch()
    supervisor._queue = queue
    return queue, Watcher(supervisor).start()


async def finish_behind_the_pod_watch(
    world: World,
    watcher: Watcher,
    queue: LaggingPodWatch,
    job: str,
    *,
    container: dict[str, Any],
    trainjob_condition: dict[str, Any],
    pod_seen: bool = True,
) -> DispatchEvent:
    """A job's pod ends as ``container`` says, then its TrainJob as ``trainjob_condition``
    says, while the pod watch holds back the pod's end (and, unless ``pod_seen``, the pod);
    the job's Finished, once the pod watch has caught up."""
    await world.trainjob(job)
    await watcher.wait_event(job, EventType.SUBMITTED)
    queue.lagging = not pod_seen
    await world.pod(job, f"{job}-0")
    await world.pod_status(f"{job}-0", phase="Running", containerStatuses=[running()])
    if pod_seen:
        await watcher.wait_event(job, EventType.RUNNING)
    queue.lagging = True
    await world.pod_status(f"{job}-0", phase=ended_phase(container), containerStatuses=[container])
    await world.trainjob_status(job, conditions=[trainjob_condition])
    finished = await watcher.wait_event(job, EventType.FINISHED)
    await queue.catch_up()
    return finished


async def job_running(world: World, watcher: Watcher, job: str) -> None:
    """``job`` submitted, its one pod ``{job}-0`` running, and both events reported."""
    await world.trainjob(job)
    await watcher.wait_event(job, EventType.SUBMITTED)
    await world.pod(job, f"{job}-0")
    await world.pod_status(f"{job}-0", phase="Running", containerStatuses=[running()])
    await watcher.wait_event(job, EventType.RUNNING)


def ended_phase(container: dict[str, Any]) -> str:
    """The phase of a one-container pod whose container ended as ``container`` says."""
    return "Failed" if container["state"]["terminated"]["exitCode"] else "Succeeded"


@dataclass(frozen=True)
class PodEnd:
    """A pod's end, then its TrainJob's, and what the job's Finished must carry."""

    container: dict[str, Any]
    trainjob_condition: dict[str, Any]
    expected: tuple[State, Cause | None, dict[str, Any] | None]


# The cause and evidence of an out-of-memory kill, or the result the pod published.
EACH_POD_END = pytest.mark.parametrize(
    "end",
    [
        PodEnd(
            terminated(137, "OOMKilled"),
            cond("Failed", reason="FailedJobs"),
            (State.FAILED, Cause.OUT_OF_MEMORY, None),
        ),
        PodEnd(
            terminated(0, "Completed", '{"loss": 0.25}'),
            cond("Complete", reason="JobsCompleted"),
            (State.SUCCEEDED, None, {"loss": 0.25}),
        ),
    ],
    ids=["out-of-memory", "published-result"],
)


@pytest.mark.parametrize("pod_seen", [True, False], ids=["pod-seen-running", "pod-never-seen"])
@EACH_POD_END
async def test_a_finish_seen_before_the_pods_end_is_judged_on_the_pods_as_they_ended(
    kube_api: Any, namespace: str, world: World, end: PodEnd, pod_seen: bool
) -> None:
    """The TrainJob's Failed or Complete arrives while the pod watch still shows the pod
    running, or has not shown it at all (the watches are separate streams; one can lag or
    relist). The pod ended before the TrainJob did, so the Finished carries what its end says:
    the cause and evidence of an out-of-memory kill, the result it published."""
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    queue, watcher = lagging(Supervisor(kube_api, make_settings(namespace, kueue=False), ADAPTER))
    try:
        finished = await finish_behind_the_pod_watch(
            world,
            watcher,
            queue,
            "lag",
            container=end.container,
            trainjob_condition=end.trainjob_condition,
            pod_seen=pod_seen,
        )
    finally:
        await watcher.stop()
    assert (finished.state, finished.cause, finished.result) == end.expected
    if finished.cause is Cause.OUT_OF_MEMORY:
        assert [(e.name, e.exit_code) for e in finished.evidence] == [("lag-0", 137)]


@EACH_POD_END
async def test_a_finish_seen_after_the_pods_end_reads_no_pod(
    kube_api: Any, namespace: str, world: World, end: PodEnd
) -> None:
    """The usual order: the pod watch shows the pod's end before the TrainJob's end arrives.
    The Finished carries what the pod's end says, judged on the pod as watched: no read of the
    pods, which only a pod the watch still shows running calls for."""
    from dispatch_kubeflow.derivation import has_ended
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    class CountingPodReads(Supervisor):
        reads = 0

        async def _with_pods_read(self, obs: Any) -> Any:
            self.reads += 1
            return await super()._with_pods_read(obs)

    supervisor = CountingPodReads(kube_api, make_settings(namespace, kueue=False), ADAPTER)
    watcher = Watcher(supervisor).start()

    async def pod_end_seen() -> bool:
        pods = supervisor._index.pods.get(("usual", 1), {})
        return "usual-0" in pods and has_ended(pods["usual-0"])

    try:
        await job_running(world, watcher, "usual")
        await world.pod_status(
            "usual-0", phase=ended_phase(end.container), containerStatuses=[end.container]
        )
        await eventually(pod_end_seen, "the pod watch showing the pod's end")
        await world.trainjob_status("usual", conditions=[end.trainjob_condition])
        finished = await watcher.wait_event("usual", EventType.FINISHED)
    finally:
        await watcher.stop()
    assert (finished.state, finished.cause, finished.result) == end.expected
    assert supervisor.reads == 0


async def test_a_finish_whose_pod_read_fails_is_reported_once_a_read_succeeds(
    kube_api: Any, namespace: str, world: World
) -> None:
    """The read of a finished job's pods fails (the apiserver not answering, injected into the
    supervisor's own call): nothing is reported from the stale pods; the job is derived again
    and its one Finished carries the cause the pods give."""
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    class FailingPodReads(Supervisor):
        reads = 0

        async def _with_pods_read(self, obs: Any) -> Any:
            self.reads += 1
            if self.reads == 1:
                raise UnavailableError("the apiserver is not answering (this test)")
            return await super()._with_pods_read(obs)

    supervisor = FailingPodReads(kube_api, make_settings(namespace, kueue=False), ADAPTER)
    queue, watcher = lagging(supervisor)
    try:
        finished = await finish_behind_the_pod_watch(
            world,
            watcher,
            queue,
            "unread",
            container=terminated(137, "OOMKilled"),
            trainjob_condition=cond("Failed", reason="FailedJobs"),
        )
        await watcher.settle(world, "barrier")
    finally:
        await watcher.stop()
    assert (finished.state, finished.cause) == (State.FAILED, Cause.OUT_OF_MEMORY)
    assert supervisor.reads == 2
    assert watcher.of("unread").count(EventType.FINISHED) == 1


async def test_a_hanging_pod_read_holds_up_no_other_jobs_commit(
    kube_api: Any, namespace: str, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished job's pod read waits apart from the commits: with a single commit slot and
    that job's read hanging, another job's Submitted is still derived and delivered; once the
    read answers, the first job's Finished follows, judged on the pod as read."""
    from dispatch_kubeflow import supervisor as supervisor_module
    from dispatch_kubeflow.supervisor import Supervisor
    from tests.integration.test_watching import ADAPTER, make_settings

    monkeypatch.setattr(supervisor_module, "SAVE_CONCURRENCY", 1)

    class HangingPodReads(Supervisor):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.hanging, self.released = asyncio.Event(), asyncio.Event()

        async def _read_pod(self, obs: Any, name: str) -> Any:
            self.hanging.set()
            await self.released.wait()
            return await super()._read_pod(obs, name)

    supervisor = HangingPodReads(kube_api, make_settings(namespace, kueue=False), ADAPTER)
    queue, watcher = lagging(supervisor)
    try:
        await job_running(world, watcher, "slow")
        queue.lagging = True
        oom = terminated(137, "OOMKilled")
        await world.pod_status("slow-0", phase="Failed", containerStatuses=[oom])
        await world.trainjob_status("slow", conditions=[cond("Failed", reason="FailedJobs")])
        await asyncio.wait_for(supervisor.hanging.wait(), 10)
        await world.trainjob("quick")
        await watcher.wait_event("quick", EventType.SUBMITTED)
        assert EventType.FINISHED not in watcher.of("slow")
        supervisor.released.set()
        finished = await watcher.wait_event("slow", EventType.FINISHED)
        await queue.catch_up()
    finally:
        supervisor.released.set()
        await watcher.stop()
    assert (finished.state, finished.cause) == (State.FAILED, Cause.OUT_OF_MEMORY)
