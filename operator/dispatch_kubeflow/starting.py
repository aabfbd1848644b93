"""start (SPEC §3): check the runtime, create the TrainJob once, and in Kueue mode see its Workload.

``start`` is idempotent: the TrainJob's name is fixed by (job, attempt) and it carries the hash
of the request, so a second start of the same request finds the first one's TrainJob and returns
it, and a changed request for the same attempt is refused. A create whose answer was lost (a
timeout, a 5xx) is decided by reading the TrainJob back; when that read cannot tell either, the
outcome is ``ErrOutcomeUnknown``, never a guess.

In Kueue mode a TrainJob without a Workload would wait forever unseen, so ``start`` waits up to
``timeouts.workload`` for Kueue to make one: on the adapter's own Workload watch while it serves
(no request), else with one LIST+WATCH (``kube.informer.wait_for``). If none comes it deletes the
TrainJob and says why Kueue likely did not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Protocol

from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.constants import (
    ANNOTATION_SPEC_HASH,
    CLUSTER_TRAINING_RUNTIMES,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_KUEUE_JOB_UID,
    LOCAL_QUEUES,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    WORKLOADS,
)
from dispatch_kubeflow.errors import (
    DispatchError,
    InvalidError,
    OutcomeUnknownError,
    RefusedError,
    RuntimeUnsupportedError,
    UnsupportedError,
)
from dispatch_kubeflow.gotime import format_duration
from dispatch_kubeflow.kube.apierrors import (
    REQUEST_ERRORS,
    TRANSPORT_ERRORS,
    api_message,
    describe,
    is_conflict,
    is_invalid,
    is_not_found,
    is_transient,
    to_dispatch_error,
)
from dispatch_kubeflow.kube.informer import wait_for
from dispatch_kubeflow.kube.objects import annotations_of, name_of, namespace_of, uid_of
from dispatch_kubeflow.runtimes import check_runtime
from dispatch_kubeflow.runtimes import describe as describe_runtime
from dispatch_kubeflow.scope import Scope
from dispatch_kubeflow.settings import RuntimeRef
from dispatch_kubeflow.stopping import delete_trainjobs
from dispatch_kubeflow.trainjob import (
    JobRef,
    JobSpec,
    build_trainjob,
    check_generated_names,
    resolve_runtime,
)

Obj = dict[str, Any]


class RuntimeWatch(Protocol):
    """A running watch of the runtimes a start may name (``Supervisor`` is one)."""

    def cached_runtime(self, ref: RuntimeRef) -> Obj | None:
        """The runtime as the watch last saw it; None when the watch cannot say."""
        ...


class WorkloadWatch(Protocol):
    """A running watch of the namespace's Workloads (``Supervisor`` is one)."""

    async def workload_of(self, trainjob_uid: str, within: timedelta) -> Obj | None:
        """The Workload, None if none came within ``within``; ``LookupError`` if not watching."""
        ...


async def start(
    scope: Scope,
    job: JobSpec,
    *,
    suspend: bool = False,
    extra_labels: Mapping[str, str] | None = None,
    workloads: WorkloadWatch | None = None,
    runtimes: RuntimeWatch | None = None,
) -> JobRef:
    """Create the TrainJob of ``job`` (idempotently), and in Kueue mode see its Workload.

    With ``workloads`` (the adapter's own watch), the Workload is awaited there, which costs no
    request; without it, or while that watch cannot answer, by a LIST and a WATCH of its own.
    With ``runtimes``, likewise the runtime is checked as that watch has it (see
    ``checked_runtime``).
    """
    settings = scope.settings
    runtime = resolve_runtime(job, settings)
    if settings.runtimes and runtime not in settings.runtimes:
        allowed = ", ".join(describe_runtime(r) for r in settings.runtimes)
        raise RuntimeUnsupportedError(
            f"runtime {describe_runtime(runtime)} is not in the adapter's runtimes ({allowed})"
        )
    await checked_runtime(scope, job, runtime, runtimes)
    body = build_trainjob(
        job, settings, scope.adapter_name, suspend=suspend, extra_labels=extra_labels
    )
    trainjob = await create_trainjob(scope, body)
    ref = _ref_of(job, runtime, trainjob)
    if settings.kueue is None:
        return ref
    workload = await _wait_for_workload(scope, trainjob, workloads)
    return ref.model_copy(update={"workload": name_of(workload)})


