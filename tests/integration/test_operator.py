"""The operator (kopf, in-process) against the real kube-apiserver, with the test playing Trainer.

No Trainer, JobSet or Kueue controller runs here: the test writes what Trainer would write on a
TrainJob's status (the jobs' counters, then a terminal condition) through the status subresource,
and reads what the operator made of it on the DispatchJob. The operator runs as
``kopf.operator(...)`` in the test's event loop, with the project's handlers and settings, against
the control plane's admin kubeconfig (or, in the chart tests, the chart's service account).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import traceback
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kopf
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

import dispatch_kubeflow.handlers  # noqa: F401  (registers the handlers)
from dispatch_kubeflow.constants import (
    ANNOTATION_REPORTED,
    FINALIZER,
    GROUP,
    LABEL_JOB,
    STATUS_REPORTED,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    VERSION,
)
from dispatch_kubeflow.handlers.registry import EventLines

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = yaml.safe_load((ROOT / "examples" / "runtime.yaml").read_text())
RUNTIME_NAME = RUNTIME["metadata"]["name"]
MERGE_PATCH = "application/merge-patch+json"
WAIT = 30.0
ADAPTER = "adapter"

T = TypeVar("T")


# --- running the operator ------------------------------------------------------------------------


@contextlib.contextmanager
def kubeconfig(path: Path) -> Iterator[None]:
    """KUBECONFIG for kopf's login and the handlers' client, restored afterwards."""
    before = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = before


def where_stuck(thread: threading.Thread) -> str:
    """The thread's stack and every task left on its event loop, with theirs: what holds it."""
    frame = sys._current_frames().get(thread.ident or 0)
    lines = ["thread:\n", *traceback.format_stack(frame)] if frame is not None else []
    loop = None
    while frame is not None and loop is None:
        candidate = frame.f_locals.get("self")
        loop = candidate if isinstance(candidate, asyncio.AbstractEventLoop) else None
        frame = frame.f_back
    for task in asyncio.all_tasks(loop) if loop is not None else ():
        lines.append(f"task {task.get_name()}:\n")
        lines.extend(f"  {where}\n" for where in awaiting(task.get_coro()))
    return "".join(lines)


def awaiting(awaitable: Any) -> Iterator[str]:
    """Where a suspended coroutine is, down the chain of what each part awaits."""
    while awaitable is not None:
        frame = getattr(awaitable, "cr_frame", None) or getattr(awaitable, "ag_frame", None)
        frame = frame or getattr(awaitable, "gi_frame", None)
        if frame is None:
            yield repr(awaitable)
            return
        yield f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        awaitable = (
            getattr(awaitable, "cr_await", None)
            or getattr(awaitable, "ag_await", None)
            or getattr(awaitable, "gi_yieldfrom", None)
        )


@contextlib.asynccontextmanager
async def running_operator(
    config: Path, namespaces: list[str], events_file: Path, memo: kopf.Memo | None = None
) -> AsyncIterator[threading.Thread]:
    """The operator, in a thread with its own event loop, until the block ends (stopped cleanly).

    No ``namespaces`` is every namespace, as the chart runs it (``--all-namespaces``). ``memo``
    is the operator's memo (``metrics_address`` in it serves the metrics).

    A thread rather than a task of the test's loop: when kopf stops, it cancels every task of its
    loop created after it started, which would include pytest's fixture teardown.
    """
    stop = threading.Event()
    ready = threading.Event()
    lines = EventLines(str(events_file))
    memo = memo if memo is not None else kopf.Memo()
    memo.event_lines = lines
    with kubeconfig(config):
        thread = threading.Thread(
            target=kopf.run,
            kwargs={
                "standalone": True,
                "clusterwide": not namespaces,
                "namespaces": namespaces,
                "stop_flag": stop,
                "ready_flag": ready,
                "memo": memo,
            },
            name="operator",
            daemon=True,
        )
        thread.start()
        try:
            assert await asyncio.to_thread(ready.wait, WAIT), "the operator did not start"
            yield thread
        finally:
            stop.set()
            await asyncio.to_thread(thread.join, WAIT * 2)
            lines.close()
    assert not thread.is_alive(), f"the operator did not stop:\n{where_stuck(thread)}"


