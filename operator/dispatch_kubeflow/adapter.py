"""The adapter: dispatch jobs in, Kubeflow Trainer TrainJobs out (SPEC §3).

``Adapter.open`` parses the settings, connects and runs the preflight probe, so that an adapter
that opened is one that can start a job: the Trainer serves ``runtimePatches``, the probe runtime
passes the runtime rules, and (in Kueue mode) Kueue makes a Workload for a TrainJob. ``start``,
``stop_job`` and ``find`` are what a dispatcher calls; the operator's handlers call the same.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Annotated, Any, Literal, Self, TypeVar

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.watch import Watch
from pydantic import BaseModel, ConfigDict, SkipValidation

from dispatch_kubeflow.constants import (
    ANNOTATION_READMIT,
    ANNOTATION_REJECT,
    ANNOTATION_SPEC_HASH,
    BUILTIN_LOSS_TAINTS,
    CLUSTER_TRAINING_RUNTIMES,
    JOBSET_GROUP,
    JOBSET_VERSION,
    JOBSETS,
    KIND_TRAINJOB,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_ATTEMPT,
    LABEL_KUEUE_JOB_UID,
    LABEL_PROBE,
    LOCAL_QUEUES,
    PROBE_JOB_PREFIX,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    WORKLOADS,
    Cause,
    State,
)
from dispatch_kubeflow.derivation import derive
from dispatch_kubeflow.errors import (
    DispatchError,
    ErrInvalid,
    ErrNotFound,
    ErrOutcomeUnknown,
    ErrUnsupported,
)
from dispatch_kubeflow.events import DerivedStatus, DispatchEvent, JobObservation, Taint
from dispatch_kubeflow.kube.connection import ApiClientWithTimeouts, connect
from dispatch_kubeflow.kube.workloads import eviction_count
from dispatch_kubeflow.reporting import ReportStore
from dispatch_kubeflow.runtimes import check_runtime, describe
from dispatch_kubeflow.settings import Declarations, RuntimeRef, Settings, parse_settings
from dispatch_kubeflow.supervisor import Supervisor
from dispatch_kubeflow.trainjob import (
    RFC1035_LABEL,
    JobRef,
    JobSpec,
    build_trainjob,
    job_selector,
    resolve_runtime,
)

Obj = dict[str, Any]
T = TypeVar("T")

PROBE_PREFIX = "preflight probe: "
MERGE_PATCH = "application/merge-patch+json"
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
# Errors that leave a write's outcome open: the request may have reached the apiserver.
TRANSPORT_ERRORS = (TimeoutError, aiohttp.ClientError)
# stop_job's read-backs start fast and slow down, so a quick stop costs few requests.
FIRST_POLL = 0.05
LONGEST_POLL = 1.0


class AdapterConfig(BaseModel):
    """What ``Adapter.open`` needs: the settings (a model or the JSON text) and who we are.

    ``store`` keeps how far each (job, attempt) has been reported, so that ``watch()`` reports
    each transition once across restarts. None keeps it in an annotation on the TrainJob, which
    needs nothing beside the TrainJob; the operator keeps it in the DispatchJob status instead.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    settings: Settings | str | bytes
    token: str | None = None
    # The value of the adapter label on everything this adapter creates.
    adapter_name: str = "default"
    # Any object with the ReportStore methods (a Protocol, so not checked by pydantic).
    store: Annotated[ReportStore | None, SkipValidation] = None


class AttemptFound(BaseModel):
    """Everything of one attempt of a job, read back, with its derived status."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    train_job: Obj | None = None
    job_set: Obj | None = None
    pods: tuple[Obj, ...] = ()
    workload: Obj | None = None
    status: DerivedStatus


class Found(BaseModel):
    """A read-back of everything of one job; state and cause are the latest attempt's."""

    model_config = ConfigDict(frozen=True)

    job_id: str
    attempts: tuple[AttemptFound, ...]
    state: State
    cause: Cause | None = None
    reason: str = ""
    message: str = ""
    result: dict[str, Any] | None = None

    @property
    def current(self) -> AttemptFound:
        return self.attempts[-1]

    def remaining(self) -> list[str]:
        """``Kind/name`` of every object still there, with its finalizers when it has any."""
        return [_describe_object(kind, obj) for kind, obj in _objects(self.attempts)]


