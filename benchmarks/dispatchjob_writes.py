"""What one write of a DispatchJob costs kube-apiserver, with the CRD's rules and without them.

    python3 benchmarks/dispatchjob_writes.py            # 100 batches of 200 writes each way
    python3 benchmarks/dispatchjob_writes.py --batches 300

The apiserver runs the CEL rules of the DispatchJob CRD on every update of a DispatchJob: the
operator's metadata patch (the stop finalizer) and each of its status writes. This measures
kube-apiserver's CPU over metadata patches (a label) and status patches (a message) on
``--jobs`` DispatchJobs, ``--concurrency`` in flight, on the CRD as shipped and on a copy of it
stripped of its ``x-kubernetes-validations`` (another group, served beside it), in batches of
``--batch`` writes, the two CRDs in turn. It prints the CPU microseconds per write of each kind on
each CRD, and what the rules cost: the mean difference between paired batches, plus or minus
half its 95% confidence interval.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.operator_events import ProfiledControlPlane, process_cpu_seconds
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.constants import DISPATCH_JOB_KIND, DISPATCH_JOBS, GROUP, VERSION
from dispatch_kubeflow.handlers import crds
from tests.cluster import binaries

NAMESPACE = "writes"
MERGE_PATCH = "application/merge-patch+json"
SPEC = {"adapter": "team", "image": "trainer:1", "numNodes": 1}
STRIPPED_GROUP = "without-rules.benchmark.example"
PROFILE_SECONDS = 60
SHIPPED, STRIPPED = "as shipped", "without rules"


def stripped(node: Any) -> Any:
    """``node`` without any ``x-kubernetes-validations``, at any depth."""
    if isinstance(node, dict):
        return {k: stripped(v) for k, v in node.items() if k != "x-kubernetes-validations"}
    if isinstance(node, list):
        return [stripped(item) for item in node]
    return node


def stripped_crd() -> dict[str, Any]:
    """The DispatchJob CRD without its rules, in a group of its own."""
    crd: dict[str, Any] = stripped(crds.dispatchjob_crd())
    crd["spec"]["group"] = STRIPPED_GROUP
    crd["metadata"]["name"] = f"{DISPATCH_JOBS}.{STRIPPED_GROUP}"
    return crd


async def apiserver_cpu_us(
    apiserver_pid: int, requests: int, concurrency: int, request: Callable[[int], Awaitable[None]]
) -> tuple[float, float]:
    """kube-apiserver's CPU microseconds per request over ``requests`` calls of ``request``
    (numbered from 0), ``concurrency`` in flight; and the requests per second."""
    queue = iter(range(requests))

    async def worker() -> None:
        for i in queue:
            await request(i)

    before = process_cpu_seconds(apiserver_pid)
    started = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.monotonic() - started
    cpu = process_cpu_seconds(apiserver_pid) - before
    return cpu * 1e6 / requests, requests / wall


class Bench:
    def __init__(self, api: client.ApiClient, apiserver_pid: int, concurrency: int) -> None:
        self.objects: Any = client.CustomObjectsApi(api)  # its signature omits _content_type
        self.extensions: Any = client.ApiextensionsV1Api(api)
        self.apiserver_pid = apiserver_pid
        self.concurrency = concurrency

    async def serve_stripped_crd(self) -> None:
        await self.extensions.create_custom_resource_definition(stripped_crd())
        for _ in range(600):
            try:
                await self.objects.list_namespaced_custom_object(
                    STRIPPED_GROUP, VERSION, NAMESPACE, DISPATCH_JOBS, limit=1
                )
                return
            except ApiException as error:
                if error.status not in (404, 429):
                    raise
            await asyncio.sleep(0.1)
        raise TimeoutError("the DispatchJob CRD without rules was not served in 60 s")

    async def create_jobs(self, group: str, count: int) -> list[str]:
        names = [f"job-{i}" for i in range(count)]
        for name in names:
            body = {
                "apiVersion": f"{group}/{VERSION}",
                "kind": DISPATCH_JOB_KIND,
                "metadata": {"name": name},
                "spec": SPEC,
            }
            await self.objects.create_namespaced_custom_object(
                group, VERSION, NAMESPACE, DISPATCH_JOBS, body
            )
        return names

    async def patch(self, group: str, name: str, body: dict[str, Any]) -> None:
        await self.objects.patch_namespaced_custom_object(
            group, VERSION, NAMESPACE, DISPATCH_JOBS, name, body, _content_type=MERGE_PATCH
        )

    async def patch_status(self, group: str, name: str, body: dict[str, Any]) -> None:
        await self.objects.patch_namespaced_custom_object_status(
            group, VERSION, NAMESPACE, DISPATCH_JOBS, name, body, _content_type=MERGE_PATCH
        )

    async def cpu_us_per_write(
        self, names: list[str], writes: int, write: Callable[[int, str], Awaitable[None]]
    ) -> tuple[float, float]:
        """kube-apiserver's CPU microseconds per write, and the writes per second."""

        async def one(i: int) -> None:
            await write(i, names[i % len(names)])

        return await apiserver_cpu_us(self.apiserver_pid, writes, self.concurrency, one)

    async def metadata_writes(
        self, group: str, names: list[str], writes: int, batch: int
    ) -> tuple[float, float]:
        async def label(i: int, name: str) -> None:
            await self.patch(group, name, {"metadata": {"labels": {"write": f"b{batch}-{i}"}}})

        return await self.cpu_us_per_write(names, writes, label)

    async def status_writes(
        self, group: str, names: list[str], writes: int, batch: int
    ) -> tuple[float, float]:
        async def message(i: int, name: str) -> None:
            body = {"status": {"message": f"batch {batch}, write {i}"}}
            await self.patch_status(group, name, body)

        return await self.cpu_us_per_write(names, writes, message)


