"""The supervisor against the real kube-apiserver, with the test playing the missing controllers.

No Trainer, JobSet, Kueue controller or kubelet runs here: each test writes the status those
would write (through the status subresources) and checks the dispatch events that come out of
the adapter's single watch per kind. Time for the Lease heartbeat comes from a manual clock.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow import constants
from dispatch_kubeflow.clock import ManualClock
from dispatch_kubeflow.constants import Cause, EventType, State
from dispatch_kubeflow.events import DispatchEvent
from dispatch_kubeflow.reporting import ReportedRecord
from dispatch_kubeflow.settings import AdmissionLease, Kueue, RuntimeRef, Settings
from dispatch_kubeflow.supervisor import Supervisor, TrainJobAnnotationStore
from tests.cluster.controlplane import ControlPlane

EVENT_TIMEOUT = 30.0
MERGE = "application/merge-patch+json"
ADAPTER = "default"
LEASE = "dispatch-admission"


def ts(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


T0 = datetime.now(UTC).replace(microsecond=0)


def cond(
    type_: str, status: str = "True", reason: str = "Reason", message: str = "", at: int = 0
) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message or f"{type_} {reason}",
        "lastTransitionTime": ts(T0 + timedelta(seconds=at)),
    }


class World:
    """Writes objects and statuses as Trainer, JobSet, Kueue and the kubelet would."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.ns = namespace
        self.nodes: list[str] = []

    @property
    def custom(self) -> Any:
        # Any: the generated signatures omit _content_type and take plain dicts as bodies too.
        return client.CustomObjectsApi(self.api)

    @property
    def core(self) -> Any:
        return client.CoreV1Api(self.api)  # takes a plain dict as the body

    def labels(self, job: str, attempt: int) -> dict[str, str]:
        return {
            constants.LABEL_ADAPTER: ADAPTER,
            constants.LABEL_JOB: job,
            constants.LABEL_ATTEMPT: str(attempt),
        }

    def _where(self, group: str, version: str, plural: str) -> dict[str, str]:
        return {"group": group, "version": version, "namespace": self.ns, "plural": plural}

    @property
    def _tj(self) -> dict[str, str]:
        return self._where(constants.TRAINER_GROUP, constants.TRAINER_VERSION, constants.TRAINJOBS)

    @property
    def _js(self) -> dict[str, str]:
        return self._where(constants.JOBSET_GROUP, constants.JOBSET_VERSION, constants.JOBSETS)

    @property
    def _wl(self) -> dict[str, str]:
        return self._where(constants.KUEUE_GROUP, constants.KUEUE_VERSION, constants.WORKLOADS)

    async def trainjob(
        self, job: str, attempt: int = 1, *, suspend: bool = False
    ) -> dict[str, Any]:
        body = {
            "apiVersion": f"{constants.TRAINER_GROUP}/{constants.TRAINER_VERSION}",
            "kind": "TrainJob",
            "metadata": {"name": f"{job}-{attempt}", "labels": self.labels(job, attempt)},
            "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": suspend},
        }
        created: dict[str, Any] = await self.custom.create_namespaced_custom_object(
            body=body, **self._tj
        )
        return created

    async def trainjob_spec(self, job: str, attempt: int = 1, **spec: Any) -> None:
        patch: Callable[..., Awaitable[Any]] = self.custom.patch_namespaced_custom_object
        await patch(name=f"{job}-{attempt}", body={"spec": spec}, _content_type=MERGE, **self._tj)

    async def trainjob_status(self, job: str, attempt: int = 1, **status: Any) -> None:
        patch: Callable[..., Awaitable[Any]] = self.custom.patch_namespaced_custom_object_status
        await patch(
            name=f"{job}-{attempt}", body={"status": status}, _content_type=MERGE, **self._tj
        )

    async def delete_trainjob(self, job: str, attempt: int = 1) -> None:
        await self.custom.delete_namespaced_custom_object(name=f"{job}-{attempt}", **self._tj)

    async def jobset(self, job: str, attempt: int = 1) -> None:
        pod_spec = {
            "restartPolicy": "Never",
            "containers": [{"name": "node", "image": "busybox:1.37"}],
        }
        body = {
            "apiVersion": f"{constants.JOBSET_GROUP}/{constants.JOBSET_VERSION}",
            "kind": "JobSet",
            "metadata": {"name": f"{job}-{attempt}", "labels": self.labels(job, attempt)},
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "replicas": 1,
                        "template": {"spec": {"template": {"spec": pod_spec}}},
                    }
                ]
            },
        }
        await self.custom.create_namespaced_custom_object(body=body, **self._js)

    async def jobset_status(self, job: str, attempt: int = 1, **status: Any) -> None:
        patch: Callable[..., Awaitable[Any]] = self.custom.patch_namespaced_custom_object_status
        await patch(
            name=f"{job}-{attempt}", body={"status": status}, _content_type=MERGE, **self._js
        )

    async def workload(self, train_job: dict[str, Any]) -> str:
        meta = train_job["metadata"]
        name = f"trainjob-{meta['name']}-abcde"
        body = {
            "apiVersion": f"{constants.KUEUE_GROUP}/{constants.KUEUE_VERSION}",
            "kind": "Workload",
            "metadata": {
                "name": name,
                "labels": {constants.LABEL_KUEUE_JOB_UID: meta["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": f"{constants.TRAINER_GROUP}/{constants.TRAINER_VERSION}",
                        "kind": "TrainJob",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                    }
                ],
            },
            "spec": {
                "queueName": "user-queue",
                "podSets": [
                    {
                        "name": "node",
                        "count": 1,
                        "template": {
                            "spec": {
                                "restartPolicy": "Never",
                                "containers": [{"name": "node", "image": "busybox:1.37"}],
                            }
                        },
                    }
                ],
            },
        }
        await self.custom.create_namespaced_custom_object(body=body, **self._wl)
        return name

    async def workload_status(self, name: str, **status: Any) -> None:
        patch: Callable[..., Awaitable[Any]] = self.custom.patch_namespaced_custom_object_status
        await patch(name=name, body={"status": status}, _content_type=MERGE, **self._wl)

    async def workload_spec(self, name: str, **spec: Any) -> None:
        patch: Callable[..., Awaitable[Any]] = self.custom.patch_namespaced_custom_object
        await patch(name=name, body={"spec": spec}, _content_type=MERGE, **self._wl)

    async def pod(
        self,
        job: str,
        name: str,
        *,
        attempt: int = 1,
        node: str | None = None,
        restart_attempt: int = 0,
    ) -> None:
        labels = {
            **self.labels(job, attempt),
            constants.LABEL_RESTART_ATTEMPT: str(restart_attempt),
            "batch.kubernetes.io/job-completion-index": "0",
        }
        spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "containers": [{"name": "node", "image": "busybox:1.37"}],
        }
        if node:
            spec["nodeName"] = node
            # The suite's controller-manager, once some test has started it, runs the taint
            # manager, which would evict the pod for any NoExecute taint a test puts on its node
            # (a NodeLost of its own, racing the taint's). Tests of the taint manager's deletion
            # write it themselves.
            spec["tolerations"] = [{"operator": "Exists", "effect": "NoExecute"}]
        await self.core.create_namespaced_pod(
            self.ns, {"metadata": {"name": name, "labels": labels}, "spec": spec}
        )

    async def pod_status(self, name: str, **status: Any) -> None:
        await self.core.patch_namespaced_pod_status(name, self.ns, {"status": status})

    async def node(self, name: str) -> None:
        await self.core.create_node({"metadata": {"name": name}})
        self.nodes.append(name)

    async def taint(self, name: str, *taints: dict[str, str]) -> None:
        patch: Callable[..., Awaitable[Any]] = self.core.patch_node
        await patch(name, {"spec": {"taints": list(taints)}}, _content_type=MERGE)

    async def lease(self, holder: str, renew: datetime, duration: int) -> None:
        leases: Any = client.CoordinationV1Api(self.api)  # takes a plain dict as the body
        spec = {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "renewTime": renew.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        }
        try:
            await leases.create_namespaced_lease(
                self.ns, {"metadata": {"name": LEASE}, "spec": spec}
            )
        except ApiException as error:
            if error.status != 409:
                raise
            patch: Callable[..., Awaitable[Any]] = leases.patch_namespaced_lease
            await patch(LEASE, self.ns, {"spec": spec}, _content_type=MERGE)

    async def cleanup(self) -> None:
        for name in self.nodes:
            with contextlib.suppress(ApiException):
                await self.core.delete_node(name)


