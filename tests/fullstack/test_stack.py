"""The full stack itself: real controllers take a TrainJob all the way, nothing written by hand.

These tests create TrainJobs directly (no adapter) and only read what Trainer, JobSet, the Job
controller, kube-scheduler, KWOK, Kueue and the node-lifecycle controller write, so that a
scenario failure elsewhere can be told apart from a stack that does not work.
"""

from __future__ import annotations

from typing import Any

from kubernetes_asyncio import client

from tests.cluster.fullstack.stack import FullStack
from tests.fullstack.kube import (
    JOBSET,
    TRAINER,
    Kube,
    condition,
    is_true,
    trainjob,
    wait_for,
)

JOB_TIMEOUT = 90.0
# What Kueue calls a Workload waiting for quota, by Kueue configuration (KUEUE_CONFIGURATIONS).
WAITING_FOR_QUOTA = {"observability-off": "Pending", "observability-on": "WaitingForQuota"}
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


def _terminated(pod: Any) -> Any:
    return pod.status.container_statuses[0].state.terminated


async def test_trainjob_completes_on_simulated_gpu_nodes(
    fullstack: FullStack, namespace: str, kube_api: client.ApiClient
) -> None:
    kube = Kube(kube_api, namespace)
    result = '{"loss": 0.125}'
    await kube.create(TRAINER, trainjob("two-ranks", {"SIM_MESSAGE": result}, num_nodes=2))

    done = await wait_for(
        lambda: kube.get(TRAINER, "two-ranks"),
        lambda job: is_true(job, "Complete"),
        JOB_TIMEOUT,
        "TrainJob two-ranks to complete",
    )

    assert condition(done, "Complete")["reason"] == "AllJobsCompleted"  # type: ignore[index]
    jobset = await kube.get(JOBSET, "two-ranks")
    assert is_true(jobset, "Completed")
    pods = await kube.pods(f"{JOBSET_LABEL}=two-ranks")
    assert len(pods) == 2
    assert {pod.spec.node_name for pod in pods} <= set(fullstack.nodes)
    assert all(pod.status.phase == "Succeeded" for pod in pods)
    assert all(_terminated(pod).message == result for pod in pods)


async def test_failed_rank_fails_the_trainjob_with_its_exit_code(
    fullstack: FullStack, namespace: str, kube_api: client.ApiClient
) -> None:
    kube = Kube(kube_api, namespace)
    env = {"SIM_OUTCOME": "fail", "SIM_EXIT_CODE": "137", "SIM_REASON": "OOMKilled"}
    await kube.create(TRAINER, trainjob("oom", env))

    failed = await wait_for(
        lambda: kube.get(TRAINER, "oom"),
        lambda job: is_true(job, "Failed"),
        JOB_TIMEOUT,
        "TrainJob oom to fail",
    )

    assert condition(failed, "Failed")["reason"] == "FailedJobs"  # type: ignore[index]
    (pod,) = await kube.pods(f"{JOBSET_LABEL}=oom")
    assert pod.status.phase == "Failed"
    assert (_terminated(pod).exit_code, _terminated(pod).reason) == (137, "OOMKilled")


async def test_kueue_admits_within_quota_and_holds_the_rest(
    fullstack: FullStack,
    namespace: str,
    queues: str,
    kueue_configuration: str,
    kube_api: client.ApiClient,
) -> None:
    kube = Kube(kube_api, namespace)
    queued = {"kueue.x-k8s.io/queue-name": queues}
    # The queue has 8 GPUs: 2 nodes x 4 fit, a second such job must wait for the first.
    await kube.create(TRAINER, trainjob("first", {"SIM_OUTCOME": "hang"}, 2, 4, queued))
    first = await wait_for(
        lambda: kube.get(TRAINER, "first"),
        lambda job: job["spec"].get("suspend") is False,
        JOB_TIMEOUT,
        "Kueue to admit and unsuspend TrainJob first",
    )
    await kube.create(TRAINER, trainjob("second", {}, 2, 4, queued))
    second = await kube.get(TRAINER, "second")

    async def second_workload() -> dict[str, Any] | None:
        return await kube.workload_of(second["metadata"]["uid"])

    pending = await wait_for(
        second_workload,
        lambda wl: (
            wl is not None and (condition(wl, "QuotaReserved") or {}).get("status") == "False"
        ),
        JOB_TIMEOUT,
        "the second Workload to wait for quota",
    )

    assert is_true(await kube.workload_of(first["metadata"]["uid"]), "Admitted")
    reserved = condition(pending, "QuotaReserved")
    assert reserved is not None
    assert reserved["reason"] == WAITING_FOR_QUOTA[kueue_configuration]
    assert "insufficient unused quota" in reserved["message"]
    assert (await kube.get(TRAINER, "second"))["spec"]["suspend"] is True


async def test_node_without_heartbeats_is_tainted_unreachable(
    fullstack: FullStack, kube_api: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube_api)
    node = fullstack.nodes[-1]

    def unreachable(n: Any) -> set[str]:
        return {t.effect for t in n.spec.taints or [] if t.key == "node.kubernetes.io/unreachable"}

    fullstack.stop_heartbeats(node)
    try:
        # NoSchedule comes first; the rate-limited NoExecute taint is the one that evicts.
        tainted = await wait_for(
            lambda: core.read_node(node),
            lambda n: "NoExecute" in unreachable(n),
            # node-monitor-grace-period (50 s) plus the controller's 5 s monitor period.
            120.0,
            f"node {node} to be tainted unreachable:NoExecute",
        )
    finally:
        fullstack.resume_heartbeats(node)

    ready = next(c for c in tainted.status.conditions if c.type == "Ready")
    assert (ready.status, ready.reason) == ("Unknown", "NodeStatusUnknown")
    await wait_for(
        lambda: core.read_node(node),
        lambda n: not unreachable(n),
        120.0,
        f"node {node} to recover once heartbeats resume",
    )
