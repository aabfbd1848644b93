"""How fast watched status changes become dispatch events, and what the supervisor costs.

    python3 benchmarks/watch_events.py                      # 2,000 jobs, 10,000 transitions
    python3 benchmarks/watch_events.py --jobs 200           # smaller run
    python3 benchmarks/watch_events.py --rate 100           # paced: 100 status writes a second
    python3 benchmarks/watch_events.py --finish-order pods-first  # each pod ends before its job
    python3 benchmarks/watch_events.py --kubeconfig ~/.kube/config --namespace bench

By default it starts the test control plane (etcd + kube-apiserver with the upstream CRDs, no
controllers) in a temporary folder. For each job it creates what the adapter, Trainer, JobSet and
Kueue would: a suspended TrainJob with the adapter's labels and a queue, its Workload, its JobSet
and one pod. The supervisor runs in a child process (so its peak memory is its own) in Kueue mode;
this process then plays the controllers and writes five status transitions per job, each of which
gives exactly one event: Workload admitted and TrainJob unsuspended (Admitted), pod running
(Running), JobSet restarted (Restarted), Workload preempted (Evicted), TrainJob complete
(Finished). Each TrainJob completes with its pod still shown running, so each Finished first reads
that pod: the worst order. With ``--finish-order pods-first`` each pod is written ended a phase
before its TrainJob completes, the order the kubelet and the controllers write them in, and the
Finished needs no read.

Unpaced, the writes outrun what the supervisor can report and the latency measures the backlog;
``--rate`` paces them to show the latency at a sustained rate.

Printed: event latency from just before the write is sent to the moment the supervisor yields
the event (p50, p99, max), the supervisor's API requests per job (its LISTs, WATCHes and record
saves), and its peak resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import resource
import secrets
import signal
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes_asyncio import client, config  # noqa: E402

from dispatch_kubeflow import constants  # noqa: E402
from dispatch_kubeflow.settings import AdmissionLease, Kueue, RuntimeRef, Settings  # noqa: E402

MERGE = "application/merge-patch+json"
ADAPTER = "bench"
TRANSITIONS = ("Admitted", "Running", "Restarted", "Evicted", "Finished")
ADMISSION_HEARTBEAT = "AdmissionHeartbeat"
# With ``--finish-order pods-first``, each job's pod is written ended (Succeeded) a phase before
# its TrainJob's Complete: the order in which the kubelet, then the Job, JobSet and Trainer
# controllers write them. That write makes no event. By default (trainjob-first) every TrainJob
# completes with its pod still shown running, so each Finished reads its pod: the worst order.
FINISH_ORDERS = ("trainjob-first", "pods-first")
POD_ENDED = "PodEnded"
# Between the last pod's end and the first TrainJob's end (pods-first), as the controllers take.
POD_END_LEAD = 1.0
# The kind whose write makes each transition's event, for the bare watch (the floor).
WRITTEN_KIND = dict(
    zip(TRANSITIONS, ("workloads", "pods", "jobsets", "workloads", "trainjobs"), strict=True)
)


def control_plane(kubeconfig: Path | None) -> AbstractContextManager[Path]:
    from tests.cluster.controlplane import given_or_temporary

    return given_or_temporary(kubeconfig)


def settings_for(namespace: str) -> Settings:
    return Settings(
        namespace=namespace,
        probe_runtime=RuntimeRef(kind="ClusterTrainingRuntime", name="torch-distributed"),
        kueue=Kueue(
            local_queue="bench",
            admission_lease=AdmissionLease(namespace=namespace, name="dispatch-admission"),
        ),
    )


# --- the supervisor, in its own process --------------------------------------------------------


def supervise(kubeconfig: str, namespace: str, out: Any, stop: Any) -> None:
    asyncio.run(_supervise(kubeconfig, namespace, out, stop))


async def _supervise(kubeconfig: str, namespace: str, out: Any, stop: Any) -> None:
    from dispatch_kubeflow.supervisor import Supervisor

    api = await config.new_client_from_config(config_file=kubeconfig)
    supervisor = Supervisor(api, settings_for(namespace), ADAPTER)
    stream = supervisor.events()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    threading.Thread(target=lambda: (stop.wait(), loop.call_soon_threadsafe(stopping.set))).start()

    async def consume() -> None:
        async for event in stream:
            out.put((event.job, event.type.value, time.time()))

    task = asyncio.create_task(consume())
    await stopping.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    watching = sum(i.requests for i in supervisor.informers)
    figures = {"total": supervisor.requests(), "lists_and_watches": watching}
    out.put(("__done__", figures, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
    await api.close()


# --- the controllers, played here ---------------------------------------------------------------


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cond(type_: str, reason: str, at: datetime | None = None) -> dict[str, Any]:
    when = (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "type": type_,
        "status": "True",
        "reason": reason,
        "message": reason,
        "lastTransitionTime": when,
    }


def written_object(job: str, type_: str, version: str) -> tuple[str, str, str]:
    """(plural, name, resourceVersion) of the write that makes ``job``'s ``type_`` event."""
    plural = WRITTEN_KIND[type_]
    name = {"workloads": workload_name(f"{job}-1"), "pods": f"{job}-1-node-0-0"}.get(
        plural, f"{job}-1"
    )
    return plural, name, version