class _Objects(BaseModel):
    """The raw objects of one job, before they are sorted into attempts."""

    trainjobs: list[Obj]
    jobsets: list[Obj]
    pods: list[Obj]
    workloads: list[Obj]

    def empty(self) -> bool:
        return not (self.trainjobs or self.jobsets or self.pods or self.workloads)

    def described(self) -> list[str]:
        return [
            *(_describe_object("TrainJob", o) for o in self.trainjobs),
            *(_describe_object("JobSet", o) for o in self.jobsets),
            *(_describe_object("Pod", o) for o in self.pods),
            *(_describe_object("Workload", o) for o in self.workloads),
        ]


class Adapter:
    """One adapter instance: one namespace, one connection, one set of settings."""

    def __init__(
        self,
        settings: Settings,
        api: ApiClientWithTimeouts,
        adapter_name: str,
        store: ReportStore | None = None,
    ) -> None:
        self.settings = settings
        self.api = api
        self.adapter_name = adapter_name
        self._custom = client.CustomObjectsApi(api)
        self._core = client.CoreV1Api(api)
        self.supervisor = Supervisor(api, settings, adapter_name, store=store)

    # ---------------------------------------------------------------------------------------
    # Life cycle

    @classmethod
    async def open(cls, config: AdapterConfig) -> Adapter:
        """Parse, connect, probe. ``ErrInvalid`` for bad settings, ``ErrUnsupported`` else."""
        settings = _settings_of(config.settings)
        if not LABEL_VALUE.match(config.adapter_name) or len(config.adapter_name) > 63:
            raise ErrInvalid(
                f"adapter name {config.adapter_name!r} is not a label value (at most 63 "
                "letters, digits, '-', '_' or '.', beginning and ending with a letter or digit)"
            )
        api = await connect(
            settings.cluster, token=config.token, request_timeout=settings.timeouts.request
        )
        adapter = cls(settings, api, config.adapter_name, config.store)
        try:
            await adapter._preflight_probe()
        except BaseException:
            await adapter.close()
            raise
        return adapter

    async def close(self) -> None:
        await self.api.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def declarations(self) -> Declarations:
        return self.settings.declarations()

    @property
    def readmission_gate(self) -> Literal["yes", "no"]:
        return self.settings.readmission_gate

    def watch(self) -> AsyncIterator[DispatchEvent]:
        """Every dispatch event of this adapter: one watch per kind, each transition once."""
        return self.supervisor.events()

    # ---------------------------------------------------------------------------------------
    # The preflight probe

    async def _preflight_probe(self) -> None:
        try:
            await check_trainer_api(self.api)
            probe = self.settings.probe_runtime
            if self.settings.runtimes and probe not in self.settings.runtimes:
                raise ErrUnsupported(
                    f"probeRuntime {describe(probe)} is not one of the adapter's runtimes; "
                    "add it to runtimes or pick one of them"
                )
            job = JobSpec(job_id=f"{PROBE_JOB_PREFIX}{secrets.token_hex(4)}", runtime=probe)
            await self._start(job, suspend=True, extra_labels={LABEL_PROBE: "true"})
            await self._stop(job.job_id, self.settings.timeouts.workload)
        except DispatchError as error:
            if str(error).startswith(PROBE_PREFIX):
                raise
            raise ErrUnsupported(f"{PROBE_PREFIX}{error}") from error

    # ---------------------------------------------------------------------------------------
    # start

    async def start(self, job: JobSpec) -> JobRef:
        """Create the TrainJob of ``job`` (idempotently), and in Kueue mode see its Workload."""
        return await self._start(job, suspend=False, extra_labels=None)

    async def _start(
        self, job: JobSpec, *, suspend: bool, extra_labels: Mapping[str, str] | None
    ) -> JobRef:
        runtime = resolve_runtime(job, self.settings)
        if self.settings.runtimes and runtime not in self.settings.runtimes:
            allowed = ", ".join(describe(r) for r in self.settings.runtimes)
            raise ErrUnsupported(
                f"runtime {describe(runtime)} is not in the adapter's runtimes ({allowed})"
            )
        check_runtime(await self._read_runtime(runtime), runtime, self.settings)
        body = build_trainjob(
            job, self.settings, self.adapter_name, suspend=suspend, extra_labels=extra_labels
        )
        trainjob = await self._create_trainjob(body)
        ref = self._ref_of(job, runtime, trainjob)
        if self.settings.kueue is None:
            return ref
        workload = await self._wait_for_workload(trainjob)
        return ref.model_copy(update={"workload": workload["metadata"]["name"]})

    async def _read_runtime(self, ref: RuntimeRef) -> Obj:
        try:
            if ref.kind == "ClusterTrainingRuntime":
                runtime: Obj = await self._custom.get_cluster_custom_object(
                    TRAINER_GROUP, TRAINER_VERSION, CLUSTER_TRAINING_RUNTIMES, ref.name
                )
            else:
                runtime = await self._custom.get_namespaced_custom_object(
                    TRAINER_GROUP,
                    TRAINER_VERSION,
                    self.settings.namespace,
                    TRAINING_RUNTIMES,
                    ref.name,
                )
        except ApiException as error:
            if error.status == 404:
                where = (
                    ""
                    if ref.kind == "ClusterTrainingRuntime"
                    else (f" in namespace {self.settings.namespace!r}")
                )
                raise ErrUnsupported(
                    f"runtime {describe(ref)} does not exist{where}; create it or name another"
                ) from None
            raise _api_error(f"reading runtime {describe(ref)}", error) from None
        except TRANSPORT_ERRORS as error:
            raise ErrUnsupported(f"reading runtime {describe(ref)}: {_transport(error)}") from None
        return runtime

    async def _create_trainjob(self, body: Obj) -> Obj:
        name = body["metadata"]["name"]
        try:
            created: Obj = await self._custom.create_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, self.settings.namespace, TRAINJOBS, body
            )
        except ApiException as error:
            if error.status == 409:
                return self._same_or_refuse(await self._read_trainjob(name), body)
            if error.status >= 500 or error.status == 429:
                return await self._read_back(body, f"the apiserver answered {error.status}")
            if error.status == 422:
                raise ErrInvalid(
                    f"TrainJob {name} was refused by the apiserver: {_message(error)}"
                ) from None
            raise _api_error(f"creating TrainJob {name}", error) from None
        except TRANSPORT_ERRORS as error:
            return await self._read_back(body, _transport(error))
        return created

    async def _read_back(self, body: Obj, why: str) -> Obj:
        """After a create whose outcome is open: the TrainJob if it is there, else unknown."""
        name = body["metadata"]["name"]
        unknown = (
            f"creating TrainJob {name} in namespace {self.settings.namespace!r} failed ({why}) "
            "and reading it back could not tell whether it exists; start again to find out "
            "(start is idempotent)"
        )
        try:
            existing = await self._read_trainjob(name)
        except (ApiException, *TRANSPORT_ERRORS):
            raise ErrOutcomeUnknown(unknown) from None
        if existing is None:
            raise ErrOutcomeUnknown(unknown)
        return self._same_or_refuse(existing, body)

    async def _read_trainjob(self, name: str) -> Obj | None:
        try:
            trainjob: Obj = await self._custom.get_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, self.settings.namespace, TRAINJOBS, name
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return trainjob

    def _same_or_refuse(self, existing: Obj | None, body: Obj) -> Obj:
        name = body["metadata"]["name"]
        if existing is None:
            raise ErrOutcomeUnknown(
                f"TrainJob {name} existed when created and was gone when read; start again"
            )
        want = body["metadata"]["annotations"][ANNOTATION_SPEC_HASH]
        have = (existing["metadata"].get("annotations") or {}).get(ANNOTATION_SPEC_HASH)
        if have != want:
            raise ErrInvalid(
                f"TrainJob {name} already exists with another spec (spec hash {have!r}, this "
                f"request's is {want!r}); a changed job needs a new attempt"
            )
        return existing

    def _ref_of(self, job: JobSpec, runtime: RuntimeRef, trainjob: Obj) -> JobRef:
        metadata = trainjob["metadata"]
        return JobRef(
            job_id=job.job_id,
            attempt=job.attempt,
            name=metadata["name"],
            namespace=metadata["namespace"],
            uid=metadata["uid"],
            runtime=runtime,
            spec_hash=metadata["annotations"][ANNOTATION_SPEC_HASH],
        )

    # ---------------------------------------------------------------------------------------
    # Kueue

    async def _wait_for_workload(self, trainjob: Obj) -> Obj:
        """The Workload Kueue makes for ``trainjob``; else the TrainJob goes and the start fails."""
        name = trainjob["metadata"]["name"]
        timeout = self.settings.timeouts.workload
        workload = await self._watch_for_workload(trainjob["metadata"]["uid"], timeout)
        if workload is not None:
            return workload
        reason = await self._why_no_workload()
        await self._delete_trainjobs(f"metadata.name={name}", field=True)
        raise ErrUnsupported(
            f"Kueue made no Workload for TrainJob {name} within {_seconds(timeout)}: {reason}; "
            "the TrainJob was deleted"
        )

    async def _watch_for_workload(self, uid: str, within: timedelta) -> Obj | None:
        """List, then watch from the list's version, until the Workload shows or time is up."""
        selector = f"{LABEL_KUEUE_JOB_UID}={uid}"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within.total_seconds()
        try:
            while (remaining := deadline - loop.time()) > 0:
                listed = await self._custom.list_namespaced_custom_object(
                    KUEUE_GROUP,
                    KUEUE_VERSION,
                    self.settings.namespace,
                    WORKLOADS,
                    label_selector=selector,
                )
                if listed["items"]:
                    found: Obj = listed["items"][0]
                    return found
                watch = Watch()
                try:
                    async with asyncio.timeout(remaining):
                        async for event in watch.stream(
                            self._custom.list_namespaced_custom_object,
                            KUEUE_GROUP,
                            KUEUE_VERSION,
                            self.settings.namespace,
                            WORKLOADS,
                            label_selector=selector,
                            resource_version=listed["metadata"]["resourceVersion"],
                            timeout_seconds=max(1, int(remaining)),
                        ):
                            if event["type"] in ("ADDED", "MODIFIED"):
                                added: Obj = event["object"]
                                return added
                except ApiException as error:
                    if error.status != 410:  # 410 Gone: the list is too old; list again
                        raise
                finally:
                    watch.stop()
                    await watch.close()
        except TimeoutError:
            return None
        except ApiException as error:
            raise _api_error("waiting for the Kueue Workload", error) from None
        return None

    async def _why_no_workload(self) -> str:
        assert self.settings.kueue is not None
        queue = self.settings.kueue.local_queue
        try:
            await self._custom.get_namespaced_custom_object(
                KUEUE_GROUP, KUEUE_VERSION, self.settings.namespace, LOCAL_QUEUES, queue
            )
        except ApiException as error:
            if error.status == 404:
                return (
                    f"LocalQueue {queue!r} does not exist in namespace "
                    f"{self.settings.namespace!r} (kueue.localQueue)"
                )
        except TRANSPORT_ERRORS:
            pass
        return (
            f"LocalQueue {queue!r} exists, so Kueue is likely not running or its TrainJob "
            "integration (trainer.kubeflow.org/trainjob) is not enabled"
        )

    # ---------------------------------------------------------------------------------------
    # stop_job

    async def stop_job(self, job_id: str) -> None:
        """Delete every TrainJob of the job and wait, up to ``timeouts.stopJob``, for all to go."""
        _check_job_id(job_id)
        self.supervisor.note_stopped(job_id)
        await self._stop(job_id, self.settings.timeouts.stop_job)

    async def _stop(self, job_id: str, within: timedelta) -> None:
        await self._delete_trainjobs(job_selector(self.adapter_name, job_id))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within.total_seconds()
        pause = FIRST_POLL
        while True:
            objects = await self._objects_of(job_id)
            if objects.empty():
                return
            if loop.time() >= deadline:
                raise ErrOutcomeUnknown(
                    f"stop_job {job_id}: after {_seconds(within)} these remain: "
                    + ", ".join(objects.described())
                )
            await asyncio.sleep(min(pause, max(0.0, deadline - loop.time())))
            pause = min(pause * 2, LONGEST_POLL)

    async def _delete_trainjobs(self, selector: str, *, field: bool = False) -> None:
        # Background: the TrainJob goes at once and the garbage collector takes its JobSet,
        # pods and Workload after it; stop_job waits for those by reading back.
        options = client.V1DeleteOptions(propagation_policy="Background")
        try:
            await self._custom.delete_collection_namespaced_custom_object(
                TRAINER_GROUP,
                TRAINER_VERSION,
                self.settings.namespace,
                TRAINJOBS,
                body=options,
                field_selector=selector if field else "",
                label_selector="" if field else selector,
            )
        except ApiException as error:
            raise _api_error("deleting TrainJobs", error) from None
        except TRANSPORT_ERRORS as error:
            raise ErrOutcomeUnknown(
                f"deleting TrainJobs ({selector}): {_transport(error)}"
            ) from None

    # ---------------------------------------------------------------------------------------
    # find

    async def find(self, job_id: str) -> Found:
        """Everything of the job read back, with state and cause; ``ErrNotFound`` for nothing."""
        _check_job_id(job_id)
        objects = await self._objects_of(job_id)
        if objects.empty():
            raise ErrNotFound(
                f"job {job_id}: nothing of it exists in namespace {self.settings.namespace!r}"
            )
        taints = await self._node_taints(objects.pods)
        attempts = tuple(
            self._attempt_found(job_id, attempt, objects, taints)
            for attempt in sorted(_attempts(job_id, objects))
        )
        current = attempts[-1].status
        return Found(
            job_id=job_id,
            attempts=attempts,
            state=current.state,
            cause=current.cause,
            reason=current.reason,
            message=current.message,
            result=current.result,
        )

    def _attempt_found(
        self,
        job_id: str,
        attempt: int,
        objects: _Objects,
        taints: Mapping[str, tuple[Taint, ...]],
    ) -> AttemptFound:
        trainjob = _first(o for o in objects.trainjobs if _attempt_of(job_id, o) == attempt)
        jobset = _first(o for o in objects.jobsets if _attempt_of(job_id, o) == attempt)
        pods = tuple(o for o in objects.pods if _attempt_of(job_id, o) == attempt)
        workload = _first(o for o in objects.workloads if _attempt_of(job_id, o) == attempt)
        stopping = bool(trainjob and trainjob["metadata"].get("deletionTimestamp"))
        observation = JobObservation(
            job=job_id,
            attempt=attempt,
            train_job=trainjob,
            job_set=jobset,
            pods=pods,
            workload=workload,
            node_taints=taints,
            # _node_taints leaves out the nodes that no longer exist.
            deleted_nodes=frozenset(
                node for p in pods if (node := (p.get("spec") or {}).get("nodeName"))
            )
            - taints.keys(),
            stopped=stopping,
        )
        return AttemptFound(
            attempt=attempt,
            train_job=trainjob,
            job_set=jobset,
            pods=pods,
            workload=workload,
            status=derive(observation, loss_taints=self._loss_taints()),
        )

    def _loss_taints(self) -> frozenset[str]:
        return frozenset((*BUILTIN_LOSS_TAINTS, *self.settings.node_loss_taints))

    async def _objects_of(self, job_id: str) -> _Objects:
        selector = job_selector(self.adapter_name, job_id)
        namespace = self.settings.namespace
        trainjobs, jobsets, pods, workloads = await asyncio.gather(
            self._list_custom(TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS, selector),
            self._list_custom(JOBSET_GROUP, JOBSET_VERSION, JOBSETS, selector),
            self._call(self._core.list_namespaced_pod(namespace, label_selector=selector)),
            self._workloads_of(job_id),
        )
        return _Objects(
            trainjobs=trainjobs,
            jobsets=jobsets,
            pods=[self.api.sanitize_for_serialization(p) for p in pods.items],
            workloads=workloads,
        )

    async def _workloads_of(self, job_id: str) -> list[Obj]:
        """The job's Workloads: Kueue labels them with their owner's uid, not with ours, so
        they are picked by owner reference (which also finds those of deleted TrainJobs)."""
        if self.settings.kueue is None:
            return []
        items = await self._list_custom(KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, None)
        return [w for w in items if _attempt_of(job_id, w) is not None]

    async def _list_custom(
        self, group: str, version: str, plural: str, selector: str | None
    ) -> list[Obj]:
        listed: Obj = await self._call(
            self._custom.list_namespaced_custom_object(
                group,
                version,
                self.settings.namespace,
                plural,
                label_selector=selector or "",
            )
        )
        items: list[Obj] = listed["items"]
        return items

    async def _node_taints(self, pods: Sequence[Obj]) -> dict[str, tuple[Taint, ...]]:
        """The taints of every node the pods are bound to that exists."""
        names = sorted(
            {p["spec"]["nodeName"] for p in pods if (p.get("spec") or {}).get("nodeName")}
        )
        nodes = await asyncio.gather(*(self._read_node(n) for n in names))
        return {
            name: tuple(
                Taint.model_validate(t)
                for t in ((node or {}).get("spec") or {}).get("taints") or ()
            )
            for name, node in zip(names, nodes, strict=True)
            if node is not None
        }

    async def _read_node(self, name: str) -> Obj | None:
        try:
            node = await self._core.read_node(name)
        except ApiException as error:
            if error.status == 404:
                return None
            raise _api_error(f"reading node {name}", error) from None
        result: Obj = self.api.sanitize_for_serialization(node)
        return result

    async def _call(self, request: Awaitable[T]) -> T:
        try:
            return await request
        except ApiException as error:
            raise _api_error("reading the job's objects", error) from None
        except TRANSPORT_ERRORS as error:
            raise ErrUnsupported(f"reading the job's objects: {_transport(error)}") from None

    # ---------------------------------------------------------------------------------------
    # The readmission gate

    async def readmit(self, job_id: str) -> None:
        """Open the readmission gate of the job's current TrainJob for its latest eviction."""
        trainjob, found = await self._gate_target("readmit", job_id)
        evictions = eviction_count(found.current.workload or {})
        await self._annotate(trainjob, {ANNOTATION_READMIT: str(evictions)})

    async def reject(self, job_id: str, reason: str) -> None:
        """Make the job's admission check ``Rejected`` with ``reason``."""
        if not reason.strip():
            raise ErrInvalid("reject: reason must not be empty")
        trainjob, _ = await self._gate_target("reject", job_id)
        await self._annotate(trainjob, {ANNOTATION_REJECT: reason})

    async def _gate_target(self, what: str, job_id: str) -> tuple[Obj, Found]:
        if self.readmission_gate == "no":
            raise ErrUnsupported(
                f"{what}: this adapter has no readmission gate (kueue.admissionCheck is not set)"
            )
        found = await self.find(job_id)
        trainjob = found.current.train_job
        if trainjob is None:
            raise ErrNotFound(f"{what}: job {job_id} has no TrainJob left")
        return trainjob, found

    async def _annotate(self, trainjob: Obj, annotations: Mapping[str, str]) -> None:
        name = trainjob["metadata"]["name"]
        # The typed stub omits _content_type; without it a dict body goes out as a JSON patch.
        patch: Callable[..., Awaitable[Any]] = self._custom.patch_namespaced_custom_object
        try:
            await patch(
                TRAINER_GROUP,
                TRAINER_VERSION,
                self.settings.namespace,
                TRAINJOBS,
                name,
                {"metadata": {"annotations": dict(annotations)}},
                _content_type=MERGE_PATCH,
            )
        except ApiException as error:
            if error.status == 404:
                raise ErrNotFound(f"TrainJob {name} is gone") from None
            raise _api_error(f"annotating TrainJob {name}", error) from None
        except TRANSPORT_ERRORS as error:
            raise ErrOutcomeUnknown(f"annotating TrainJob {name}: {_transport(error)}") from None


