"""Dispatch events: what a job's Kubernetes objects say, as a coarse state plus a typed cause.

Trainer, JobSet, Kueue and the kubelet each tell part of a job's story in their own conditions
and container states; none of them says "this job failed because its node died". This module
reads all of them together (``derive``), picks the one cause that explains the outcome by the
precedence of ``constants.Cause``, and keeps the upstream reason and message verbatim with the
objects they came from as evidence.

It also turns successive derivations into transitions reported exactly once (``advance`` and
``Reporter``): the last reported position of each (job, attempt) is a small record kept outside
the process (``ReportStore``), so a restarted adapter neither repeats nor loses a transition.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, Literal, Protocol

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)
from pydantic.alias_generators import to_camel

from dispatch_kubeflow.constants import (
    LABEL_QUEUE_NAME,
    LABEL_RESTART_ATTEMPT,
    PUBLISH_MAX_BYTES,
    TRAINER_NODE,
    Cause,
    EventType,
    State,
)

# Condition types and reasons read here (upstream wire names).
TRAINJOB_COMPLETE = "Complete"
TRAINJOB_FAILED = "Failed"
REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"
REASON_RUNTIME_NOT_SUPPORTED = "TrainingRuntimeNotSupported"
WL_EVICTED = "Evicted"
WL_ADMITTED = "Admitted"
WL_QUOTA_RESERVED = "QuotaReserved"
WL_DEACTIVATION_TARGET = "DeactivationTarget"
WL_REASON_PREEMPTED = "Preempted"
WL_REASON_NODE_FAILURES = "NodeFailures"
WL_REASON_PODS_READY_TIMEOUT = "PodsReadyTimeout"
WL_REASON_DEACTIVATED = "Deactivated"
WL_REASON_MAX_EXEC_TIME = "MaximumExecutionTimeExceeded"
WL_NO_CAPACITY_REASONS = frozenset({"Inadmissible", "ExceedsMaxQuota", "NoMatchingFlavor"})
# Without the UnadmittedWorkloadsObservability gate Kueue reports every unadmitted Workload with
# reason Pending; only the flavor assigner's verdict says the job does not fit.
WL_REASON_PENDING = "Pending"
WL_NO_FIT_PREFIX = "couldn't assign flavors to pod set"
# Suffixes Kueue appends when it found room by preempting others: the job fits once they go.
WL_PREEMPTION_UNDERWAY = ("Pending the preemption of", "Preempting ")
CHECK_REJECTED = "Rejected"
POD_DISRUPTION_TARGET = "DisruptionTarget"
POD_REASON_TAINT_MANAGER = "DeletionByTaintManager"
POD_SCHEDULED = "PodScheduled"
POD_REASON_UNSCHEDULABLE = "Unschedulable"
WAITING_IMAGE_PULL = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
WAITING_CONFIG = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
)
TERMINATED_OOM = "OOMKilled"
LABEL_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
EFFECT_NO_EXECUTE = "NoExecute"

KIND_TRAINJOB = "TrainJob"
KIND_JOBSET = "JobSet"
KIND_POD = "Pod"
KIND_WORKLOAD = "Workload"
KIND_NODE = "Node"


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, alias_generator=to_camel, populate_by_name=True, extra="forbid"
    )


class Taint(_Model):
    key: str
    value: str | None = None
    effect: str


class Evidence(_Model):
    """One object and the condition, container state or taint a conclusion was drawn from."""

    kind: str
    name: str
    field: str | None = None
    type: str | None = None
    status: str | None = None
    reason: str | None = None
    message: str | None = None
    container: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    node: str | None = None
    taint_key: str | None = None
    effect: str | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if value is not None}


class DispatchEvent(_Model):
    type: EventType
    job: str | None = None
    attempt: int | None = None
    train_job: str | None = None
    time: AwareDatetime
    state: State | None = None
    cause: Cause | None = None
    reason: str = ""
    message: str = ""
    evidence: tuple[Evidence, ...] = ()
    result: dict[str, Any] | None = None
    gate: Literal["open", "closed"] | None = None


class JobObservation(BaseModel):
    """Everything watched of one (job, attempt), as raw API objects."""

    model_config = ConfigDict(frozen=True)

    job: str
    attempt: int
    train_job: dict[str, Any] | None = None
    job_set: dict[str, Any] | None = None
    pods: tuple[dict[str, Any], ...] = ()
    workload: dict[str, Any] | None = None
    node_taints: Mapping[str, tuple[Taint, ...]] = Field(default_factory=dict)
    stopped: bool = False


class JobStatus(_Model):
    state: State
    cause: Cause | None = None
    reason: str = ""
    message: str = ""
    evidence: tuple[Evidence, ...] = ()
    admitted: bool = False
    running: bool = False
    finished: bool = False
    restart_attempt: int = 0
    result: dict[str, Any] | None = None
    # The Workload's current Evicted=True condition, when there is one.
    eviction: Evidence | None = None
    # A token that differs for each distinct eviction (reason and transition time).
    eviction_token: str | None = None


# --------------------------------------------------------------------------------------------
# Reading raw objects


def _dig(obj: Mapping[str, Any] | None, *path: str) -> Any:
    current: Any = obj
    for key in path:
        if not isinstance(current, Mapping):
            return None
        current = current.get(key)
    return current


def _name(obj: Mapping[str, Any] | None) -> str:
    return str(_dig(obj, "metadata", "name") or "")


def _conditions(obj: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    found = _dig(obj, "status", "conditions")
    return [c for c in found if isinstance(c, Mapping)] if isinstance(found, list) else []


def _condition(obj: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    return next((c for c in _conditions(obj) if c.get("type") == type_), None)


def _is_true(condition: Mapping[str, Any] | None) -> bool:
    return condition is not None and condition.get("status") == "True"


def _condition_evidence(kind: str, obj: Mapping[str, Any], cond: Mapping[str, Any]) -> Evidence:
    return Evidence(
        kind=kind,
        name=_name(obj),
        field="status.conditions",
        type=str(cond.get("type") or ""),
        status=str(cond.get("status") or ""),
        reason=str(cond.get("reason") or ""),
        message=str(cond.get("message") or ""),
    )


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _container_statuses(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainerStatuses", "containerStatuses"):
        statuses = _dig(pod, "status", key)
        if isinstance(statuses, list):
            yield from (s for s in statuses if isinstance(s, Mapping))


def _terminations(status: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("state", "lastState"):
        terminated = _dig(status, key, "terminated")
        if isinstance(terminated, Mapping):
            yield terminated


def _is_deleted(pod: Mapping[str, Any]) -> bool:
    return _dig(pod, "metadata", "deletionTimestamp") is not None


def restart_attempt_of(pod: Mapping[str, Any]) -> int:
    return _int(_dig(pod, "metadata", "labels", LABEL_RESTART_ATTEMPT))


# --------------------------------------------------------------------------------------------
# Cause detectors: each yields (cause, evidence) pairs it finds; precedence picks among them.

_Found = tuple[Cause, Evidence]


def _workload_causes(workload: Mapping[str, Any] | None) -> Iterator[_Found]:
    if workload is None:
        return
    evicted = _condition(workload, WL_EVICTED)
    if _is_true(evicted):
        assert evicted is not None
        ev = _condition_evidence(KIND_WORKLOAD, workload, evicted)
        reason = evicted.get("reason")
        if reason == WL_REASON_PREEMPTED:
            yield Cause.PREEMPTED, ev
        elif reason == WL_REASON_NODE_FAILURES:
            yield Cause.NODE_LOST, ev
        elif reason == WL_REASON_PODS_READY_TIMEOUT:
            yield Cause.PODS_READY_TIMEOUT, ev
        elif reason == WL_REASON_DEACTIVATED:
            underlying = _deactivation_cause(workload, evicted)
            if underlying is not None:
                yield underlying, ev
    quota = _condition(workload, WL_QUOTA_RESERVED)
    if quota is not None and _lacks_capacity(quota):
        yield Cause.NO_CAPACITY, _condition_evidence(KIND_WORKLOAD, workload, quota)
    checks = _dig(workload, "status", "admissionChecks")
    for check in checks if isinstance(checks, list) else []:
        if isinstance(check, Mapping) and check.get("state") == CHECK_REJECTED:
            yield (
                Cause.ADMISSION_REJECTED,
                Evidence(
                    kind=KIND_WORKLOAD,
                    name=_name(workload),
                    field="status.admissionChecks",
                    type=str(check.get("name") or ""),
                    status=CHECK_REJECTED,
                    reason=CHECK_REJECTED,
                    message=str(check.get("message") or ""),
                ),
            )


def _lacks_capacity(quota: Mapping[str, Any]) -> bool:
    """Whether a QuotaReserved condition says the Workload does not fit the quota."""
    if quota.get("status") != "False":
        return False
    reason = quota.get("reason")
    if reason in WL_NO_CAPACITY_REASONS:
        return True
    message = str(quota.get("message") or "")
    return (
        reason == WL_REASON_PENDING
        and message.startswith(WL_NO_FIT_PREFIX)
        and not any(marker in message for marker in WL_PREEMPTION_UNDERWAY)
    )


def _deactivation_cause(workload: Mapping[str, Any], evicted: Mapping[str, Any]) -> Cause | None:
    """Why Kueue deactivated a Workload, from the condition message or its recorded cause."""
    texts = [str(evicted.get("message") or "")]
    target = _condition(workload, WL_DEACTIVATION_TARGET)
    if target is not None:
        texts += [str(target.get("reason") or ""), str(target.get("message") or "")]
    stats = _dig(workload, "status", "schedulingStats", "evictions")
    for entry in stats if isinstance(stats, list) else []:
        if isinstance(entry, Mapping) and entry.get("reason") == WL_REASON_DEACTIVATED:
            texts.append(str(entry.get("underlyingCause") or ""))
    joined = " ".join(texts).lower()
    if WL_REASON_MAX_EXEC_TIME.lower() in joined or "maximum execution time" in joined:
        return Cause.TIMEOUT
    if "requeuinglimitexceeded" in joined:
        # Kueue gives up requeuing after repeated PodsReadyTimeout evictions.
        return Cause.PODS_READY_TIMEOUT
    if "admissioncheck" in joined or "admission check" in joined or "rejected" in joined:
        return Cause.ADMISSION_REJECTED
    return None


def _trainjob_causes(train_job: Mapping[str, Any] | None) -> Iterator[_Found]:
    failed = _condition(train_job, TRAINJOB_FAILED)
    if train_job is None or not _is_true(failed):
        return
    assert failed is not None
    ev = _condition_evidence(KIND_TRAINJOB, train_job, failed)
    if failed.get("reason") == REASON_DEADLINE_EXCEEDED:
        yield Cause.TIMEOUT, ev
    elif failed.get("reason") == REASON_RUNTIME_NOT_SUPPORTED:
        yield Cause.RUNTIME_UNSUPPORTED, ev


def _node_loss_causes(
    pods: Iterable[Mapping[str, Any]],
    node_taints: Mapping[str, tuple[Taint, ...]],
    loss_taints: frozenset[str],
) -> Iterator[_Found]:
    for pod in pods:
        if _dig(pod, "status", "phase") == "Succeeded":
            continue
        node = _dig(pod, "spec", "nodeName")
        for taint in node_taints.get(node, ()) if isinstance(node, str) else ():
            if taint.key in loss_taints and taint.effect == EFFECT_NO_EXECUTE:
                yield (
                    Cause.NODE_LOST,
                    Evidence(
                        kind=KIND_NODE,
                        name=node,
                        field="spec.taints",
                        node=node,
                        taint_key=taint.key,
                        effect=taint.effect,
                        reason=taint.key,
                        message=f"pod {_name(pod)} runs on node {node} tainted {taint.key}"
                        f":{taint.effect}",
                    ),
                )
        disruption = _condition(pod, POD_DISRUPTION_TARGET)
        if (
            disruption is not None
            and _is_true(disruption)
            and disruption.get("reason") == POD_REASON_TAINT_MANAGER
        ):
            yield Cause.NODE_LOST, _condition_evidence(KIND_POD, pod, disruption)


def _container_causes(pods: Iterable[Mapping[str, Any]]) -> Iterator[_Found]:
    for pod in pods:
        scheduled = _condition(pod, POD_SCHEDULED)
        if (
            scheduled is not None
            and scheduled.get("status") == "False"
            and scheduled.get("reason") == POD_REASON_UNSCHEDULABLE
        ):
            yield Cause.NO_CAPACITY, _condition_evidence(KIND_POD, pod, scheduled)
        for status in _container_statuses(pod):
            yield from _one_container_causes(pod, status)


def _one_container_causes(pod: Mapping[str, Any], status: Mapping[str, Any]) -> Iterator[_Found]:
    container = str(status.get("name") or "")
    waiting = _dig(status, "state", "waiting")
    if isinstance(waiting, Mapping):
        reason = waiting.get("reason")
        cause = (
            Cause.IMAGE_PULL
            if reason in WAITING_IMAGE_PULL
            else Cause.CONFIG_ERROR
            if reason in WAITING_CONFIG
            else None
        )
        if cause is not None:
            yield (
                cause,
                Evidence(
                    kind=KIND_POD,
                    name=_name(pod),
                    field="status.containerStatuses.state.waiting",
                    container=container,
                    reason=str(reason),
                    message=str(waiting.get("message") or ""),
                ),
            )
    for terminated in _terminations(status):
        code = _int(terminated.get("exitCode"))
        reason = str(terminated.get("reason") or "")
        if reason != TERMINATED_OOM and code == 0:
            continue
        signal = _int(terminated.get("signal")) or (code - 128 if code > 128 else 0)
        yield (
            Cause.OUT_OF_MEMORY if reason == TERMINATED_OOM else Cause.PROGRAM_ERROR,
            Evidence(
                kind=KIND_POD,
                name=_name(pod),
                field="status.containerStatuses.state.terminated",
                container=container,
                exit_code=code,
                signal=signal or None,
                reason=reason,
                message=str(terminated.get("message") or "")[:PUBLISH_MAX_BYTES],
                node=_dig(pod, "spec", "nodeName"),
            ),
        )


def _pick(found: Iterable[_Found]) -> tuple[Cause | None, tuple[Evidence, ...]]:
    """The highest-precedence cause and every piece of evidence for it (deduplicated)."""
    by_cause: dict[Cause, list[Evidence]] = {}
    for cause, evidence in found:
        if evidence not in by_cause.setdefault(cause, []):
            by_cause[cause].append(evidence)
    for cause in Cause:
        if cause in by_cause:
            return cause, tuple(by_cause[cause])
    return None, ()


# --------------------------------------------------------------------------------------------
# State


def current_pods(pods: Iterable[Mapping[str, Any]], restart_attempt: int) -> list[dict[str, Any]]:
    """The pods of the gang's current incarnation: older restart attempts explain nothing now."""
    return [dict(p) for p in pods if restart_attempt_of(p) >= restart_attempt]