def ci95(values: list[float]) -> float:
    """Half the width of the mean's 95% confidence interval."""
    return round(1.96 * statistics.stdev(values) / math.sqrt(len(values)), 1)


async def measure(plane: ProfiledControlPlane, args: argparse.Namespace) -> dict[str, Any]:
    api = await config.new_client_from_config(config_file=str(plane.kubeconfig))
    try:
        await client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE))
        )
        bench = Bench(api, plane.processes.pids["kube-apiserver"], args.concurrency)
        await bench.serve_stripped_crd()
        groups = {SHIPPED: GROUP, STRIPPED: STRIPPED_GROUP}
        names = {crd: await bench.create_jobs(group, args.jobs) for crd, group in groups.items()}
        kinds = {"metadata": bench.metadata_writes, "status": bench.status_writes}
        profile = args.profile and plane.record_profile(PROFILE_SECONDS, args.profile)
        cpu_us: dict[str, dict[str, list[float]]] = {
            crd: {kind: [] for kind in kinds} for crd in groups
        }
        rate: dict[str, dict[str, list[float]]] = {
            crd: {kind: [] for kind in kinds} for crd in groups
        }
        # Batch by batch, the two CRDs in turn: what the machine does meanwhile falls on both.
        for kind, batch_of in kinds.items():
            for batch in range(args.batches):
                for crd in (SHIPPED, STRIPPED) if batch % 2 == 0 else (STRIPPED, SHIPPED):
                    used, per_s = await batch_of(groups[crd], names[crd], args.batch, batch)
                    cpu_us[crd][kind].append(used)
                    rate[crd][kind].append(per_s)
        if profile:
            await asyncio.to_thread(profile.wait)
    finally:
        await api.close()
    paired = {
        kind: [a - b for a, b in zip(cpu_us[SHIPPED][kind], cpu_us[STRIPPED][kind], strict=True)]
        for kind in kinds
    }
    return {
        "jobs": args.jobs,
        "writes_per_batch": args.batch,
        "batches_per_crd_and_kind": args.batches,
        "concurrency": args.concurrency,
        "apiserver_cpu_us_per_write": {
            crd: {kind: round(statistics.fmean(cpu_us[crd][kind]), 1) for kind in kinds}
            for crd in groups
        },
        "writes_per_s": {
            crd: {kind: round(statistics.fmean(rate[crd][kind]), 1) for kind in kinds}
            for crd in groups
        },
        "rules_cost_us_per_write": {
            kind: {
                "mean": round(statistics.fmean(paired[kind]), 1),
                "ci95": ci95(paired[kind]),
            }
            for kind in kinds
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200, help="DispatchJobs written to")
    parser.add_argument("--batch", type=int, default=200, help="writes a batch")
    parser.add_argument("--concurrency", type=int, default=8, help="writes in flight")
    parser.add_argument(
        "--batches", type=int, default=100, help="batches of each kind of write on each CRD"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help=f"record kube-apiserver's CPU profile over the first {PROFILE_SECONDS} s here",
    )
    args = parser.parse_args()
    return print_measured(measure, args, profiling=args.profile is not None)


Measured = Coroutine[Any, Any, dict[str, Any]]


def print_measured(
    measure: Callable[[ProfiledControlPlane, argparse.Namespace], Measured],
    args: argparse.Namespace,
    profiling: bool = False,
) -> int:
    """Print, as JSON, what ``measure`` finds on a test control plane of its own."""
    binaries.build()
    with tempfile.TemporaryDirectory(prefix="control-plane-") as run_dir:
        plane = ProfiledControlPlane(Path(run_dir))
        plane.profiling = profiling
        plane.start()
        try:
            result = asyncio.run(measure(plane, args))
        finally:
            plane.stop()
    print(json.dumps({"kubernetes": binaries.kubernetes_version(), **result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
