"""What a user of the operator sees: upstream transitions on DispatchJobs, beside a bare watch.

    python3 benchmarks/operator_events.py                       # 2,000 jobs, 10,000 transitions
    python3 benchmarks/operator_events.py --jobs 100            # a quick run
    python3 benchmarks/operator_events.py --rate 50             # paced: 50 transitions a second
    python3 benchmarks/operator_events.py --profile /tmp/prof   # py-spy on the operator meanwhile
                                          # (creation.txt, transitions.txt: the first round's)

It starts the test control plane (etcd + kube-apiserver with the upstream CRDs, no controllers)
in a temporary folder, with an audit log of the operator's own identity. Four processes then
share the machine:

- the operator, ``dispatch-kubeflow run --namespace NS`` (kopf with the project's handlers),
  as its own ServiceAccount holding the chart's ClusterRole (``--identities``), serving one
  KubeflowAdapter in Kueue mode;
- a bare watcher (the floor): a LIST+WATCH of TrainJobs, Workloads, JobSets and pods with
  kubernetes_asyncio that only parses each line and notes when it saw each resourceVersion;
- an observer: a LIST+WATCH of DispatchJobs noting when each event type first shows in a
  DispatchJob's ``status.events``, as ``kubectl get dj -w`` would show it;
- this process, which plays Kueue, Trainer and JobSet as a ServiceAccount of its own (the two
  watchers' too): it creates the DispatchJobs, gives each TrainJob the operator creates a
  Workload, a JobSet and one pod, writes five transitions per job as ``watch_events.py`` does
  (Admitted, Running, Restarted, Evicted, Finished), then deletes the DispatchJobs and, as the
  garbage collector would, the children of each deleted TrainJob.

Printed, as JSON: for each transition, the latency from just before the upstream write that makes
the event to the DispatchJob status showing it (p50, p99, max), beside the floor's (the bare
watcher seeing that write) and the difference; the operator's API requests by verb and resource
(from the audit log) per job created, per transition and per job deleted; the operator's peak
resident memory and resident memory after each round; its CPU seconds per 1,000 transitions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import multiprocessing
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.watch_events import (  # noqa: E402
    ADAPTER,
    Cluster,
    Events,
    Written,
    add_finish_order,
    difference_p99_by_type,
    percentiles,
    progress,
    workload_name,
    write_phases,
)
from kubernetes_asyncio import client, config  # noqa: E402
from kubernetes_asyncio.client.exceptions import ApiException  # noqa: E402

from dispatch_kubeflow import constants  # noqa: E402
from tests.cluster import binaries  # noqa: E402
from tests.cluster.controlplane import ADMIN_USER, ControlPlane  # noqa: E402
from tests.integration.rbac import OPERATOR_CLUSTER_ROLE, chart_rules  # noqa: E402

# The operator's user name as a certificate, and its ServiceAccount's name as a token.
OPERATOR_USER = OPERATOR_ACCOUNT = "dispatch-operator"
BENCHMARK_ACCOUNT = "dispatch-benchmark"
# The chart's ClusterRole for an operator serving every namespace: the operator's token holds
# exactly the rights a Helm install grants it.
CHART_CLUSTER_ROLE: dict[str, Any] = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "ClusterRole",
    "metadata": {"name": OPERATOR_ACCOUNT},
    "rules": chart_rules(*OPERATOR_CLUSTER_ROLE),
}
RUNTIME: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "runtime.yaml").read_text())
UPSTREAM = ("trainjobs", "workloads", "jobsets", "pods")
# Watches end server-side well before aiohttp's default 5-minute total timeout.
WATCH_SECONDS = 240
PHASE_LIMIT = 900.0
RETRIES = 5
DELETED = "Deleted"
# Every request of the operator; the benchmark's own patches (it plays the upstream controllers
# as its own identity) only to time how long the apiserver takes over the writes of the first trip.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: Metadata
    users: [%s]
  - level: Metadata
    users: [%s]
    verbs: [patch]
  - level: None
"""


# --- the control plane, with the operator's requests audited -----------------------------------