def running(name: str = "node") -> dict[str, Any]:
    return {
        "name": name,
        "image": "busybox:1.37",
        "imageID": "",
        "ready": True,
        "restartCount": 0,
        "state": {"running": {"startedAt": ts(T0)}},
    }


def terminated(
    code: int, reason: str = "Error", message: str = "", name: str = "node"
) -> dict[str, Any]:
    return {
        "name": name,
        "image": "busybox:1.37",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "message": message,
                "startedAt": ts(T0),
                "finishedAt": ts(T0),
            }
        },
    }


def waiting(reason: str, message: str = "", name: str = "node") -> dict[str, Any]:
    return {
        "name": name,
        "image": "busybox:1.37",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": reason, "message": message or reason}},
    }


class Watcher:
    """Runs one Supervisor in the background and collects what it yields."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.supervisor = supervisor
        self.events: list[DispatchEvent] = []
        self._arrived = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    async def _consume(self) -> None:
        async for event in self.supervisor.events():
            async with self._arrived:
                self.events.append(event)
                self._arrived.notify_all()

    def start(self) -> Watcher:
        self._task = asyncio.create_task(self._consume())
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def wait_until(self, done: Callable[[], bool], what: str) -> None:
        def check() -> bool:
            if self._task is not None and self._task.done():
                self._task.result()  # the supervisor failed: show why
            return done()

        try:
            async with asyncio.timeout(EVENT_TIMEOUT), self._arrived:
                await self._arrived.wait_for(check)
        except TimeoutError:
            seen = [(e.type.value, e.job, e.cause) for e in self.events]
            raise AssertionError(
                f"no {what} within {EVENT_TIMEOUT}s; saw {seen}; {self.describe()}"
            ) from None

    def describe(self) -> str:
        """Where the supervisor stands: what a timed-out wait shows to explain itself."""
        sup = self.supervisor
        # Requests per informer: one LIST and one WATCH, more after each resume or relist.
        informers = {i.kind: (i.synced.is_set(), i.requests) for i in sup.informers}
        return (
            f"backlog {sup.backlog()}, held {sup.held()}, informers (synced, requests) "
            f"{informers}, watch problems {sup.watch_problems()}, jobs {self.indexed_jobs()}"
        )

    def indexed_jobs(self) -> dict[str, Any]:
        """Each job as the supervisor's index has it: its pods and what it derives to now."""
        from dispatch_kubeflow.derivation import derive

        index = self.supervisor._index
        jobs: dict[str, Any] = {}
        for key in sorted(index.job_keys()):
            obs = index.observation(key, stopped=False)
            status = derive(obs, loss_taints=frozenset())
            pods = [
                (
                    pod["metadata"]["name"],
                    pod["metadata"].get("resourceVersion"),
                    (pod.get("status") or {}).get("phase"),
                    "deleting" if pod["metadata"].get("deletionTimestamp") else "live",
                    [
                        (c.get("type"), c.get("status"), c.get("reason"))
                        for c in (pod.get("status") or {}).get("conditions") or []
                    ],
                )
                for pod in obs.pods
            ]
            jobs[f"{key[0]}/{key[1]}"] = {
                "derived": (status.state.value, status.cause and status.cause.value),
                "pods": pods,
            }
        return jobs

    async def wait_for(
        self, predicate: Callable[[DispatchEvent], bool], what: str
    ) -> DispatchEvent:
        await self.wait_until(lambda: any(predicate(e) for e in self.events), what)
        return next(e for e in self.events if predicate(e))

    async def wait_event(self, job: str, type_: EventType) -> DispatchEvent:
        return await self.wait_for(
            lambda e: e.job == job and e.type is type_, f"{type_.value} of {job}"
        )

    def of(self, job: str) -> list[EventType]:
        return [e.type for e in self.events if e.job == job]

    async def settle(self, world: World, name: str) -> None:
        """Wait until a fresh barrier job is reported: everything written before is processed."""
        await world.trainjob(name)
        await self.wait_event(name, EventType.SUBMITTED)