async def checked_runtime(
    scope: Scope, job: JobSpec, ref: RuntimeRef, runtimes: RuntimeWatch | None = None
) -> Obj:
    """The runtime ``ref`` names, once the runtime rules and ``job``'s pod names pass on it.

    A runtime the watch has that passes costs no request. Anything else is read from the
    apiserver: a runtime the watch has not seen (created a moment ago, or the watch is not
    serving), and one that fails on the watch's copy, so a start is refused only on the runtime
    as the apiserver has it now. A runtime changed within the watch's lag may pass on its
    previous version, as it may between a read and the create.
    """
    cached = runtimes.cached_runtime(ref) if runtimes is not None else None
    if cached is not None:
        with contextlib.suppress(DispatchError):
            _check_runtime(cached, job, ref, scope)
            return cached
    runtime = await read_runtime(scope, ref)
    _check_runtime(runtime, job, ref, scope)
    return runtime


def _check_runtime(runtime: Obj, job: JobSpec, ref: RuntimeRef, scope: Scope) -> None:
    check_runtime(runtime, ref, scope.settings)
    check_generated_names(job, runtime)


async def read_runtime(scope: Scope, ref: RuntimeRef) -> Obj:
    """The runtime ``ref`` names: a ClusterTrainingRuntime, or a TrainingRuntime of ours."""
    cluster_wide = ref.kind == "ClusterTrainingRuntime"
    try:
        if cluster_wide:
            runtime: Obj = await scope.custom.get_cluster_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, CLUSTER_TRAINING_RUNTIMES, ref.name
            )
        else:
            runtime = await scope.custom.get_namespaced_custom_object(
                TRAINER_GROUP, TRAINER_VERSION, scope.namespace, TRAINING_RUNTIMES, ref.name
            )
    except REQUEST_ERRORS as error:
        if is_not_found(error):
            where = "" if cluster_wide else f" in namespace {scope.namespace!r}"
            raise RuntimeUnsupportedError(
                f"runtime {describe_runtime(ref)} does not exist{where}; create it or name another"
            ) from None
        raise to_dispatch_error(
            f"reading runtime {describe_runtime(ref)}",
            error,
            verb="get",
            resource=CLUSTER_TRAINING_RUNTIMES if cluster_wide else TRAINING_RUNTIMES,
        ) from None
    return runtime


async def create_trainjob(scope: Scope, body: Obj) -> Obj:
    """Create ``body``; the existing TrainJob when it is the same request, else a refusal."""
    name = name_of(body)
    try:
        created: Obj = await scope.custom.create_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, scope.namespace, TRAINJOBS, body
        )
    except ApiException as error:
        if is_conflict(error):
            return _same_or_refuse(await _read_trainjob(scope, name), body)
        if is_transient(error):
            return await _read_back(scope, body, f"the apiserver answered {error.status}")
        if is_invalid(error):
            raise RefusedError(
                f"TrainJob {name} was refused by the apiserver: {api_message(error)}"
            ) from None
        raise to_dispatch_error(
            f"creating TrainJob {name}", error, verb="create", resource=TRAINJOBS
        ) from None
    except TRANSPORT_ERRORS as error:
        return await _read_back(scope, body, describe(error))
    return created


async def _read_back(scope: Scope, body: Obj, why: str) -> Obj:
    """After a create whose outcome is open: the TrainJob if it is there, else unknown."""
    name = name_of(body)
    unknown = (
        f"creating TrainJob {name} in namespace {scope.namespace!r} failed ({why}) "
        "and reading it back could not tell whether it exists; start again to find out "
        "(start is idempotent)"
    )
    try:
        existing = await _read_trainjob(scope, name)
    except DispatchError:
        raise OutcomeUnknownError(unknown) from None
    if existing is None:
        raise OutcomeUnknownError(unknown)
    return _same_or_refuse(existing, body)