# --- reading and writing the scene ---------------------------------------------------------------


async def eventually(
    probe: Callable[[], Awaitable[T | None]], what: str, within: float = WAIT
) -> T:
    """The first non-None, non-False result of ``probe``; fails naming ``what`` past ``within``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last: T | None = None
    while loop.time() < deadline:
        last = await probe()
        if last is not None and last is not False:
            return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for entry in ((obj or {}).get("status") or {}).get("conditions") or []:
        if entry.get("type") == kind:
            return dict(entry)
    return None


class Scene:
    """One namespace with a KubeflowAdapter serving it, DispatchJobs, and Trainer played by hand."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        # Any: the generated signatures omit _content_type and take plain dicts as bodies too.
        self.objects: Any = client.CustomObjectsApi(api)
        self.namespace = namespace

    async def ensure_runtime(self) -> None:
        try:
            await self.objects.create_cluster_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", RUNTIME
            )
        except ApiException as error:
            if error.status != 409:
                raise

    def adapter_spec(self, **extra: Any) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "runtimes": [{"kind": "ClusterTrainingRuntime", "name": RUNTIME_NAME}],
            "timeouts": {"stopJob": "20s"},
            **extra,
        }

    async def apply_adapter(self, spec: dict[str, Any], name: str = ADAPTER) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "KubeflowAdapter",
            "metadata": {"name": name},
            "spec": spec,
        }
        await self.objects.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "kubeflowadapters", body
        )

    async def patch_adapter_spec(self, spec: dict[str, Any], name: str = ADAPTER) -> None:
        await self.objects.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            self.namespace,
            "kubeflowadapters",
            name,
            {"spec": spec},
            _content_type=MERGE_PATCH,
        )

    async def adapter(self, name: str = ADAPTER) -> dict[str, Any]:
        found: dict[str, Any] = await self.objects.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "kubeflowadapters", name
        )
        return found

    async def ready_adapter(self, generation: int = 1, name: str = ADAPTER) -> dict[str, Any]:
        async def ready() -> dict[str, Any] | None:
            body = await self.adapter(name)
            found = condition(body, "Ready")
            if (
                found
                and found["status"] == "True"
                and found.get("observedGeneration") == generation
            ):
                return body
            return None

        return await eventually(ready, f"KubeflowAdapter {name} Ready at generation {generation}")

    async def create_job(self, name: str, **spec: Any) -> None:
        body = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "DispatchJob",
            "metadata": {"name": name},
            "spec": {"adapter": ADAPTER, "image": "busybox:1.37", "numNodes": 2, **spec},
        }
        await self.objects.create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "dispatchjobs", body
        )

    async def job(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.objects.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "dispatchjobs", name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    async def job_in_state(self, name: str, state: str, cause: str | None = None) -> dict[str, Any]:
        async def arrived() -> dict[str, Any] | None:
            body = await self.job(name)
            status = (body or {}).get("status") or {}
            if status.get("state") == state and status.get("cause") == cause:
                return body
            return None

        return await eventually(arrived, f"DispatchJob {name} in {state}/{cause}")

    async def trainjob(self, name: str) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = await self.objects.get_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, self.namespace, TRAINJOBS, name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return found

    async def play_trainer(self, name: str, status: dict[str, Any]) -> None:
        await self.objects.patch_namespaced_custom_object_status(
            TRAINER_GROUP,
            TRAINER_VERSION,
            self.namespace,
            TRAINJOBS,
            name,
            {"status": status},
            _content_type=MERGE_PATCH,
        )

    async def play_running(self, name: str) -> None:
        await self.play_trainer(
            name,
            {
                "jobsStatus": [
                    {
                        "name": "node",
                        "active": 2,
                        "ready": 2,
                        "succeeded": 0,
                        "failed": 0,
                        "suspended": 0,
                    }
                ]
            },
        )

    async def play_deadline_exceeded(self, name: str) -> None:
        await self.play_trainer(
            name,
            {
                "jobsStatus": [
                    {
                        "name": "node",
                        "active": 0,
                        "ready": 0,
                        "succeeded": 0,
                        "failed": 2,
                        "suspended": 0,
                    }
                ],
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "DeadlineExceeded",
                        "message": "TrainJob exceeded its activeDeadlineSeconds",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            },
        )

    async def kube_events(self, name: str) -> list[Any]:
        listed = await client.CoreV1Api(self.api).list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name}"
        )
        return list(listed.items)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(port: int) -> Samples:
    """The /metrics on ``port``, parsed by prometheus_client: value by (name, labels)."""
    url = f"http://127.0.0.1:{port}/metrics"
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=WAIT).read())
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def event_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# --- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
async def scene(kube_api: client.ApiClient, namespace: str) -> Scene:
    scene = Scene(kube_api, namespace)
    await scene.ensure_runtime()
    return scene