def make_settings(namespace: str, *, kueue: bool = True) -> Settings:
    return Settings(
        namespace=namespace,
        probe_runtime=RuntimeRef(kind="ClusterTrainingRuntime", name="torch-distributed"),
        kueue=Kueue(
            local_queue="user-queue",
            admission_lease=AdmissionLease(namespace=namespace, name=LEASE),
        )
        if kueue
        else None,
        node_loss_taints=("example.com/node-dead",),
    )


@pytest.fixture
async def world(kube_api: client.ApiClient, namespace: str) -> AsyncIterator[World]:
    w = World(kube_api, namespace)
    try:
        yield w
    finally:
        await w.cleanup()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
async def watcher(
    kube_api: client.ApiClient, namespace: str, clock: ManualClock
) -> AsyncIterator[Watcher]:
    w = Watcher(Supervisor(kube_api, make_settings(namespace), ADAPTER, clock=clock)).start()
    try:
        yield w
    finally:
        await w.stop()


# --- event types -------------------------------------------------------------------------------


async def test_a_queued_job_is_submitted_admitted_runs_and_finishes_with_its_result(
    world: World, watcher: Watcher
) -> None:
    tj = await world.trainjob("life", suspend=True)
    wl = await world.workload(tj)
    submitted = await watcher.wait_event("life", EventType.SUBMITTED)
    assert (submitted.state, submitted.train_job, submitted.attempt) == (State.PENDING, "life-1", 1)

    await world.workload_status(
        wl,
        conditions=[
            cond("QuotaReserved", reason="QuotaReserved"),
            cond("Admitted", reason="Admitted"),
        ],
    )
    await watcher.wait_event("life", EventType.ADMITTED)

    await world.trainjob_spec("life", suspend=False)
    await world.jobset("life")
    await world.pod("life", "life-1-node-0-0")
    await world.pod_status("life-1-node-0-0", phase="Running", containerStatuses=[running()])
    run = await watcher.wait_event("life", EventType.RUNNING)
    assert run.state is State.RUNNING

    await world.pod_status(
        "life-1-node-0-0",
        phase="Succeeded",
        containerStatuses=[terminated(0, "Completed", '{"loss": 0.25}')],
    )
    await world.trainjob_status(
        "life",
        conditions=[
            cond("Complete", reason="AllJobsCompleted", message="jobset completed successfully")
        ],
    )
    finished = await watcher.wait_event("life", EventType.FINISHED)
    assert (finished.state, finished.cause, finished.reason, finished.message) == (
        State.SUCCEEDED,
        None,
        "AllJobsCompleted",
        "jobset completed successfully",
    )
    assert finished.result == {"loss": 0.25}
    await watcher.settle(world, "barrier")
    assert watcher.of("life") == [
        EventType.SUBMITTED,
        EventType.ADMITTED,
        EventType.RUNNING,
        EventType.FINISHED,
    ]
    wire = finished.model_dump(mode="json", by_alias=True)
    assert wire["trainJob"] == "life-1"