def _restart_attempt(obs: JobObservation) -> int:
    from_pods = max((restart_attempt_of(p) for p in obs.pods), default=0)
    return max(from_pods, _int(_dig(obs.job_set, "status", "restarts")))


def _is_running(obs: JobObservation, pods: list[dict[str, Any]]) -> bool:
    if _dig(obs.train_job, "spec", "suspend") is True:
        return False
    if any(_dig(p, "status", "phase") == "Running" and not _is_deleted(p) for p in pods):
        return True
    if pods:
        return False
    # Without pods in view, fall back on the Job counters Trainer copies from the JobSet.
    statuses = _dig(obs.train_job, "status", "jobsStatus") or _dig(
        obs.job_set, "status", "replicatedJobsStatus"
    )
    return any(
        _int(s.get("ready")) > 0 or _int(s.get("active")) > 0
        for s in (statuses if isinstance(statuses, list) else [])
        if isinstance(s, Mapping)
    )


def _is_admitted(obs: JobObservation) -> bool:
    """Admitted now: Kueue's Admitted condition, newer than any eviction; else not suspended."""
    if obs.workload is None:
        # A TrainJob queued in Kueue is admitted only through its Workload, which may not be
        # in view yet; without a queue it runs once it is not suspended.
        if _dig(obs.train_job, "metadata", "labels", LABEL_QUEUE_NAME):
            return False
        return obs.train_job is not None and _dig(obs.train_job, "spec", "suspend") is not True
    admitted = _condition(obs.workload, WL_ADMITTED)
    if admitted is None or not _is_true(admitted):
        return False
    evicted = _condition(obs.workload, WL_EVICTED)
    if evicted is None or not _is_true(evicted):
        return True
    # Kueue leaves Admitted=True for a moment after an eviction, until the job has stopped.
    return str(admitted.get("lastTransitionTime") or "") > str(
        evicted.get("lastTransitionTime") or ""
    )