# -------------------------------------------------------------------------------------------
# Pure helpers


async def check_trainer_api(
    api: ApiClientWithTimeouts, group: str = TRAINER_GROUP, version: str = TRAINER_VERSION
) -> None:
    """Refuse a Trainer whose served TrainJob has no ``spec.runtimePatches`` (before v2.2).

    It reads the group's OpenAPI v3 document, which every authenticated user may read, rather
    than the CRD, which would need a permission on CustomResourceDefinitions.
    """
    path = f"/openapi/v3/apis/{group}/{version}"
    try:
        document: Obj = await api.call_api(
            path,
            "GET",
            header_params={"Accept": "application/json"},
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )
    except ApiException as error:
        if error.status == 404:
            raise ErrUnsupported(
                f"the Trainer API {group}/{version} is not served; "
                "install Kubeflow Trainer v2.2 or later"
            ) from None
        raise _api_error(f"reading {path}", error) from None
    except TRANSPORT_ERRORS as error:
        raise ErrUnsupported(f"reading {path}: {_transport(error)}") from None
    check_trainjob_schema(document, group, version)


def check_trainjob_schema(document: Mapping[str, Any], group: str, version: str) -> None:
    """Refuse an OpenAPI document whose TrainJob of ``group/version`` lacks runtimePatches."""
    schemas = (document.get("components") or {}).get("schemas") or {}
    trainjob = _schema_of_kind(schemas, group, version, KIND_TRAINJOB)
    if trainjob is None:
        raise ErrUnsupported(
            f"the Trainer API {group}/{version} serves no TrainJob; "
            "install Kubeflow Trainer v2.2 or later"
        )
    spec = _resolve(schemas, (trainjob.get("properties") or {}).get("spec"))
    if "runtimePatches" not in (spec.get("properties") or {}):
        raise ErrUnsupported(
            "the served TrainJob has no spec.runtimePatches, so Kubeflow Trainer is older than "
            "v2.2; upgrade Kubeflow Trainer to v2.2 or later"
        )