class ProfiledControlPlane(ControlPlane):
    """The test control plane; with ``profiling``, kube-apiserver serves ``/debug/pprof``."""

    profiling = False

    def _apiserver_args(self) -> list[str]:
        # The later of a repeated flag wins.
        return [*super()._apiserver_args(), *(["--profiling=true"] if self.profiling else [])]

    def cpu_seconds(self, name: str) -> float:
        """CPU seconds ``name`` (etcd, kube-apiserver) has used so far."""
        return process_cpu_seconds(self.processes.pids[name])

    def record_profile(self, seconds: int, output: Path) -> subprocess.Popen[bytes]:
        """kube-apiserver's CPU profile over the next ``seconds``, written to ``output``."""
        with output.open("wb") as out:
            return subprocess.Popen(
                [
                    str(self.bin_dir / "kubectl"),
                    f"--kubeconfig={self.kubeconfig}",
                    *("get", "--raw", f"/debug/pprof/profile?seconds={seconds}"),
                ],
                stdout=out,
                stderr=subprocess.DEVNULL,
            )


@dataclasses.dataclass(frozen=True)
class Identities:
    """Who the audit log names: the operator, and the benchmark (the upstream controllers it
    plays, the floor and the observer).

    By default both are ServiceAccounts with bearer tokens, as a cluster's controllers are: the
    operator's bound to the chart's ClusterRole, the benchmark's to ``cluster-admin``. With
    ``--identities certificates``, client certificates in ``system:masters``, as the benchmark's
    runs before ``--identities`` were. kube-apiserver verifies a certificate's chain on every
    request and caches a token's verification, so certificates cost the shared cores more.
    """

    operator: str
    benchmark: str
    tokens: bool

    @classmethod
    def chosen(cls, kind: str, namespace: str) -> Identities:
        if kind == "certificates":
            return cls(OPERATOR_USER, ADMIN_USER, tokens=False)
        account = f"system:serviceaccount:{namespace}:"
        return cls(account + OPERATOR_ACCOUNT, account + BENCHMARK_ACCOUNT, tokens=True)

    def kubeconfigs(self, plane: ControlPlane, namespace: str) -> tuple[Path, Path]:
        """The operator's kubeconfig and the benchmark's, in ``namespace`` (made already)."""
        if not self.tokens:
            return plane.kubeconfig_for(OPERATOR_USER, ["system:masters"]), plane.kubeconfig
        plane.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(CHART_CLUSTER_ROLE))
        return (
            plane.kubeconfig_for_service_account(namespace, OPERATOR_ACCOUNT, OPERATOR_ACCOUNT),
            plane.kubeconfig_for_service_account(namespace, BENCHMARK_ACCOUNT, "cluster-admin"),
        )


class AuditedControlPlane(ProfiledControlPlane):
    """The test control plane, logging every request of the operator and the benchmark's
    patches (metadata only)."""

    identities = Identities(OPERATOR_USER, ADMIN_USER, tokens=False)

    @property
    def audit_log(self) -> Path:
        return self.run_dir / "logs" / "audit.log"

    def _apiserver_args(self) -> list[str]:
        policy = self.run_dir / "audit-policy.yaml"
        policy.write_text(AUDIT_POLICY % (self.identities.operator, self.identities.benchmark))
        return [
            *super()._apiserver_args(),
            f"--audit-policy-file={policy}",
            f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json",
            # Rotated away at its default of 100 MB, a long run's early requests went uncounted.
            "--audit-log-maxsize=100000",
        ]


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def control_plane(identities: Identities, profiling: bool = False) -> Iterator[AuditedControlPlane]:
    binaries.build()
    with tempfile.TemporaryDirectory(prefix="control-plane-") as run_dir:
        plane = AuditedControlPlane(Path(run_dir))
        plane.identities = identities
        plane.profiling = profiling
        (plane.run_dir / "logs").mkdir(parents=True)
        plane.start()
        try:
            yield plane
        finally:
            plane.stop()


@dataclasses.dataclass(frozen=True)
class Audited:
    """One completed request: when the apiserver received it, what it was, whose, and how long
    the apiserver took from receiving it to completing the response."""

    at: float
    what: str
    user: str
    seconds: float
    name: str


def audited_requests(log: Path) -> list[Audited]:
    """Each completed request in the log ("verb resource[/subresource]" as ``what``)."""
    found: list[Audited] = []
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("stage") != "ResponseComplete":
            continue
        ref = entry.get("objectRef") or {}
        what = ref.get("resource") or entry.get("requestURI", "?")
        if ref.get("subresource"):
            what += "/" + ref["subresource"]
        received = _instant(entry["requestReceivedTimestamp"])
        completed = _instant(entry["stageTimestamp"])
        user = (entry.get("user") or {}).get("username", "")
        what = f"{entry['verb']} {what}"
        found.append(Audited(received, what, user, completed - received, ref.get("name", "")))
    return found


