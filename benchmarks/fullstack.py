"""Jobs per minute through Kueue admission to completion, and event latency, on the full stack.

    python3 benchmarks/fullstack.py                    # 40 jobs, 8 at a time by GPU quota
    python3 benchmarks/fullstack.py --jobs 80 --gpus 16 --seconds 2

Starts a control plane and the full stack (real Trainer, JobSet, Kueue, kube-scheduler,
kube-controller-manager, KWOK nodes) in a temporary folder, opens a Kueue-mode adapter, starts
`--jobs` one-node jobs of one GPU each whose ranks run `--seconds`, and waits for every
`Finished` event. The ClusterQueue has `--gpus` GPUs, so at most that many run at once.

Throughput is jobs finished per minute from the first `start` to the last `Finished`.
Event latency is measured against an independent watch on the same apiserver: for each job,
from the moment that watch first sees the controller's write (Kueue's `Admitted=True` on the
Workload; Trainer's `Complete` on the TrainJob) to the moment the adapter yields the matching
dispatch event. Both clocks are this process's monotonic clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes_asyncio import client, config, watch

from dispatch_kubeflow.constants import EventType
from tests.cluster import binaries
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fullstack import build
from tests.cluster.fullstack.stack import FullStack
from tests.fullstack.scenarios import job, open_adapter, settings

NAMESPACE = "bench"


def _true(obj: dict[str, Any], kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions") or []
    )


async def _observe(
    api: client.ApiClient,
    plural: str,
    group: str,
    version: str,
    kind: str,
    key: str,
    seen: dict[str, float],
    stop: asyncio.Event,
) -> None:
    """Record when a watch first sees condition `kind` True, by the label/owner key of the job."""
    custom = client.CustomObjectsApi(api)
    while not stop.is_set():
        listed = await custom.list_namespaced_custom_object(group, version, NAMESPACE, plural)
        rv = listed["metadata"]["resourceVersion"]
        async with watch.Watch().stream(
            custom.list_namespaced_custom_object,
            group,
            version,
            NAMESPACE,
            plural,
            resource_version=rv,
            timeout_seconds=30,
        ) as stream:
            async for event in stream:
                obj = event["object"]
                if not _true(obj, kind):
                    continue
                labels = obj["metadata"].get("labels", {})
                job_id = labels.get(key)
                if job_id is None and plural == "workloads":
                    owner = (obj["metadata"].get("ownerReferences") or [{}])[0].get("name", "")
                    job_id = owner.rsplit("-", 1)[0] or None
                if job_id is not None:
                    seen.setdefault(job_id, time.monotonic())
                if stop.is_set():
                    break


def _summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "median_ms": round(statistics.median(ordered) * 1000, 1),
        "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))] * 1000, 1),
        "max_ms": round(ordered[-1] * 1000, 1),
    }


async def run(
    plane: ControlPlane,
    stack: FullStack,
    jobs: int,
    gpus: int,
    seconds: float,
    concurrency: int,
) -> dict[str, Any]:
    plane.kubectl("create", "namespace", NAMESPACE)
    stack.create_queues(NAMESPACE, gpus=gpus)
    api = await config.new_client_from_config(config_file=str(plane.kubeconfig))
    admitted_seen: dict[str, float] = {}
    complete_seen: dict[str, float] = {}
    stop = asyncio.Event()
    watchers = [
        asyncio.create_task(
            _observe(
                api, "workloads", "kueue.x-k8s.io", "v1beta2", "Admitted", "", admitted_seen, stop
            )
        ),
        asyncio.create_task(
            _observe(
                api,
                "trainjobs",
                "trainer.kubeflow.org",
                "v1alpha1",
                "Complete",
                "dispatch.phpboyscout.uk/job",
                complete_seen,
                stop,
            )
        ),
    ]
    ours: dict[tuple[str, str], float] = {}
    text = settings(plane.kubeconfig, NAMESPACE, {"localQueue": "lq", "priorityClass": "low"})
    try:
        async with open_adapter(text, "bench") as (adapter, log):
            started = time.monotonic()
            gate = asyncio.Semaphore(concurrency)

            async def submit(index: int) -> None:
                async with gate:
                    spec = job(f"j{index}", seconds=seconds, num_nodes=1, gpus_per_node=1)
                    await adapter.start(spec)

            await asyncio.gather(*(submit(index) for index in range(jobs)))
            submitted = time.monotonic()
            deadline = started + 60 + jobs * (seconds + 5)
            while time.monotonic() < deadline:
                done = {e.job for e in log.events if e.type == EventType.FINISHED}
                if len(done) >= jobs:
                    break
                await asyncio.sleep(0.05)
            finished = time.monotonic()
            for event, at in zip(log.events, log.received, strict=True):
                if event.job is not None:
                    ours.setdefault((event.job, str(event.type)), at)
            failed = [
                e.job for e in log.events if e.type == EventType.FINISHED and e.state != "Succeeded"
            ]
    finally:
        stop.set()
        for task in watchers:
            task.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        await api.close()
    done = {j for (j, t) in ours if t == EventType.FINISHED}
    admit_latency = [
        ours[(j, EventType.ADMITTED)] - admitted_seen[j]
        for j in done
        if (j, EventType.ADMITTED) in ours and j in admitted_seen
    ]
    finish_latency = [
        ours[(j, EventType.FINISHED)] - complete_seen[j] for j in done if j in complete_seen
    ]
    return {
        "jobs": jobs,
        "finished": len(done),
        "not_succeeded": failed,
        "gpus_in_queue": gpus,
        "rank_seconds": seconds,
        "start_concurrency": concurrency,
        "submit_seconds": round(submitted - started, 1),
        "wall_seconds": round(finished - started, 1),
        "jobs_per_minute": round(len(done) / ((finished - started) / 60), 1),
        "admitted_event_latency": _summary(admit_latency),
        "finished_event_latency": _summary(finish_latency),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--gpus", type=int, default=8, help="GPU quota of the ClusterQueue")
    parser.add_argument("--seconds", type=float, default=1.0, help="how long each rank runs")
    parser.add_argument("--concurrency", type=int, default=8, help="start calls in flight at once")
    args = parser.parse_args()
    binaries.build()
    build.build()
    with tempfile.TemporaryDirectory(prefix="fullstack-bench-") as run_dir:
        plane = ControlPlane(Path(run_dir))
        plane.start(with_controller_manager=True)
        stack = FullStack(plane)
        try:
            started = time.monotonic()
            stack.start()
            stack_start = time.monotonic() - started
            result = asyncio.run(
                run(plane, stack, args.jobs, args.gpus, args.seconds, args.concurrency)
            )
            result["stack_start_seconds"] = round(stack_start, 1)
        finally:
            stack.stop()
            plane.stop()
    print(json.dumps(result, indent=2))
    return 0 if result["finished"] == args.jobs else 1


if __name__ == "__main__":
    sys.exit(main())
