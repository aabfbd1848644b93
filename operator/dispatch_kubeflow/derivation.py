"""Derivation: what a job's Kubernetes objects say, as a coarse state plus a typed cause.

Trainer, JobSet, Kueue and the kubelet each tell part of a job's story in their own conditions
and container states; none of them says "this job failed because its node died". ``derive``
reads all of them together, picks the one cause that explains the outcome by the precedence of
``constants.Cause``, and keeps the upstream reason and message verbatim with the objects they
came from as evidence.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from dispatch_kubeflow import reasons
from dispatch_kubeflow.clock import parse_time
from dispatch_kubeflow.constants import (
    EFFECT_NO_EXECUTE,
    KIND_NODE,
    KIND_POD,
    KIND_TRAINJOB,
    KIND_WORKLOAD,
    LABEL_COMPLETION_INDEX,
    LABEL_QUEUE_NAME,
    LABEL_RESTART_ATTEMPT,
    POD_DISRUPTION_TARGET,
    POD_SCHEDULED,
    PUBLISH_MAX_BYTES,
    TRAINER_NODE,
    TRAINJOB_COMPLETE,
    TRAINJOB_FAILED,
    TRAINJOB_SUSPENDED,
    WORKLOAD_ADMITTED,
    WORKLOAD_DEACTIVATION_TARGET,
    WORKLOAD_EVICTED,
    WORKLOAD_QUOTA_RESERVED,
    Cause,
    State,
)
from dispatch_kubeflow.events import DerivedStatus, Evidence, JobObservation, Taint
from dispatch_kubeflow.kube.objects import (
    as_int,
    condition,
    dig,
    is_deleting,
    is_false,
    is_true,
    mappings,
    name_of,
    text,
)
from dispatch_kubeflow.kube.workloads import eviction_count, is_active, is_admitted

POD_SUCCEEDED = "Succeeded"
POD_FAILED = "Failed"
# The evidence's reason when a pod's Node was deleted: no upstream object says it in words.
REASON_NODE_DELETED = "NodeDeleted"
# Kueue's eviction reason for a deactivated Workload, alone or as DeactivatedDueTo<cause>.
WL_REASON_DEACTIVATED = "Deactivated"
# publish never writes a record nested deeper; json.loads recurses once per level, so a deeper
# termination message (a trainer can write anything there) is refused before it is parsed.
RECORD_MAX_DEPTH = 64

# --------------------------------------------------------------------------------------------
# Reading raw objects


def _condition_evidence(kind: str, obj: Mapping[str, Any], cond: Mapping[str, Any]) -> Evidence:
    return Evidence(
        kind=kind,
        name=name_of(obj),
        field="status.conditions",
        type=str(cond.get("type") or ""),
        status=str(cond.get("status") or ""),
        reason=str(cond.get("reason") or ""),
        message=str(cond.get("message") or ""),
    )


def _container_statuses(pod: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("initContainerStatuses", "containerStatuses"):
        yield from mappings(dig(pod, "status", key))


def _terminations(status: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for key in ("state", "lastState"):
        terminated = dig(status, key, "terminated")
        if isinstance(terminated, Mapping):
            yield terminated


def restart_attempt_of(pod: Mapping[str, Any]) -> int:
    return as_int(dig(pod, "metadata", "labels", LABEL_RESTART_ATTEMPT))


# --------------------------------------------------------------------------------------------
# Cause detectors: each yields (cause, evidence) pairs it finds; precedence picks among them.
# What each upstream reason means is the reason table's (``reasons``); these only read it.

_Found = tuple[Cause, Evidence]


def _workload_causes(workload: Mapping[str, Any] | None) -> Iterator[_Found]:
    if workload is None:
        return
    evicted = condition(workload, WORKLOAD_EVICTED)
    # An eviction that a later admission superseded ended an earlier admission: no cause now.
    current = evicted is not None and is_true(evicted) and not is_admitted(workload)
    eviction_reason = text(evicted.get("reason")) if evicted is not None and current else ""
    if evicted is not None and eviction_reason:
        cause = reasons.eviction_cause(
            eviction_reason, text(evicted.get("message")), _deactivation_causes(workload)
        )
        if cause is not None:
            yield cause, _condition_evidence(KIND_WORKLOAD, workload, evicted)
    quota = condition(workload, WORKLOAD_QUOTA_RESERVED)
    if quota is not None and is_false(quota):
        cause = reasons.quota_reserved_cause(
            text(quota.get("reason")),
            text(quota.get("message")),
            queue_stopped=reasons.is_queue_stop(eviction_reason),
        )
        if cause is not None:
            yield cause, _condition_evidence(KIND_WORKLOAD, workload, quota)
    for check in mappings(dig(workload, "status", "admissionChecks")):
        state = text(check.get("state"))
        cause = reasons.check_cause(state)
        if cause is not None:
            yield (
                cause,
                Evidence(
                    kind=KIND_WORKLOAD,
                    name=name_of(workload),
                    field="status.admissionChecks",
                    type=text(check.get("name")),
                    status=state,
                    reason=state,
                    message=text(check.get("message")),
                ),
            )


def _deactivation_causes(workload: Mapping[str, Any]) -> list[str]:
    """The underlying causes Kueue recorded for deactivating ``workload``.

    Kueue v0.19 names it in the eviction reason (``DeactivatedDueTo<cause>``); the temporary
    ``DeactivationTarget`` condition and ``schedulingStats.evictions[].underlyingCause`` carry it
    for a plain ``Deactivated`` eviction.
    """
    found = []
    target = condition(workload, WORKLOAD_DEACTIVATION_TARGET)
    if target is not None:
        found.append(text(target.get("reason")))
    for entry in mappings(dig(workload, "status", "schedulingStats", "evictions")):
        if text(entry.get("reason")).startswith(WL_REASON_DEACTIVATED):
            found.append(text(entry.get("underlyingCause")))
    return [cause for cause in found if cause]


def _trainjob_causes(train_job: Mapping[str, Any] | None) -> Iterator[_Found]:
    failed = condition(train_job, TRAINJOB_FAILED)
    if train_job is None or failed is None or not is_true(failed):
        return
    cause = reasons.trainjob_failed_cause(text(failed.get("reason")))
    # A child Job's failure (ProgramError) is the fallback of ``_state``: the pods say more.
    if cause is not None and cause is not Cause.PROGRAM_ERROR:
        yield cause, _condition_evidence(KIND_TRAINJOB, train_job, failed)


def _node_causes(
    pods: Iterable[Mapping[str, Any]],
    node_taints: Mapping[str, tuple[Taint, ...]],
    loss_taints: frozenset[str],
    deleted_nodes: frozenset[str],
) -> Iterator[_Found]:
    """NodeLost from the nodes the job's unfinished pods are bound to: a loss taint, or gone."""
    for pod in pods:
        node = dig(pod, "spec", "nodeName")
        if not isinstance(node, str) or dig(pod, "status", "phase") == POD_SUCCEEDED:
            continue
        for taint in node_taints.get(node, ()):
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
                        time_added=taint.time_added,
                        reason=taint.key,
                        message=f"pod {name_of(pod)} runs on node {node} tainted {taint.key}"
                        f":{taint.effect}",
                    ),
                )
        if node in deleted_nodes and dig(pod, "status", "phase") != POD_FAILED:
            yield (
                Cause.NODE_LOST,
                Evidence(
                    kind=KIND_NODE,
                    name=node,
                    field="metadata",
                    node=node,
                    reason=REASON_NODE_DELETED,
                    message=f"pod {name_of(pod)} is bound to node {node}, which was deleted",
                ),
            )