async def _read_trainjob(scope: Scope, name: str) -> Obj | None:
    try:
        trainjob: Obj = await scope.custom.get_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, scope.namespace, TRAINJOBS, name
        )
    except REQUEST_ERRORS as error:
        if is_not_found(error):
            return None
        raise to_dispatch_error(
            f"reading TrainJob {name}", error, verb="get", resource=TRAINJOBS
        ) from None
    return trainjob


def _same_or_refuse(existing: Obj | None, body: Obj) -> Obj:
    name = name_of(body)
    if existing is None:
        raise OutcomeUnknownError(
            f"TrainJob {name} existed when created and was gone when read; start again"
        )
    want = annotations_of(body)[ANNOTATION_SPEC_HASH]
    have = annotations_of(existing).get(ANNOTATION_SPEC_HASH)
    if have != want:
        raise InvalidError(
            f"TrainJob {name} already exists with another spec (spec hash {have!r}, this "
            f"request's is {want!r}); a changed job needs a new attempt"
        )
    return existing


def _ref_of(job: JobSpec, runtime: RuntimeRef, trainjob: Obj) -> JobRef:
    return JobRef(
        job_id=job.job_id,
        attempt=job.attempt,
        name=name_of(trainjob),
        namespace=namespace_of(trainjob),
        uid=uid_of(trainjob),
        runtime=runtime,
        spec_hash=annotations_of(trainjob)[ANNOTATION_SPEC_HASH],
    )


async def _wait_for_workload(
    scope: Scope, trainjob: Obj, workloads: WorkloadWatch | None = None
) -> Obj:
    """The Workload Kueue makes for ``trainjob``; else the TrainJob goes and the start fails."""
    name = name_of(trainjob)
    timeout = scope.settings.timeouts.workload
    workload = await _watched_workload(scope, trainjob, workloads)
    if workload is not None:
        return workload
    reason = await _why_no_workload(scope)
    await delete_trainjobs(scope, f"metadata.name={name}", field=True)
    raise UnsupportedError(
        f"Kueue made no Workload for TrainJob {name} within {format_duration(timeout)}: "
        f"{reason}; the TrainJob was deleted"
    )


async def _watched_workload(
    scope: Scope, trainjob: Obj, workloads: WorkloadWatch | None
) -> Obj | None:
    timeout = scope.settings.timeouts.workload
    if workloads is not None:
        with contextlib.suppress(LookupError):
            return await workloads.workload_of(uid_of(trainjob), timeout)
    name = name_of(trainjob)
    selector = f"{LABEL_KUEUE_JOB_UID}={uid_of(trainjob)}"

    async def list_workloads(**options: Any) -> Any:
        return await scope.custom.list_namespaced_custom_object(
            KUEUE_GROUP,
            KUEUE_VERSION,
            scope.namespace,
            WORKLOADS,
            label_selector=selector,
            **options,
        )

    return await wait_for(
        list_workloads,
        lambda _: True,
        what=f"waiting for the Kueue Workload of TrainJob {name}",
        within=timeout,
        request_timeout=scope.settings.timeouts.request,
    )


async def _why_no_workload(scope: Scope) -> str:
    assert scope.settings.kueue is not None
    queue = scope.settings.kueue.local_queue
    try:
        await scope.custom.get_namespaced_custom_object(
            KUEUE_GROUP, KUEUE_VERSION, scope.namespace, LOCAL_QUEUES, queue
        )
    except REQUEST_ERRORS as error:
        if is_not_found(error):
            return (
                f"LocalQueue {queue!r} does not exist in namespace "
                f"{scope.namespace!r} (kueue.localQueue)"
            )
    return (
        f"LocalQueue {queue!r} exists, so Kueue is likely not running or its TrainJob "
        "integration (trainer.kubeflow.org/trainjob) is not enabled"
    )
