"""DispatchJob: create starts the attempt, delete stops the job, events fold into the status.

The handlers are thin: they find the open adapter serving the DispatchJob's namespace, call the
library (``start``, ``stop_job``) and record the outcome in the status. Starts and stops are
handed over to the operator's own tasks (``handover``), so a burst of either waits lightly; the
operator's stop finalizer, put on before a job's first start, holds a deleted job until its stop
is done. The adapter's dispatch
events reach DispatchJobs through the adapter's report store (``reported``), which commits each
transition into the status in one write, driven by the KubeflowAdapter's single watch, never by
a watch per job.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast

import kopf
from kubernetes_asyncio.client import ApiClient

from dispatch_kubeflow import metrics
from dispatch_kubeflow.clock import SYSTEM_CLOCK, Clock
from dispatch_kubeflow.constants import (
    DISPATCH_JOBS,
    FINALIZER,
    GROUP,
    STATUS_REPORTED,
    STOP_FINALIZER,
    VERSION,
    Cause,
    State,
)
from dispatch_kubeflow.errors import (
    ErrInvalid,
    ErrOutcomeUnknown,
    ErrUnsupported,
    RuntimeUnsupportedError,
)
from dispatch_kubeflow.handlers.handover import (
    STARTS_IN_FLIGHT,
    STOPS_IN_FLIGHT,
    Ended,
    HandedOver,
    JobKey,
)
from dispatch_kubeflow.handlers.kube import (
    change_finalizers,
    update_status,
    with_finalizer,
    without_finalizer,
)
from dispatch_kubeflow.handlers.registry import AdapterRegistry
from dispatch_kubeflow.handlers.reported import DispatchJobStatusStore
from dispatch_kubeflow.handlers.serving import (
    AdaptersByName,
    adapter_exists,
    adapters_seen,
    waiting_conditions,
    why_not_serving,
)
from dispatch_kubeflow.handlers.status import (
    DispatchJobStatus,
    begin_attempt,
    refuse_attempt,
)
from dispatch_kubeflow.settings import RuntimeRef
from dispatch_kubeflow.tasks import stop_if_cancelled
from dispatch_kubeflow.trainjob import EnvVar, JobSpec, trainjob_name

ADAPTER_WAIT: Final = 10.0
UNFINISHED_WAIT: Final = 30.0
RETRY_UNKNOWN: Final = 10.0
# A handed-over start that failed for a reason of no known kind tries again after kopf's own
# default backoff for a handler that raised.
RETRY_FAILED: Final = 60.0
REASON_INVALID_JOB: Final = "InvalidJob"
REASON_UNSUPPORTED: Final = "Unsupported"

Logger = logging.Logger | logging.LoggerAdapter[Any]
PostEvent = Callable[[Mapping[str, Any], str, str, str], None]


@dataclass(frozen=True)
class Refusal:
    """Why an attempt was not started: the status's reason, message and cause."""

    reason: str
    message: str
    cause: Cause


@dataclass(frozen=True)
class Target:
    """The DispatchJob a start is for, as little of it as its outcome needs to be recorded."""

    namespace: str
    name: str
    reference: Mapping[str, Any]  # apiVersion, kind and metadata (name, namespace, uid)
    adapter: str
    runtime: Any

    @property
    def key(self) -> JobKey:
        return (self.namespace, self.name)


def target_of(body: Mapping[str, Any]) -> Target:
    metadata = body.get("metadata") or {}
    spec = body.get("spec") or {}
    return Target(
        namespace=str(metadata.get("namespace")),
        name=str(metadata.get("name")),
        reference={
            "apiVersion": body.get("apiVersion"),
            "kind": body.get("kind"),
            "metadata": {k: metadata.get(k) for k in ("name", "namespace", "uid")},
        },
        adapter=str(spec.get("adapter")),
        runtime=spec.get("runtime"),
    )