@pytest.fixture
def operator_memo() -> kopf.Memo:
    """The memo of the ``operator`` fixture's operator: it serves metrics on a free port."""
    return kopf.Memo(metrics_address="127.0.0.1:0")


@pytest.fixture
async def operator(
    cluster: Any, scene: Scene, tmp_path: Path, operator_memo: kopf.Memo
) -> AsyncIterator[Path]:
    """The operator serving the scene's namespace; yields the file of its event lines."""
    events = tmp_path / "events.jsonl"
    async with running_operator(cluster.kubeconfig, [scene.namespace], events, operator_memo):
        yield events


# --- KubeflowAdapter -----------------------------------------------------------------------------


async def test_a_valid_adapter_is_probed_and_ready_with_its_declarations(
    scene: Scene, operator: Path
) -> None:
    await scene.apply_adapter(scene.adapter_spec())
    body = await scene.ready_adapter()
    status = body["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Valid": "True",
        "Connected": "True",
        "Probed": "True",
        "Ready": "True",
    }
    assert all(c["observedGeneration"] == 1 for c in status["conditions"])
    assert status["mode"] == "plain"
    assert status["readmissionGate"] == "no"
    assert status["declarations"] == {
        "nodeLossWindow": "5m0s",
        "callBound": "1m5s",
        "polledLoss": [],
    }
    assert status["observedGeneration"] == 1
    annotations = body["metadata"].get("annotations") or {}
    assert not any(key.startswith("kopf.zalando.org") for key in annotations)
    assert body["metadata"].get("finalizers") == [FINALIZER]


@pytest.mark.parametrize(
    ("change", "pointer"),
    [
        # Each passes the CRD's schema and is refused by the settings parser in the operator.
        ({"kueue": None}, "/spec/kueue"),
        (
            {"credentials": [{"secretName": "s3", "mountPath": "/var/run//s3"}]},
            "/spec/credentials/0/mountPath",
        ),
        ({"labels": {"example.com/" + "a" * 64: "v"}}, "/spec/labels/example.com~1"),
    ],
)
async def test_an_invalid_adapter_is_refused_naming_the_json_path(
    scene: Scene, operator: Path, change: dict[str, Any], pointer: str
) -> None:
    await scene.apply_adapter(scene.adapter_spec(**change))

    async def refused() -> dict[str, Any] | None:
        found = condition(await scene.adapter(), "Valid")
        return found if found and found["status"] == "False" else None

    valid = await eventually(refused, "Valid=False")
    assert valid["reason"] == "InvalidSettings"
    assert pointer in valid["message"]
    ready = condition(await scene.adapter(), "Ready")
    assert ready is not None
    assert ready["status"] == "False"


async def test_a_spec_change_restarts_the_adapter_with_the_new_settings(
    scene: Scene, operator: Path
) -> None:
    await scene.apply_adapter(scene.adapter_spec(labels={"team": "a"}))
    await scene.ready_adapter(generation=1)
    await scene.patch_adapter_spec({"labels": {"team": "b"}})
    body = await scene.ready_adapter(generation=2)
    assert body["status"]["observedGeneration"] == 2

    await scene.create_job("after-change")
    trainjob = await eventually(lambda: scene.trainjob("after-change-1"), "TrainJob after-change-1")
    assert trainjob["metadata"]["labels"]["team"] == "b"

    await scene.patch_adapter_spec(
        {"credentials": [{"secretName": "s3", "mountPath": "/var/run//s3"}]}
    )

    async def invalid() -> dict[str, Any] | None:
        found = condition(await scene.adapter(), "Valid")
        return found if found and found.get("observedGeneration") == 3 else None

    assert (await eventually(invalid, "Valid at generation 3"))["status"] == "False"