def _pod_causes(pods: Iterable[Mapping[str, Any]]) -> Iterator[_Found]:
    """What the scheduler, the kubelet and the controllers wrote on the job's pods."""
    for pod in pods:
        if dig(pod, "status", "phase") != POD_SUCCEEDED:
            disruption = condition(pod, POD_DISRUPTION_TARGET)
            if disruption is not None and is_true(disruption):
                cause = reasons.disruption_cause(
                    text(disruption.get("reason")), text(disruption.get("message"))
                )
                if cause is not None:
                    yield cause, _condition_evidence(KIND_POD, pod, disruption)
            yield from _pod_failure_causes(pod)
        scheduled = condition(pod, POD_SCHEDULED)
        if scheduled is not None and is_false(scheduled):
            cause = reasons.scheduling_cause(text(scheduled.get("reason")))
            if cause is not None:
                yield cause, _condition_evidence(KIND_POD, pod, scheduled)
        for status in _container_statuses(pod):
            yield from _one_container_causes(pod, status)


def _pod_failure_causes(pod: Mapping[str, Any]) -> Iterator[_Found]:
    """A pod the kubelet failed as a whole (refused at admission, evicted, shut down)."""
    reason = text(dig(pod, "status", "reason"))
    if dig(pod, "status", "phase") != POD_FAILED or not reason:
        return
    cause = reasons.pod_failure_cause(reason)
    if cause is not None:
        message = text(dig(pod, "status", "message"))
        yield cause, _pod_evidence(pod, "status.reason", reason, message, status=POD_FAILED)