def _eviction(workload: Mapping[str, Any] | None) -> tuple[Evidence | None, str | None]:
    evicted = _condition(workload, WL_EVICTED)
    if workload is None or evicted is None or not _is_true(evicted):
        return None, None
    token = f"{evicted.get('reason') or ''}@{evicted.get('lastTransitionTime') or ''}"
    return _condition_evidence(KIND_WORKLOAD, workload, evicted), token


def _is_deactivated(workload: Mapping[str, Any] | None) -> bool:
    return workload is not None and _dig(workload, "spec", "active") is False


def published_result(pods: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The record ``publish`` wrote to the termination message of container ``node``.

    Rank 0 is preferred; otherwise the first pod by name that carries one.
    """

    def rank(pod: Mapping[str, Any]) -> tuple[int, str]:
        index = _dig(pod, "metadata", "labels", LABEL_COMPLETION_INDEX)
        return (0 if index == "0" else 1, _name(pod))

    for pod in sorted(pods, key=rank):
        for status in _container_statuses(pod):
            if status.get("name") != TRAINER_NODE:
                continue
            for terminated in _terminations(status):
                record = _parse_record(terminated.get("message"))
                if record is not None:
                    return record
    return None


def _parse_record(message: Any) -> dict[str, Any] | None:
    if not isinstance(message, str) or len(message.encode()) > PUBLISH_MAX_BYTES:
        return None
    try:
        record = json.loads(message)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _state_evidence(obs: JobObservation) -> tuple[str, str, tuple[Evidence, ...]]:
    """Reason, message and evidence of the condition that sets the state, when no cause does."""
    tj = obs.train_job
    for type_ in (TRAINJOB_COMPLETE, TRAINJOB_FAILED):
        cond = _condition(tj, type_)
        if tj is not None and cond is not None and _is_true(cond):
            ev = _condition_evidence(KIND_TRAINJOB, tj, cond)
            return ev.reason or "", ev.message or "", (ev,)
    for type_ in (WL_ADMITTED, WL_QUOTA_RESERVED):
        cond = _condition(obs.workload, type_)
        if obs.workload is not None and cond is not None and cond.get("status") == "False":
            ev = _condition_evidence(KIND_WORKLOAD, obs.workload, cond)
            return ev.reason or "", ev.message or "", (ev,)
    cond = _condition(tj, "Suspended")
    if tj is not None and cond is not None and _is_true(cond):
        ev = _condition_evidence(KIND_TRAINJOB, tj, cond)
        return ev.reason or "", ev.message or "", (ev,)
    return "", "", ()


def derive(obs: JobObservation, *, loss_taints: frozenset[str]) -> JobStatus:
    """The state and cause of one (job, attempt) from everything watched of it."""
    restart = _restart_attempt(obs)
    pods = current_pods(obs.pods, restart)
    found: list[_Found] = [
        *_workload_causes(obs.workload),
        *_node_loss_causes(pods, obs.node_taints, loss_taints),
        *_trainjob_causes(obs.train_job),
        *_container_causes(pods),
    ]
    cause, evidence = _pick(found)
    eviction, eviction_token = _eviction(obs.workload)
    admitted = _is_admitted(obs)
    common: dict[str, Any] = {
        "admitted": admitted,
        "restart_attempt": restart,
        "result": published_result(pods) or published_result(obs.pods),
        "eviction": eviction,
        "eviction_token": eviction_token,
    }
    state, cause = _state(obs, pods, cause)
    if not evidence or cause in (None, Cause.STOPPED, Cause.EVIDENCE_LOST):
        reason, message, evidence = _state_evidence(obs)
    else:
        reason, message = evidence[0].reason or "", evidence[0].message or ""
    if cause is Cause.STOPPED:
        reason, message = reason or "StopJob", message or "stop_job was called"
    elif cause is Cause.EVIDENCE_LOST:
        reason = "TrainJobVanished"
        message = f"TrainJob of job {obs.job} attempt {obs.attempt} vanished before it finished"
    return JobStatus(
        state=state,
        cause=cause,
        reason=reason,
        message=message,
        evidence=evidence,
        running=state is State.RUNNING,
        finished=state not in (State.PENDING, State.RUNNING),
        **common,
    )


def _state(
    obs: JobObservation, pods: list[dict[str, Any]], cause: Cause | None
) -> tuple[State, Cause | None]:
    tj = obs.train_job
    if _is_true(_condition(tj, TRAINJOB_COMPLETE)):
        return State.SUCCEEDED, None
    if _is_true(_condition(tj, TRAINJOB_FAILED)):
        # A Failed TrainJob always names a cause: JobSet reasons (FailedJobs, ReachedMaxRestarts,
        # FailJobSetFailurePolicyAction) mean a child Job failed, i.e. the program did.
        return State.FAILED, cause or Cause.PROGRAM_ERROR
    if obs.stopped:
        return State.STOPPED, Cause.STOPPED
    if tj is None:
        return State.UNKNOWN, Cause.EVIDENCE_LOST
    if _is_deactivated(obs.workload) and _is_true(_condition(obs.workload, WL_EVICTED)):
        return State.FAILED, cause
    return (State.RUNNING if _is_running(obs, pods) else State.PENDING), cause


# --------------------------------------------------------------------------------------------
# Exactly-once reporting


class ReportedRecord(BaseModel):
    """How far the events of one (job, attempt) have been reported; stored as short JSON."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    submitted: bool = Field(default=False, alias="s")
    # Evictions reported so far; Admitted and Running are reported once per admission epoch.
    epoch: int = Field(default=0, alias="e")
    eviction: str | None = Field(default=None, alias="x")
    admitted: int = Field(default=-1, alias="a")
    running: int = Field(default=-1, alias="r")
    restarts: int = Field(default=0, alias="ra")
    node_lost: str | None = Field(default=None, alias="n")
    finished: bool = Field(default=False, alias="f")
    # The phase last reported in and the causes its events carried, as "<phase>:<cause>,...";
    # absent from records written before causes were tracked.
    causes: str | None = Field(default=None, alias="c")

    def causes_in(self, phase: str) -> frozenset[str] | None:
        """The causes reported in ``phase``; None when the record predates cause tracking."""
        if self.causes is None:
            return None
        reported_phase, _, causes = self.causes.partition(":")
        return frozenset(causes.split(",")) if reported_phase == phase else frozenset()

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True, exclude_defaults=True)

    @classmethod
    def from_json(cls, text: str | None) -> ReportedRecord | None:
        """The record in ``text``, or None when it is absent or unreadable (reported nothing)."""
        if not text:
            return None
        try:
            return cls.model_validate_json(text)
        except ValueError:
            return None