def _schema_of_kind(
    schemas: Mapping[str, Any], group: str, version: str, kind: str
) -> Mapping[str, Any] | None:
    wanted = {"group": group, "version": version, "kind": kind}
    for schema in schemas.values():
        if isinstance(schema, Mapping) and wanted in (
            schema.get("x-kubernetes-group-version-kind") or ()
        ):
            return schema
    return None


def _resolve(schemas: Mapping[str, Any], node: Any) -> Mapping[str, Any]:
    """Follow ``$ref`` and single-entry ``allOf`` wrappers to the schema they name."""
    for _ in range(8):
        if not isinstance(node, Mapping):
            return {}
        if "$ref" in node:
            node = schemas.get(str(node["$ref"]).rsplit("/", 1)[-1])
        elif "properties" not in node and len(node.get("allOf") or ()) == 1:
            node = node["allOf"][0]
        else:
            return node
    return {}


def _settings_of(value: Settings | str | bytes) -> Settings:
    if isinstance(value, Settings):
        return value
    return parse_settings(value)


def _check_job_id(job_id: str) -> None:
    if not RFC1035_LABEL.match(job_id) or len(job_id) > 61:
        raise ErrInvalid(f"job id {job_id!r} is not an RFC 1035 label of at most 61 characters")


def _attempt_of(job_id: str, obj: Mapping[str, Any]) -> int | None:
    """The attempt an object belongs to: our label, else its TrainJob owner's name."""
    metadata = obj.get("metadata") or {}
    label = (metadata.get("labels") or {}).get(LABEL_ATTEMPT)
    if label is not None and label.isdigit():
        return int(label)
    pattern = re.compile(rf"^{re.escape(job_id)}-([1-9][0-9]*)$")
    for owner in metadata.get("ownerReferences") or ():
        if owner.get("kind") == KIND_TRAINJOB and (match := pattern.match(owner.get("name", ""))):
            return int(match.group(1))
    return None