def refusal_of(error: ErrInvalid | ErrUnsupported) -> Refusal:
    """A refused start as the DispatchJob's status shows it: never a failure without a cause.

    A runtime that cannot carry the job is RuntimeUnsupported; anything else refused (an invalid
    job, a queue or permission the cluster lacks) is a configuration to fix, ConfigError.
    """
    if isinstance(error, ErrInvalid):
        return Refusal(REASON_INVALID_JOB, str(error), Cause.CONFIG_ERROR)
    if isinstance(error, RuntimeUnsupportedError):
        return Refusal(REASON_UNSUPPORTED, str(error), Cause.RUNTIME_UNSUPPORTED)
    return Refusal(REASON_UNSUPPORTED, str(error), Cause.CONFIG_ERROR)


def job_spec(name: str, spec: Mapping[str, Any]) -> JobSpec:
    """The library's JobSpec for a DispatchJob; ``ErrInvalid`` names the refused field."""
    runtime = spec.get("runtime")
    return JobSpec(
        job_id=name,
        attempt=int(spec.get("attempt", 1)),
        runtime=RuntimeRef.model_validate(runtime) if runtime is not None else None,
        image=spec.get("image"),
        command=tuple(spec.get("command") or ()),
        args=tuple(spec.get("args") or ()),
        env=tuple(EnvVar.model_validate(item) for item in spec.get("env") or ()),
        num_nodes=int(spec.get("numNodes", 1)),
        gpus_per_node=int(spec.get("gpusPerNode", 0)),
        active_deadline_seconds=spec.get("activeDeadlineSeconds"),
    )