def workload_name(trainjob: str) -> str:
    """The name Kueue gives a TrainJob's Workload (its hash suffix fixed here)."""
    return f"trainjob-{trainjob}-abcde"


class Where(TypedDict):
    """Where a namespaced custom object lives: the keyword arguments of CustomObjectsApi."""

    group: str
    version: str
    namespace: str
    plural: str


class Cluster:
    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.ns = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def labels(self, job: str) -> dict[str, str]:
        return {
            constants.LABEL_ADAPTER: ADAPTER,
            constants.LABEL_JOB: job,
            constants.LABEL_ATTEMPT: "1",
        }

    def where(self, group: str, version: str, plural: str) -> Where:
        return {"group": group, "version": version, "namespace": self.ns, "plural": plural}

    async def create_job(self, job: str) -> None:
        tj_where = self.where(constants.TRAINER_GROUP, constants.TRAINER_VERSION, "trainjobs")
        tj = await self.custom.create_namespaced_custom_object(
            body={
                "apiVersion": f"{constants.TRAINER_GROUP}/{constants.TRAINER_VERSION}",
                "kind": "TrainJob",
                "metadata": {
                    "name": f"{job}-1",
                    "labels": {**self.labels(job), constants.LABEL_QUEUE_NAME: "bench"},
                },
                # As Kueue's webhook leaves it: suspended until admitted.
                "spec": {"runtimeRef": {"name": "torch-distributed"}, "suspend": True},
            },
            **tj_where,
        )
        await self.create_children(tj)

    async def create_children(
        self, tj: dict[str, Any], workload_only: bool = False, with_workload: bool = True
    ) -> None:
        """What Kueue and Trainer make for a TrainJob: its Workload, its JobSet and one pod."""
        meta = tj["metadata"]
        pod_spec = {"restartPolicy": "Never", "containers": [{"name": "node", "image": "x:1"}]}
        if with_workload:
            await self._create_workload(tj, pod_spec)
        if workload_only:
            return
        await self._create_jobset_and_pod(meta, pod_spec)

    async def _create_workload(self, tj: dict[str, Any], pod_spec: dict[str, Any]) -> None:
        meta = tj["metadata"]
        name = meta["name"]
        await self.custom.create_namespaced_custom_object(
            body={
                "apiVersion": f"{constants.KUEUE_GROUP}/{constants.KUEUE_VERSION}",
                "kind": "Workload",
                "metadata": {
                    "name": workload_name(name),
                    "labels": {constants.LABEL_KUEUE_JOB_UID: meta["uid"]},
                    "ownerReferences": [
                        {
                            "apiVersion": tj["apiVersion"],
                            "kind": "TrainJob",
                            "name": name,
                            "uid": meta["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": {
                    "queueName": "bench",
                    "podSets": [{"name": "node", "count": 1, "template": {"spec": pod_spec}}],
                },
            },
            **self.where(constants.KUEUE_GROUP, constants.KUEUE_VERSION, "workloads"),
        )

    async def _create_jobset_and_pod(self, meta: dict[str, Any], pod_spec: dict[str, Any]) -> None:
        name = meta["name"]
        labels = {k: v for k, v in meta["labels"].items() if k != constants.LABEL_QUEUE_NAME}
        await self.custom.create_namespaced_custom_object(
            body={
                "apiVersion": f"{constants.JOBSET_GROUP}/{constants.JOBSET_VERSION}",
                "kind": "JobSet",
                "metadata": {"name": name, "labels": labels},
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "replicas": 1,
                            "template": {"spec": {"template": {"spec": pod_spec}}},
                        }
                    ]
                },
            },
            **self.where(constants.JOBSET_GROUP, constants.JOBSET_VERSION, "jobsets"),
        )
        await self.core.create_namespaced_pod(
            self.ns,
            client.V1Pod(
                metadata=client.V1ObjectMeta(
                    name=f"{name}-node-0-0",
                    labels={**labels, constants.LABEL_RESTART_ATTEMPT: "0"},
                ),
                spec=client.V1PodSpec(
                    restart_policy="Never",
                    containers=[client.V1Container(name="node", image="x:1")],
                ),
            ),
        )

    async def _status(self, where: Where, name: str, status: dict[str, Any]) -> str:
        patch: Callable[..., Awaitable[Any]] = self.custom.patch_namespaced_custom_object_status
        written = await patch(name=name, body={"status": status}, _content_type=MERGE, **where)
        return str(written["metadata"]["resourceVersion"])

    async def _pod_status(self, job: str, phase: str, *, ready: bool, state: dict[str, Any]) -> str:
        """The kubelet's write of the job's pod in ``phase``, its container in ``state``."""
        container = {
            "name": "node",
            "image": "x:1",
            "imageID": "",
            "ready": ready,
            "restartCount": 0,
            "state": state,
        }
        pod = await self.core.patch_namespaced_pod_status(
            f"{job}-1-node-0-0",
            self.ns,
            {"status": {"phase": phase, "containerStatuses": [container]}},
        )
        return str(pod.metadata.resource_version)

    async def transition(self, job: str, step: str, admitted_at: datetime) -> str:
        """Write one transition; returns the resourceVersion of the write that makes its event."""
        wl_where = self.where(constants.KUEUE_GROUP, constants.KUEUE_VERSION, "workloads")
        tj_where = self.where(constants.TRAINER_GROUP, constants.TRAINER_VERSION, "trainjobs")
        workload = workload_name(f"{job}-1")
        if step == "Admitted":
            # Kueue admits the Workload (the event's write), then unsuspends the TrainJob.
            written = await self._status(
                wl_where, workload, {"conditions": [cond("Admitted", "Admitted", admitted_at)]}
            )
            patch: Callable[..., Awaitable[Any]] = self.custom.patch_namespaced_custom_object
            await patch(
                name=f"{job}-1", body={"spec": {"suspend": False}}, _content_type=MERGE, **tj_where
            )
            return written
        if step == "Running":
            return await self._pod_status(
                job, "Running", ready=True, state={"running": {"startedAt": now()}}
            )
        if step == POD_ENDED:
            terminated = {
                "exitCode": 0,
                "reason": "Completed",
                "startedAt": admitted_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "finishedAt": now(),
            }
            return await self._pod_status(
                job, "Succeeded", ready=False, state={"terminated": terminated}
            )
        if step == "Restarted":
            where = self.where(constants.JOBSET_GROUP, constants.JOBSET_VERSION, "jobsets")
            return await self._status(where, f"{job}-1", {"restarts": 1})
        if step == "Evicted":
            return await self._status(
                wl_where,
                workload,
                {
                    "conditions": [
                        cond("Admitted", "Admitted", admitted_at),
                        cond("Evicted", "Preempted", admitted_at + timedelta(seconds=1)),
                    ]
                },
            )
        if step == "Finished":
            return await self._status(
                tj_where, f"{job}-1", {"conditions": [cond("Complete", "AllJobsCompleted")]}
            )
        raise ValueError(f"no transition {step!r}")


class Events:
    """Drains the child's event queue in a thread, keeping the first arrival of each event."""

    def __init__(self, queue: Any) -> None:
        self.arrived: dict[tuple[str, str], float] = {}
        self.duplicates = 0
        # The child's closing message: its figures (a mapping) and a number.
        self.final: tuple[dict[Any, Any], int] | None = None
        self._queue = queue
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            job, type_, at = self._queue.get()
            if job == "__done__":
                self.final = (type_, at)
                return
            if (job, type_) in self.arrived:
                self.duplicates += 1
            else:
                self.arrived[(job, type_)] = at

    async def wait(self, keys: list[tuple[str, str]], limit: float) -> None:
        deadline = time.monotonic() + limit
        while any(k not in self.arrived for k in keys):
            if time.monotonic() > deadline:
                missing = [k for k in keys if k not in self.arrived]
                raise TimeoutError(f"{len(missing)} events missing, e.g. {missing[:3]}")
            await asyncio.sleep(0.1)

    def join(self) -> None:
        self._thread.join(timeout=60)

    def unexpected(self, *also: str) -> int:
        """Events of a type the writes do not make (each job makes Submitted and the five), but
        for the types ``also`` names."""
        expected = {"Submitted", *TRANSITIONS, *also}
        return sum(1 for _, type_ in self.arrived if type_ not in expected)


async def drive(
    kubeconfig: Path,
    namespace: str,
    jobs: int,
    concurrency: int,
    rate: float,
    finish_order: str,
    events: Events,
) -> dict[str, Any]:
    api = await config.new_client_from_config(config_file=str(kubeconfig))
    cluster = Cluster(api, namespace)
    names = [f"job{i:05d}" for i in range(jobs)]
    gate = asyncio.Semaphore(concurrency)

    async def create(job: str) -> None:
        async with gate:
            await cluster.create_job(job)

    began = time.perf_counter()
    await asyncio.gather(*(create(job) for job in names))
    created = time.perf_counter() - began
    progress(f"created {jobs} jobs in {created:.1f}s")
    await events.wait([(job, "Submitted") for job in names], limit=600)

    written: Written = {}
    began = time.perf_counter()
    other_writes = await write_phases(
        cluster, names, events, written, rate=rate, gate=gate, finish_order=finish_order
    )
    driven = time.perf_counter() - began
    await api.close()

    return {
        "jobs": jobs,
        "transitions": len(written),
        "finish_order": finish_order,
        "writes_without_event": other_writes,
        "rate_limit_per_second": rate or None,
        "create_seconds": round(created, 1),
        "transition_seconds": round(driven, 1),
        "written": written,
    }


# (job, transition): when its write began, and the (plural, name, resourceVersion) written.
Written = dict[tuple[str, str], tuple[float, tuple[str, str, str]]]


async def write_phases(
    cluster: Cluster,
    names: list[str],
    events: Events,
    written: Written,
    *,
    rate: float,
    gate: asyncio.Semaphore,
    finish_order: str,
    shown: str = "events",
    limit: float = 600,
) -> int:
    """Every job's writes, one phase after another (``phases``), ``rate`` a second (0: as fast
    as they go): a transition's phase ends once all its events are in. Each transition's write
    goes into ``written``; returns how many writes made no event (the pods' ends)."""
    admitted_at = datetime.now(UTC).replace(microsecond=0)
    other_writes = 0

    async def step(job: str, type_: str, at: float) -> None:
        if rate:
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
        async with gate:
            began = time.time()
            version = await cluster.transition(job, type_, admitted_at)
        if type_ in TRANSITIONS:
            written[(job, type_)] = (began, written_object(job, type_, version))

    for type_ in phases(finish_order):
        start = time.perf_counter()
        await asyncio.gather(
            *(step(job, type_, start + i / rate if rate else 0.0) for i, job in enumerate(names))
        )
        if type_ not in TRANSITIONS:
            other_writes += len(names)
            await asyncio.sleep(POD_END_LEAD)
            progress(f"{type_}: all {len(names)} written in {time.perf_counter() - start:.1f}s")
            continue
        await events.wait([(job, type_) for job in names], limit=limit)
        progress(f"{type_}: all {len(names)} {shown} in {time.perf_counter() - start:.1f}s")
    return other_writes


def phases(finish_order: str) -> tuple[str, ...]:
    """Each job's writes, phase by phase: the five transitions, and with ``pods-first`` the
    pod's end just before the TrainJob's."""
    if finish_order == "pods-first":
        return (*TRANSITIONS[:-1], POD_ENDED, TRANSITIONS[-1])
    return TRANSITIONS


def latencies(
    written: Written, arrived: dict[tuple[str, str], float], seen: dict[tuple[str, str, str], float]
) -> dict[str, Any]:
    """The supervisor's event latencies beside the bare watch's (the floor), and the difference;
    and each event type's p99 over the floor's: a Finished that reads its pods makes a second
    trip through the apiserver the other types do not."""
    events, floor_ = beside_the_floor(written, arrived, seen)
    return {
        "events": events,
        "floor_bare_watch": floor_,
        "difference": {k: round(events[k] - floor_[k], 1) for k in events},
        "difference_p99_by_type": difference_p99_by_type(written, arrived, seen),
    }


def difference_p99_by_type(
    written: Written, arrived: dict[tuple[str, str], float], seen: dict[tuple[str, str, str], float]
) -> dict[str, float]:
    """Each transition type's p99 over the floor's p99 for the same writes."""
    by_type = {}
    for type_ in TRANSITIONS:
        ours = {key: value for key, value in written.items() if key[1] == type_}
        typed, typed_floor = beside_the_floor(ours, arrived, seen)
        by_type[type_] = round(typed["p99"] - typed_floor["p99"], 1)
    return by_type


def beside_the_floor(
    written: Written, arrived: dict[tuple[str, str], float], seen: dict[tuple[str, str, str], float]
) -> tuple[dict[str, float], dict[str, float]]:
    """Percentiles of the writes' events arriving, and of the bare watch seeing the writes."""
    events = percentiles([arrived[key] - began for key, (began, _) in written.items()])
    floor_ = percentiles([seen[write] - began for began, write in written.values()])
    return events, floor_


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(1000 * statistics.median(ordered), 1),
        "p99": round(1000 * ordered[int(0.99 * (len(ordered) - 1))], 1),
        "max": round(1000 * ordered[-1], 1),
    }


