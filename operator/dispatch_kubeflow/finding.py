"""find (SPEC §3): everything of one job read back, sorted into attempts, with its status.

A job's objects are its TrainJobs, JobSets and pods (found by our labels) and, in Kueue mode,
its Workloads. Kueue labels a Workload with its TrainJob's uid (``kueue.x-k8s.io/job-uid``), not
with ours, so the Workloads are selected by the uids of the TrainJobs read and of those the
caller already knows (the watch's, and those a stop deleted), which finds the Workloads of
deleted TrainJobs too and reads only the job's own. Knowing no uid at all, the namespace's
Workloads are read and matched by their TrainJob owner's name. Each object belongs to the attempt
our label names, else to the attempt in its TrainJob owner's name. Each attempt's status is
derived the way the watch derives it (``derivation.derive``, ``index.node_taints``,
``index.loss_taints_of``), from what one read shows. ``stop_job`` reads back through
``objects_of`` too, until nothing is left.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from dispatch_kubeflow.constants import (
    JOBSET_GROUP,
    JOBSET_VERSION,
    JOBSETS,
    KIND_JOBSET,
    KIND_POD,
    KIND_TRAINJOB,
    KIND_WORKLOAD,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_ATTEMPT,
    LABEL_KUEUE_JOB_UID,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    WORKLOADS,
    Cause,
    State,
)
from dispatch_kubeflow.derivation import derive
from dispatch_kubeflow.errors import InvalidError, NotFoundError
from dispatch_kubeflow.events import DerivedStatus, JobObservation, Taint
from dispatch_kubeflow.index import loss_taints_of, node_of, node_taints
from dispatch_kubeflow.kube.apierrors import REQUEST_ERRORS, is_not_found, to_dispatch_error
from dispatch_kubeflow.kube.informer import ListFn, list_all
from dispatch_kubeflow.kube.objects import (
    dig,
    is_deleting,
    labels_of,
    mappings,
    name_of,
    text,
    uid_of,
)
from dispatch_kubeflow.scope import Scope
from dispatch_kubeflow.settings.names import is_rfc1035_label
from dispatch_kubeflow.tasks import gathered
from dispatch_kubeflow.trainjob import job_selector

Obj = dict[str, Any]
# A job id leaves room for "-<attempt>" in an RFC 1035 label of 63 characters.
JOB_ID_MAX = 61


class AttemptFound(BaseModel):
    """Everything of one attempt of a job, read back, with its derived status."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    train_job: Obj | None = None
    job_set: Obj | None = None
    pods: tuple[Obj, ...] = ()
    workload: Obj | None = None
    status: DerivedStatus

    def objects(self) -> list[tuple[str, Obj]]:
        """``(kind, object)`` of everything of this attempt that is still there."""
        found: list[tuple[str, Obj]] = []
        found += [(KIND_TRAINJOB, self.train_job)] if self.train_job else []
        found += [(KIND_JOBSET, self.job_set)] if self.job_set else []
        found += [(KIND_POD, p) for p in self.pods]
        found += [(KIND_WORKLOAD, self.workload)] if self.workload else []
        return found


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
        return [describe_object(kind, obj) for a in self.attempts for kind, obj in a.objects()]


class JobObjects(BaseModel):
    """The raw objects of one job, before they are sorted into attempts."""

    trainjobs: list[Obj]
    jobsets: list[Obj]
    pods: list[Obj]
    workloads: list[Obj]

    def empty(self) -> bool:
        return not (self.trainjobs or self.jobsets or self.pods or self.workloads)

    def described(self) -> list[str]:
        return [
            *(describe_object(KIND_TRAINJOB, o) for o in self.trainjobs),
            *(describe_object(KIND_JOBSET, o) for o in self.jobsets),
            *(describe_object(KIND_POD, o) for o in self.pods),
            *(describe_object(KIND_WORKLOAD, o) for o in self.workloads),
        ]

    def attempts(self, job_id: str) -> set[int]:
        every = (*self.trainjobs, *self.jobsets, *self.pods, *self.workloads)
        return {a for o in every if (a := attempt_of(job_id, o)) is not None}


def check_job_id(job_id: str) -> None:
    """Refuse a job id that no job of ours can have (``ErrInvalid``)."""
    if not is_rfc1035_label(job_id, limit=JOB_ID_MAX):
        raise InvalidError(
            f"job id {job_id!r} is not an RFC 1035 label of at most {JOB_ID_MAX} characters"
        )


