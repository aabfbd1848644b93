"""Memory under churn: jobs started, finished and deleted through the watch, by the thousand.

    python3 benchmarks/churn.py                             # 20,000 jobs; RSS at 2,000 and 20,000
    python3 benchmarks/churn.py --jobs 4000 --checkpoint 1000 --wave 250

By default it starts the test control plane (etcd + kube-apiserver with the upstream CRDs, no
controllers) in a temporary folder. The supervisor runs in a child process (so its memory is its
own) in plain mode. Jobs come in waves: for every job of a wave this process creates what Trainer
and JobSet would (a TrainJob with the adapter's labels, its JobSet and one pod), marks the
TrainJob complete, waits for every job's Finished event, deletes the pod, the JobSet and the
TrainJob (as the garbage collector would), and waits until the supervisor holds nothing of the
wave.

Printed: the supervisor's peak resident memory after ``--checkpoint`` jobs and after all of them,
and their ratio; its resident memory now; what it still holds at the end (entries of each of its
per-job structures: all zero when nothing leaks); events per job, duplicates and Vanished events.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import queue
import resource
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.watch_events import (  # noqa: E402
    ADAPTER,
    Cluster,
    cleanup,
    cond,
    control_plane,
    prepare,
    progress,
)
from kubernetes_asyncio import config  # noqa: E402

from dispatch_kubeflow import constants  # noqa: E402
from dispatch_kubeflow.settings import RuntimeRef, Settings  # noqa: E402

HELD = "__held__"
STOP = "__stop__"


def settings_for(namespace: str) -> Settings:
    return Settings(
        namespace=namespace,
        probe_runtime=RuntimeRef(kind="ClusterTrainingRuntime", name="torch-distributed"),
    )


def resident_kib() -> int:
    """This process's resident memory now, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- the supervisor, in its own process --------------------------------------------------------


def supervise(kubeconfig: str, namespace: str, out: Any, control: Any) -> None:
    asyncio.run(_supervise(kubeconfig, namespace, out, control))


async def _supervise(kubeconfig: str, namespace: str, out: Any, control: Any) -> None:
    from dispatch_kubeflow.supervisor import Supervisor

    api = await config.new_client_from_config(config_file=kubeconfig)
    supervisor = Supervisor(api, settings_for(namespace), ADAPTER)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()

    async def held() -> dict[str, Any]:
        return {
            "held": supervisor.held(),
            "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "rss_kib": resident_kib(),
        }

    def answer() -> None:
        while (message := control.get()) != STOP:
            out.put((HELD, asyncio.run_coroutine_threadsafe(held(), loop).result(), message))
        loop.call_soon_threadsafe(stopping.set)

    async def consume() -> None:
        async for event in supervisor.events():
            out.put((event.job, event.type.value, time.time()))

    threading.Thread(target=answer, daemon=True).start()
    task = asyncio.create_task(consume())
    await stopping.wait()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await api.close()


# --- the controllers, played here ---------------------------------------------------------------


class Observed:
    """Drains the child's queue in a thread: event counts per job, and its answers."""

    def __init__(self, out: Any) -> None:
        self.finished: set[str] = set()
        self.events = 0
        self.duplicates = 0
        self.vanished = 0
        self._seen: set[tuple[str, str]] = set()
        self._out = out
        self._answers: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            job, what, _ = self._out.get()
            if job == HELD:
                self._answers.put(what)
                continue
            self.events += 1
            if (job, what) in self._seen:
                self.duplicates += 1
            self._seen.add((job, what))
            self.vanished += what == constants.EventType.VANISHED.value
            if what == constants.EventType.FINISHED.value:
                self.finished.add(job)

    async def ask(self, control: Any) -> dict[str, Any]:
        control.put("held")
        return await asyncio.to_thread(self._answers.get, True, 60)

    async def wait_finished(self, jobs: list[str], limit: float = 600) -> None:
        deadline = time.monotonic() + limit
        while any(job not in self.finished for job in jobs):
            if time.monotonic() > deadline:
                missing = [job for job in jobs if job not in self.finished]
                raise TimeoutError(f"{len(missing)} jobs not finished, e.g. {missing[:3]}")
            await asyncio.sleep(0.1)


