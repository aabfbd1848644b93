"""The operator's exactly-once promise when the cluster misbehaves, on the real kube-apiserver.

Each test is one way a status write or a DispatchJob can go wrong: a write the apiserver refuses
(a ValidatingAdmissionPolicy that denies it), a DispatchJob deleted and created again under the
same name, events whose messages and evidence would outgrow etcd's object limit. The operator
runs in-process (``running_operator``) and the test plays Trainer, as in ``test_operator``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.constants import GROUP, STATUS_REPORTED, VERSION
from dispatch_kubeflow.events import DispatchEvent, Evidence
from dispatch_kubeflow.handlers.jobs import record_start
from dispatch_kubeflow.handlers.reported import DispatchJobStatusStore
from dispatch_kubeflow.handlers.status import STATUS_LIMIT
from dispatch_kubeflow.reporting import ReportedRecord
from tests.integration.policies import DenyingPolicy
from tests.integration.rbac import policy_rule, user_with_rules
from tests.integration.test_adapter_rbac import CHART_RULES
from tests.integration.test_operator import (
    ADAPTER,
    Scene,
    condition,
    event_lines,
    eventually,
    operator,
    operator_memo,
    running_operator,
    scene,
)

__all__ = ["operator", "operator_memo", "scene"]  # fixtures used by the tests below

T0 = "2026-01-01T00:00:00Z"


async def play_succeeded(scene: Scene, trainjob: str) -> None:
    await scene.play_trainer(
        trainjob,
        {
            "conditions": [
                {
                    "type": "Complete",
                    "status": "True",
                    "reason": "JobsCompleted",
                    "message": "the TrainJob completed",
                    "lastTransitionTime": T0,
                }
            ]
        },
    )


def deny_finished(scene: Scene) -> DenyingPolicy:
    """A policy that refuses a DispatchJob status update adding a ``Finished`` event."""
    return DenyingPolicy(
        scene.api,
        scene.namespace,
        group=GROUP,
        version=VERSION,
        resources=["dispatchjobs/status"],
        operations=["UPDATE"],
        expression=(
            "!has(object.status) || !has(object.status.events) || "
            "!object.status.events.exists(e, e.type == 'Finished')"
        ),
        message="Finished events are denied by this test",
    )


async def until_denied(scene: Scene, job: str) -> None:
    """Wait until the policy is in force: a Finished write to ``job`` (dry run) is refused."""

    async def refused() -> bool:
        body = await scene.job(job)
        assert body is not None
        events = [*((body.get("status") or {}).get("events") or []), {"type": "Finished"}]
        try:
            await scene.objects.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                scene.namespace,
                "dispatchjobs",
                job,
                {"status": {"events": events}},
                dry_run="All",
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            return "denied by this test" in str(error.body)
        return False

    await eventually(refused, "the ValidatingAdmissionPolicy to be in force")


async def test_item1_a_denied_status_write_loses_no_event(scene: Scene, operator: Path) -> None:
    """The Finished transition is refused by a policy; once the policy goes, it is reported."""
    await scene.apply_adapter(scene.adapter_spec())
    await scene.ready_adapter()
    await scene.create_job("denied")
    await scene.job_in_state("denied", "Pending")

    async with deny_finished(scene) as policy:
        await until_denied(scene, "denied")
        await play_succeeded(scene, "denied-1")

        # The operator tries (at once, then after 1, 2 s...) and is refused each time; meanwhile
        # nothing of the transition shows, in the status or on the operator's event stream.
        for _ in range(15):
            body = await scene.job("denied")
            assert body is not None
            assert body["status"]["state"] == "Pending"
            assert "Finished" not in [e["type"] for e in body["status"]["events"]]
            await asyncio.sleep(0.2)
        assert "Finished" not in [e["type"] for e in event_lines(operator)]
        await policy.remove()

    body = await scene.job_in_state("denied", "Succeeded")
    types = [e["type"] for e in body["status"]["events"]]
    assert types == ["Submitted", "Admitted", "Finished"]
    assert '"f":true' in body["status"][STATUS_REPORTED]["1"]
    finished = condition(body, "Finished")
    assert finished is not None
    assert finished["status"] == "True"

    async def mirrored() -> list[Any] | None:
        found = [e for e in await scene.kube_events("denied") if e.reason == "Finished"]
        return found or None

    (event,) = await eventually(mirrored, "the Finished Kubernetes Event")
    assert event.type == "Normal"
    lines = [e["type"] for e in event_lines(operator) if e.get("job") == "denied"]
    assert lines == types


def transition(job: str, kind: str, state: str, **extra: Any) -> DispatchEvent:
    return DispatchEvent.model_validate(
        {"type": kind, "job": job, "attempt": 1, "time": T0, "state": state, **extra}
    )


async def test_item2_a_transition_is_one_status_write_and_no_read(scene: Scene) -> None:
    """No operator runs: the store alone, as the supervisor uses it."""
    await scene.create_job("counted")
    store = DispatchJobStatusStore(scene.api, scene.namespace, ADAPTER)
    try:
        assert await store.load("counted", 1) is None
        listed = store.requests
        steps = [
            (ReportedRecord(submitted=True), transition("counted", "Submitted", "Pending")),
            (
                ReportedRecord(submitted=True, admitted=0),
                transition("counted", "Admitted", "Pending"),
            ),
            (
                ReportedRecord(submitted=True, admitted=0, running=0),
                transition("counted", "Running", "Running"),
            ),
        ]
        for record, event in steps:
            await store.commit("counted", 1, record, [event])
        assert store.writes == len(steps)
        # Watching the DispatchJobs costs requests of its own (a watch, a reconnect); a commit
        # adds only its write.
        assert store.requests - listed <= len(steps) + 2
        body = await scene.job("counted")
        assert body is not None
        status = body["status"]
        assert [e["type"] for e in status["events"]] == ["Submitted", "Admitted", "Running"]
        assert status["state"] == "Running"
        assert status[STATUS_REPORTED]["1"] == steps[-1][0].to_json()
        assert condition(body, "Running")["status"] == "True"  # type: ignore[index]
    finally:
        await store.close()


async def test_item2_a_start_recorded_as_the_first_transition_commits_reads_nothing(
    scene: Scene,
) -> None:
    """The start is recorded through the store while it commits the job's first transition:
    the two go one after the other, the second from what the first wrote, so nothing conflicts
    or reads; the transition showed the start already, so its record writes nothing."""
    await scene.create_job("raced")
    store = DispatchJobStatusStore(scene.api, scene.namespace, ADAPTER)
    try:
        assert await store.load("raced", 1) is None
        listed = store.requests
        await asyncio.gather(
            store.commit(
                "raced",
                1,
                ReportedRecord(submitted=True),
                [transition("raced", "Submitted", "Pending", trainJob="raced-1")],
            ),
            record_start(
                scene.api, scene.namespace, "raced", attempt=1, train_job="raced-1", store=store
            ),
        )
        assert store.writes == 1
        assert store.requests - listed == 1
        body = await scene.job("raced")
        assert body is not None
        assert body["status"]["trainJob"] == "raced-1"
        assert body["status"]["attempt"] == 1
        assert [e["type"] for e in body["status"]["events"]] == ["Submitted"]
        assert len(store._writing) == 0
    finally:
        await store.close()


async def test_item2_the_store_drops_transitions_of_jobs_it_does_not_serve(scene: Scene) -> None:
    await scene.create_job("foreign", adapter="another")
    store = DispatchJobStatusStore(scene.api, scene.namespace, ADAPTER)
    try:
        event = transition("foreign", "Submitted", "Pending")
        await store.commit("foreign", 1, ReportedRecord(submitted=True), [event])
        await store.commit("gone", 1, ReportedRecord(submitted=True), [event])
        assert store.writes == 0
        foreign = await scene.job("foreign")
        assert STATUS_REPORTED not in ((foreign or {}).get("status") or {})
        assert await store.unfinished() == []
    finally:
        await store.close()


async def test_item2_a_restarted_store_lists_unfinished_records(scene: Scene) -> None:
    await scene.create_job("kept")
    running = ReportedRecord(submitted=True, admitted=0, running=0)
    first = DispatchJobStatusStore(scene.api, scene.namespace, ADAPTER)
    try:
        await first.commit("kept", 1, running, [transition("kept", "Running", "Running")])
    finally:
        await first.close()
    restarted = DispatchJobStatusStore(scene.api, scene.namespace, ADAPTER)
    try:

        async def listed() -> list[tuple[str, int]] | None:
            return await restarted.unfinished() or None

        assert await eventually(listed, "the unfinished record") == [("kept", 1)]
        assert await restarted.load("kept", 1) == running
        assert await restarted.load("kept", 2) is None
    finally:
        await restarted.close()


async def test_item3_a_recreated_dispatchjob_is_reported_again(
    cluster: Any, scene: Scene, tmp_path: Path
) -> None:
    """x finishes, its TrainJob goes, the operator restarts, x is deleted and created again."""
    events = tmp_path / "events.jsonl"
    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        await scene.apply_adapter(scene.adapter_spec())
        await scene.ready_adapter()
        await scene.create_job("phoenix")
        await scene.job_in_state("phoenix", "Pending")
        await play_succeeded(scene, "phoenix-1")
        await scene.job_in_state("phoenix", "Succeeded")
        await scene.objects.delete_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", scene.namespace, "trainjobs", "phoenix-1"
        )

    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        await scene.ready_adapter()
        await scene.objects.delete_namespaced_custom_object(
            GROUP, VERSION, scene.namespace, "dispatchjobs", "phoenix"
        )

        async def gone() -> bool:
            return await scene.job("phoenix") is None

        await eventually(gone, "the first DispatchJob to go")
        await scene.create_job("phoenix")
        await scene.job_in_state("phoenix", "Pending")
        await play_succeeded(scene, "phoenix-1")
        body = await scene.job_in_state("phoenix", "Succeeded")

        # The event line follows the status write: wait for it before the operator stops.
        async def logged() -> bool:
            return len([e for e in event_lines(events) if e.get("job") == "phoenix"]) >= 6

        await eventually(logged, "the second Finished in the event log")

    assert [e["type"] for e in body["status"]["events"]] == ["Submitted", "Admitted", "Finished"]
    lines = [e["type"] for e in event_lines(events) if e.get("job") == "phoenix"]
    assert lines == ["Submitted", "Admitted", "Finished"] * 2


async def test_item14_the_status_stays_bounded_whatever_the_job_reports(scene: Scene) -> None:
    await scene.create_job("verbose")
    store = DispatchJobStatusStore(scene.api, scene.namespace, ADAPTER)
    huge = "x" * 4096
    evidence = [
        Evidence(kind="Pod", name=f"verbose-1-node-{i}", message=huge, reason="Error")
        for i in range(40)
    ]
    try:
        for sequence in range(60):
            event = transition(
                "verbose",
                "Restarted",
                "Running",
                message=huge,
                evidence=evidence,
                result={"note": huge[:3000]},
                reason=f"Restart{sequence}",
            )
            record = ReportedRecord(submitted=True, restarts=sequence + 1)
            await store.commit("verbose", 1, record, [event])
    finally:
        await store.close()
    body = await scene.job("verbose")
    assert body is not None
    status = body["status"]
    assert len(json.dumps(status, separators=(",", ":"))) <= STATUS_LIMIT + 4096
    assert status["events"][-1]["reason"] == "Restart59"
    assert len(status["events"][-1]["message"]) <= 1024
    # 50 events of this size would be over the limit: the oldest went, and the status says so.
    assert len(status["events"]) < 50
    assert "oldest events were dropped" in status["truncated"]


async def test_item11_item12_a_kind_the_adapter_cannot_list_is_named_on_its_status(
    cluster: Any, kube_api: client.ApiClient, scene: Scene, operator: Path
) -> None:
    """An adapter whose identity may not list nodes opens (its probe needs none), then says
    within 30 s which kind it cannot list and the refused verb and resource; once allowed, it
    is Ready again."""
    rules = [rule for rule in CHART_RULES if "nodes" not in rule["resources"]]
    async with user_with_rules(cluster, kube_api, rules, "no-nodes") as kubeconfig:
        spec = scene.adapter_spec(cluster={"kubeconfig": str(kubeconfig)})
        await scene.apply_adapter(spec)

        async def ready_is(status: str, reason: str) -> dict[str, Any] | None:
            ready = condition(await scene.adapter(), "Ready")
            if ready and (ready["status"], ready["reason"]) == (status, reason):
                return ready
            return None

        blocked = await eventually(
            lambda: ready_is("False", "ForbiddenListNodes"), "Ready=False naming nodes", 30
        )
        assert "cannot list nodes" in blocked["message"]
        assert "forbidden" in blocked["message"]

        # user_with_rules names the user's ClusterRole after the user, its kubeconfig too.
        rbac: Any = client.RbacAuthorizationV1Api(kube_api)
        role = await rbac.read_cluster_role(kubeconfig.stem)
        nodes = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]}
        role.rules.append(policy_rule(nodes))
        await rbac.replace_cluster_role(role.metadata.name, role)
        await eventually(
            lambda: ready_is("True", "Watching"), "Ready=True once nodes can be listed", 60
        )