async def test_plain_mode_without_kueue(
    kube_api: client.ApiClient, namespace: str, world: World
) -> None:
    w = Watcher(Supervisor(kube_api, make_settings(namespace, kueue=False), ADAPTER)).start()
    try:
        await world.trainjob("plain")
        await world.pod("plain", "plain-1-node-0-0")
        await world.pod_status("plain-1-node-0-0", phase="Running", containerStatuses=[running()])
        await w.wait_event("plain", EventType.RUNNING)
        assert w.of("plain") == [EventType.SUBMITTED, EventType.ADMITTED, EventType.RUNNING]
        assert not [e for e in w.events if e.type is EventType.ADMISSION_HEARTBEAT]
    finally:
        await w.stop()


async def test_a_closed_watch_leaves_no_task_behind(
    kube_api: client.ApiClient, namespace: str
) -> None:
    """Closing the supervisor's event stream ends every task it made, the one waiting on its
    queue among them: one left waits for ever, and holds the operator's stop for kopf's 5 s."""
    before = asyncio.all_tasks()
    supervisor = Supervisor(kube_api, make_settings(namespace), ADAPTER)
    w = Watcher(supervisor).start()
    async with asyncio.timeout(EVENT_TIMEOUT):
        await asyncio.gather(*(i.synced.wait() for i in supervisor.informers))
    await asyncio.sleep(0.1)  # nothing is left to derive: the stream waits on its queue
    await w.stop()
    await asyncio.sleep(0)  # what a cancelled task's callbacks schedule has run
    left = [t for t in asyncio.all_tasks() - before if t is not asyncio.current_task()]
    assert [t for t in left if not t.done()] == []


async def test_objects_of_another_adapter_are_not_watched(world: World, watcher: Watcher) -> None:
    body = {
        "apiVersion": f"{constants.TRAINER_GROUP}/{constants.TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {
            "name": "other-1",
            "labels": {**world.labels("other", 1), constants.LABEL_ADAPTER: "other"},
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}},
    }
    await world.custom.create_namespaced_custom_object(body=body, **world._tj)
    await watcher.settle(world, "barrier")
    assert watcher.of("other") == []


async def test_restarted_when_the_jobset_restarts_the_gang(world: World, watcher: Watcher) -> None:
    await world.trainjob("rs")
    await world.jobset("rs")
    await world.pod("rs", "rs-a")
    await world.pod_status("rs-a", phase="Running", containerStatuses=[running()])
    await watcher.wait_event("rs", EventType.RUNNING)
    await world.jobset_status("rs", restarts=1)
    await world.pod("rs", "rs-b", restart_attempt=1)
    restarted = await watcher.wait_event("rs", EventType.RESTARTED)
    assert restarted.state in (State.RUNNING, State.PENDING)
    await watcher.settle(world, "barrier")
    assert watcher.of("rs").count(EventType.RESTARTED) == 1


async def test_vanished_when_the_trainjob_goes_before_finishing(
    world: World, watcher: Watcher
) -> None:
    await world.trainjob("gone")
    await watcher.wait_event("gone", EventType.SUBMITTED)
    await world.delete_trainjob("gone")
    vanished = await watcher.wait_event("gone", EventType.VANISHED)
    assert (vanished.state, vanished.cause) == (State.UNKNOWN, Cause.EVIDENCE_LOST)


async def test_stopped_when_stop_job_was_called(world: World, watcher: Watcher) -> None:
    await world.trainjob("stop")
    await watcher.wait_event("stop", EventType.SUBMITTED)
    watcher.supervisor.note_stopped("stop")
    await world.delete_trainjob("stop")
    finished = await watcher.wait_event("stop", EventType.FINISHED)
    assert (finished.state, finished.cause) == (State.STOPPED, Cause.STOPPED)
    await watcher.settle(world, "barrier")
    assert EventType.VANISHED not in watcher.of("stop")