async def find(scope: Scope, job_id: str, known_uids: Iterable[str] = ()) -> Found:
    """Everything of the job read back, with state and cause; ``ErrNotFound`` for nothing.

    ``known_uids`` are uids of the job's TrainJobs the caller has seen, perhaps deleted since.
    """
    check_job_id(job_id)
    objects = await objects_of(scope, job_id, known_uids)
    if objects.empty():
        raise NotFoundError(f"job {job_id}: nothing of it exists in namespace {scope.namespace!r}")
    taints = await _node_taints(scope, objects.pods)
    loss_taints = loss_taints_of(scope.settings)
    attempts = tuple(
        _attempt_found(job_id, attempt, objects, taints, loss_taints)
        for attempt in sorted(objects.attempts(job_id))
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
    job_id: str,
    attempt: int,
    objects: JobObjects,
    taints: Mapping[str, tuple[Taint, ...]],
    loss_taints: frozenset[str],
) -> AttemptFound:
    def of_attempt(items: Iterable[Obj]) -> list[Obj]:
        return [o for o in items if attempt_of(job_id, o) == attempt]

    trainjob = next(iter(of_attempt(objects.trainjobs)), None)
    jobset = next(iter(of_attempt(objects.jobsets)), None)
    pods = tuple(of_attempt(objects.pods))
    workload = next(iter(of_attempt(objects.workloads)), None)
    observation = JobObservation(
        job=job_id,
        attempt=attempt,
        train_job=trainjob,
        job_set=jobset,
        pods=pods,
        workload=workload,
        node_taints=taints,
        # _node_taints leaves out the nodes that no longer exist.
        deleted_nodes=frozenset(node for p in pods if (node := node_of(p))) - taints.keys(),
        stopped=trainjob is not None and is_deleting(trainjob),
    )
    return AttemptFound(
        attempt=attempt,
        train_job=trainjob,
        job_set=jobset,
        pods=pods,
        workload=workload,
        status=derive(observation, loss_taints=loss_taints),
    )


async def objects_of(scope: Scope, job_id: str, known_uids: Iterable[str] = ()) -> JobObjects:
    """Every object of the job there is now, each kind read with one (paged) LIST.

    The TrainJobs are read first: their uids select the Workloads.
    """
    selector = job_selector(scope.adapter_name, job_id)
    trainjobs = await _list(
        scope, _custom_list(scope, TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS, selector)
    )
    uids = {*known_uids, *uids_of(trainjobs)}
    jobsets, pods, workloads = await gathered(
        _list(scope, _custom_list(scope, JOBSET_GROUP, JOBSET_VERSION, JOBSETS, selector)),
        _list(scope, _pod_list(scope, selector)),
        _workloads_of(scope, job_id, uids),
    )
    return JobObjects(trainjobs=trainjobs, jobsets=jobsets, pods=pods, workloads=workloads)


def uids_of(objects: Iterable[Mapping[str, Any]]) -> set[str]:
    """The uids of ``objects`` (TrainJobs read or deleted), for ``objects_of``'s ``known_uids``."""
    return {uid for o in objects if (uid := uid_of(o))}


def workload_selector(uids: Iterable[str]) -> str:
    """Kueue's label for the Workloads of the TrainJobs with these uids; empty for none."""
    chosen = sorted(set(uids))
    return f"{LABEL_KUEUE_JOB_UID} in ({','.join(chosen)})" if chosen else ""


async def _workloads_of(scope: Scope, job_id: str, uids: set[str]) -> list[Obj]:
    if scope.settings.kueue is None:
        return []
    selector = workload_selector(uids)
    items = await _list(scope, _custom_list(scope, KUEUE_GROUP, KUEUE_VERSION, WORKLOADS, selector))
    return [w for w in items if attempt_of(job_id, w) is not None]


def _custom_list(scope: Scope, group: str, version: str, plural: str, selector: str) -> ListFn:
    async def call(**options: Any) -> Any:
        return await scope.custom.list_namespaced_custom_object(
            group, version, scope.namespace, plural, label_selector=selector, **options
        )

    return call


def _pod_list(scope: Scope, selector: str) -> ListFn:
    async def call(**options: Any) -> Any:
        return await scope.core.list_namespaced_pod(
            scope.namespace, label_selector=selector, **options
        )

    return call


async def _list(scope: Scope, list_fn: ListFn) -> list[Obj]:
    listing = await list_all(
        list_fn, what="reading the job's objects", request_timeout=scope.settings.timeouts.request
    )
    return listing.items


async def _node_taints(scope: Scope, pods: Sequence[Obj]) -> dict[str, tuple[Taint, ...]]:
    """The taints of every node the pods are bound to that exists."""
    names = sorted({node for p in pods if (node := node_of(p))})
    nodes = await gathered(*(_read_node(scope, n) for n in names))
    return {
        name: node_taints(node) for name, node in zip(names, nodes, strict=True) if node is not None
    }


async def _read_node(scope: Scope, name: str) -> Obj | None:
    try:
        node = await scope.core.read_node(name)
    except REQUEST_ERRORS as error:
        if is_not_found(error):
            return None
        raise to_dispatch_error(
            f"reading node {name}", error, verb="get", resource="nodes"
        ) from None
    result: Obj = scope.api.sanitize_for_serialization(node)
    return result


def attempt_of(job_id: str, obj: Mapping[str, Any]) -> int | None:
    """The attempt an object belongs to: our label, else its TrainJob owner's name."""
    label = labels_of(obj).get(LABEL_ATTEMPT)
    if label is not None and label.isdigit():
        return int(label)
    pattern = re.compile(rf"^{re.escape(job_id)}-([1-9][0-9]*)$")
    for owner in mappings(dig(obj, "metadata", "ownerReferences")):
        if owner.get("kind") == KIND_TRAINJOB and (match := pattern.match(text(owner.get("name")))):
            return int(match.group(1))
    return None


def describe_object(kind: str, obj: Mapping[str, Any]) -> str:
    """``Kind/name``, and the finalizers that hold the object when it has any."""
    finalizers = dig(obj, "metadata", "finalizers") or ()
    held = f" (finalizers: {', '.join(finalizers)})" if finalizers else ""
    return f"{kind}/{name_of(obj)}{held}"