def _pod_evidence(
    pod: Mapping[str, Any], field: str, reason: str, message: str, **details: Any
) -> Evidence:
    """Evidence from a pod's status: ``field`` says which part, ``details`` the rest."""
    node = dig(pod, "spec", "nodeName")
    return Evidence(
        kind=KIND_POD,
        name=name_of(pod),
        field=field,
        reason=reason,
        message=message,
        node=node if isinstance(node, str) else None,
        **details,
    )


def _one_container_causes(pod: Mapping[str, Any], status: Mapping[str, Any]) -> Iterator[_Found]:
    container = text(status.get("name"))
    waiting = dig(status, "state", "waiting")
    if isinstance(waiting, Mapping):
        reason = text(waiting.get("reason"))
        cause = reasons.waiting_cause(reason)
        if cause is not None:
            field = "status.containerStatuses.state.waiting"
            message = text(waiting.get("message"))
            yield cause, _pod_evidence(pod, field, reason, message, container=container)
    for terminated in _terminations(status):
        code = as_int(terminated.get("exitCode"))
        reason = text(terminated.get("reason"))
        cause = reasons.terminated_cause(reason, code)
        if cause is None:
            continue
        signal = as_int(terminated.get("signal")) or (code - 128 if code > 128 else 0)
        yield (
            cause,
            _pod_evidence(
                pod,
                "status.containerStatuses.state.terminated",
                reason,
                text(terminated.get("message"))[:PUBLISH_MAX_BYTES],
                container=container,
                exit_code=code,
                signal=signal or None,
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


def admission_pods(obs: JobObservation) -> list[Mapping[str, Any]]:
    """The pods of the job's current admission: those of an earlier one explain nothing now.

    A Kueue eviction suspends the job and its readmission resumes it without raising JobSet's
    restart attempt, so a pod created before the Workload's latest ``Admitted`` transition ran
    in an admission that has ended. Only a Workload evicted before is read this way: in a first
    admission every pod is current, whatever the skew between Kueue's clock and the apiserver's.
    """
    start = _admission_start(obs.workload)
    if start is None:
        return list(obs.pods)
    return [p for p in obs.pods if not _created_before(p, start)]


def pods_have_ended(obs: JobObservation) -> bool:
    """Every pod of the job is seen deleted or in a phase it never leaves.

    Until then a job the TrainJob says has finished may have pods whose end the pod watch has
    not shown yet: a pod ends before its Job, JobSet and TrainJob do, but each kind is watched
    on its own stream.
    """
    return bool(obs.pods) and all(has_ended(pod) for pod in obs.pods)


def has_ended(pod: Mapping[str, Any]) -> bool:
    """The pod is deleted or in a phase it never leaves: nothing more will be written of it."""
    return is_deleting(pod) or dig(pod, "status", "phase") in (POD_SUCCEEDED, POD_FAILED)


def _admission_start(workload: Mapping[str, Any] | None) -> datetime | None:
    """When the current admission of a once-evicted Workload began; None otherwise."""
    if workload is None or eviction_count(workload) == 0:
        return None
    admitted = condition(workload, WORKLOAD_ADMITTED)
    if admitted is None or not is_true(admitted):
        return None
    return parse_time(admitted.get("lastTransitionTime"))


def _created_before(obj: Mapping[str, Any], instant: datetime) -> bool:
    created = parse_time(dig(obj, "metadata", "creationTimestamp"))
    return created is not None and created < instant


def _restart_attempt(obs: JobObservation) -> int:
    from_pods = max((restart_attempt_of(p) for p in obs.pods), default=0)
    return max(from_pods, as_int(dig(obs.job_set, "status", "restarts")))


def _is_running(obs: JobObservation, pods: list[dict[str, Any]]) -> bool:
    if dig(obs.train_job, "spec", "suspend") is True:
        return False
    if any(dig(p, "status", "phase") == "Running" and not is_deleting(p) for p in pods):
        return True
    if pods:
        return False
    # Without pods in view, fall back on the Job counters Trainer copies from the JobSet.
    statuses = dig(obs.train_job, "status", "jobsStatus") or dig(
        obs.job_set, "status", "replicatedJobsStatus"
    )
    return any(
        as_int(s.get("ready")) > 0 or as_int(s.get("active")) > 0
        for s in (statuses if isinstance(statuses, list) else [])
        if isinstance(s, Mapping)
    )


def _is_admitted(obs: JobObservation) -> bool:
    """Admitted now: through the Workload when there is one; else when not suspended."""
    if obs.workload is None:
        # A TrainJob queued in Kueue is admitted only through its Workload, which may not be
        # in view yet; without a queue it runs once it is not suspended.
        if dig(obs.train_job, "metadata", "labels", LABEL_QUEUE_NAME):
            return False
        return obs.train_job is not None and dig(obs.train_job, "spec", "suspend") is not True
    return is_admitted(obs.workload)


def _eviction(workload: Mapping[str, Any] | None) -> tuple[Evidence | None, str | None]:
    evicted = condition(workload, WORKLOAD_EVICTED)
    if workload is None or evicted is None or not is_true(evicted):
        return None, None
    token = f"{evicted.get('reason') or ''}@{evicted.get('lastTransitionTime') or ''}"
    return _condition_evidence(KIND_WORKLOAD, workload, evicted), token


def _is_deactivated(workload: Mapping[str, Any] | None) -> bool:
    return workload is not None and not is_active(workload)


def published_result(pods: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The record ``publish`` wrote to the termination message of container ``node``.

    Rank 0 is preferred; otherwise the first pod by name that carries one.
    """

    def rank(pod: Mapping[str, Any]) -> tuple[int, str]:
        index = dig(pod, "metadata", "labels", LABEL_COMPLETION_INDEX)
        return (0 if index == "0" else 1, name_of(pod))

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
    """The JSON object a termination message holds; None for anything else, never an error."""
    if not isinstance(message, str) or len(message) > PUBLISH_MAX_BYTES:
        return None
    if len(message.encode("utf-8", "surrogatepass")) > PUBLISH_MAX_BYTES:
        return None
    if not _nested_at_most(message, RECORD_MAX_DEPTH):
        return None
    try:
        record = json.loads(message)
    except (ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def _nested_at_most(document: str, limit: int) -> bool:
    """Whether the arrays and objects of ``document`` (read as JSON) nest ``limit`` deep at most."""
    depth = 0
    in_string = escaped = False
    for char in document:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return False
        elif char in "]}":
            depth -= 1
    return True


def _state_evidence(obs: JobObservation) -> tuple[str, str, tuple[Evidence, ...]]:
    """Reason, message and evidence of the condition that sets the state, when no cause does."""
    tj = obs.train_job
    for type_ in (TRAINJOB_COMPLETE, TRAINJOB_FAILED):
        cond = condition(tj, type_)
        if tj is not None and cond is not None and is_true(cond):
            ev = _condition_evidence(KIND_TRAINJOB, tj, cond)
            return ev.reason or "", ev.message or "", (ev,)
    evicted = condition(obs.workload, WORKLOAD_EVICTED)
    deactivated = obs.workload is not None and _is_deactivated(obs.workload)
    if obs.workload is not None and evicted is not None and is_true(evicted) and deactivated:
        ev = _condition_evidence(KIND_WORKLOAD, obs.workload, evicted)
        return ev.reason or "", ev.message or "", (ev,)
    for type_ in (WORKLOAD_ADMITTED, WORKLOAD_QUOTA_RESERVED):
        cond = condition(obs.workload, type_)
        if obs.workload is not None and cond is not None and cond.get("status") == "False":
            ev = _condition_evidence(KIND_WORKLOAD, obs.workload, cond)
            return ev.reason or "", ev.message or "", (ev,)
    cond = condition(tj, TRAINJOB_SUSPENDED)
    if tj is not None and cond is not None and is_true(cond):
        ev = _condition_evidence(KIND_TRAINJOB, tj, cond)
        return ev.reason or "", ev.message or "", (ev,)
    return "", "", ()


def derive(obs: JobObservation, *, loss_taints: frozenset[str]) -> DerivedStatus:
    """The state and cause of one (job, attempt) from everything watched of it."""
    restart = _restart_attempt(obs)
    admitted_pods = admission_pods(obs)
    pods = current_pods(admitted_pods, restart)
    found: list[_Found] = [
        *_workload_causes(obs.workload),
        *_node_causes(pods, obs.node_taints, loss_taints, obs.deleted_nodes),
        *_trainjob_causes(obs.train_job),
        *_pod_causes(pods),
    ]
    cause, evidence = _pick(found)
    eviction, eviction_token = _eviction(obs.workload)
    admitted = _is_admitted(obs)
    common: dict[str, Any] = {
        "admitted": admitted,
        "restart_attempt": restart,
        "result": published_result(pods) or published_result(admitted_pods),
        "eviction": eviction,
        "eviction_token": eviction_token,
    }
    state, cause = _state(obs, pods, cause)
    # State Stopped is stop_job's; a queue stopped by an administrator keeps Kueue's evidence.
    stop_job = state is State.STOPPED
    if not evidence or stop_job or cause in (None, Cause.EVIDENCE_LOST):
        reason, message, evidence = _state_evidence(obs)
    else:
        reason, message = evidence[0].reason or "", evidence[0].message or ""
    if stop_job:
        reason, message = reason or "StopJob", message or "stop_job was called"
    elif cause is Cause.EVIDENCE_LOST:
        reason = "TrainJobVanished"
        message = f"TrainJob of job {obs.job} attempt {obs.attempt} vanished before it finished"
    return DerivedStatus(
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
    if is_true(condition(tj, TRAINJOB_COMPLETE)):
        return State.SUCCEEDED, None
    if is_true(condition(tj, TRAINJOB_FAILED)):
        # A Failed TrainJob always names a cause: JobSet reasons (FailedJobs, ReachedMaxRestarts,
        # FailJobSetFailurePolicyAction) mean a child Job failed, i.e. the program did, unless a
        # pod or the Workload says more (the reason table's TrainJob rows).
        return State.FAILED, cause or Cause.PROGRAM_ERROR
    if obs.stopped:
        return State.STOPPED, Cause.STOPPED
    if tj is None:
        return State.UNKNOWN, Cause.EVIDENCE_LOST
    if _is_deactivated(obs.workload) and is_true(condition(obs.workload, WORKLOAD_EVICTED)):
        # Deactivated, the Workload is never admitted again unless someone reactivates it:
        # whatever Kueue's reason, the job was stopped by the one with authority over it.
        return State.FAILED, cause or Cause.STOPPED
    return (State.RUNNING if _is_running(obs, pods) else State.PENDING), cause