# --- one per row of the cause table ------------------------------------------------------------


async def running_job(world: World, watcher: Watcher, job: str, node: str | None = None) -> None:
    await world.trainjob(job)
    await world.pod(job, f"{job}-p0", node=node)
    await world.pod_status(f"{job}-p0", phase="Running", containerStatuses=[running()])
    await watcher.wait_event(job, EventType.RUNNING)


async def queued_job(world: World, watcher: Watcher, job: str) -> str:
    tj = await world.trainjob(job, suspend=True)
    wl = await world.workload(tj)
    await watcher.wait_event(job, EventType.SUBMITTED)
    return wl


async def test_preempted(world: World, watcher: Watcher) -> None:
    wl = await queued_job(world, watcher, "pre")
    await world.workload_status(wl, conditions=[cond("Admitted", reason="Admitted")])
    await watcher.wait_event("pre", EventType.ADMITTED)
    await world.workload_status(
        wl,
        conditions=[
            cond("Admitted", reason="Admitted"),
            cond(
                "Evicted", reason="Preempted", message="Preempted to accommodate a workload", at=5
            ),
        ],
    )
    evicted = await watcher.wait_event("pre", EventType.EVICTED)
    assert (evicted.cause, evicted.reason, evicted.message) == (
        Cause.PREEMPTED,
        "Preempted",
        "Preempted to accommodate a workload",
    )
    # Readmitted: a new admission epoch.
    await world.workload_status(
        wl,
        conditions=[
            cond("Admitted", reason="Admitted", at=9),
            cond(
                "Evicted", reason="Preempted", message="Preempted to accommodate a workload", at=5
            ),
        ],
    )
    await watcher.wait_until(
        lambda: watcher.of("pre").count(EventType.ADMITTED) == 2, "readmission"
    )
    await watcher.settle(world, "barrier")
    assert watcher.of("pre") == [
        EventType.SUBMITTED,
        EventType.ADMITTED,
        EventType.EVICTED,
        EventType.ADMITTED,
    ]


async def test_node_lost_when_a_node_running_a_pod_is_tainted(
    world: World, watcher: Watcher, namespace: str
) -> None:
    node = f"n-{namespace}"[:63]
    await world.node(node)
    await running_job(world, watcher, "nl", node=node)
    await world.taint(node, {"key": constants.TAINT_UNREACHABLE, "effect": "NoExecute"})
    lost = await watcher.wait_event("nl", EventType.NODE_LOST)
    assert (lost.state, lost.cause) == (State.RUNNING, Cause.NODE_LOST)
    assert (lost.evidence[0].node, lost.evidence[0].taint_key) == (
        node,
        constants.TAINT_UNREACHABLE,
    )


async def test_node_lost_from_a_site_taint(world: World, watcher: Watcher, namespace: str) -> None:
    node = f"s-{namespace}"[:63]
    await world.node(node)
    await running_job(world, watcher, "site", node=node)
    await world.taint(node, {"key": "example.com/other", "effect": "NoExecute"})
    await world.taint(node, {"key": "example.com/node-dead", "effect": "NoExecute"})
    lost = await watcher.wait_event("site", EventType.NODE_LOST)
    assert lost.evidence[0].taint_key == "example.com/node-dead"


async def test_node_lost_from_a_taint_manager_deletion(world: World, watcher: Watcher) -> None:
    await running_job(world, watcher, "tm")
    # Stamped now, as the taint manager stamps it: the suite's controller-manager, once some test
    # has started it, runs the disruption controller, which resets to False a DisruptionTarget
    # older than two minutes on a pod not yet deleting, racing the deletion below.
    disruption = cond(
        "DisruptionTarget",
        reason="DeletionByTaintManager",
        message="Taint manager: deleting due to NoExecute taint",
    )
    disruption["lastTransitionTime"] = ts(datetime.now(UTC))
    await world.pod_status("tm-p0", conditions=[disruption])
    await world.core.delete_namespaced_pod("tm-p0", world.ns, grace_period_seconds=0)
    lost = await watcher.wait_event("tm", EventType.NODE_LOST)
    assert lost.reason == "DeletionByTaintManager"


async def test_node_lost_from_workload_node_failures(world: World, watcher: Watcher) -> None:
    wl = await queued_job(world, watcher, "nf")
    await world.workload_status(
        wl, conditions=[cond("Evicted", reason="NodeFailures", message="nodes failed")]
    )
    evicted = await watcher.wait_event("nf", EventType.EVICTED)
    assert evicted.cause is Cause.NODE_LOST
    await watcher.wait_event("nf", EventType.NODE_LOST)


async def test_out_of_memory(world: World, watcher: Watcher) -> None:
    await running_job(world, watcher, "oom")
    await world.pod_status(
        "oom-p0", phase="Failed", containerStatuses=[terminated(137, "OOMKilled")]
    )
    await world.trainjob_status(
        "oom", conditions=[cond("Failed", reason="FailedJobs", message="jobset failed")]
    )
    finished = await watcher.wait_event("oom", EventType.FINISHED)
    assert (finished.state, finished.cause) == (State.FAILED, Cause.OUT_OF_MEMORY)
    assert finished.evidence[0].exit_code == 137