class ReportStore(Protocol):
    """Where the last reported record of each (job, attempt) outlives the process."""

    async def load(self, job: str, attempt: int) -> ReportedRecord | None: ...

    async def save(self, job: str, attempt: int, record: ReportedRecord) -> None: ...


class MemoryStore:
    """A ReportStore that lives as long as the process: for tests and the library default."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], ReportedRecord] = {}

    async def load(self, job: str, attempt: int) -> ReportedRecord | None:
        return self.records.get((job, attempt))

    async def save(self, job: str, attempt: int, record: ReportedRecord) -> None:
        self.records[(job, attempt)] = record


_NO_CAUSE = "-"
# Causes that explain why a job waits; every other cause comes with an event of its own
# (Evicted, NodeLost, Restarted, Finished), and a cleared cause shows on the next event.
WAITING_CAUSES = frozenset({Cause.NO_CAPACITY, Cause.IMAGE_PULL, Cause.CONFIG_ERROR})
_PHASE_EVENTS = {"S": EventType.SUBMITTED, "A": EventType.ADMITTED, "R": EventType.RUNNING}


def _phase_of(status: JobStatus, epoch: int) -> str:
    """Where a non-terminal job is: admission epoch, gang incarnation, waiting/admitted/running."""
    step = "R" if status.admitted and status.running else "A" if status.admitted else "S"
    return f"{epoch}.{status.restart_attempt}.{step}"


def _cause_key(cause: Cause | None) -> str:
    return cause.value if cause is not None else _NO_CAUSE


def advance(
    *,
    job: str,
    attempt: int,
    train_job: str | None,
    record: ReportedRecord | None,
    status: JobStatus,
    now: datetime,
) -> tuple[list[DispatchEvent], ReportedRecord]:
    """The transitions from ``record`` to ``status`` not yet reported, in order, and the new record.

    Order: Submitted, Evicted, Admitted, Running, NodeLost, Restarted, Finished or Vanished; an
    eviction seen in the same step as an admission came before it (the admission is a readmission).
    Nothing is reported after Finished or Vanished.

    A waiting cause (``WAITING_CAUSES``) that a non-terminal job takes on without any of these
    transitions (quota runs out, pods turn unschedulable or cannot pull their image) is reported
    as a repeat of the event of the job's phase (``Submitted`` while it waits for admission,
    ``Admitted``, ``Running``), once per distinct cause and phase.
    """
    rec = record or ReportedRecord()
    if rec.finished:
        return [], rec
    vanished = status.state is State.UNKNOWN and status.cause is Cause.EVIDENCE_LOST
    if vanished and not rec.submitted:
        return [], rec  # nothing was ever reported of a job that was never seen

    def event(type_: EventType, **overrides: Any) -> DispatchEvent:
        fields: dict[str, Any] = {
            "type": type_,
            "job": job,
            "attempt": attempt,
            "train_job": train_job,
            "time": now,
            "state": status.state,
            "cause": status.cause,
            "reason": status.reason,
            "message": status.message,
            "evidence": status.evidence,
        }
        fields.update(overrides)
        return DispatchEvent(**fields)

    events: list[DispatchEvent] = []
    updates: dict[str, Any] = {}
    if not rec.submitted:
        events.append(event(EventType.SUBMITTED))
        updates["submitted"] = True
    epoch = rec.epoch
    if status.eviction_token is not None and status.eviction_token != rec.eviction:
        eviction = status.eviction
        if eviction is None:
            events.append(event(EventType.EVICTED))
        else:
            others = tuple(e for e in status.evidence if e != eviction)
            events.append(
                event(
                    EventType.EVICTED,
                    reason=eviction.reason or "",
                    message=eviction.message or "",
                    evidence=(eviction, *others),
                )
            )
        epoch += 1
        updates.update(eviction=status.eviction_token, epoch=epoch)
    # Admitted and Running are reported once per admission epoch (a readmission starts one).
    if status.admitted and rec.admitted < epoch:
        events.append(event(EventType.ADMITTED))
        updates["admitted"] = epoch
    if status.admitted and status.running and rec.running < epoch:
        events.append(event(EventType.RUNNING))
        updates["running"] = epoch
    node_lost_key = f"{epoch}/{status.restart_attempt}"
    if status.cause is Cause.NODE_LOST and rec.node_lost != node_lost_key:
        events.append(event(EventType.NODE_LOST))
        updates["node_lost"] = node_lost_key
    if status.restart_attempt > rec.restarts:
        events.append(event(EventType.RESTARTED))
        updates["restarts"] = status.restart_attempt
    if status.finished:
        events.append(
            event(
                EventType.VANISHED if vanished else EventType.FINISHED,
                result=status.result,
            )
        )
        updates["finished"] = True
    else:
        phase = _phase_of(status, epoch)
        cause = _cause_key(status.cause)
        reported = rec.causes_in(phase)
        if reported is None and not events:
            # A record written before causes were tracked: its events carried the current cause
            # as far as anyone can tell, so the cause is adopted without a report.
            return events, rec.model_copy(update={"causes": f"{phase}:{cause}"})
        reported = reported or frozenset()
        if not events and status.cause in WAITING_CAUSES and cause not in reported:
            events.append(event(_PHASE_EVENTS[phase[-1]]))
        if events:
            updates["causes"] = f"{phase}:{','.join(sorted(reported | {cause}))}"
    return events, rec.model_copy(update=updates) if updates else rec


class Reporter:
    """Applies ``advance`` per (job, attempt), keeping the record in memory and in the store.

    The record is saved before the events are handed out: a transition counts as reported
    once the store holds it.
    """

    def __init__(self, store: ReportStore) -> None:
        self._store = store
        self._records: dict[tuple[str, int], ReportedRecord] = {}

    async def record_of(self, job: str, attempt: int) -> ReportedRecord | None:
        key = (job, attempt)
        if key not in self._records:
            loaded = await self._store.load(job, attempt)
            if loaded is None:
                return None
            self._records[key] = loaded
        return self._records[key]

    async def report(
        self,
        *,
        job: str,
        attempt: int,
        train_job: str | None,
        status: JobStatus,
        now: datetime,
    ) -> list[DispatchEvent]:
        previous = await self.record_of(job, attempt)
        events, record = advance(
            job=job,
            attempt=attempt,
            train_job=train_job,
            record=previous,
            status=status,
            now=now,
        )
        if record != previous and events:
            await self._store.save(job, attempt, record)
        self._records[(job, attempt)] = record
        return events

    def forget(self, job: str, attempt: int) -> None:
        self._records.pop((job, attempt), None)


def heartbeat_event(
    *,
    gate: Literal["open", "closed"],
    now: datetime,
    reason: str,
    message: str,
    evidence: tuple[Evidence, ...] = (),
) -> DispatchEvent:
    return DispatchEvent(
        type=EventType.ADMISSION_HEARTBEAT,
        time=now,
        gate=gate,
        reason=reason,
        message=message,
        evidence=evidence,
    )