class Churn(Cluster):
    async def create(self, job: str) -> None:
        tj = await self.custom.create_namespaced_custom_object(
            body={
                "apiVersion": f"{constants.TRAINER_GROUP}/{constants.TRAINER_VERSION}",
                "kind": "TrainJob",
                "metadata": {"name": f"{job}-1", "labels": self.labels(job)},
                "spec": {"runtimeRef": {"name": "torch-distributed"}},
            },
            **self.where(constants.TRAINER_GROUP, constants.TRAINER_VERSION, "trainjobs"),
        )
        await self.create_children(tj, with_workload=False)

    async def finish(self, job: str) -> None:
        where = self.where(constants.TRAINER_GROUP, constants.TRAINER_VERSION, "trainjobs")
        status = {"conditions": [cond("Complete", "JobsCompleted")]}
        await self._status(where, f"{job}-1", status)

    async def delete(self, job: str) -> None:
        name = f"{job}-1"
        await self.core.delete_namespaced_pod(f"{name}-node-0-0", self.ns, grace_period_seconds=0)
        await self.custom.delete_namespaced_custom_object(
            name=name, **self.where(constants.JOBSET_GROUP, constants.JOBSET_VERSION, "jobsets")
        )
        await self.custom.delete_namespaced_custom_object(
            name=name, **self.where(constants.TRAINER_GROUP, constants.TRAINER_VERSION, "trainjobs")
        )


async def until_nothing_held(observed: Observed, control: Any, limit: float = 120) -> None:
    deadline = time.monotonic() + limit
    while True:
        answer = await observed.ask(control)
        if not any(answer["held"].values()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the supervisor still holds {answer['held']}")
        await asyncio.sleep(0.2)


async def churn(
    kubeconfig: Path, namespace: str, args: argparse.Namespace, observed: Observed, control: Any
) -> dict[str, Any]:
    api = await config.new_client_from_config(config_file=str(kubeconfig))
    cluster = Churn(api, namespace)
    gate = asyncio.Semaphore(args.concurrency)

    async def each(action: Any, jobs: list[str]) -> None:
        async def one(job: str) -> None:
            async with gate:
                await action(job)

        await asyncio.gather(*(one(job) for job in jobs))

    figures: dict[str, Any] = {"jobs": args.jobs, "wave": args.wave}
    began = time.perf_counter()
    done = 0
    while done < args.jobs:
        wave = [f"c{n:06d}" for n in range(done, min(done + args.wave, args.jobs))]
        await each(cluster.create, wave)
        await each(cluster.finish, wave)
        await observed.wait_finished(wave)
        await each(cluster.delete, wave)
        await until_nothing_held(observed, control)
        done += len(wave)
        if done == args.checkpoint:
            figures["at_checkpoint"] = await observed.ask(control)
        progress(f"{done} jobs started, finished and deleted")
    figures["seconds"] = round(time.perf_counter() - began, 1)
    figures["at_end"] = await observed.ask(control)
    await api.close()
    return figures


def report(figures: dict[str, Any], observed: Observed, checkpoint: int) -> dict[str, Any]:
    end, at = figures["at_end"], figures.get("at_checkpoint")
    result: dict[str, Any] = {
        "jobs": figures["jobs"],
        "seconds": figures["seconds"],
        "peak_rss_mib_at_end": round(end["peak_rss_kib"] / 1024, 1),
        "rss_mib_at_end": round(end["rss_kib"] / 1024, 1),
        "held_at_end": end["held"],
        "events_per_job": round(observed.events / figures["jobs"], 2),
        "duplicate_events": observed.duplicates,
        "vanished_events": observed.vanished,
    }
    if at is not None:
        result[f"peak_rss_mib_after_{checkpoint}"] = round(at["peak_rss_kib"] / 1024, 1)
        result["peak_ratio_end_to_checkpoint"] = round(end["peak_rss_kib"] / at["peak_rss_kib"], 3)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--checkpoint", type=int, default=2000, help="a multiple of --wave")
    parser.add_argument("--wave", type=int, default=500, help="jobs alive at once")
    parser.add_argument("--concurrency", type=int, default=16, help="writes in flight")
    parser.add_argument("--kubeconfig", type=Path, help="an existing cluster (default: start one)")
    parser.add_argument("--namespace", default=f"churn-{secrets.token_hex(3)}")
    args = parser.parse_args()
    if args.checkpoint % args.wave:
        parser.error("--checkpoint must be a multiple of --wave")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    context = multiprocessing.get_context("spawn")
    with control_plane(args.kubeconfig) as kubeconfig:
        asyncio.run(prepare(kubeconfig, args.namespace))
        out, control = context.Queue(), context.Queue()
        child = context.Process(
            target=supervise, args=(str(kubeconfig), args.namespace, out, control)
        )
        child.start()
        observed = Observed(out)
        try:
            figures = asyncio.run(churn(kubeconfig, args.namespace, args, observed, control))
        finally:
            control.put(STOP)
            child.join(timeout=60)
            asyncio.run(cleanup(kubeconfig, args.namespace))
    print(json.dumps(report(figures, observed, args.checkpoint), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