async def test_timeout_from_the_trainjob_deadline(world: World, watcher: Watcher) -> None:
    await running_job(world, watcher, "dl")
    await world.trainjob_status(
        "dl",
        conditions=[
            cond(
                "Failed", reason="DeadlineExceeded", message="TrainJob exceeded its active deadline"
            )
        ],
    )
    finished = await watcher.wait_event("dl", EventType.FINISHED)
    assert (finished.state, finished.cause, finished.message) == (
        State.FAILED,
        Cause.TIMEOUT,
        "TrainJob exceeded its active deadline",
    )


async def test_timeout_from_kueue_maximum_execution_time(world: World, watcher: Watcher) -> None:
    wl = await queued_job(world, watcher, "met")
    await world.workload_spec(wl, active=False)
    await world.workload_status(
        wl,
        conditions=[
            cond(
                "Evicted",
                reason="Deactivated",
                message="The workload is deactivated due to exceeding the maximum execution time",
            ),
            cond(
                "DeactivationTarget",
                reason="MaximumExecutionTimeExceeded",
                message="exceeding the maximum execution time",
            ),
        ],
    )
    finished = await watcher.wait_event("met", EventType.FINISHED)
    assert (finished.state, finished.cause, finished.reason) == (
        State.FAILED,
        Cause.TIMEOUT,
        "Deactivated",
    )


@pytest.mark.parametrize("reason", ["WaitingForQuota", "ExceedsMaxQuota", "NoMatchingFlavor"])
async def test_no_capacity_from_kueue_is_carried_by_the_first_event(
    kube_api: client.ApiClient, namespace: str, world: World, reason: str
) -> None:
    tj = await world.trainjob("stuck", suspend=True)
    wl = await world.workload(tj)
    await world.workload_status(
        wl, conditions=[cond("QuotaReserved", "False", reason, "couldn't assign flavors")]
    )
    fresh = Watcher(Supervisor(kube_api, make_settings(namespace), ADAPTER)).start()
    try:
        submitted = await fresh.wait_event("stuck", EventType.SUBMITTED)
        assert (submitted.state, submitted.cause, submitted.reason, submitted.message) == (
            State.PENDING,
            Cause.NO_CAPACITY,
            reason,
            "couldn't assign flavors",
        )
        fresh.supervisor.note_stopped("stuck")
        stopped = await fresh.wait_event("stuck", EventType.FINISHED)
        assert (stopped.state, stopped.cause) == (State.STOPPED, Cause.STOPPED)
    finally:
        await fresh.stop()


async def test_no_capacity_from_unschedulable_pods_carried_by_finished(
    world: World, watcher: Watcher
) -> None:
    await world.trainjob("unsched")
    await world.pod("unsched", "unsched-p0")
    await world.pod_status(
        "unsched-p0",
        phase="Pending",
        conditions=[cond("PodScheduled", "False", "Unschedulable", "0/3 nodes are available")],
    )
    await watcher.wait_event("unsched", EventType.SUBMITTED)
    await world.trainjob_status("unsched", conditions=[cond("Failed", reason="FailedJobs")])
    finished = await watcher.wait_event("unsched", EventType.FINISHED)
    assert (finished.cause, finished.message) == (Cause.NO_CAPACITY, "0/3 nodes are available")


async def test_pods_ready_timeout(world: World, watcher: Watcher) -> None:
    wl = await queued_job(world, watcher, "prt")
    await world.workload_status(
        wl,
        conditions=[
            cond("Evicted", reason="PodsReadyTimeout", message="Exceeded the PodsReady timeout")
        ],
    )
    evicted = await watcher.wait_event("prt", EventType.EVICTED)
    assert (evicted.cause, evicted.reason) == (Cause.PODS_READY_TIMEOUT, "PodsReadyTimeout")


