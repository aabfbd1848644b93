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
from typing import Any

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
    POD_REASON_TAINT_MANAGER,
    POD_REASON_UNSCHEDULABLE,
    POD_SCHEDULED,
    PUBLISH_MAX_BYTES,
    REASON_DEADLINE_EXCEEDED,
    REASON_RUNTIME_NOT_SUPPORTED,
    TERMINATED_OOM,
    TRAINER_NODE,
    TRAINJOB_COMPLETE,
    TRAINJOB_FAILED,
    TRAINJOB_SUSPENDED,
    WAITING_CONFIG,
    WAITING_IMAGE_PULL,
    WL_NO_CAPACITY_REASONS,
    WL_NO_FIT_PREFIX,
    WL_PREEMPTION_UNDERWAY,
    WL_REASON_DEACTIVATED,
    WL_REASON_MAX_EXEC_TIME,
    WL_REASON_NODE_FAILURES,
    WL_REASON_PENDING,
    WL_REASON_PODS_READY_TIMEOUT,
    WL_REASON_PREEMPTED,
    WORKLOAD_ADMITTED,
    WORKLOAD_DEACTIVATION_TARGET,
    WORKLOAD_EVICTED,
    WORKLOAD_QUOTA_RESERVED,
    Cause,
    CheckState,
    State,
)
from dispatch_kubeflow.events import DerivedStatus, Evidence, JobObservation, Taint
from dispatch_kubeflow.kube.objects import (
    as_int,
    condition,
    dig,
    is_deleting,
    is_true,
    mappings,
    name_of,
)
from dispatch_kubeflow.kube.workloads import (
    is_active,
    is_admitted,
    rejected_checks,
)

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

_Found = tuple[Cause, Evidence]


def _workload_causes(workload: Mapping[str, Any] | None) -> Iterator[_Found]:
    if workload is None:
        return
    evicted = condition(workload, WORKLOAD_EVICTED)
    if is_true(evicted):
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
    quota = condition(workload, WORKLOAD_QUOTA_RESERVED)
    if quota is not None and _lacks_capacity(quota):
        yield Cause.NO_CAPACITY, _condition_evidence(KIND_WORKLOAD, workload, quota)
    for check in rejected_checks(workload):
        yield (
            Cause.ADMISSION_REJECTED,
            Evidence(
                kind=KIND_WORKLOAD,
                name=name_of(workload),
                field="status.admissionChecks",
                type=str(check.get("name") or ""),
                status=CheckState.REJECTED,
                reason=CheckState.REJECTED,
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
    target = condition(workload, WORKLOAD_DEACTIVATION_TARGET)
    if target is not None:
        texts += [str(target.get("reason") or ""), str(target.get("message") or "")]
    stats = dig(workload, "status", "schedulingStats", "evictions")
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
    failed = condition(train_job, TRAINJOB_FAILED)
    if train_job is None or not is_true(failed):
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
        if dig(pod, "status", "phase") == "Succeeded":
            continue
        node = dig(pod, "spec", "nodeName")
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
                        message=f"pod {name_of(pod)} runs on node {node} tainted {taint.key}"
                        f":{taint.effect}",
                    ),
                )
        disruption = condition(pod, POD_DISRUPTION_TARGET)
        if (
            disruption is not None
            and is_true(disruption)
            and disruption.get("reason") == POD_REASON_TAINT_MANAGER
        ):
            yield Cause.NODE_LOST, _condition_evidence(KIND_POD, pod, disruption)


def _container_causes(pods: Iterable[Mapping[str, Any]]) -> Iterator[_Found]:
    for pod in pods:
        scheduled = condition(pod, POD_SCHEDULED)
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
    waiting = dig(status, "state", "waiting")
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
                    name=name_of(pod),
                    field="status.containerStatuses.state.waiting",
                    container=container,
                    reason=str(reason),
                    message=str(waiting.get("message") or ""),
                ),
            )
    for terminated in _terminations(status):
        code = as_int(terminated.get("exitCode"))
        reason = str(terminated.get("reason") or "")
        if reason != TERMINATED_OOM and code == 0:
            continue
        signal = as_int(terminated.get("signal")) or (code - 128 if code > 128 else 0)
        yield (
            Cause.OUT_OF_MEMORY if reason == TERMINATED_OOM else Cause.PROGRAM_ERROR,
            Evidence(
                kind=KIND_POD,
                name=name_of(pod),
                field="status.containerStatuses.state.terminated",
                container=container,
                exit_code=code,
                signal=signal or None,
                reason=reason,
                message=str(terminated.get("message") or "")[:PUBLISH_MAX_BYTES],
                node=dig(pod, "spec", "nodeName"),
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
        cond = condition(tj, type_)
        if tj is not None and cond is not None and is_true(cond):
            ev = _condition_evidence(KIND_TRAINJOB, tj, cond)
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
        # FailJobSetFailurePolicyAction) mean a child Job failed, i.e. the program did.
        return State.FAILED, cause or Cause.PROGRAM_ERROR
    if obs.stopped:
        return State.STOPPED, Cause.STOPPED
    if tj is None:
        return State.UNKNOWN, Cause.EVIDENCE_LOST
    if _is_deactivated(obs.workload) and is_true(condition(obs.workload, WORKLOAD_EVICTED)):
        return State.FAILED, cause
    return (State.RUNNING if _is_running(obs, pods) else State.PENDING), cause