async def prepare(kubeconfig: Path, namespace: str) -> None:
    api = await config.new_client_from_config(config_file=str(kubeconfig))
    try:
        await client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
        )
    finally:
        await api.close()


async def cleanup(kubeconfig: Path, namespace: str) -> None:
    api = await config.new_client_from_config(config_file=str(kubeconfig))
    try:
        await client.CoreV1Api(api).delete_namespace(namespace)
    finally:
        await api.close()


def add_finish_order(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--finish-order",
        choices=FINISH_ORDERS,
        default=FINISH_ORDERS[0],
        help="trainjob-first: every TrainJob completes with its pod still shown running, so "
        "each Finished reads its pod (the worst order); pods-first: each pod is written ended "
        f"a phase before its TrainJob's end ({POD_END_LEAD:g} s after the last pod's), as the "
        "kubelet and the controllers write them",
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=16, help="writes in flight")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="transitions written per second (0: as fast as possible)",
    )
    add_finish_order(parser)
    parser.add_argument("--kubeconfig", type=Path, help="an existing cluster (default: start one)")
    parser.add_argument("--namespace", default=f"bench-{secrets.token_hex(3)}")
    args = parser.parse_args()
    # Stop the control plane on SIGTERM too, not only on Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    context = multiprocessing.get_context("spawn")
    with control_plane(args.kubeconfig) as kubeconfig:
        asyncio.run(prepare(kubeconfig, args.namespace))
        from benchmarks.operator_events import floor

        floor_out, floor_ready = context.Queue(), context.Event()
        bare = context.Process(
            target=floor, args=(str(kubeconfig), args.namespace, floor_out, floor_ready)
        )
        bare.start()
        assert floor_ready.wait(60), "the bare watcher did not list"
        queue, stop = context.Queue(), context.Event()
        child = context.Process(
            target=supervise, args=(str(kubeconfig), args.namespace, queue, stop)
        )
        child.start()
        events = Events(queue)
        try:
            result = asyncio.run(
                drive(
                    kubeconfig,
                    args.namespace,
                    args.jobs,
                    args.concurrency,
                    args.rate,
                    args.finish_order,
                    events,
                )
            )
        finally:
            stop.set()
            bare.terminate()
            events.join()
            child.join(timeout=60)
            seen: dict[tuple[str, str, str], float] = floor_out.get(timeout=60)
            bare.join(timeout=60)
            asyncio.run(cleanup(kubeconfig, args.namespace))
        result["latency_ms"] = latencies(result.pop("written"), events.arrived, seen)
    assert events.final is not None, "the supervisor did not report its figures"
    requests, peak_kib = events.final
    result["supervisor_requests_per_job"] = round(requests["total"] / args.jobs, 2)
    result["supervisor_lists_and_watches"] = requests["lists_and_watches"]
    result["supervisor_peak_rss_mib"] = round(peak_kib / 1024, 1)
    result["duplicate_events"] = events.duplicates
    # The adapter's own AdmissionHeartbeat says the admission Lease, never written here, is absent.
    result["unexpected_events"] = events.unexpected(ADMISSION_HEARTBEAT)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
