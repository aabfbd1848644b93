"""End to end through the operator: DispatchJobs in, the real controllers underneath.

The operator (kopf, in this event loop, with the project's handlers) serves a KubeflowAdapter
and its DispatchJobs; Trainer, JobSet, Kueue, kube-scheduler and KWOK do the rest. The test only
creates the two custom resources and reads the DispatchJob's status back.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kopf
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

import dispatch_kubeflow.handlers  # noqa: F401  (registers the handlers)
from dispatch_kubeflow.constants import GROUP, VERSION
from dispatch_kubeflow.handlers.registry import EventLines
from dispatch_kubeflow.publish import encode
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fullstack.stack import EXAMPLE_RUNTIME_NAME, FullStack
from tests.integration.test_operator import Samples, eventually, sample, scrape

START_TIMEOUT = 60.0
JOB_TIMEOUT = 120.0
ADAPTER = "adapter"


@contextlib.contextmanager
def _kubeconfig(path: Path) -> Iterator[None]:
    before = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = before


@contextlib.asynccontextmanager
async def _operator(
    kubeconfig: Path, namespace: str | list[str], events: Path, memo: kopf.Memo | None = None
) -> AsyncIterator[None]:
    stop, ready = asyncio.Event(), asyncio.Event()
    lines = EventLines(str(events))
    memo = memo if memo is not None else kopf.Memo()
    memo.event_lines = lines
    with _kubeconfig(kubeconfig):
        task = asyncio.create_task(
            kopf.operator(
                standalone=True,
                namespaces=[namespace] if isinstance(namespace, str) else namespace,
                stop_flag=stop,
                ready_flag=ready,
                memo=memo,
            )
        )
        try:
            await asyncio.wait_for(ready.wait(), START_TIMEOUT)
            yield
        finally:
            stop.set()
            await asyncio.wait_for(task, START_TIMEOUT)
            lines.close()


async def _status_when(
    objects: client.CustomObjectsApi, namespace: str, name: str, state: str
) -> dict[str, Any]:
    deadline = time.monotonic() + JOB_TIMEOUT
    last: dict[str, Any] = {}
    while time.monotonic() < deadline:
        with contextlib.suppress(ApiException):
            body = await objects.get_namespaced_custom_object(
                GROUP, VERSION, namespace, "dispatchjobs", name
            )
            last = body.get("status") or {}
            if last.get("state") == state:
                return last
        await asyncio.sleep(0.25)
    raise AssertionError(f"DispatchJob {name} not {state} within {JOB_TIMEOUT:.0f} s: {last}")


async def _create(
    objects: client.CustomObjectsApi, namespace: str, plural: str, body: dict[str, Any]
) -> None:
    await objects.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)


async def test_dispatch_jobs_end_with_their_causes_through_the_operator(
    fullstack: FullStack,
    cluster: ControlPlane,
    namespace: str,
    kube_api: client.ApiClient,
    tmp_path: Path,
) -> None:
    objects = client.CustomObjectsApi(kube_api)
    result = '{"accuracy": 0.93}'
    adapter = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "KubeflowAdapter",
        "metadata": {"name": ADAPTER},
        "spec": {
            "namespace": namespace,
            "runtimes": [{"kind": "ClusterTrainingRuntime", "name": EXAMPLE_RUNTIME_NAME}],
        },
    }

    def dispatch_job(name: str, env: dict[str, str], **spec: Any) -> dict[str, Any]:
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DispatchJob",
            "metadata": {"name": name},
            "spec": {
                "adapter": ADAPTER,
                "attempt": 1,
                "numNodes": 2,
                "gpusPerNode": 1,
                "env": [{"name": k, "value": v} for k, v in env.items()],
                **spec,
            },
        }

    memo = kopf.Memo(metrics_address="127.0.0.1:0")
    async with _operator(cluster.kubeconfig, namespace, tmp_path / "events.jsonl", memo):
        await _create(objects, namespace, "kubeflowadapters", adapter)
        await _create(
            objects,
            namespace,
            "dispatchjobs",
            dispatch_job("good", {"SIM_MESSAGE": encode(result).decode()}),
        )
        await _create(
            objects,
            namespace,
            "dispatchjobs",
            dispatch_job("bad", {"SIM_OUTCOME": "fail", "SIM_EXIT_CODE": "2"}),
        )
        await _create(
            objects,
            namespace,
            "dispatchjobs",
            dispatch_job(
                "oom", {"SIM_OUTCOME": "fail", "SIM_EXIT_CODE": "137", "SIM_REASON": "OOMKilled"}
            ),
        )
        await _create(
            objects,
            namespace,
            "dispatchjobs",
            dispatch_job("late", {"SIM_OUTCOME": "hang"}, activeDeadlineSeconds=5),
        )
        good = await _status_when(objects, namespace, "good", "Succeeded")
        bad = await _status_when(objects, namespace, "bad", "Failed")
        oom = await _status_when(objects, namespace, "oom", "Failed")
        late = await _status_when(objects, namespace, "late", "Failed")

        async def all_counted() -> Samples | None:
            samples = await scrape(memo.metrics_port)
            return samples if len(_finished_in(samples, namespace)) == 4 else None

        # The status is written before the operator counts it: wait for the counter too.
        samples = await eventually(all_counted, "four finished attempts in /metrics")

    assert good.get("cause") is None
    finished = [e for e in good["events"] if e["type"] == "Finished"]
    assert len(finished) == 1
    assert finished[0].get("result") == {"accuracy": 0.93}
    assert bad["cause"] == "ProgramError"
    assert oom["cause"] == "OutOfMemory"
    assert (late["cause"], late["reason"]) == ("Timeout", "DeadlineExceeded")
    for status in (good, bad, oom, late):
        keys = [
            (e["type"], e.get("state"), e.get("cause"), e.get("reason")) for e in status["events"]
        ]
        assert all(count == 1 for count in Counter(keys).values()), keys

    # The operator's /metrics count exactly these four outcomes, by state and cause.
    assert _finished_in(samples, namespace) == {
        ("Succeeded", ""): 1.0,
        ("Failed", "ProgramError"): 1.0,
        ("Failed", "OutOfMemory"): 1.0,
        ("Failed", "Timeout"): 1.0,
    }
    where = {"namespace": namespace, "runtime": EXAMPLE_RUNTIME_NAME}
    assert sample(samples, "dispatch_kubeflow_job_admission_wait_seconds_count", **where) == 4
    assert sample(samples, "dispatch_kubeflow_job_run_seconds_count", **where) == 4


def _finished_in(samples: Samples, namespace: str) -> dict[tuple[str, str], float]:
    """``dispatch_kubeflow_jobs_finished_total`` of ``namespace`` by (state, cause)."""
    found: dict[tuple[str, str], float] = {}
    for (name, labels), value in samples.items():
        fields = dict(labels)
        if name == "dispatch_kubeflow_jobs_finished_total" and fields["namespace"] == namespace:
            assert (fields["adapter"], fields["runtime"]) == (ADAPTER, EXAMPLE_RUNTIME_NAME)
            found[(fields["state"], fields["cause"])] = value
    return found