async def test_admission_rejected(world: World, watcher: Watcher) -> None:
    wl = await queued_job(world, watcher, "rej")
    await world.workload_spec(wl, active=False)
    await world.workload_status(
        wl,
        conditions=[
            cond(
                "Evicted",
                reason="Deactivated",
                message="The workload is deactivated due to an AdmissionCheck rejection",
            )
        ],
        admissionChecks=[
            {
                "name": "dispatch-admission",
                "state": "Rejected",
                "message": "rejected by dispatch",
                "lastTransitionTime": ts(T0),
            }
        ],
    )
    finished = await watcher.wait_event("rej", EventType.FINISHED)
    assert (finished.state, finished.cause) == (State.FAILED, Cause.ADMISSION_REJECTED)
    assert watcher.of("rej") == [EventType.SUBMITTED, EventType.EVICTED, EventType.FINISHED]


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("ErrImagePull", Cause.IMAGE_PULL),
        ("ImagePullBackOff", Cause.IMAGE_PULL),
        ("InvalidImageName", Cause.IMAGE_PULL),
        ("CreateContainerConfigError", Cause.CONFIG_ERROR),
        ("CreateContainerError", Cause.CONFIG_ERROR),
        ("RunContainerError", Cause.CONFIG_ERROR),
    ],
)
async def test_container_waiting_causes(
    world: World, watcher: Watcher, reason: str, cause: Cause
) -> None:
    await world.trainjob("wait")
    await world.pod("wait", "wait-p0")
    await world.pod_status(
        "wait-p0", phase="Pending", containerStatuses=[waiting(reason, "cannot start")]
    )
    await watcher.wait_event("wait", EventType.SUBMITTED)
    await world.trainjob_status("wait", conditions=[cond("Failed", reason="FailedJobs")])
    finished = await watcher.wait_event("wait", EventType.FINISHED)
    assert (finished.state, finished.cause, finished.reason, finished.message) == (
        State.FAILED,
        cause,
        reason,
        "cannot start",
    )


async def test_runtime_unsupported(world: World, watcher: Watcher) -> None:
    await world.trainjob("rt")
    await world.trainjob_status(
        "rt",
        conditions=[
            cond("Failed", reason="TrainingRuntimeNotSupported", message="unsupported runtime: x")
        ],
    )
    finished = await watcher.wait_event("rt", EventType.FINISHED)
    assert (finished.cause, finished.message) == (
        Cause.RUNTIME_UNSUPPORTED,
        "unsupported runtime: x",
    )


async def test_program_error(world: World, watcher: Watcher) -> None:
    await running_job(world, watcher, "pe")
    await world.pod_status("pe-p0", phase="Failed", containerStatuses=[terminated(143, "Error")])
    await world.trainjob_status("pe", conditions=[cond("Failed", reason="FailedJobs")])
    finished = await watcher.wait_event("pe", EventType.FINISHED)
    assert (finished.cause, finished.evidence[0].exit_code, finished.evidence[0].signal) == (
        Cause.PROGRAM_ERROR,
        143,
        15,
    )


async def test_precedence_a_rank_that_died_with_its_node_is_node_lost(
    world: World, watcher: Watcher, namespace: str
) -> None:
    node = f"p-{namespace}"[:63]
    await world.node(node)
    await running_job(world, watcher, "prec", node=node)
    await world.taint(node, {"key": constants.TAINT_NOT_READY, "effect": "NoExecute"})
    await world.pod_status("prec-p0", phase="Failed", containerStatuses=[terminated(1, "Error")])
    await world.trainjob_status("prec", conditions=[cond("Failed", reason="FailedJobs")])
    finished = await watcher.wait_event("prec", EventType.FINISHED)
    assert (finished.state, finished.cause) == (State.FAILED, Cause.NODE_LOST)


# --- the Lease heartbeat -----------------------------------------------------------------------


async def test_heartbeat_opens_on_renewal_and_closes_by_timer(
    world: World, watcher: Watcher, clock: ManualClock
) -> None:
    missing = await watcher.wait_for(lambda e: e.type is EventType.ADMISSION_HEARTBEAT, "heartbeat")
    assert (missing.gate, missing.reason) == ("closed", "LeaseMissing")
    await world.lease("ctl-0", clock.now(), duration=15)
    opened = await watcher.wait_for(lambda e: e.gate == "open", "gate open")
    assert opened.reason == "LeaseRenewed"
    clock.advance(timedelta(seconds=16))  # inside duration + skew: still open, no event
    clock.advance(timedelta(seconds=2))  # past renewTime + 15 s + 2 s, and no watch event came
    await watcher.wait_until(lambda: len(heartbeats(watcher)) == 3, "gate closed by the timer")
    assert [e.gate for e in heartbeats(watcher)] == ["closed", "open", "closed"]
    closed = heartbeats(watcher)[-1]
    assert closed.reason == "LeaseExpired"
    assert closed.time == T0 + timedelta(seconds=18)


def heartbeats(watcher: Watcher) -> list[DispatchEvent]:
    return [e for e in watcher.events if e.type is EventType.ADMISSION_HEARTBEAT]


# --- restarts, lost watches, compaction ----------------------------------------------------------


async def test_apiserver_restart_mid_watch(
    cluster: ControlPlane, world: World, watcher: Watcher, namespace: str
) -> None:
    await running_job(world, watcher, "ar")
    await asyncio.to_thread(cluster.restart_apiserver)
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        world.api = api
        await world.pod_status(
            "ar-p0", phase="Succeeded", containerStatuses=[terminated(0, "Completed")]
        )
        await world.trainjob_status("ar", conditions=[cond("Complete", reason="AllJobsCompleted")])
        await watcher.wait_event("ar", EventType.FINISHED)
        await watcher.settle(world, "barrier")
        assert watcher.of("ar") == [
            EventType.SUBMITTED,
            EventType.ADMITTED,
            EventType.RUNNING,
            EventType.FINISHED,
        ]
    finally:
        await api.close()