# --- DispatchJob ---------------------------------------------------------------------------------


@pytest.mark.parametrize("operator_memo", [kopf.Memo(job_events="warnings")])
async def test_job_events_warnings_mirrors_only_the_warning_transitions(
    scene: Scene, operator: Path
) -> None:
    """``--job-events warnings``: the status holds every event; only Warnings become Events."""
    await scene.apply_adapter(scene.adapter_spec())
    await scene.ready_adapter()
    await scene.create_job("quiet", activeDeadlineSeconds=60)
    await scene.job_in_state("quiet", "Pending")
    await scene.play_running("quiet-1")
    await scene.job_in_state("quiet", "Running")
    await scene.play_deadline_exceeded("quiet-1")
    failed = await scene.job_in_state("quiet", "Failed", "Timeout")
    types = [e["type"] for e in failed["status"]["events"]]
    assert types == ["Submitted", "Admitted", "Running", "Finished"]

    async def warned() -> list[Any] | None:
        events = await scene.kube_events("quiet")
        return events if any(e.reason == "Finished" for e in events) else None

    events = await eventually(warned, "the Warning Event Finished on the DispatchJob")
    mirrored = [(e.type, e.reason) for e in events if e.reason in types]
    assert mirrored == [("Warning", "Finished")]


async def test_a_dispatchjob_follows_its_trainjob_to_a_typed_failure(
    scene: Scene, operator: Path, operator_memo: kopf.Memo
) -> None:
    await scene.apply_adapter(scene.adapter_spec())
    await scene.ready_adapter()
    await scene.create_job("train", activeDeadlineSeconds=60)

    pending = await scene.job_in_state("train", "Pending")
    assert pending["status"]["trainJob"] == "train-1"
    trainjob = await scene.trainjob("train-1")
    assert trainjob is not None
    assert trainjob["metadata"]["labels"][LABEL_JOB] == "train"

    await scene.play_running("train-1")
    running = await scene.job_in_state("train", "Running")
    assert condition(running, "Running")["status"] == "True"  # type: ignore[index]
    assert condition(running, "Admitted")["status"] == "True"  # type: ignore[index]

    await scene.play_deadline_exceeded("train-1")
    failed = await scene.job_in_state("train", "Failed", "Timeout")
    finished = condition(failed, "Finished")
    assert finished is not None
    assert finished["status"] == "True"
    assert finished["reason"] == "DeadlineExceeded"
    assert failed["status"]["reason"] == "DeadlineExceeded"
    types = [e["type"] for e in failed["status"]["events"]]
    assert types == ["Submitted", "Admitted", "Running", "Finished"]

    async def mirrored() -> list[Any] | None:
        reasons = {e.reason for e in await scene.kube_events("train")}
        return sorted(reasons) if {"Running", "Finished"} <= reasons else None

    await eventually(mirrored, "Kubernetes Events Running and Finished on the DispatchJob")
    lines = [e for e in event_lines(operator) if e.get("job") == "train"]
    assert [e["type"] for e in lines] == types

    # The operator's metrics count this one job: its four events, its finish and its phases.
    where = {"namespace": scene.namespace, "adapter": ADAPTER}

    def events_of(samples: Samples) -> dict[str, float | None]:
        return {
            kind: sample(samples, "dispatch_kubeflow_events_total", **where, type=kind, cause=cause)
            for kind, cause in (
                ("Submitted", ""),
                ("Admitted", ""),
                ("Running", ""),
                ("Finished", "Timeout"),
            )
        }

    async def counted() -> Samples | None:
        samples = await scrape(operator_memo.metrics_port)
        return samples if events_of(samples)["Finished"] == 1 else None

    samples = await eventually(counted, "the Finished event counted in /metrics")
    assert events_of(samples) == dict.fromkeys(types, 1.0)
    finishes = {
        labels: value
        for (name, labels), value in samples.items()
        if name == "dispatch_kubeflow_jobs_finished_total"
        and ("namespace", scene.namespace) in labels
    }
    labels = {**where, "state": "Failed", "cause": "Timeout", "runtime": RUNTIME_NAME}
    assert finishes == {frozenset(labels.items()): 1.0}
    for phase in ("admission_wait", "startup", "run"):
        count = f"dispatch_kubeflow_job_{phase}_seconds_count"
        assert sample(samples, count, namespace=scene.namespace, runtime=RUNTIME_NAME) == 1, phase
    assert sample(samples, "dispatch_kubeflow_watch_backlog", **where) == 0
    created = {"verb": "create", "resource": "trainjobs", "code": "201"}
    assert (sample(samples, "dispatch_kubeflow_api_requests_total", **created) or 0) >= 1


