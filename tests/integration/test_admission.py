"""The admission controller against the real kube-apiserver, with the test playing Kueue.

Kueue's controllers do not run here. The tests write what Kueue would write on a Workload's
status, through the status subresource with server-side apply under a Kueue field manager:
``QuotaReserved``, the check's ``Pending`` entry, an eviction (``Evicted``, the check reset to
``Pending``, ``schedulingStats.evictions``) and the requeue. Another admission check's entry is
written the same way under a third field manager.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.admission.controller import AdmissionConfig, AdmissionController
from dispatch_kubeflow.constants import (
    ADMISSION_CHECKS,
    ADMISSION_CONTROLLER_NAME,
    ADMISSION_FIELD_MANAGER,
    ANNOTATION_READMIT,
    ANNOTATION_REJECT,
    API_VERSION,
    APPLY_PATCH,
    GROUP,
    KUBEFLOW_ADAPTER_KIND,
    KUBEFLOW_ADAPTERS,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_JOB,
    LEASE_GROUP,
    LEASE_VERSION,
    LEASES,
    MERGE_PATCH,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    VERSION,
    WORKLOADS,
    CheckState,
    EventType,
)
from dispatch_kubeflow.errors import DispatchError
from dispatch_kubeflow.heartbeat import DEFAULT_SKEW
from dispatch_kubeflow.kube.leaderelection import ElectionTiming, LeaderElector
from dispatch_kubeflow.kube.leases import ApiLeaseStore, Lease, LeaseConflict
from dispatch_kubeflow.kube.objects import key_of
from dispatch_kubeflow.kube.workloads import check_entry
from dispatch_kubeflow.settings import parse_settings_object
from dispatch_kubeflow.supervisor import Supervisor

FAST = ElectionTiming(
    lease_duration=timedelta(seconds=2),
    renew_deadline=timedelta(seconds=1),
    retry_period=timedelta(seconds=0.2),
)
WAIT = 15.0
KUEUE_MANAGER = "kueue-admission"
OTHER_MANAGER = "example.com/provisioning"
OTHER_CHECK = "provisioning"
LEASE = "dispatch-admission"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Scene:
    """One namespace, one AdmissionCheck of ours, and the Kueue side played by hand.

    The controller decides its check in every namespace; ``serve`` makes this namespace
    dispatch's with a KubeflowAdapter of the check.
    """

    def __init__(self, api: client.ApiClient, namespace: str, check: str | None = None) -> None:
        self.api = api
        # Any: the generated signatures omit _content_type and take plain dicts as bodies too.
        self.objects: Any = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.check = check or f"{namespace}-gate"

    def config(self, identity: str) -> AdmissionConfig:
        return AdmissionConfig(
            check=self.check,
            lease_namespace=self.namespace,
            lease_name=LEASE,
            identity=identity,
            timing=FAST,
            request_timeout=5.0,
            retry_backoff=0.2,
        )

    def controller(self, identity: str, *, release_on_cancel: bool = True) -> AdmissionController:
        cfg = self.config(identity)
        elector = LeaderElector(
            ApiLeaseStore(self.api, self.namespace, LEASE, 5.0),
            identity,
            FAST,
            release_on_cancel=release_on_cancel,
        )
        return AdmissionController(self.api, cfg, elector=elector)

    async def serve(self, lease: tuple[str, str] | None = None, name: str = "team") -> None:
        """A KubeflowAdapter of the check serving this namespace, reading ``lease`` (by default
        the Lease the scene's controllers hold)."""
        lease_namespace, lease_name = lease or (self.namespace, LEASE)
        await self.objects.create_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            KUBEFLOW_ADAPTERS,
            {
                "apiVersion": API_VERSION,
                "kind": KUBEFLOW_ADAPTER_KIND,
                "metadata": {"name": name},
                "spec": {
                    "namespace": self.namespace,
                    "probeRuntime": {"kind": "ClusterTrainingRuntime", "name": "torch"},
                    "kueue": {
                        "localQueue": "lq",
                        "admissionCheck": self.check,
                        "admissionLease": {"namespace": lease_namespace, "name": lease_name},
                    },
                },
            },
        )

    async def create_admission_check(
        self, controller_name: str = ADMISSION_CONTROLLER_NAME
    ) -> None:
        await self.objects.create_cluster_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            ADMISSION_CHECKS,
            {
                "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
                "kind": "AdmissionCheck",
                "metadata": {"name": self.check},
                "spec": {"controllerName": controller_name},
            },
        )

    async def delete_admission_check(self) -> None:
        with contextlib.suppress(ApiException):
            await self.objects.delete_cluster_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, ADMISSION_CHECKS, self.check
            )

    async def admission_check(self) -> dict[str, Any]:
        found: dict[str, Any] = await self.objects.get_cluster_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, ADMISSION_CHECKS, self.check
        )
        return found

    async def trainjob(self, name: str, *, dispatch: bool = True) -> dict[str, Any]:
        created: dict[str, Any] = await self.objects.create_namespaced_custom_object(
            TRAINER_GROUP,
            TRAINER_VERSION,
            self.namespace,
            TRAINJOBS,
            {
                "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
                "kind": "TrainJob",
                "metadata": {"name": name, "labels": {LABEL_JOB: name} if dispatch else {}},
                "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1}},
            },
        )
        return created

    async def annotate(self, trainjob: str, key: str, value: str) -> None:
        await self.objects.patch_namespaced_custom_object(
            TRAINER_GROUP,
            TRAINER_VERSION,
            self.namespace,
            TRAINJOBS,
            trainjob,
            {"metadata": {"annotations": {key: value}}},
            _content_type=MERGE_PATCH,
        )

    async def workload_for(self, trainjob: dict[str, Any]) -> str:
        name = f"trainjob-{trainjob['metadata']['name']}-0a1b2"
        await self.objects.create_namespaced_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            self.namespace,
            WORKLOADS,
            {
                "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
                "kind": "Workload",
                "metadata": {
                    "name": name,
                    "ownerReferences": [
                        {
                            "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
                            "kind": "TrainJob",
                            "name": trainjob["metadata"]["name"],
                            "uid": trainjob["metadata"]["uid"],
                            "controller": True,
                            "blockOwnerDeletion": True,
                        }
                    ],
                },
                "spec": {
                    "queueName": "lq",
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
            },
        )
        return name

    async def workload(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self.objects.get_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, self.namespace, WORKLOADS, name
        )
        return found

    async def apply_status(self, name: str, manager: str, status: dict[str, Any]) -> None:
        await self.objects.patch_namespaced_custom_object_status(
            KUEUE_GROUP,
            KUEUE_VERSION,
            self.namespace,
            WORKLOADS,
            name,
            {
                "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
                "kind": "Workload",
                "metadata": {"name": name},
                "status": status,
            },
            field_manager=manager,
            force=True,
            _content_type=APPLY_PATCH,
        )

    # Kueue's part. Each apply carries everything Kueue owns, as Kueue's own applies do.

    async def kueue_reserves(self, name: str, evictions: int = 0) -> None:
        conditions = [condition("QuotaReserved", "True", "QuotaReserved")]
        if evictions:
            conditions.append(condition("Evicted", "False", "QuotaReserved"))
        await self.apply_status(
            name,
            KUEUE_MANAGER,
            {
                "conditions": conditions,
                "admissionChecks": [pending(self.check)],
                **stats(evictions),
            },
        )

    async def kueue_evicts(self, name: str, evictions: int) -> None:
        await self.apply_status(
            name,
            KUEUE_MANAGER,
            {
                "conditions": [
                    condition("QuotaReserved", "False", "Pending"),
                    condition("Evicted", "True", "Preempted"),
                ],
                "admissionChecks": [
                    pending(self.check, "Reset to Pending after eviction. Previously: Ready")
                ],
                **stats(evictions),
            },
        )

    async def other_controller_decides(self, name: str) -> None:
        await self.apply_status(
            name,
            OTHER_MANAGER,
            {
                "admissionChecks": [
                    {
                        "name": OTHER_CHECK,
                        "state": "Ready",
                        "message": "capacity provisioned",
                        "lastTransitionTime": now(),
                    }
                ]
            },
        )

    async def lease_holder(self) -> str | None:
        try:
            lease = await self.objects.get_namespaced_custom_object(
                LEASE_GROUP, LEASE_VERSION, self.namespace, LEASES, LEASE
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        holder: str | None = lease["spec"].get("holderIdentity")
        return holder

    async def wait_for_state(
        self, name: str, state: CheckState, message: Callable[[str], bool] = lambda _: True
    ) -> dict[str, Any]:
        async def matches() -> dict[str, Any] | None:
            workload = await self.workload(name)
            entry = check_entry(workload, self.check) or {}
            if entry.get("state") == state and message(entry.get("message", "")):
                return workload
            return None

        found: dict[str, Any] = await eventually(matches, f"Workload {name} check {state}")
        return found


def condition(kind: str, status: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": f"{kind} {status}",
        "lastTransitionTime": now(),
    }


def pending(check: str, message: str = "") -> dict[str, Any]:
    return {"name": check, "state": "Pending", "message": message, "lastTransitionTime": now()}


def stats(evictions: int) -> dict[str, Any]:
    if not evictions:
        return {}
    return {
        "schedulingStats": {
            "evictions": [{"reason": "Preempted", "underlyingCause": "", "count": evictions}]
        }
    }


async def eventually(probe: Callable[[], Any], what: str, within: float = WAIT) -> Any:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``within``."""
    try:
        async with asyncio.timeout(within):
            while True:
                found = await probe()
                if found:
                    return found
                await asyncio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"timed out after {within}s waiting for {what}")


def managed_by(obj: dict[str, Any], manager: str) -> list[dict[str, Any]]:
    return [m for m in obj["metadata"].get("managedFields", []) if m.get("manager") == manager]


async def cancel_and_wait(task: asyncio.Task[Any], what: str) -> None:
    """Cancel ``task`` and wait for it, failing (not hanging) if it does not stop."""
    task.cancel()
    try:
        async with asyncio.timeout(WAIT):
            await asyncio.gather(task, return_exceptions=True)
    except TimeoutError:
        pytest.fail(f"{what} did not stop within {WAIT}s of being cancelled")


@contextlib.asynccontextmanager
async def running(*controllers: AdmissionController) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks = [asyncio.create_task(c.run()) for c in controllers]
    try:
        yield tasks
    finally:
        for controller, task in zip(controllers, tasks, strict=True):
            await cancel_and_wait(task, f"replica {controller.cfg.identity}")


@pytest.fixture
async def unserved(kube_api: client.ApiClient, namespace: str) -> AsyncIterator[Scene]:
    """The scene's AdmissionCheck, and no KubeflowAdapter serving its namespace yet."""
    scene = Scene(kube_api, namespace)
    await scene.create_admission_check()
    try:
        yield scene
    finally:
        await scene.delete_admission_check()


@pytest.fixture
async def scene(unserved: Scene) -> Scene:
    """The scene's AdmissionCheck, and a KubeflowAdapter of it serving its namespace."""
    await unserved.serve()
    return unserved


# The AdmissionCheck.


async def test_the_controller_marks_its_admission_check_active(scene: Scene) -> None:
    async with running(scene.controller("a")):

        async def active() -> dict[str, Any] | None:
            check = await scene.admission_check()
            conditions = (check.get("status") or {}).get("conditions") or []
            found = next((c for c in conditions if c["type"] == "Active"), None)
            return found if found and found["status"] == "True" else None

        condition = await eventually(active, "Active=True on the AdmissionCheck")

    check = await scene.admission_check()
    assert condition["reason"] == "Active"
    assert condition["observedGeneration"] == check["metadata"]["generation"]
    (mine,) = managed_by(check, ADMISSION_FIELD_MANAGER)
    assert mine["operation"] == "Apply"
    assert mine["subresource"] == "status"


async def test_an_admission_check_of_another_controller_is_left_alone(
    kube_api: client.ApiClient, namespace: str
) -> None:
    scene = Scene(kube_api, namespace)
    await scene.create_admission_check(controller_name="example.com/other")
    try:
        controller = scene.controller("a")
        async with running(controller):
            await eventually(lambda: _leading(controller), "leadership")
            await eventually(_true(controller.checks.synced.is_set), "the AdmissionCheck mirror")
            await asyncio.sleep(0.5)  # room for a wrong write to land
        check = await scene.admission_check()
        assert not (check.get("status") or {}).get("conditions")
        assert not managed_by(check, ADMISSION_FIELD_MANAGER)
    finally:
        await scene.delete_admission_check()


# Decisions.


async def test_first_admission_goes_ready_and_another_check_is_never_touched(
    scene: Scene,
) -> None:
    trainjob = await scene.trainjob("job-1")
    name = await scene.workload_for(trainjob)
    await scene.other_controller_decides(name)
    before = await scene.workload(name)
    other_before = check_entry(before, OTHER_CHECK)
    (other_fields_before,) = managed_by(before, OTHER_MANAGER)

    async with running(scene.controller("a")):
        await scene.kueue_reserves(name)
        after = await scene.wait_for_state(name, CheckState.READY)

    entry = check_entry(after, scene.check)
    assert entry is not None
    assert entry["message"] == "first admission"
    assert check_entry(after, OTHER_CHECK) == other_before
    assert managed_by(after, OTHER_MANAGER) == [other_fields_before]
    (mine,) = managed_by(after, ADMISSION_FIELD_MANAGER)
    assert mine["operation"] == "Apply"
    assert mine["subresource"] == "status"
    assert OTHER_CHECK not in str(mine["fieldsV1"])
    assert scene.check in str(mine["fieldsV1"])


async def test_an_evicted_job_stays_pending_until_readmitted(scene: Scene) -> None:
    trainjob = await scene.trainjob("job-1")
    name = await scene.workload_for(trainjob)
    controller = scene.controller("a")

    async with running(controller):
        await scene.kueue_reserves(name)
        await scene.wait_for_state(name, CheckState.READY)

        await scene.kueue_evicts(name, evictions=1)
        await scene.kueue_reserves(name, evictions=1)
        held = await scene.wait_for_state(
            name, CheckState.PENDING, lambda m: m.startswith("held after eviction 1")
        )
        # An unrelated change to the job, and a readmit for an older eviction, keep it held.
        await scene.annotate("job-1", "example.com/note", "x")
        await scene.annotate("job-1", ANNOTATION_READMIT, "0")
        await eventually(
            lambda: _trainjob_seen(controller, scene.namespace, ANNOTATION_READMIT, "0"),
            "the readmit annotation",
        )
        await asyncio.sleep(0.5)
        still = await scene.workload(name)
        assert check_entry(still, scene.check) == check_entry(held, scene.check)

        await scene.annotate("job-1", ANNOTATION_READMIT, "1")
        ready = await scene.wait_for_state(name, CheckState.READY)

        # A second eviction closes the gate again without anyone touching the annotation.
        await scene.kueue_evicts(name, evictions=2)
        await scene.kueue_reserves(name, evictions=2)
        await scene.wait_for_state(
            name, CheckState.PENDING, lambda m: m.startswith("held after eviction 2")
        )

    entry = check_entry(ready, scene.check)
    assert entry is not None
    assert entry["message"] == "readmitted by dispatch after eviction 1"
    decided = [(w.evictions, w.state) for w in controller.written if w.state != "Pending"]
    assert decided == [(0, CheckState.READY), (1, CheckState.READY)]


async def test_reject_gives_rejected_with_the_reason(scene: Scene) -> None:
    trainjob = await scene.trainjob("job-1")
    name = await scene.workload_for(trainjob)

    async with running(scene.controller("a")):
        await scene.kueue_reserves(name)
        await scene.wait_for_state(name, CheckState.READY)
        await scene.kueue_evicts(name, evictions=1)
        await scene.kueue_reserves(name, evictions=1)
        await scene.wait_for_state(name, CheckState.PENDING, lambda m: m.startswith("held"))

        await scene.annotate("job-1", ANNOTATION_REJECT, "node pool retired")
        rejected = await scene.wait_for_state(name, CheckState.REJECTED)

    entry = check_entry(rejected, scene.check)
    assert entry is not None
    assert entry["message"] == "node pool retired"


async def test_a_workload_of_a_job_dispatch_did_not_start_is_not_held(scene: Scene) -> None:
    trainjob = await scene.trainjob("someone-elses", dispatch=False)
    name = await scene.workload_for(trainjob)

    async with running(scene.controller("a")):
        await scene.kueue_reserves(name)
        await scene.wait_for_state(name, CheckState.READY)
        await scene.kueue_evicts(name, evictions=1)
        await scene.kueue_reserves(name, evictions=1)
        await scene.wait_for_state(name, CheckState.READY)


# One controller for every namespace.


async def test_a_workload_in_a_namespace_no_adapter_serves_is_ready_at_once(
    unserved: Scene,
) -> None:
    """Even a dispatch-labelled TrainJob's Workload after an eviction, which a served namespace
    would hold: no KubeflowAdapter of the check says this namespace is dispatch's."""
    name = await unserved.workload_for(await unserved.trainjob("job-1"))
    controller = unserved.controller("a")
    async with running(controller):
        await unserved.kueue_reserves(name, evictions=1)
        ready = await unserved.wait_for_state(name, CheckState.READY)
    entry = check_entry(ready, unserved.check)
    assert entry is not None
    assert entry["message"] == (
        f"no KubeflowAdapter of AdmissionCheck {unserved.check} serves namespace "
        f"{unserved.namespace}: not held by the readmission gate"
    )
    assert unserved.namespace not in controller.served


@contextlib.asynccontextmanager
async def another_namespace(api: client.ApiClient, namespace: str) -> AsyncIterator[str]:
    core: Any = client.CoreV1Api(api)  # takes a plain dict as the body
    name = f"{namespace[:56]}-b"
    await core.create_namespace({"metadata": {"name": name}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            await core.delete_namespace(name)


async def test_one_controller_decides_two_namespaces_served_by_two_adapters(
    scene: Scene, kube_api: client.ApiClient
) -> None:
    """Each namespace's evicted job is held and its first admission is Ready; the second
    adapter names another Lease than the controller holds, and the AdmissionCheck says so."""
    async with another_namespace(kube_api, scene.namespace) as other_namespace:
        other = Scene(kube_api, other_namespace, check=scene.check)
        await other.serve(lease=(other_namespace, "elsewhere"), name="team-b")
        names = {}
        for each in (scene, other):
            first = await each.workload_for(await each.trainjob("first"))
            evicted = await each.workload_for(await each.trainjob("evicted"))
            names[each.namespace] = (first, evicted)
        controller = scene.controller("a")
        async with running(controller):
            for each in (scene, other):
                first, evicted = names[each.namespace]
                await each.kueue_reserves(first)
                await each.kueue_reserves(evicted, evictions=1)
                await each.wait_for_state(first, CheckState.READY)
                await each.wait_for_state(
                    evicted, CheckState.PENDING, lambda m: m.startswith("held after eviction 1")
                )

            async def mismatch_named() -> str | None:
                check = await scene.admission_check()
                conditions = (check.get("status") or {}).get("conditions") or []
                active: dict[str, Any] = next((c for c in conditions if c["type"] == "Active"), {})
                return active.get("message") if "team-b" in active.get("message", "") else None

            message = await eventually(mismatch_named, "the Lease mismatch on Active")

    assert controller.served >= {scene.namespace, other_namespace}
    assert {w.namespace for w in controller.written} == {scene.namespace, other_namespace}
    assert (
        f"KubeflowAdapter {other_namespace}/team-b reads Lease {other_namespace}/elsewhere, "
        f"not {scene.namespace}/{LEASE}"
    ) in message


async def test_a_kubeflow_adapter_created_after_the_controller_started_is_picked_up(
    unserved: Scene,
) -> None:
    namespace = unserved.namespace
    name = await unserved.workload_for(await unserved.trainjob("job-1"))
    controller = unserved.controller("a")
    async with running(controller):
        await eventually(lambda: _leading(controller), "leadership")
        await eventually(_true(controller.adapters.synced.is_set), "the adapters listed")
        assert namespace not in controller.served
        await unserved.serve()
        await eventually(_true(lambda: namespace in controller.served), "the new adapter")
        await unserved.kueue_reserves(name, evictions=1)
        await unserved.wait_for_state(
            name, CheckState.PENDING, lambda m: m.startswith("held after eviction 1")
        )


# Two replicas.


async def test_two_replicas_that_both_believe_they_lead_cannot_decide_one_admission_two_ways(
    scene: Scene,
) -> None:
    """Split brain, forced: each replica's view differs (one sees a reject), both write at once.

    The apply carries the resourceVersion the decision was made from, so only one write lands.
    """
    trainjob = await scene.trainjob("job-1")
    name = await scene.workload_for(trainjob)
    await scene.kueue_reserves(name, evictions=1)
    workload = await scene.workload(name)

    replicas = [scene.controller("a"), scene.controller("b")]
    for replica in replicas:
        replica.elector = _AlwaysLeader(replica.elector)
        replica.served = frozenset({scene.namespace})
        replica.workloads.cache[key_of(workload)] = workload
    readmitted = {**trainjob, "metadata": {**trainjob["metadata"]}}
    readmitted["metadata"]["annotations"] = {ANNOTATION_READMIT: "1"}
    rejected = {**trainjob, "metadata": {**trainjob["metadata"]}}
    rejected["metadata"]["annotations"] = {ANNOTATION_REJECT: "changed my mind"}
    replicas[0].trainjobs.cache[key_of(trainjob)] = readmitted
    replicas[1].trainjobs.cache[key_of(trainjob)] = rejected

    await asyncio.gather(*(r._reconcile_workload(key_of(workload)) for r in replicas))

    written = [w for r in replicas for w in r.written]
    assert len(written) == 1
    final = check_entry(await scene.workload(name), scene.check)
    assert final is not None
    assert final["state"] == written[0].state


async def test_the_standby_takes_over_within_the_lease_duration_when_the_leader_dies(
    scene: Scene,
) -> None:
    loop = asyncio.get_running_loop()
    jobs = [await scene.trainjob(f"job-{i}") for i in range(6)]
    names = [await scene.workload_for(job) for job in jobs]
    a = scene.controller("a", release_on_cancel=False)  # it crashes: nothing is released
    b = scene.controller("b")

    task_a = asyncio.create_task(a.run())
    await eventually(lambda: _holder_is(scene, "a"), "replica a to take the Lease")
    async with running(b):
        await scene.kueue_reserves(names[0])
        await scene.wait_for_state(names[0], CheckState.READY)

        # The leader dies while Kueue reserves quota for the rest.
        reserving = [asyncio.create_task(scene.kueue_reserves(n)) for n in names[1:]]
        await cancel_and_wait(task_a, "replica a")
        died = loop.time()
        await asyncio.gather(*reserving)

        await eventually(lambda: _holder_is(scene, "b"), "replica b to take the Lease")
        took_over = loop.time() - died
        for name in names:
            await scene.wait_for_state(name, CheckState.READY)

    bound = FAST.lease_duration.total_seconds() + 2 * 1.2 * FAST.retry_period.total_seconds()
    assert took_over <= bound + 0.5, f"took over after {took_over:.2f}s"
    assert not a.elector.is_leader()
    decided = [(w.uid, w.evictions) for w in a.written + b.written]
    assert len(decided) == len(set(decided)), "an admission was decided twice"
    assert {w.workload for w in b.written} <= set(names[1:])


async def test_a_released_lease_is_taken_over_at_the_next_retry(scene: Scene) -> None:
    loop = asyncio.get_running_loop()
    a, b = scene.controller("a"), scene.controller("b")
    task_a = asyncio.create_task(a.run())
    await eventually(lambda: _holder_is(scene, "a"), "replica a to take the Lease")
    async with running(b):
        await asyncio.sleep(0.5)  # b sees a's Lease being renewed
        await cancel_and_wait(task_a, "replica a")
        released = loop.time()
        await eventually(lambda: _holder_is(scene, "b"), "replica b to take the Lease")
        took_over = loop.time() - released

    # A released Lease lasts one second; b takes it then, well inside a lease duration.
    assert took_over < FAST.lease_duration.total_seconds()


# The Lease store the elector writes through.


async def test_the_lease_store_reads_writes_and_refuses_a_stale_or_second_writer(
    kube_api: client.ApiClient, namespace: str
) -> None:
    store = ApiLeaseStore(kube_api, namespace, LEASE, 5.0)
    assert await store.get() is None

    renewed = datetime(2026, 3, 4, 5, 6, 7, 123456, tzinfo=UTC)
    wanted = Lease(holder_identity="a", lease_duration_seconds=2, renew_time=renewed)
    created = await store.create(wanted)
    assert created.same_election_state(wanted)
    assert created.resource_version
    with pytest.raises(LeaseConflict):
        await store.create(wanted)

    taken = wanted.model_copy(
        update={"holder_identity": "b", "resource_version": created.resource_version}
    )
    updated = await store.update(taken)
    assert await store.get() == updated
    assert updated.holder_identity == "b"
    with pytest.raises(LeaseConflict):
        await store.update(taken)  # the resourceVersion it carries is stale now


async def test_the_lease_store_raises_other_failures_as_the_error_family(
    kube_api: client.ApiClient,
) -> None:
    store = ApiLeaseStore(kube_api, "Not-A-Namespace", LEASE, 5.0)
    with pytest.raises(DispatchError):
        await store.create(Lease(holder_identity="a", lease_duration_seconds=2))


# Helpers over the controllers.


class _AlwaysLeader(LeaderElector):
    def __init__(self, inner: LeaderElector) -> None:
        super().__init__(inner.store, inner.identity, inner.timing)

    def is_leader(self) -> bool:
        return True


async def _leading(controller: AdmissionController) -> bool:
    return controller.elector.is_leader()


def _true(predicate: Callable[[], bool]) -> Callable[[], Any]:
    async def probe() -> bool:
        return predicate()

    return probe


async def _holder_is(scene: Scene, identity: str) -> bool:
    return await scene.lease_holder() == identity


async def _trainjob_seen(
    controller: AdmissionController, namespace: str, key: str, value: str
) -> bool:
    job = controller.trainjobs.get("job-1", namespace) or {}
    return bool((job.get("metadata", {}).get("annotations") or {}).get(key) == value)


# The adapter's side of the heartbeat.


async def test_the_adapters_heartbeat_follows_the_lease_going_stale_and_fresh(
    scene: Scene,
) -> None:
    """The adapter's Supervisor reads this controller's Lease: open, closed on a crash, open again.

    The adapter allows 2 s of clock skew on top of the Lease's own duration.
    """

    settings = parse_settings_object(
        {
            "namespace": scene.namespace,
            "probeRuntime": {"kind": "ClusterTrainingRuntime", "name": "torch-distributed"},
            "kueue": {
                "localQueue": "lq",
                "admissionCheck": scene.check,
                "admissionLease": {"namespace": scene.namespace, "name": LEASE},
            },
        }
    )
    loop = asyncio.get_running_loop()
    a = scene.controller("a", release_on_cancel=False)
    task_a = asyncio.create_task(a.run())
    await eventually(lambda: _holder_is(scene, "a"), "replica a to take the Lease")

    events = Supervisor(scene.api, settings, adapter_name=scene.namespace).events()
    beats: asyncio.Queue[tuple[float, str, str]] = asyncio.Queue()

    async def collect() -> None:
        async for event in events:
            if event.type == EventType.ADMISSION_HEARTBEAT:
                await beats.put((loop.time(), str(event.gate), event.reason))

    collector = asyncio.create_task(collect())
    try:
        async with asyncio.timeout(WAIT):
            _, gate, _ = await beats.get()
        assert gate == "open"

        await cancel_and_wait(task_a, "replica a")  # a crash: the Lease is left to expire
        crashed = loop.time()
        async with asyncio.timeout(WAIT):
            at, gate, reason = await beats.get()
        assert (gate, reason) == ("closed", "LeaseExpired")
        stale_after = FAST.lease_duration + DEFAULT_SKEW
        assert at - crashed <= stale_after.total_seconds() + 0.5

        async with running(scene.controller("b")):
            async with asyncio.timeout(WAIT):
                _, gate, reason = await beats.get()
            assert (gate, reason) == ("open", "LeaseRenewed")
        # b released the Lease on its way out: the gate closes at once, not after an expiry.
        released = loop.time()
        async with asyncio.timeout(WAIT):
            at, gate, reason = await beats.get()
        assert (gate, reason) == ("closed", "LeaseReleased")
        assert at - released < FAST.lease_duration.total_seconds()
    finally:
        await cancel_and_wait(task_a, "replica a")
        await cancel_and_wait(collector, "the adapter's event stream")


# Faults of the API server.


async def test_decisions_continue_after_an_apiserver_restart_and_etcd_compaction(
    scene: Scene, cluster: Any
) -> None:
    """Every watch breaks and cannot resume from its old resourceVersion: the mirrors relist."""
    core: Any = client.CoreV1Api(scene.api)  # takes a plain dict as the body
    first = await scene.workload_for(await scene.trainjob("job-1"))
    controller = scene.controller("a")

    async with running(controller):
        await scene.kueue_reserves(first, evictions=1)
        await scene.wait_for_state(first, CheckState.PENDING, lambda m: m.startswith("held"))
        for i in range(3):  # history the mirrors' watches never see, then compacted away
            await core.create_namespaced_config_map(
                scene.namespace, {"metadata": {"name": f"filler-{i}"}}
            )
        await asyncio.to_thread(cluster.compact_etcd)

        async def retried(call: Callable[[], Any]) -> Any:
            # The first request on a connection pooled before the restart may find it closed.
            async def attempt() -> Any:
                try:
                    return await call() or True
                except (ApiException, OSError) as exc:
                    if isinstance(exc, ApiException) and exc.status < 500:
                        raise
                    return None

            return await eventually(attempt, "the API server to answer again")

        await retried(lambda: scene.annotate("job-1", ANNOTATION_READMIT, "1"))
        await scene.wait_for_state(first, CheckState.READY)
        second = await scene.workload_for(await scene.trainjob("job-2"))
        await scene.kueue_reserves(second)
        await scene.wait_for_state(second, CheckState.READY)