async def test_forced_410_relists_and_reconciles(
    cluster: ControlPlane, world: World, watcher: Watcher
) -> None:
    await running_job(world, watcher, "c410")
    await world.trainjob("c410b")
    await watcher.wait_event("c410b", EventType.SUBMITTED)
    relists = sum(i.relists for i in watcher.supervisor.informers)
    # Move etcd's revision past every informer's resourceVersion, then compact and restart.
    await world.core.create_namespaced_config_map(world.ns, {"metadata": {"name": "bump"}})
    await asyncio.to_thread(cluster.compact_etcd)
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        world.api = api
        await world.delete_trainjob("c410b")
        await world.trainjob_status(
            "c410", conditions=[cond("Complete", reason="AllJobsCompleted")]
        )
        await watcher.wait_event("c410", EventType.FINISHED)
        await watcher.wait_event("c410b", EventType.VANISHED)
        await watcher.settle(world, "barrier")
        assert sum(i.relists for i in watcher.supervisor.informers) > relists
        assert watcher.of("c410") == [
            EventType.SUBMITTED,
            EventType.ADMITTED,
            EventType.RUNNING,
            EventType.FINISHED,
        ]
        assert watcher.of("c410b") == [EventType.SUBMITTED, EventType.ADMITTED, EventType.VANISHED]
    finally:
        await api.close()


async def test_an_adapter_restarted_between_two_transitions_reports_each_once(
    kube_api: client.ApiClient, namespace: str, world: World
) -> None:
    settings = make_settings(namespace)
    first = Watcher(Supervisor(kube_api, settings, ADAPTER)).start()
    tj = await world.trainjob("ex", suspend=True)
    wl = await world.workload(tj)
    try:
        await first.wait_event("ex", EventType.SUBMITTED)
        await world.workload_status(wl, conditions=[cond("Admitted", reason="Admitted")])
        await first.wait_event("ex", EventType.ADMITTED)
    finally:
        await first.stop()
    # While no adapter runs: the job starts and finishes.
    await world.trainjob_spec("ex", suspend=False)
    await world.pod("ex", "ex-p0")
    await world.pod_status(
        "ex-p0", phase="Succeeded", containerStatuses=[terminated(0, "Completed", '{"ok": true}')]
    )
    await world.trainjob_status("ex", conditions=[cond("Complete", reason="AllJobsCompleted")])
    second = Watcher(Supervisor(kube_api, settings, ADAPTER)).start()
    try:
        finished = await second.wait_event("ex", EventType.FINISHED)
        assert finished.result == {"ok": True}
        await second.settle(world, "barrier-a")
        assert second.of("ex") == [EventType.FINISHED]
    finally:
        await second.stop()
    third = Watcher(Supervisor(kube_api, settings, ADAPTER)).start()
    try:
        await third.settle(world, "barrier-b")
        assert third.of("ex") == []
    finally:
        await third.stop()


async def test_a_job_id_used_again_after_a_stop_is_a_new_job(
    world: World, watcher: Watcher
) -> None:
    await world.trainjob("again")
    await watcher.wait_event("again", EventType.SUBMITTED)
    watcher.supervisor.note_stopped("again")
    await world.delete_trainjob("again")
    await watcher.wait_event("again", EventType.FINISHED)
    await world.trainjob("again")
    await watcher.wait_until(
        lambda: watcher.of("again").count(EventType.SUBMITTED) == 2, "resubmission"
    )
    await watcher.settle(world, "barrier")
    assert watcher.of("again") == [
        EventType.SUBMITTED,
        EventType.ADMITTED,
        EventType.FINISHED,
        EventType.SUBMITTED,
        EventType.ADMITTED,
    ]


async def test_a_record_for_a_deleted_trainjob_never_lands_on_one_created_again_under_its_name(
    world: World, kube_api: client.ApiClient, namespace: str
) -> None:
    # The supervisor commits a transition after handing it on, from its cache: the TrainJob it
    # holds may be deleted, and a new one (a new job) created under the name, by then.
    deleted = await world.trainjob("heir")
    await world.delete_trainjob("heir")
    await world.trainjob("heir")
    store = TrainJobAnnotationStore(
        client.CustomObjectsApi(kube_api), namespace, lambda job, attempt: deleted
    )
    await store.commit("heir", 1, ReportedRecord(submitted=True, finished=True), [])
    current = await world.custom.get_namespaced_custom_object(name="heir-1", **world._tj)
    assert constants.ANNOTATION_REPORTED not in current["metadata"].get("annotations", {})
    assert store.requests == 1  # the patch was sent, and refused