def _attempts(job_id: str, objects: _Objects) -> set[int]:
    every = (*objects.trainjobs, *objects.jobsets, *objects.pods, *objects.workloads)
    return {a for o in every if (a := _attempt_of(job_id, o)) is not None}


def _objects(attempts: Sequence[AttemptFound]) -> list[tuple[str, Obj]]:
    found: list[tuple[str, Obj]] = []
    for a in attempts:
        found += [("TrainJob", a.train_job)] if a.train_job else []
        found += [("JobSet", a.job_set)] if a.job_set else []
        found += [("Pod", p) for p in a.pods]
        found += [("Workload", a.workload)] if a.workload else []
    return found


def _describe_object(kind: str, obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    finalizers = metadata.get("finalizers") or ()
    held = f" (finalizers: {', '.join(finalizers)})" if finalizers else ""
    return f"{kind}/{metadata.get('name')}{held}"


def _taints(node: Mapping[str, Any] | None) -> tuple[Taint, ...]:
    taints = ((node or {}).get("spec") or {}).get("taints") or ()
    return tuple(Taint.model_validate(t) for t in taints)


def _first(items: Any) -> Obj | None:
    return next(iter(items), None)


def _seconds(duration: timedelta) -> str:
    return f"{duration.total_seconds():g}s"


def _message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body or b"").get("message") or error.reason)
    except (TypeError, ValueError, AttributeError):
        return str(error.reason)


def _transport(error: BaseException) -> str:
    if isinstance(error, TimeoutError):
        return "the request timed out"
    return f"{type(error).__name__}: {error}"


def _api_error(what: str, error: ApiException) -> DispatchError:
    if error.status == 403:
        return ErrUnsupported(f"{what}: forbidden: {_message(error)}")
    if error.status == 404:
        return ErrUnsupported(f"{what}: not found, is the API installed? {_message(error)}")
    if error.status in (400, 422):
        return ErrInvalid(f"{what}: refused: {_message(error)}")
    return ErrOutcomeUnknown(f"{what}: the apiserver answered {error.status}: {_message(error)}")