async def test_deleting_a_dispatchjob_stops_its_job_and_everything_of_it_goes(
    cluster: Any, scene: Scene, operator: Path
) -> None:
    cluster.start_controller_manager()  # the garbage collector takes the TrainJob's dependents
    # Late in a whole-suite run the collector works through the previous tests' namespaces
    # too; give it the time it needs rather than the short bound the other tests use.
    await scene.apply_adapter(scene.adapter_spec(timeouts={"stopJob": "120s"}))
    await scene.ready_adapter()
    await scene.create_job("doomed")
    await scene.job_in_state("doomed", "Pending")
    trainjob = await scene.trainjob("doomed-1")
    assert trainjob is not None
    pod = {
        "metadata": {
            "name": "doomed-1-node-0-0",
            "labels": dict(trainjob["metadata"]["labels"]),
            "ownerReferences": [
                {
                    "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
                    "kind": "TrainJob",
                    "name": "doomed-1",
                    "uid": trainjob["metadata"]["uid"],
                }
            ],
        },
        "spec": {"containers": [{"name": "node", "image": "busybox:1.37"}]},
    }
    core: Any = client.CoreV1Api(scene.api)  # takes a plain dict as the body
    await core.create_namespaced_pod(scene.namespace, pod)

    await scene.objects.delete_namespaced_custom_object(
        GROUP, VERSION, scene.namespace, "dispatchjobs", "doomed"
    )

    async def gone() -> bool:
        return await scene.job("doomed") is None

    await eventually(gone, "the DispatchJob to go (its finalizer released)", within=150.0)
    assert await scene.trainjob("doomed-1") is None
    pods = await core.list_namespaced_pod(scene.namespace, label_selector=f"{LABEL_JOB}=doomed")
    assert pods.items == []


async def test_raising_attempt_on_a_finished_job_starts_that_attempt(
    scene: Scene, operator: Path
) -> None:
    await scene.apply_adapter(scene.adapter_spec())
    await scene.ready_adapter()
    await scene.create_job("again")
    await scene.job_in_state("again", "Pending")
    await scene.play_deadline_exceeded("again-1")
    await scene.job_in_state("again", "Failed", "Timeout")

    await scene.objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        scene.namespace,
        "dispatchjobs",
        "again",
        {"spec": {"attempt": 2}},
        _content_type=MERGE_PATCH,
    )
    second = await scene.job_in_state("again", "Pending")
    assert second["status"]["attempt"] == 2
    assert second["status"]["trainJob"] == "again-2"
    assert condition(second, "Finished")["status"] == "False"  # type: ignore[index]
    assert await scene.trainjob("again-2") is not None


async def test_the_spec_is_immutable_but_for_attempt(scene: Scene, operator: Path) -> None:
    await scene.apply_adapter(scene.adapter_spec())
    await scene.ready_adapter()
    await scene.create_job("fixed")
    with pytest.raises(ApiException) as refused:
        await scene.objects.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            scene.namespace,
            "dispatchjobs",
            "fixed",
            {"spec": {"numNodes": 3}},
            _content_type=MERGE_PATCH,
        )
    assert refused.value.status == 422
    assert "spec.numNodes is immutable" in str(refused.value.body)


