"""How fast the adapter starts and stops jobs on a real apiserver, and what each costs in requests.

    python3 benchmarks/start_stop.py                  # 200 jobs, 20 at a time, own control plane
    python3 benchmarks/start_stop.py --jobs 500 --concurrency 50
    python3 benchmarks/start_stop.py --kubeconfig ~/.kube/config --namespace bench

By default it starts the test control plane (etcd + kube-apiserver with the upstream CRDs, no
controllers) in a temporary folder. Each job is one ``start`` (read the runtime, create the
TrainJob) followed by one ``stop_job`` (delete by label, read back until nothing is left), in
plain mode. The jobs are started first, ``--concurrency`` at a time, then stopped the same way, so
the rate of ``start`` alone and of ``stop_job`` alone are printed beside the two together.
Requests are counted by the adapter's own API client, so every request the adapter
makes is counted, and nothing else. The preflight probe of ``open`` is not part of the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes_asyncio import client, config  # noqa: E402

from dispatch_kubeflow.adapter import Adapter, AdapterConfig  # noqa: E402
from dispatch_kubeflow.settings import Cluster, RuntimeRef, Settings  # noqa: E402
from dispatch_kubeflow.trainjob import JobSpec  # noqa: E402

RUNTIME = RuntimeRef(kind="TrainingRuntime", name="dispatch-torch")
SEQUENTIAL = 10


def control_plane(kubeconfig: Path | None) -> AbstractContextManager[Path]:
    from tests.cluster.controlplane import given_or_temporary

    return given_or_temporary(kubeconfig)


async def prepare(kubeconfig: Path, namespace: str) -> None:
    """The namespace and the example runtime, as an admin."""
    api = await config.new_client_from_config(config_file=str(kubeconfig))
    try:
        await client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
        )
        runtime: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "runtime.yaml").read_text())
        runtime["kind"] = RUNTIME.kind
        runtime["metadata"] = {"name": RUNTIME.name}
        await client.CustomObjectsApi(api).create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", namespace, "trainingruntimes", runtime
        )
    finally:
        await api.close()


async def cleanup(kubeconfig: Path, namespace: str) -> None:
    api = await config.new_client_from_config(config_file=str(kubeconfig))
    try:
        await client.CoreV1Api(api).delete_namespace(namespace)
    finally:
        await api.close()


async def run(kubeconfig: Path, namespace: str, jobs: int, concurrency: int) -> dict[str, Any]:
    settings = Settings(
        namespace=namespace,
        cluster=Cluster(kubeconfig=str(kubeconfig)),
        runtimes=(RUNTIME,),
        probe_runtime=RUNTIME,
    )
    async with await Adapter.open(AdapterConfig(settings=settings)) as adapter:
        # The split between start and stop_job, from a few jobs one at a time (under
        # concurrency the shared counter cannot tell whose request is whose).
        split = {"start": 0, "stop_job": 0}
        for index in range(SEQUENTIAL):
            job = JobSpec(job_id=f"split-{index}", image="trainer:1", num_nodes=2)
            before = adapter.api.requests
            await adapter.start(job)
            middle = adapter.api.requests
            await adapter.stop_job(job.job_id)
            split["start"] += middle - before
            split["stop_job"] += adapter.api.requests - middle

        gate = asyncio.Semaphore(concurrency)
        specs = [JobSpec(job_id=f"bench-{i}", image="trainer:1", num_nodes=2) for i in range(jobs)]

        async def start(job: JobSpec) -> None:
            async with gate:
                await adapter.start(job)

        async def stop(job: JobSpec) -> None:
            async with gate:
                await adapter.stop_job(job.job_id)

        began_requests = adapter.api.requests
        began = time.perf_counter()
        await asyncio.gather(*(start(job) for job in specs))
        started = time.perf_counter()
        await asyncio.gather(*(stop(job) for job in specs))
        stopped = time.perf_counter()
        total = adapter.api.requests - began_requests
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "seconds": round(stopped - began, 2),
        "starts_per_second": round(jobs / (started - began), 1),
        "stops_per_second": round(jobs / (stopped - started), 1),
        "jobs_per_second": round(jobs / (stopped - began), 1),
        "requests_per_job": round(total / jobs, 2),
        "requests_per_start_sequential": round(split["start"] / SEQUENTIAL, 2),
        "requests_per_stop_job_sequential": round(split["stop_job"] / SEQUENTIAL, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--kubeconfig", type=Path, help="an existing cluster (default: start one)")
    parser.add_argument("--namespace", default=f"bench-{secrets.token_hex(3)}")
    args = parser.parse_args()
    with control_plane(args.kubeconfig) as kubeconfig:
        asyncio.run(prepare(kubeconfig, args.namespace))
        try:
            result = asyncio.run(run(kubeconfig, args.namespace, args.jobs, args.concurrency))
        finally:
            asyncio.run(cleanup(kubeconfig, args.namespace))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