def _instant(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


# --- watching with no processing: the floor and the observer -----------------------------------


def lister(api: client.ApiClient, namespace: str, plural: str) -> Callable[..., Awaitable[Any]]:
    if plural == "pods":
        return partial(client.CoreV1Api(api).list_namespaced_pod, namespace)
    group, version = {
        "trainjobs": (constants.TRAINER_GROUP, constants.TRAINER_VERSION),
        "workloads": (constants.KUEUE_GROUP, constants.KUEUE_VERSION),
        "jobsets": (constants.JOBSET_GROUP, constants.JOBSET_VERSION),
        "dispatchjobs": (constants.GROUP, constants.VERSION),
    }[plural]
    objects = client.CustomObjectsApi(api)
    return partial(objects.list_namespaced_custom_object, group, version, namespace, plural)


class RetryingClient(client.ApiClient):
    """The benchmark's client: a request dropped with its connection is sent again.

    The apiserver closes idle keep-alive connections; a request aiohttp sends on one as it closes
    fails with ``ServerDisconnectedError`` before the apiserver saw it.
    """

    async def request(self, *args: Any, **kwargs: Any) -> Any:
        for _ in range(RETRIES - 1):
            try:
                return await super().request(*args, **kwargs)
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
        return await super().request(*args, **kwargs)


async def api_client(kubeconfig: Path | str) -> client.ApiClient:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    return RetryingClient(configuration)


Seen = Callable[[str, dict[str, Any]], None]
SeenOf = Callable[[str, str, dict[str, Any]], None]


async def follow(list_fn: Callable[..., Awaitable[Any]], seen: Seen, listed: asyncio.Event) -> None:
    """LIST, then WATCH from there for ever, handing each (type, object) to ``seen`` as parsed."""
    response = await list_fn(_preload_content=False)
    body = json.loads(await response.read())
    for item in body["items"]:
        seen("ADDED", item)
    version = body["metadata"]["resourceVersion"]
    listed.set()
    while True:
        response = await list_fn(
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _preload_content=False,
        )
        pending = b""
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with response:
                async for chunk in response.content.iter_any():
                    *lines, pending = (pending + chunk).split(b"\n")
                    for line in lines:
                        if not line:
                            continue
                        event = json.loads(line)
                        version = event["object"]["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            seen(event["type"], event["object"])


async def watch_until_stopped(
    kubeconfig: str, namespace: str, plurals: tuple[str, ...], seen: SeenOf, ready: Any
) -> None:
    """Watch until SIGTERM (``Process.terminate``, or Ctrl-C's signal to the process group)."""
    api = await api_client(kubeconfig)
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    listed = [asyncio.Event() for _ in plurals]
    tasks = [
        asyncio.create_task(follow(lister(api, namespace, plural), partial(seen, plural), flag))
        for plural, flag in zip(plurals, listed, strict=True)
    ]
    await asyncio.gather(*(flag.wait() for flag in listed))
    ready.set()
    await stopping.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await api.close()


def floor(kubeconfig: str, namespace: str, out: Any, ready: Any) -> None:
    """The bare watcher: when it saw each (plural, name, resourceVersion), sent back at the end."""
    arrived: dict[tuple[str, str, str], float] = {}

    def seen(plural: str, _type: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        arrived.setdefault((plural, meta["name"], meta["resourceVersion"]), time.time())

    asyncio.run(watch_until_stopped(kubeconfig, namespace, UPSTREAM, seen, ready))
    out.put(arrived)


def observe(kubeconfig: str, namespace: str, out: Any, ready: Any) -> None:
    """The user's view: when each event type first shows in a DispatchJob's status.

    It also keeps each event's ``time`` (when the operator derived it) and sends them at the
    end, so the latency splits at the operator's derivation.
    """
    shown: dict[str, set[str]] = {}
    derived: dict[tuple[str, str], float] = {}

    def seen(_plural: str, type_: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if type_ == "DELETED":
            out.put((name, DELETED, time.time()))
            return
        events = (obj.get("status") or {}).get("events") or []
        known = shown.setdefault(name, set())
        for event in events:
            event_type = event.get("type")
            if event_type in known:
                continue
            known.add(event_type)
            out.put((name, event_type, time.time()))
            with contextlib.suppress(TypeError, ValueError):
                derived[(name, event_type)] = datetime.fromisoformat(event["time"]).timestamp()

    plurals = ("dispatchjobs",)
    asyncio.run(watch_until_stopped(kubeconfig, namespace, plurals, seen, ready))
    out.put(("__done__", derived, 0))


# --- the operator, in its own process ----------------------------------------------------------


class Operator:
    """``dispatch-kubeflow run`` for one namespace, as its own user; its memory and CPU."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, job_events: str) -> None:
        command = shutil.which("dispatch-kubeflow") or str(
            Path(sys.executable).parent / "dispatch-kubeflow"
        )
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [
                *(command, "run", "--namespace", namespace, "--events-to", "none"),
                *("--job-events", job_events),
            ],
            env=dict(os.environ, KUBECONFIG=str(kubeconfig)),
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def _status(self, field: str) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise LookupError(field)

    def peak_rss_mib(self) -> float:
        return round(self._status("VmHWM") / 1024, 1)

    def rss_mib(self) -> float:
        return round(self._status("VmRSS") / 1024, 1)

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.process.pid)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


class Profiler:
    """py-spy sampling the operator (without pausing it) while a phase runs."""

    def __init__(self, pid: int, output: Path) -> None:
        self.process = subprocess.Popen(
            [
                *("py-spy", "record", "--nonblocking", "--format", "raw"),
                *("--pid", str(pid), "--output", str(output)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        self.process.wait(60)


# --- the scene ---------------------------------------------------------------------------------


async def prepare(kubeconfig: Path, namespace: str) -> None:
    """The namespace, the runtime, a live admission Lease and the KubeflowAdapter serving it."""
    api = await api_client(kubeconfig)
    try:
        await client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
        )
        objects: Any = client.CustomObjectsApi(api)
        with contextlib.suppress(ApiException):
            await objects.create_cluster_custom_object(
                constants.TRAINER_GROUP,
                constants.TRAINER_VERSION,
                "clustertrainingruntimes",
                RUNTIME,
            )
        leases: Any = client.CoordinationV1Api(api)
        await leases.create_namespaced_lease(
            namespace,
            {
                "metadata": {"name": "dispatch-admission"},
                "spec": {
                    "holderIdentity": "bench",
                    "leaseDurationSeconds": 86400,
                    "renewTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                },
            },
        )
        runtime = {"kind": "ClusterTrainingRuntime", "name": RUNTIME["metadata"]["name"]}
        spec = {
            "namespace": namespace,
            "runtimes": [runtime],
            "kueue": {
                "localQueue": "bench",
                "admissionLease": {"namespace": namespace, "name": "dispatch-admission"},
            },
        }
        await objects.create_namespaced_custom_object(
            constants.GROUP,
            constants.VERSION,
            namespace,
            "kubeflowadapters",
            {
                "apiVersion": f"{constants.GROUP}/{constants.VERSION}",
                "kind": "KubeflowAdapter",
                "metadata": {"name": ADAPTER},
                "spec": spec,
            },
        )
    finally:
        await api.close()


async def adapter_ready(api: client.ApiClient, namespace: str, limit: float = 120.0) -> None:
    objects: Any = client.CustomObjectsApi(api)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        body = await objects.get_namespaced_custom_object(
            constants.GROUP, constants.VERSION, namespace, "kubeflowadapters", ADAPTER
        )
        conditions = (body.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return
        await asyncio.sleep(0.5)
    raise TimeoutError(f"KubeflowAdapter {ADAPTER} not Ready: {body.get('status')}")


@contextlib.asynccontextmanager
async def conflict_tolerated() -> AsyncIterator[None]:
    """A create or delete sent again after a dropped connection may find it already done."""
    try:
        yield
    except ApiException as error:
        if error.status not in (404, 409):
            raise


class Player:
    """Kueue, Trainer, JobSet and the garbage collector, for the TrainJobs the operator makes."""

    def __init__(self, cluster: Cluster, concurrency: int) -> None:
        self.cluster = cluster
        self.gate = asyncio.Semaphore(concurrency)
        self.tasks: set[asyncio.Task[None]] = set()
        self.failures: list[BaseException] = []
        self.made: set[str] = set()

    async def _make(self, trainjob: dict[str, Any], probe: bool) -> None:
        await self.cluster.create_children(trainjob, workload_only=probe)
        self.made.add(trainjob["metadata"]["name"])

    def seen(self, type_: str, obj: dict[str, Any]) -> None:
        if type_ == "ADDED":
            probe = obj["metadata"].get("labels", {}).get(constants.LABEL_PROBE) == "true"
            self._spawn(self._make(obj, probe))
        elif type_ == "DELETED":
            self._spawn(self._collect(obj["metadata"]["name"]))

    def _spawn(self, work: Awaitable[None]) -> None:
        async def gated() -> None:
            async with self.gate:
                try:
                    await work
                except ApiException as error:
                    # A retried create that had gone through, or a child already collected.
                    if error.status not in (404, 409):
                        self.failures.append(error)
                except Exception as error:  # reported when the round ends
                    self.failures.append(error)

        task = asyncio.create_task(gated())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def settled(self, trainjobs: list[str]) -> None:
        """Until each of ``trainjobs`` has its children, which its transitions write to."""
        deadline = time.monotonic() + PHASE_LIMIT
        while missing := [name for name in trainjobs if name not in self.made]:
            if self.failures:
                raise self.failures[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(missing)} TrainJobs without children, e.g. {missing[:3]}")
            await asyncio.sleep(0.1)

    async def _collect(self, trainjob: str) -> None:
        self.made.discard(trainjob)
        cluster = self.cluster
        for plural, name in (("workloads", workload_name(trainjob)), ("jobsets", trainjob)):
            group = constants.KUEUE_GROUP if plural == "workloads" else constants.JOBSET_GROUP
            version = constants.KUEUE_VERSION if plural == "workloads" else constants.JOBSET_VERSION
            with contextlib.suppress(ApiException):
                await cluster.custom.delete_namespaced_custom_object(
                    name=name, **cluster.where(group, version, plural)
                )
        with contextlib.suppress(ApiException):
            await cluster.core.delete_namespaced_pod(f"{trainjob}-node-0-0", cluster.ns)


# --- the run -----------------------------------------------------------------------------------


class Run:
    def __init__(
        self, args: argparse.Namespace, plane: AuditedControlPlane, kubeconfig: Path
    ) -> None:
        self.args = args
        self.plane = plane
        # The benchmark's own identity: it plays the upstream controllers with it.
        self.kubeconfig = kubeconfig
        self.identities = plane.identities
        self.namespace = args.namespace
        self.marks: dict[str, list[tuple[float, float]]] = {
            "create": [],
            "transition": [],
            "delete": [],
        }
        self.written: Written = {}
        self.writes_without_event = 0
        self.rss_after_rounds: list[float] = []
        self.peak_rss_through_creation = 0.0
        self.transition_cpu = 0.0
        self.create_seconds = 0.0
        # CPU seconds over the creations, by process.
        self.create_cpu: Counter[str] = Counter()
        self.delete_seconds = 0.0
        self.duplicates = 0
        self.undeleted = 0

    async def drive(self, operator: Operator, events: Events) -> None:
        api = await api_client(self.kubeconfig)
        cluster = Cluster(api, self.namespace)
        player = Player(cluster, self.args.concurrency)
        listed = asyncio.Event()
        playing = asyncio.create_task(
            follow(lister(api, self.namespace, "trainjobs"), player.seen, listed)
        )
        await listed.wait()
        await adapter_ready(api, self.namespace)
        progress("the KubeflowAdapter is Ready")
        try:
            for round_ in range(self.args.rounds):
                names = [f"r{round_}-job{i:05d}" for i in range(self.args.jobs)]
                profiler = self.profiler(operator, "creation") if round_ == 0 else None
                apiserver_profile = self.apiserver_profiler("creation") if round_ == 0 else None
                cpu = self.cpu_seconds(operator)
                await self.create(cluster, names, events)
                self.create_cpu.update(self.cpu_seconds(operator) - cpu)
                if profiler is not None:
                    profiler.stop()
                if apiserver_profile is not None:
                    apiserver_profile.wait(120)
                await player.settled([f"{name}-1" for name in names])
                if round_ == 0:
                    self.peak_rss_through_creation = operator.peak_rss_mib()
                    peak = self.peak_rss_through_creation
                    progress(f"operator peak RSS through the creation: {peak} MiB")
                await self.transitions(cluster, names, events, operator)
                await self.count_duplicates(api)
                if not self.args.keep:
                    await self.delete(cluster, names, events)
                self.rss_after_rounds.append(operator.rss_mib())
                progress(f"round {round_ + 1}: operator RSS {self.rss_after_rounds[-1]} MiB")
            if player.failures:
                raise player.failures[0]
        finally:
            playing.cancel()
            await asyncio.gather(playing, return_exceptions=True)
            await api.close()

    async def create(self, cluster: Cluster, names: list[str], events: Events) -> None:
        gate = asyncio.Semaphore(self.args.concurrency)
        objects: Any = cluster.custom

        async def one(name: str) -> None:
            async with gate, conflict_tolerated():
                await objects.create_namespaced_custom_object(
                    constants.GROUP,
                    constants.VERSION,
                    self.namespace,
                    "dispatchjobs",
                    {
                        "apiVersion": f"{constants.GROUP}/{constants.VERSION}",
                        "kind": "DispatchJob",
                        "metadata": {"name": name},
                        "spec": {"adapter": ADAPTER, "image": "trainer:1", "numNodes": 1},
                    },
                )

        began = time.time()
        await asyncio.gather(*(one(name) for name in names))
        await events.wait([(name, "Submitted") for name in names], limit=PHASE_LIMIT)
        self.marks["create"].append((began, time.time()))
        self.create_seconds += time.time() - began
        progress(f"created {len(names)} DispatchJobs, all Submitted, in {time.time() - began:.1f}s")

    async def transitions(
        self, cluster: Cluster, names: list[str], events: Events, operator: Operator
    ) -> None:
        profiler = self.profiler(operator, "transitions") if not self.marks["transition"] else None
        cpu, began = operator.cpu_seconds(), time.time()
        self.writes_without_event += await write_phases(
            cluster,
            names,
            events,
            self.written,
            rate=self.args.rate,
            gate=asyncio.Semaphore(self.args.concurrency),
            finish_order=self.args.finish_order,
            shown="on the DispatchJobs",
            limit=PHASE_LIMIT,
        )
        self.marks["transition"].append((began, time.time()))
        self.transition_cpu += operator.cpu_seconds() - cpu
        if profiler is not None:
            profiler.stop()

    def profiler(self, operator: Operator, phase: str) -> Profiler | None:
        """With ``--profile``, py-spy on the operator until stopped, into ``PHASE.txt``."""
        if not self.args.profile:
            return None
        self.args.profile.mkdir(parents=True, exist_ok=True)
        return Profiler(operator.process.pid, self.args.profile / f"{phase}.txt")

    def apiserver_profiler(self, phase: str) -> subprocess.Popen[bytes] | None:
        """With ``--profile``, kube-apiserver's CPU profile over the phase's first 20 s."""
        if not self.args.profile:
            return None
        self.args.profile.mkdir(parents=True, exist_ok=True)
        return self.plane.record_profile(20, self.args.profile / f"apiserver-{phase}.pprof")

    def cpu_seconds(self, operator: Operator) -> Counter[str]:
        return Counter(
            {
                "operator": operator.cpu_seconds(),
                "kube-apiserver": self.plane.cpu_seconds("kube-apiserver"),
                "etcd": self.plane.cpu_seconds("etcd"),
                "benchmark": process_cpu_seconds(os.getpid()),
            }
        )

    async def count_duplicates(self, api: client.ApiClient) -> None:
        """Event types shown twice in one DispatchJob's history (each must show once)."""
        listed = await client.CustomObjectsApi(api).list_namespaced_custom_object(
            constants.GROUP, constants.VERSION, self.namespace, "dispatchjobs"
        )
        for item in listed["items"]:
            counts = Counter(e["type"] for e in (item.get("status") or {}).get("events") or [])
            self.duplicates += sum(n - 1 for n in counts.values())

    async def delete(self, cluster: Cluster, names: list[str], events: Events) -> None:
        gate = asyncio.Semaphore(self.args.concurrency)
        objects: Any = cluster.custom

        async def one(name: str) -> None:
            async with gate, conflict_tolerated():
                await objects.delete_namespaced_custom_object(
                    constants.GROUP, constants.VERSION, self.namespace, "dispatchjobs", name
                )

        began = time.time()
        await asyncio.gather(*(one(name) for name in names))
        keys = [(name, DELETED) for name in names]
        try:
            await events.wait(keys, limit=PHASE_LIMIT)
        except TimeoutError:
            # The figures of the earlier phases still stand; say how far the deletion got.
            self.undeleted += sum(key not in events.arrived for key in keys)
        self.marks["delete"].append((began, time.time()))
        self.delete_seconds += time.time() - began
        gone = len(names) - sum(key not in events.arrived for key in keys)
        progress(f"deleted {len(names)} DispatchJobs, {gone} gone, in {time.time() - began:.1f}s")

    def latencies(self, events: Events, seen: dict[tuple[str, str, str], float]) -> dict[str, Any]:
        """Each transition's latency, the floor's, and where the operator's splits.

        ``derived`` runs from the upstream write to the operator deriving the event (its watch,
        its queue, its derivation); ``commit_and_delivery`` from there to the user's watch
        showing it (the status patch, the apiserver, the watch).
        """
        derived_at: dict[tuple[str, str], float] = events.final[0] if events.final else {}
        shown: list[float] = []
        floor_: list[float] = []
        derived: list[float] = []
        delivered: list[float] = []
        for key, (began, write) in self.written.items():
            shown.append(events.arrived[key] - began)
            floor_.append(seen[write] - began)
            if key in derived_at:
                derived.append(derived_at[key] - began)
                delivered.append(events.arrived[key] - derived_at[key])
        operator, bare = percentiles(shown), percentiles(floor_)
        split = {"derived": percentiles(derived), "commit_and_delivery": percentiles(delivered)}
        return {
            "dispatchjob_status": operator,
            "floor_bare_watch": bare,
            "difference": {k: round(operator[k] - bare[k], 1) for k in operator},
            "difference_p99_by_type": difference_p99_by_type(self.written, events.arrived, seen),
            "dispatchjob_status_split": split if derived else None,
        }

    def requests(self, audited: list[Audited]) -> dict[str, Any]:
        total = self.args.jobs * self.args.rounds
        per = {"create": total, "transition": len(self.written), "delete": total}
        counted: dict[str, Counter[str]] = {phase: Counter() for phase in self.marks}
        for request in audited:
            if request.user != self.identities.operator:
                continue
            for phase, windows in self.marks.items():
                if any(a <= request.at < b for a, b in windows):
                    counted[phase][request.what] += 1
        return {
            f"per_{'job_created' if p == 'create' else 'job_deleted' if p == 'delete' else p}": {
                what: round(n / per[p], 3) for what, n in sorted(counted[p].items())
            }
            for p in self.marks
        }

    def apiserver_time(self, audited: list[Audited]) -> dict[str, Any]:
        """How long the apiserver took over each write of the two trips, during the transitions:
        the benchmark's upstream patches (the first) and the operator's status patches (the
        second), from receiving the request to completing the response."""
        benchmark = self.identities.benchmark
        upstream = [r.seconds for r in self._in_transitions(audited) if r.user == benchmark]
        status = [r.seconds for r in self._status_patches(audited)]
        return {
            "upstream_patch": percentiles(upstream) if upstream else None,
            "dispatchjob_status_patch": percentiles(status) if status else None,
        }

    def second_trip(self, audited: list[Audited], events: Events) -> dict[str, Any] | None:
        """The second trip of each transition in three: from the operator deriving the event to
        the apiserver receiving its status patch, the apiserver's handling of the patch, and from
        the response to the user's watch showing the event. A job's patches are paired with its
        events in time order, and only a job with as many of each is counted."""
        derived_at: dict[tuple[str, str], float] = events.final[0] if events.final else {}
        patches: dict[str, list[Audited]] = {}
        for request in self._status_patches(audited):
            patches.setdefault(request.name, []).append(request)
        derived: dict[str, list[tuple[float, float]]] = {}
        for key in self.written:
            if key in derived_at and key in events.arrived:
                derived.setdefault(key[0], []).append((derived_at[key], events.arrived[key]))
        sending: list[float] = []
        handling: list[float] = []
        delivering: list[float] = []
        for job, moments in derived.items():
            sent = sorted(patches.get(job, []), key=lambda r: r.at)
            if len(sent) != len(moments):
                continue
            for (began, shown), patch in zip(sorted(moments), sent, strict=True):
                sending.append(patch.at - began)
                handling.append(patch.seconds)
                delivering.append(shown - patch.at - patch.seconds)
        if not sending:
            return None
        return {
            "transitions": len(sending),
            "derived_to_received": percentiles(sending),
            "apiserver": percentiles(handling),
            "response_to_shown": percentiles(delivering),
        }

    def _in_transitions(self, audited: list[Audited]) -> list[Audited]:
        windows = self.marks["transition"]
        return [r for r in audited if any(a <= r.at < b for a, b in windows)]

    def _status_patches(self, audited: list[Audited]) -> list[Audited]:
        return [
            r
            for r in self._in_transitions(audited)
            if r.user == self.identities.operator and r.what == "patch dispatchjobs/status"
        ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000, help="DispatchJobs per round")
    parser.add_argument("--rounds", type=int, default=1, help="create, transition, delete rounds")
    parser.add_argument("--concurrency", type=int, default=16, help="writes in flight")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="transitions written per second (0: as fast as possible)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="leave the DispatchJobs: no deletion phase, one round"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="record the operator's py-spy stacks and kube-apiserver's CPU profile here",
    )
    add_finish_order(parser)
    parser.add_argument("--operator-log", type=Path, help="keep the operator's log here")
    parser.add_argument("--namespace", default=f"bench-{secrets.token_hex(3)}")
    parser.add_argument(
        "--job-events",
        choices=("all", "warnings", "none"),
        default="all",
        help="the operator's --job-events: which transitions also post a Kubernetes Event",
    )
    parser.add_argument(
        "--identities",
        choices=("tokens", "certificates"),
        default="tokens",
        help="how the operator and the benchmark authenticate: ServiceAccount tokens, as in a "
        "cluster, or client certificates in system:masters",
    )
    args = parser.parse_args()
    if args.keep and args.rounds != 1:
        parser.error("--keep runs one round")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    context = multiprocessing.get_context("spawn")
    identities = Identities.chosen(args.identities, args.namespace)
    with control_plane(identities, profiling=args.profile is not None) as plane:
        asyncio.run(prepare(plane.kubeconfig, args.namespace))
        operator_config, benchmark_config = identities.kubeconfigs(plane, args.namespace)
        own = str(benchmark_config)
        floor_out, floor_ready = context.Queue(), context.Event()
        shown_out, shown_ready = context.Queue(), context.Event()
        watchers = [
            context.Process(target=floor, args=(own, args.namespace, floor_out, floor_ready)),
            context.Process(target=observe, args=(own, args.namespace, shown_out, shown_ready)),
        ]
        for watcher in watchers:
            watcher.start()
        assert floor_ready.wait(60), "the bare watcher did not list"
        assert shown_ready.wait(60), "the observer did not list"
        events = Events(shown_out)
        operator = Operator(
            operator_config,
            args.namespace,
            args.operator_log or plane.run_dir / "operator.log",
            args.job_events,
        )
        run = Run(args, plane, benchmark_config)
        try:
            asyncio.run(run.drive(operator, events))
            peak = operator.peak_rss_mib()
        finally:
            operator.stop()
            for watcher in watchers:
                watcher.terminate()
            seen: dict[tuple[str, str, str], float] = floor_out.get(timeout=60)
            events.join()
            for watcher in watchers:
                watcher.join(timeout=60)
        transitions = len(run.written)
        audited = audited_requests(plane.audit_log)
        result = {
            "jobs": args.jobs,
            "rounds": args.rounds,
            "transitions": transitions,
            "finish_order": args.finish_order,
            "writes_without_event": run.writes_without_event,
            "rate_limit_per_second": args.rate or None,
            "job_events": args.job_events,
            "identities": args.identities,
            "create_seconds": round(run.create_seconds, 1),
            "starts_per_second": round(args.jobs * args.rounds / run.create_seconds, 1),
            "creation_cpu_ms_per_start": {
                name: round(1000 * seconds / (args.jobs * args.rounds), 1)
                for name, seconds in run.create_cpu.items()
            },
            "transition_seconds": round(sum(b - a for a, b in run.marks["transition"]), 1),
            "delete_seconds": None if args.keep else round(run.delete_seconds, 1),
            "still_there_when_deletion_gave_up": run.undeleted,
            "latency_ms": run.latencies(events, seen),
            "apiserver_ms_per_write": run.apiserver_time(audited),
            "second_trip_ms": run.second_trip(audited, events),
            "operator_requests": run.requests(audited),
            "operator_peak_rss_mib": peak,
            "operator_peak_rss_mib_through_first_creation": run.peak_rss_through_creation,
            "operator_rss_mib_after_each_round": run.rss_after_rounds,
            "operator_cpu_seconds_per_1000_transitions": round(
                1000 * run.transition_cpu / transitions, 2
            ),
            "duplicate_events": run.duplicates,
            "unexpected_events": events.unexpected(DELETED),
        }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