async def test_each_transition_is_reported_once_across_an_operator_restart(
    cluster: Any, scene: Scene, tmp_path: Path
) -> None:
    events = tmp_path / "events.jsonl"
    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        await scene.apply_adapter(scene.adapter_spec())
        await scene.ready_adapter()
        await scene.create_job("survivor")
        await scene.job_in_state("survivor", "Pending")
        await scene.play_running("survivor-1")
        await scene.job_in_state("survivor", "Running")

    await scene.play_deadline_exceeded("survivor-1")  # while no operator runs

    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        body = await scene.job_in_state("survivor", "Failed", "Timeout")

    types = [e["type"] for e in body["status"]["events"]]
    assert types == ["Submitted", "Admitted", "Running", "Finished"]
    lines = [e["type"] for e in event_lines(events) if e.get("job") == "survivor"]
    assert lines == types
    # The position is kept in the DispatchJob status, not on the TrainJob.
    assert '"f":true' in body["status"][STATUS_REPORTED]["1"]
    trainjob = await scene.trainjob("survivor-1")
    assert trainjob is not None
    assert ANNOTATION_REPORTED not in (trainjob["metadata"].get("annotations") or {})


async def test_a_job_that_vanished_while_no_operator_ran_gets_vanished_once(
    cluster: Any, scene: Scene, tmp_path: Path
) -> None:
    """The record outlives the TrainJob in the DispatchJob status, so the loss is reported."""
    events = tmp_path / "events.jsonl"
    async with running_operator(cluster.kubeconfig, [scene.namespace], events):
        await scene.apply_adapter(scene.adapter_spec())
        await scene.ready_adapter()
        await scene.create_job("ghost")
        await scene.job_in_state("ghost", "Pending")
        await scene.play_running("ghost-1")
        running = await scene.job_in_state("ghost", "Running")
    assert "1" in running["status"][STATUS_REPORTED]

    # While no operator runs, everything of the job goes (no JobSet or pods exist here: no
    # controller made them).
    await scene.objects.delete_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, scene.namespace, TRAINJOBS, "ghost-1"
    )
    assert await scene.trainjob("ghost-1") is None

    for _ in range(2):  # the second restart must not report it again
        async with running_operator(cluster.kubeconfig, [scene.namespace], events):
            body = await scene.job_in_state("ghost", "Unknown", "EvidenceLost")
            await scene.ready_adapter()

    types = [e["type"] for e in body["status"]["events"]]
    assert types == ["Submitted", "Admitted", "Running", "Vanished"]
    finished = condition(body, "Finished")
    assert finished is not None
    assert finished["status"] == "True"
    lines = [e["type"] for e in event_lines(events) if e.get("job") == "ghost"]
    assert lines == types
    after = await scene.job("ghost")
    assert after is not None
    assert [e["type"] for e in after["status"]["events"]] == types


async def test_a_job_the_adapter_refuses_finishes_failed_with_the_reason(
    scene: Scene, operator: Path
) -> None:
    await scene.apply_adapter(scene.adapter_spec())
    await scene.ready_adapter()
    await scene.create_job("elsewhere", runtime={"kind": "TrainingRuntime", "name": "unlisted"})

    async def refused() -> dict[str, Any] | None:
        body = await scene.job("elsewhere")
        finished = condition(body, "Finished")
        return body if finished and finished["status"] == "True" else None

    body = await eventually(refused, "the refused DispatchJob to finish")
    status = body["status"]
    assert (status["state"], status["reason"]) == ("Failed", "Unsupported")
    assert "unlisted" in status["message"]
    assert await scene.trainjob("elsewhere-1") is None

    async def warned() -> list[Any] | None:
        found = [e for e in await scene.kube_events("elsewhere") if e.reason == "Unsupported"]
        return found or None

    (event,) = await eventually(warned, "a Warning Event on the DispatchJob")
    assert event.type == "Warning"