async def record_start(
    api: ApiClient,
    namespace: str,
    name: str,
    *,
    attempt: int,
    train_job: str | None,
    refused: Refusal | None = None,
    store: DispatchJobStatusStore | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Record the attempt started (or refused) in the DispatchJob's status.

    Through the serving adapter's status store while it is open: it reads the DispatchJob from
    its watch, so the write costs no read unless it conflicts. Without it, read and written.
    """

    async def change(current: dict[str, Any]) -> dict[str, Any] | None:
        status = DispatchJobStatus.from_wire(current.get("status"))
        generation = current["metadata"].get("generation")
        if refused is not None:
            after = refuse_attempt(
                status,
                attempt=attempt,
                reason=refused.reason,
                message=refused.message,
                cause=refused.cause,
                generation=generation,
                now=clock.now(),
            )
        else:
            after = begin_attempt(
                status, attempt=attempt, train_job=train_job, generation=generation, now=clock.now()
            )
        # The job's first transition, committed first, may have shown it all already.
        return None if after == status else after.to_wire()

    if store is not None and not store.closed:
        await store.update(name, change)
    else:
        await update_status(api, DISPATCH_JOBS, namespace, name, change)


def status_store_of(adapter: Any) -> DispatchJobStatusStore | None:
    """The adapter's status store, when it reports into the DispatchJobs' status."""
    store = getattr(getattr(adapter, "supervisor", None), "store", None)
    return store if isinstance(store, DispatchJobStatusStore) else None


async def serving_adapter(registry: AdapterRegistry, namespace: str, adapter: str) -> Any:
    """The open adapter, once it opens within ``ADAPTER_WAIT``; else the handler retries.

    Waiting here rather than in kopf's retry delay starts the job as soon as the adapter opens.
    """
    found = await registry.wait_for(namespace, adapter, ADAPTER_WAIT)
    if found is None:
        raise kopf.TemporaryError(
            f"KubeflowAdapter {adapter!r} serving namespace {namespace!r} is not ready",
            delay=0,
        )
    return found


async def record_waiting(
    api: ApiClient,
    namespace: str,
    name: str,
    why: tuple[str, str],
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Say in the DispatchJob's ``Admitted`` condition why its attempt has not started."""
    reason, message = why

    async def change(current: dict[str, Any]) -> dict[str, Any] | None:
        conditions = waiting_conditions(
            current.get("status"),
            reason,
            message,
            generation=current["metadata"].get("generation"),
            now=clock.now(),
        )
        return None if conditions is None else {"conditions": conditions}

    await update_status(api, DISPATCH_JOBS, namespace, name, change)


async def adapter_to_start(
    memo: kopf.Memo, adapters: AdaptersByName, name: str, namespace: str, adapter: str
) -> Any:
    """The open adapter serving the DispatchJob; while there is none, its status says why."""
    found = memo.registry.get(namespace, adapter)
    if found is not None:
        return found
    why = why_not_serving(adapters, namespace, adapter)
    await record_waiting(memo.api, namespace, name, why)
    return await serving_adapter(memo.registry, namespace, adapter)


def share_handed_over(memo: kopf.Memo) -> None:
    """Put the operator's starts and stops, and their bounds in flight, in its memo, at startup.

    kopf gives each object's handlers a shallow copy of the operator's memo: what is made there
    is shared by every DispatchJob, while what a handler made would be its own job's alone.
    """
    if "starts" not in memo:
        memo.starts = HandedOver("start", STARTS_IN_FLIGHT, metrics.STARTS_PENDING)
    if "stops" not in memo:
        memo.stops = HandedOver("stop", STOPS_IN_FLIGHT, metrics.STOPS_PENDING)
        memo.stopped = Ended()


def starts_of(memo: kopf.Memo) -> HandedOver:
    """The operator's starts, shared by every DispatchJob's memo."""
    starts: HandedOver = memo.starts
    return starts


def stops_of(memo: kopf.Memo) -> HandedOver:
    """The operator's stops, shared by every DispatchJob's memo."""
    stops: HandedOver = memo.stops
    return stops


async def held_for_stop(memo: kopf.Memo, body: Mapping[str, Any]) -> bool:
    """Put the stop finalizer on the job before anything of it is made; False if it is gone."""
    target = target_of(body)
    return await change_finalizers(
        memo.api,
        DISPATCH_JOBS,
        target.namespace,
        target.name,
        with_finalizer(STOP_FINALIZER),
        known=body,
    )


async def adapter_and_job(
    memo: kopf.Memo, body: kopf.Body, spec: Mapping[str, Any], kwargs: Mapping[str, Any]
) -> tuple[Any, JobSpec] | None:
    """The open adapter and the JobSpec to start; None once an invalid job is refused, or gone.

    While no adapter serves the job, its status says why and kopf retries the handler. The job
    gets the stop finalizer here, before its start, so a deletion always finds it held.
    """
    target = target_of(body)
    try:
        job = job_spec(target.name, spec)
    except ErrInvalid as error:
        await _refuse(memo, target, int(spec.get("attempt", 1)), refusal_of(error))
        return None
    adapters = adapters_seen(kwargs)
    adapter = await adapter_to_start(memo, adapters, target.name, target.namespace, target.adapter)
    if not await held_for_stop(memo, body):
        return None
    return adapter, job


async def start_and_record(
    memo: kopf.Memo, adapter: Any, job: JobSpec, target: Target, logger: Logger
) -> None:
    """Start ``job`` within the bound in flight and record the outcome, a refusal too.

    ``ErrOutcomeUnknown`` is raised: the start is to be tried again.
    """
    try:
        async with starts_of(memo).gate:
            await adapter.start(job)
    except (ErrInvalid, ErrUnsupported) as error:
        await _refuse(memo, target, job.attempt, refusal_of(error), status_store_of(adapter))
        return
    train_job = trainjob_name(target.name, job.attempt)
    logger.info("attempt %s started as TrainJob %s", job.attempt, train_job)
    await record_start(
        memo.api,
        target.namespace,
        target.name,
        attempt=job.attempt,
        train_job=train_job,
        store=status_store_of(adapter),
    )


async def start_attempt(
    *, memo: kopf.Memo, body: kopf.Body, spec: Mapping[str, Any], logger: Logger, **kwargs: Any
) -> None:
    """Start attempt ``spec.attempt`` before the handler returns (kopf holds the job meanwhile)."""
    found = await adapter_and_job(memo, body, spec, kwargs)
    if found is None:
        return
    adapter, job = found
    try:
        await start_and_record(memo, adapter, job, target_of(body), logger)
    except ErrOutcomeUnknown as error:
        raise kopf.TemporaryError(str(error), delay=RETRY_UNKNOWN) from error


async def hand_over_start(
    *, memo: kopf.Memo, body: kopf.Body, spec: Mapping[str, Any], logger: Logger, **kwargs: Any
) -> None:
    """Hand attempt ``spec.attempt``'s start over to the operator's starts and return.

    The job is checked and its adapter found first, so a refusal or a missing adapter shows in
    its status as the handler's own outcome; the start itself then waits for its turn.
    """
    found = await adapter_and_job(memo, body, spec, kwargs)
    if found is None:
        return
    target = target_of(body)
    job = found[1]
    starts_of(memo).hand_over(target.key, lambda: start_until_done(memo, job, target, logger))


async def start_until_done(memo: kopf.Memo, job: JobSpec, target: Target, logger: Logger) -> None:
    """A handed-over start: tried until it is started or refused, or the job's deletion ends it."""

    async def start(adapter: Any) -> None:
        await start_and_record(memo, adapter, job, target, logger)

    await tried_until_done(memo, target, f"attempt {job.attempt}'s start", start, logger)


# Work tried with the open adapter serving a job; None when the work needs no adapter.
AdapterWork = Callable[[Any | None], Awaitable[None]]


async def tried_until_done(
    memo: kopf.Memo,
    target: Target,
    what: str,
    work: AdapterWork,
    logger: Logger,
    needs_adapter: Callable[[], bool] = lambda: True,
) -> None:
    """Handed-over ``work`` tried until it succeeds (or the task is withdrawn).

    Nothing is left to kopf's retries: its handler has returned. The adapter is looked up at
    each try, as the one there at the hand-over may have closed (its settings changed); work
    that failed because its adapter closed under it is tried again at once, an outcome unknown
    in 10 s, any other failure in 60 s. While the adapter is not open the work waits for it,
    unless ``needs_adapter`` says it no longer needs one. A failure of a cancelled task is never
    tried again, even one that arrived in place of the cancellation (``stop_if_cancelled``).
    """
    waiting_said = False
    while True:
        adapter = None
        if needs_adapter():
            adapter = await serving_adapter_or_none(memo.registry, target)
            if adapter is None:
                if not waiting_said:
                    logger.info("KubeflowAdapter %r is not ready: %s waits", target.adapter, what)
                waiting_said = True
                continue
        try:
            await work(adapter)
            return
        except Exception as error:
            stop_if_cancelled()
            if (
                adapter is not None
                and memo.registry.get(target.namespace, target.adapter) is not adapter
            ):
                logger.info("KubeflowAdapter %r closed during %s: again", target.adapter, what)
                continue
            if isinstance(error, ErrOutcomeUnknown):
                logger.warning("%s; trying again in %s s", error, RETRY_UNKNOWN)
                delay = RETRY_UNKNOWN
            else:
                logger.exception("%s failed; trying again in %s s", what, RETRY_FAILED)
                delay = RETRY_FAILED
        await asyncio.sleep(delay)


async def serving_adapter_or_none(registry: AdapterRegistry, target: Target) -> Any | None:
    found = registry.get(target.namespace, target.adapter)
    if found is not None:
        return found
    return await registry.wait_for(target.namespace, target.adapter, ADAPTER_WAIT)


async def _refuse(
    memo: kopf.Memo,
    target: Target,
    attempt: int,
    refused: Refusal,
    store: DispatchJobStatusStore | None = None,
) -> None:
    await record_start(
        memo.api,
        target.namespace,
        target.name,
        attempt=attempt,
        train_job=None,
        refused=refused,
        store=store,
    )
    kopf.warn(
        kopf.Body(cast(kopf.RawBody, target.reference)),
        reason=refused.reason,
        message=refused.message,
    )
    runtime = metrics.runtime_label(
        target.runtime, default_runtime(memo, target.namespace, target.adapter)
    )
    metrics.start_refused(target.namespace, target.adapter, runtime, State.FAILED, refused.cause)


def default_runtime(memo: kopf.Memo, namespace: str, adapter: str) -> str:
    """The runtime of a job that names none: the first of its open adapter's ``runtimes``."""
    found = memo.registry.get(namespace, adapter)
    return found.settings.runtimes[0].name if found is not None else metrics.UNKNOWN_RUNTIME


@kopf.on.create(GROUP, VERSION, DISPATCH_JOBS)
async def start_job(**kwargs: Any) -> None:
    """A created job's first attempt: handed over, so a burst of creations waits lightly."""
    await hand_over_start(**kwargs)


def never_started(status: Mapping[str, Any] | None) -> bool:
    """No attempt of the job was ever handed to an adapter, as far as its status tells."""
    current = status or {}
    recorded = DispatchJobStatus.from_wire(current).attempt is not None
    return not recorded and not current.get(STATUS_REPORTED)


def is_never_started(status: kopf.Status, **_: Any) -> bool:
    return never_started(status)


@kopf.on.resume(GROUP, VERSION, DISPATCH_JOBS, when=is_never_started)
async def resume_start(**kwargs: Any) -> None:
    """A job created before the operator stopped, whose start was handed over and not done.

    kopf counts the creation handled once the start is handed over, so a start still queued or
    in flight when the operator stopped is found here, by the job's status, and started again
    (a start is idempotent: a TrainJob it made before is taken as it is).
    """
    await hand_over_start(**kwargs)


def waits_for_current(status: DispatchJobStatus, raised: int) -> bool:
    """Whether attempt ``raised`` must wait for the attempt ``status`` describes to finish.

    A Vanished attempt (state Unknown) is over as well: everything of it is gone, so nothing
    of it will ever finish.
    """
    if status.attempt is None or status.attempt >= raised:
        return False
    return not (status.finished or status.state == State.UNKNOWN)


@kopf.on.update(GROUP, VERSION, DISPATCH_JOBS, field="spec.attempt")
async def raise_attempt(
    old: Any, new: Any, status: kopf.Status, memo: kopf.Memo, body: kopf.Body, **kwargs: Any
) -> None:
    """A raised attempt starts once the current attempt has finished."""
    if old is not None and new is not None and int(new) <= int(old):
        return
    if starts_of(memo).holds(target_of(body).key):
        raise kopf.TemporaryError(
            f"the start of an earlier attempt is still under way; attempt {new} waits for it",
            delay=UNFINISHED_WAIT,
        )
    current = DispatchJobStatus.from_wire(status)
    if waits_for_current(current, int(new)):
        raise kopf.TemporaryError(
            f"attempt {current.attempt} has not finished; attempt {new} waits for it",
            delay=UNFINISHED_WAIT,
        )
    await start_attempt(memo=memo, body=body, **kwargs)


def deletion_held(body: kopf.Body) -> bool:
    """Deleted, and held by the stop finalizer (a DELETED event still shows the last one)."""
    return bool(body.metadata.get("deletionTimestamp")) and STOP_FINALIZER in (
        body.metadata.get("finalizers") or ()
    )


def is_deleted_and_held(type: str | None, body: kopf.Body, **_: Any) -> bool:
    return type != "DELETED" and deletion_held(body)


def is_held_by_kopf_alone(body: kopf.Body, **_: Any) -> bool:
    """A job made before the stop finalizer: kopf's finalizer holds it, and only that."""
    finalizers = body.metadata.get("finalizers") or ()
    return FINALIZER in finalizers and STOP_FINALIZER not in finalizers


def is_live_and_held_by_kopf_alone(body: kopf.Body, **kwargs: Any) -> bool:
    return not body.metadata.get("deletionTimestamp") and is_held_by_kopf_alone(body)


@kopf.on.event(GROUP, VERSION, DISPATCH_JOBS, when=is_live_and_held_by_kopf_alone)
async def take_over_from_kopf(memo: kopf.Memo, body: kopf.Body, **_: Any) -> None:
    """A job made before the stop finalizer gets it; kopf then takes its own finalizer off.

    Until then kopf's finalizer holds the job, and a deletion is stopped by ``stop_held_job``.
    """
    await held_for_stop(memo, body)


@kopf.on.event(GROUP, VERSION, DISPATCH_JOBS, when=is_deleted_and_held)
async def hand_over_stop(
    body: kopf.Body, status: kopf.Status, memo: kopf.Memo, logger: Logger, **kwargs: Any
) -> None:
    """A deleted job's stop, handed over; the stop finalizer holds the job until it is done.

    Each of the job's events while it is deleted comes here: a stop already handed over, or
    already done for this job (its uid), is not handed over again. After a restart the first
    listing brings every deleted job still held, so no stop is lost with the operator.
    """
    target = target_of(body)
    uid = str(body.metadata.get("uid"))
    if uid in stopped_of(memo):
        return
    adapters = adapters_seen(kwargs)
    started = not never_started(status)
    finalizers = list(body.metadata.get("finalizers") or ())
    stops_of(memo).hand_over(
        target.key,
        lambda: stop_until_done(memo, target, uid, finalizers, adapters, started, logger),
    )


def stopped_of(memo: kopf.Memo) -> Ended:
    """The uids of the jobs this operator has stopped and released."""
    stopped: Ended = memo.stopped
    return stopped


async def stop_until_done(
    memo: kopf.Memo,
    target: Target,
    uid: str,
    finalizers: list[str],
    adapters: AdaptersByName,
    started: bool,
    logger: Logger,
) -> None:
    """A handed-over stop: tried until nothing of the job is left, then the job released.

    ``finalizers`` are the job's as its deletion showed them: where the stop finalizer was.

    A job that never started and names a KubeflowAdapter that does not exist has nothing to stop
    and nothing that could stop it: it is released at once rather than waiting for that adapter.
    """
    if await starts_of(memo).withdraw(target.key):
        logger.info("the start of job %s, handed over and not done, was withdrawn", target.name)

    def needs_adapter() -> bool:
        return started or adapter_exists(adapters, target.namespace, target.adapter)

    async def stop_and_release(adapter: Any | None) -> None:
        if adapter is None:
            logger.info("job %s never started and its adapter does not exist", target.name)
        else:
            async with stops_of(memo).gate:
                await adapter.stop_job(target.name)
            logger.info("job %s stopped: nothing of it is left", target.name)
        await change_finalizers(
            memo.api,
            DISPATCH_JOBS,
            target.namespace,
            target.name,
            without_finalizer(STOP_FINALIZER),
            known={"metadata": {"finalizers": finalizers}},
        )
        stopped_of(memo).add(uid)

    await tried_until_done(memo, target, "the stop", stop_and_release, logger, needs_adapter)


@kopf.on.delete(GROUP, VERSION, DISPATCH_JOBS, when=is_held_by_kopf_alone)
async def stop_held_job(
    spec: kopf.Spec,
    status: kopf.Status,
    name: str,
    namespace: str | None,
    memo: Any,
    logger: Logger,
    **kwargs: Any,
) -> None:
    """A job made before the stop finalizer, deleted before it got it: kopf's finalizer holds it
    until this handler has stopped it, and kopf retries the handler while it cannot."""
    served, name_of_adapter = str(namespace), str(spec.get("adapter"))
    if await starts_of(memo).withdraw((served, name)):
        logger.info("the start of job %s, handed over and not done, was withdrawn", name)
    adapters = adapters_seen(kwargs)
    if never_started(status) and not adapter_exists(adapters, served, name_of_adapter):
        logger.info("job %s never started and its adapter does not exist: nothing to stop", name)
        return
    adapter = await serving_adapter(memo.registry, served, name_of_adapter)
    await adapter.stop_job(name)
    logger.info("job %s stopped: nothing of it is left", name)
