"""The reason table: every upstream reason the adapter reads, and the cause it means.

Kueue, Trainer, JobSet, the scheduler, the kubelet and the controllers of kube-controller-manager
each explain a job in their own words. One row here says, for one of those words, which object and
field it is read from, the cause it stands for (``None``: deliberately not a cause) and why, by the
principle of ``SPEC.md`` §6: a cause answers "whose fault, and what next".

Derivation asks the lookup functions at the end; ``docs/events.md`` shows the same rows, written
between two marker comments by ``python -m dispatch_kubeflow.reasons --write`` (``--check`` exits
1 when the committed table is stale). A test reads the pinned upstream sources and fails on a
reason that has no row, so raising a pin shows every new reason at once.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from dispatch_kubeflow.constants import (
    TAINT_NOT_READY,
    TAINT_OUT_OF_SERVICE,
    TAINT_UNREACHABLE,
    Cause,
)

# A row whose reason is ANY matches every reason not matched by an earlier row of its field.
ANY = "*"


class Where(StrEnum):
    """The object and field a reason is read from."""

    WORKLOAD_QUOTA_RESERVED = "Workload QuotaReserved=False"
    WORKLOAD_EVICTED = "Workload Evicted=True"
    WORKLOAD_DEACTIVATION = "Workload DeactivationTarget / evictions[].underlyingCause"
    WORKLOAD_CHECK = "Workload status.admissionChecks[].state"
    WORKLOAD_ADMITTED = "Workload Admitted=False"
    WORKLOAD_UNREAD = "Workload, other conditions"
    TRAINJOB = "TrainJob Complete / Failed / Suspended"
    JOBSET_UNREAD = "JobSet conditions and Events"
    POD_SCHEDULED = "Pod PodScheduled=False"
    POD_DISRUPTION = "Pod DisruptionTarget=True"
    POD_FAILED = "Pod status.reason (phase Failed)"
    POD_UNREAD = "Pod, other conditions"
    CONTAINER_WAITING = "container state.waiting.reason"
    CONTAINER_TERMINATED = "container terminated.reason (state or lastState)"
    NODE_TAINT = "Node spec.taints[].key (effect NoExecute)"


@dataclass(frozen=True)
class Reason:
    """One upstream reason (or, with ``message``, one kind of its messages) and its cause."""

    where: Where
    # One reason, or several that share the row.
    reason: str | tuple[str, ...]
    cause: Cause | None
    why: str
    # Who writes it: kueue, trainer, jobset, kubernetes (k8s.io/api, kube-controller-manager,
    # kube-scheduler, kube-apiserver), kubelet, or runtime (the container runtime, via CRI).
    source: str
    # A regular expression searched in the message: the row applies only when it matches.
    message: str | None = None
    # ``reason`` is a prefix (kubelet's ``OutOf<resource>``, JobSet's ``FailurePolicy_<rule>``).
    prefix: bool = False
    # The row applies only to a Workload evicted because its queue was stopped.
    after_queue_stop: bool = False
    # Literal text of the message as the pinned upstream source writes it; the upstream-sources
    # test checks it is still there, so a changed message is seen when a pin is raised.
    upstream_text: str | None = None

    @property
    def reasons(self) -> tuple[str, ...]:
        return self.reason if isinstance(self.reason, tuple) else (self.reason,)

    def matches(self, reason: str, message: str, *, queue_stopped: bool) -> bool:
        if self.after_queue_stop and not queue_stopped:
            return False
        if ANY not in self.reasons and not any(
            reason.startswith(name) if self.prefix else reason == name for name in self.reasons
        ):
            return False
        return self.message is None or re.search(self.message, message, re.DOTALL) is not None


W = Where
C = Cause
KUEUE, TRAINER, JOBSET, KUBE, KUBELET, RUNTIME = (
    "kueue",
    "trainer",
    "jobset",
    "kubernetes",
    "kubelet",
    "runtime",
)

# Messages Kueue writes about a Workload's queues (pkg/controller/core/workload_controller.go,
# pkg/scheduler/scheduler.go): the same texts under reason Inadmissible (gate
# UnadmittedWorkloadsObservability off), Misconfigured or Suspended (on), or Pending.
_QUEUE_MISSING = (
    r"^(LocalQueue|ClusterQueue) \S+ (doesn't exist|is terminating or missing|not found)"
)
_QUEUE_STOPPED = r"^(LocalQueue \S+ is (inactive|stopped)|ClusterQueue \S+ is stopped)"
_CLUSTER_QUEUE_INACTIVE = r"^ClusterQueue \S+ is inactive"
_NOT_ADMISSIBLE = (
    r"^(workload namespace doesn't match ClusterQueue selector"
    r"|workload namespace \S+ does not exist"
    r"|resources validation failed"
    r"|resources didn't satisfy LimitRange constraints)"
)
_NO_FIT = r"^couldn't assign flavors to pod set"
_PREEMPTION_UNDERWAY = r"Pending the preemption of|Preempting \d+ workload|Pending the migration of"


# The reasons under which Kueue writes those messages.
_QUEUE_REASONS = ("Inadmissible", "Misconfigured", "Suspended", "Pending")


def _queue_rows() -> Iterator[Reason]:
    """The messages Kueue writes about a Workload's LocalQueue and ClusterQueue."""
    q = W.WORKLOAD_QUOTA_RESERVED
    yield Reason(
        q,
        _QUEUE_REASONS,
        C.CONFIG_ERROR,
        "the job names a LocalQueue, or its LocalQueue a ClusterQueue, that does not exist",
        KUEUE,
        message=_QUEUE_MISSING,
        upstream_text="LocalQueue %s doesn't exist",
    )
    yield Reason(
        q,
        _QUEUE_REASONS,
        C.STOPPED,
        "an administrator stopped the queue (stopPolicy); the job waits until it is resumed",
        KUEUE,
        message=_QUEUE_STOPPED,
        upstream_text="LocalQueue %s is inactive",
    )
    yield Reason(
        q,
        _QUEUE_REASONS,
        C.STOPPED,
        "the ClusterQueue went inactive when an administrator stopped it under the job",
        KUEUE,
        message=_CLUSTER_QUEUE_INACTIVE,
        after_queue_stop=True,
        upstream_text="ClusterQueue %s is inactive",
    )
    yield Reason(
        q,
        _QUEUE_REASONS,
        C.CONFIG_ERROR,
        "an inactive ClusterQueue (missing flavor or admission check, or stopped before the "
        "job came: the Workload does not say which) admits nothing until an administrator acts",
        KUEUE,
        message=_CLUSTER_QUEUE_INACTIVE,
    )
    yield Reason(
        q,
        _QUEUE_REASONS,
        C.CONFIG_ERROR,
        "the job's namespace or resource requests do not fit the queue's rules",
        KUEUE,
        message=_NOT_ADMISSIBLE,
        upstream_text="workload namespace doesn't match ClusterQueue selector",
    )


def _rows() -> Iterator[Reason]:
    q = W.WORKLOAD_QUOTA_RESERVED
    # -- Workload QuotaReserved=False --------------------------------------------------------------
    yield from _queue_rows()
    yield Reason(
        q,
        "Pending",
        None,
        "Kueue found room by preempting or migrating others: the job fits once they are gone",
        KUEUE,
        message=_PREEMPTION_UNDERWAY,
        upstream_text=". Pending the preemption of %d workload(s)",
    )
    yield Reason(
        q,
        "Pending",
        C.NO_CAPACITY,
        "the flavor assigner's verdict: no flavor has room for a pod set (gate off)",
        KUEUE,
        message=_NO_FIT,
        upstream_text="couldn't assign flavors to pod set ",
    )
    yield Reason(
        q,
        "Pending",
        None,
        "waiting for the scheduler, or an eviction's quota being released (gate off)",
        KUEUE,
    )
    yield Reason(
        q,
        "Inadmissible",
        C.CONFIG_ERROR,
        "Kueue cannot queue the job (gate off: Misconfigured and Suspended both read this)",
        KUEUE,
    )
    yield Reason(q, "Misconfigured", C.CONFIG_ERROR, "the job or its queue is misconfigured", KUEUE)
    yield Reason(q, "Suspended", C.STOPPED, "the LocalQueue or ClusterQueue is stopped", KUEUE)
    for reason, why in (
        ("WaitingForQuota", "waiting for unused quota in the ClusterQueue or cohort"),
        ("NoMatchingFlavor", "no ResourceFlavor matches the pods' node selector or tolerations"),
        ("ExceedsMaxQuota", "the job asks for more than the queue can ever hold"),
        ("TopologyPlacementFailed", "no topology domain has room for the pods"),
    ):
        yield Reason(q, reason, C.NO_CAPACITY, why, KUEUE)
    for reason, why in (
        ("WaitingForPreemptedWorkloads", "it fits once the workloads being preempted are gone"),
        ("PendingEvaluation", "waiting for the scheduler to look at it"),
        ("WaitingForPodsReady", "waitForPodsReady holds admissions until others' pods are ready"),
        ("Waiting", "WaitingForPodsReady with the gate off"),
        ("AdmissionGated", "an AdmissionGatedBy annotation holds it; its owner decides"),
        ("OnHold", "StatefulSet scale-to-zero; never a TrainJob's"),
        ("Deactivated", "the Evicted condition tells why it was deactivated"),
    ):
        yield Reason(q, reason, None, why, KUEUE)

    # -- Workload Evicted=True ---------------------------------------------------------------------
    e = W.WORKLOAD_EVICTED
    yield Reason(
        e, "Preempted", C.PREEMPTED, "a higher-priority or reclaiming workload took it", KUEUE
    )
    yield Reason(
        e,
        "AdmissionCheck",
        C.ADMISSION_REJECTED,
        "an admission check rejected it",
        KUEUE,
        message=r"in Rejected state",
    )
    yield Reason(
        e,
        "AdmissionCheck",
        C.PREEMPTED,
        "an admission check went Retry: the capacity it had granted (a ProvisioningRequest, "
        "the dispatch gate) was revoked",
        KUEUE,
        upstream_text="Evicted due to %s",
    )
    yield Reason(
        e, "ClusterQueueStopped", C.STOPPED, "an administrator stopped the ClusterQueue", KUEUE
    )
    yield Reason(
        e, "LocalQueueStopped", C.STOPPED, "an administrator stopped the LocalQueue", KUEUE
    )
    yield Reason(e, "NodeFailures", C.NODE_LOST, "Kueue's failure recovery: nodes failed", KUEUE)
    yield Reason(
        e, "PodsReadyTimeout", C.PODS_READY_TIMEOUT, "its pods were not ready in time", KUEUE
    )
    yield Reason(
        e,
        "FlavorMigration",
        C.PREEMPTED,
        "evicted to move it to a more favourable flavor: the cluster took its capacity back",
        KUEUE,
    )
    for cause, underlying in (
        (C.TIMEOUT, "MaximumExecutionTimeExceeded"),
        (C.PODS_READY_TIMEOUT, "RequeuingLimitExceeded"),
        (C.ADMISSION_REJECTED, "AdmissionCheck"),
    ):
        yield Reason(
            e,
            f"DeactivatedDueTo{underlying}",
            cause,
            f"Kueue deactivated it for {underlying}",
            KUEUE,
        )
    yield Reason(
        e,
        "DeactivatedDueToEvictedOnManagerCluster",
        None,
        "only on a MultiKueue worker cluster, which the adapter does not serve",
        KUEUE,
    )
    yield Reason(
        e,
        "DeactivatedDueTo",
        C.STOPPED,
        "Kueue deactivated it for a cause this table does not name: it runs again only when "
        "someone sets spec.active: true",
        KUEUE,
        prefix=True,
    )
    for cause, text, why in (
        (C.TIMEOUT, r"(?i)maximum execution time", "deactivated for its maximum execution time"),
        (C.PODS_READY_TIMEOUT, r"(?i)re-queuing retries", "requeued too often after timeouts"),
        (C.ADMISSION_REJECTED, r"(?i)admission ?check|rejected", "an admission check rejected"),
    ):
        yield Reason(e, "Deactivated", cause, why, KUEUE, message=text)
    yield Reason(
        e,
        "Deactivated",
        C.STOPPED,
        "someone set spec.active: false and no other reason is recorded",
        KUEUE,
    )
    yield Reason(
        e,
        "EvictedOnManagerCluster",
        None,
        "only on a MultiKueue worker cluster, which the adapter does not serve",
        KUEUE,
    )
    yield Reason(
        e,
        "WorkloadSliceReplaced",
        None,
        "elastic workload slices: the job goes on under its replacement slice",
        KUEUE,
    )

    # -- Workload DeactivationTarget, and schedulingStats.evictions[].underlyingCause --------------
    d = W.WORKLOAD_DEACTIVATION
    yield Reason(
        d, "MaximumExecutionTimeExceeded", C.TIMEOUT, "its maximum execution time ran out", KUEUE
    )
    yield Reason(
        d,
        "RequeuingLimitExceeded",
        C.PODS_READY_TIMEOUT,
        "Kueue gives up after repeated PodsReady timeouts",
        KUEUE,
    )
    yield Reason(d, "AdmissionCheck", C.ADMISSION_REJECTED, "an admission check rejected it", KUEUE)
    yield Reason(d, "EvictedOnManagerCluster", None, "only on a MultiKueue worker cluster", KUEUE)
    for reason in ("WaitForStart", "WaitForRecovery"):
        yield Reason(
            d,
            reason,
            None,
            "the underlying cause of a PodsReadyTimeout eviction, which carries the cause",
            KUEUE,
        )

    # -- Workload status.admissionChecks[].state ---------------------------------------------------
    c = W.WORKLOAD_CHECK
    yield Reason(c, "Rejected", C.ADMISSION_REJECTED, "the check refused the job", KUEUE)
    yield Reason(
        c, "Retry", None, "Kueue evicts with reason AdmissionCheck, which has the cause", KUEUE
    )
    yield Reason(c, "Pending", None, "the check has not decided yet", KUEUE)
    yield Reason(c, "Ready", None, "the check passed", KUEUE)

    # -- Workload Admitted=False: evidence for a Pending state, never a cause ----------------------
    for reason in ("NoReservation", "UnsatisfiedAdmissionChecks", "PendingDelayedTopologyRequests"):
        yield Reason(
            W.WORKLOAD_ADMITTED,
            reason,
            None,
            "a stage of admission; QuotaReserved and the checks say why",
            KUEUE,
        )

    # -- Workload conditions the adapter does not read ---------------------------------------------
    u = W.WORKLOAD_UNREAD
    for reason, why in (
        ("InClusterQueue", "Preempted condition; Evicted reason Preempted carries the cause"),
        ("InCohortReclamation", "Preempted condition; Evicted reason Preempted carries the cause"),
        ("InCohortFairSharing", "Preempted condition; Evicted reason Preempted carries the cause"),
        (
            "InCohortReclaimWhileBorrowing",
            "Preempted condition; Evicted reason Preempted carries the cause",
        ),
        ("BackoffFinished", "Requeued condition: the job is queued again"),
        ("Reactivated", "Requeued condition: the job is queued again"),
        ("ClusterQueueRestarted", "Requeued condition: the job is queued again"),
        ("LocalQueueRestarted", "Requeued condition: the job is queued again"),
        ("Started", "PodsReady condition; readiness is read from the pods"),
        ("Recovered", "PodsReady condition; readiness is read from the pods"),
        ("Succeeded", "Finished condition; the TrainJob's own conditions decide"),
        ("Failed", "Finished condition; the TrainJob's own conditions decide"),
        ("OutOfSync", "Finished condition of prebuilt workloads, which TrainJobs do not use"),
        ("OwnerNotFound", "Finished condition; a vanished TrainJob is EvidenceLost"),
        (
            "PreemptionGated",
            "BlockedOnPreemptionGates condition (MultiKueue, concurrent admission)",
        ),
    ):
        yield Reason(u, reason, None, why, KUEUE)

    # -- TrainJob conditions (Failed/Complete reasons are copied from the JobSet) ------------------
    t = W.TRAINJOB
    yield Reason(t, "DeadlineExceeded", C.TIMEOUT, "activeDeadlineSeconds ran out", TRAINER)
    yield Reason(
        t,
        "TrainingRuntimeNotSupported",
        C.RUNTIME_UNSUPPORTED,
        "Trainer cannot run the job's runtime",
        TRAINER,
    )
    for reason in ("FailedJobs", "ReachedMaxRestarts", "FailJobSetFailurePolicyAction"):
        yield Reason(
            t,
            reason,
            C.PROGRAM_ERROR,
            "a child Job failed: the program did, unless a pod or the Workload says more",
            JOBSET,
        )
    yield Reason(t, "AllJobsCompleted", None, "success has no cause", JOBSET)
    yield Reason(t, "Suspended", None, "suspended while Kueue holds it", TRAINER)
    yield Reason(t, "Resumed", None, "resumed on admission", TRAINER)

    # -- JobSet conditions and Events the adapter does not read ------------------------------------
    j = W.JOBSET_UNREAD
    for reason in ("SuspendedJobs", "ResumeJobs"):
        yield Reason(j, reason, None, "JobSet Suspended; the TrainJob's says the same", JOBSET)
    for reason in (
        "DefaultFailurePolicy",
        "JobsReady",
        "JobSetFailed",
        "JobSetCompleted",
        "JobSetSuspended",
    ):
        yield Reason(
            j,
            reason,
            None,
            "RestartingJobSet condition; restarts are read from restart-attempt",
            JOBSET,
        )
    yield Reason(
        j,
        "FailurePolicy_",
        None,
        "RestartingJobSet condition; restarts are read from restart-attempt",
        JOBSET,
        prefix=True,
    )
    for reason in ("InOrderStartupPolicyInProgress", "InOrderStartupPolicyCompleted"):
        yield Reason(j, reason, None, "startup-policy condition, not an outcome", JOBSET)
    for reason in (
        "JobCreationFailed",
        "HeadlessServiceCreationFailed",
        "PVCCreationFailed",
        "ExclusivePlacementViolation",
        "Restarting",
        "RestartJobSetFailurePolicyAction",
        "RestartJobSetAndIgnoreMaxRestartsFailurePolicyAction",
        "RestartJobFailurePolicyAction",
        "RestartJobAndIgnoreMaxRestartsFailurePolicyAction",
    ):
        yield Reason(j, reason, None, "a Kubernetes Event's reason; Events are not read", JOBSET)

    # -- Pod PodScheduled=False --------------------------------------------------------------------
    s = W.POD_SCHEDULED
    yield Reason(s, "Unschedulable", C.NO_CAPACITY, "no node can hold the pod", KUBE)
    yield Reason(s, "SchedulingGated", None, "held by a scheduling gate (Kueue's TAS)", KUBE)
    yield Reason(s, "SchedulerError", None, "the scheduler's own error; it retries", KUBE)

    # -- Pod DisruptionTarget=True -----------------------------------------------------------------
    p = W.POD_DISRUPTION
    yield Reason(
        p,
        "DeletionByTaintManager",
        C.NODE_LOST,
        "deleted for a NoExecute taint of its node",
        KUBE,
    )
    yield Reason(p, "DeletionByPodGC", C.NODE_LOST, "its node was deleted", KUBE)
    yield Reason(
        p,
        "DeletionByDeviceTaintManager",
        C.NODE_LOST,
        "a device it uses (a GPU) was tainted NoExecute: the hardware failed under it",
        KUBE,
    )
    yield Reason(
        p,
        "TerminationByKubelet",
        C.PREEMPTED,
        "the kubelet preempted it to make room for a critical pod",
        KUBELET,
        message=r"preempted by Kubelet",
        upstream_text="Pod was preempted by Kubelet to accommodate a critical pod.",
    )
    yield Reason(
        p,
        "TerminationByKubelet",
        C.NODE_LOST,
        "node-pressure eviction or graceful node shutdown",
        KUBELET,
    )
    yield Reason(
        p,
        "PreemptionByScheduler",
        C.PREEMPTED,
        "the scheduler preempted it for a higher-priority pod",
        KUBE,
    )
    yield Reason(
        p,
        "EvictionByEvictionAPI",
        C.PREEMPTED,
        "evicted through the Eviction API (a node drain): the cluster took the node back",
        KUBE,
    )

    # -- Pod status.reason, set when the kubelet fails a pod ---------------------------------------
    f = W.POD_FAILED
    yield Reason(
        f,
        "UnexpectedAdmissionError",
        C.NODE_LOST,
        "the kubelet could not allocate what it had advertised (a GPU its device plugin lost)",
        KUBELET,
    )
    yield Reason(
        f,
        "OutOf",
        C.NO_CAPACITY,
        "the node had too little of a resource when the kubelet admitted the pod",
        KUBELET,
        prefix=True,
    )
    yield Reason(
        f, "Evicted", C.NODE_LOST, "node-pressure eviction (or refused under pressure)", KUBELET
    )
    yield Reason(f, "Terminated", C.NODE_LOST, "graceful node shutdown", KUBELET)
    yield Reason(f, "NodeShutdown", C.NODE_LOST, "refused while its node shuts down", KUBELET)
    yield Reason(
        f, "Preempting", C.PREEMPTED, "preempted by the kubelet for a critical pod", KUBELET
    )
    yield Reason(
        f, "DeadlineExceeded", C.TIMEOUT, "the pod's activeDeadlineSeconds ran out", KUBELET
    )
    for reason, why in (
        ("InvalidNodeInfo", "the kubelet could not read its own Node"),
        ("UnknownReason", "the kubelet refused it for a reason it could not name"),
        ("UnexpectedPredicateFailureType", "the kubelet refused it for a reason it could not name"),
        ("NodeAffinity", "the node's labels changed after the pod was bound to it"),
        ("NodeName", "the node changed under the bound pod"),
        ("TaintToleration", "the node was tainted NoExecute after the pod was bound to it"),
    ):
        yield Reason(f, reason, C.NODE_LOST, why, KUBELET)
    yield Reason(
        f, "NodePorts", C.NO_CAPACITY, "a host port it needs is taken on the node", KUBELET
    )
    yield Reason(
        f,
        "TopologyAffinityError",
        C.NO_CAPACITY,
        "the node has no room with the required NUMA alignment",
        KUBELET,
    )
    for reason in (
        "PodOSSelectorNodeLabelDoesNotMatch",
        "PodOSNotSupported",
        "InitContainerRestartPolicyForbidden",
        "SupplementalGroupsPolicyNotSupported",
        "AppArmor",
        "PodLevelResourcesNotSupported",
        "PodFeatureUnsupported",
        "SysctlForbidden",
        "SMTAlignmentError",
        "EmptyPodSharedPoolError",
    ):
        yield Reason(
            f, reason, C.CONFIG_ERROR, "the pod asks for something the node refuses", KUBELET
        )

    # -- Pod conditions the adapter does not read --------------------------------------------------
    for reason in ("Deferred", "Infeasible", "Error"):
        yield Reason(
            W.POD_UNREAD,
            reason,
            None,
            "in-place resize conditions; a dispatch job is never resized",
            KUBE,
        )

    # -- Container waiting -------------------------------------------------------------------------
    cw = W.CONTAINER_WAITING
    for reason in (
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "ImageInspectError",
    ):
        yield Reason(cw, reason, C.IMAGE_PULL, "the image cannot be had", KUBELET)
    for reason in (
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "PreCreateHookError",
        "PreStartHookError",
        "PostStartHookError",
    ):
        yield Reason(
            cw,
            reason,
            C.CONFIG_ERROR,
            "the container cannot be made or started as specified",
            KUBELET,
        )
    yield Reason(
        cw, "CrashLoopBackOff", None, "its last termination (lastState) has the cause", KUBELET
    )
    for reason in ("ContainerCreating", "PodInitializing", "RestartingAllContainers"):
        yield Reason(cw, reason, None, "on its way to running", KUBELET)
    for reason in (
        "KillContainerError",
        "CreatePodSandboxError",
        "ConfigPodSandboxError",
        "KillPodSandboxError",
        "ResizePodInPlaceError",
        "RemoveContainerError",
    ):
        yield Reason(
            cw,
            reason,
            None,
            "a kubelet sync result that never becomes a container's waiting reason",
            KUBELET,
        )

    # -- Container terminated ----------------------------------------------------------------------
    ct = W.CONTAINER_TERMINATED
    yield Reason(
        ct,
        "OOMKilled",
        C.OUT_OF_MEMORY,
        "killed for memory; with exit code 0 not a cause: the kubelet can report OOMKilled for a "
        "container that succeeded (kubernetes/kubernetes#116042)",
        RUNTIME,
    )
    for reason in ("StartError", "ContainerCannotRun"):
        yield Reason(
            ct,
            reason,
            C.CONFIG_ERROR,
            "the runtime could not start the command: the image or command is wrong",
            RUNTIME,
        )
    yield Reason(ct, "Completed", None, "exit code 0", RUNTIME)
    yield Reason(
        ct,
        ANY,
        C.PROGRAM_ERROR,
        "a non-zero exit code (exit code and signal in the evidence); exit code 0 is no cause",
        RUNTIME,
    )

    # -- Node taints -------------------------------------------------------------------------------
    for taint, why in (
        (TAINT_UNREACHABLE, "the node stopped renewing its Lease"),
        (TAINT_NOT_READY, "the node reports itself not ready"),
        (TAINT_OUT_OF_SERVICE, "an administrator declared the node down"),
    ):
        yield Reason(W.NODE_TAINT, taint, C.NODE_LOST, why, KUBE)


TABLE: tuple[Reason, ...] = tuple(_rows())


# --------------------------------------------------------------------------------------------
# Lookups derivation calls


def find(
    where: Where, reason: str, message: str = "", *, queue_stopped: bool = False
) -> Reason | None:
    """The first row of ``where`` that matches ``reason`` and ``message``, if any."""
    return next(
        (
            row
            for row in TABLE
            if row.where is where and row.matches(reason, message, queue_stopped=queue_stopped)
        ),
        None,
    )


def cause_of(
    where: Where, reason: str, message: str = "", *, queue_stopped: bool = False
) -> Cause | None:
    row = find(where, reason, message, queue_stopped=queue_stopped)
    return row.cause if row is not None else None


def quota_reserved_cause(reason: str, message: str, *, queue_stopped: bool) -> Cause | None:
    """The cause of a Workload's ``QuotaReserved=False``; ``queue_stopped`` when the Workload
    was evicted because its LocalQueue or ClusterQueue was stopped."""
    return cause_of(W.WORKLOAD_QUOTA_RESERVED, reason, message, queue_stopped=queue_stopped)


def eviction_cause(reason: str, message: str, underlying: Sequence[str] = ()) -> Cause | None:
    """The cause of a Workload's ``Evicted=True``.

    ``underlying`` are the deactivation causes Kueue recorded elsewhere (the
    ``DeactivationTarget`` condition, ``schedulingStats.evictions[].underlyingCause``): a plain
    ``Deactivated`` eviction with one of them is that cause, not a person's stop.
    """
    if reason == "Deactivated":
        for cause in (cause_of(W.WORKLOAD_DEACTIVATION, u) for u in underlying):
            if cause is not None:
                return cause
    return cause_of(W.WORKLOAD_EVICTED, reason, message)


def is_queue_stop(eviction_reason: str) -> bool:
    """Whether an eviction reason says the Workload's queue was stopped."""
    return eviction_reason in ("ClusterQueueStopped", "LocalQueueStopped")


def check_cause(state: str) -> Cause | None:
    return cause_of(W.WORKLOAD_CHECK, state)


def trainjob_failed_cause(reason: str) -> Cause | None:
    return cause_of(W.TRAINJOB, reason)


def scheduling_cause(reason: str) -> Cause | None:
    return cause_of(W.POD_SCHEDULED, reason)


def disruption_cause(reason: str, message: str) -> Cause | None:
    """The cause of a pod's ``DisruptionTarget=True``."""
    return cause_of(W.POD_DISRUPTION, reason, message)


def pod_failure_cause(reason: str) -> Cause | None:
    """The cause of a pod the kubelet failed with ``status.reason``."""
    return cause_of(W.POD_FAILED, reason)


def waiting_cause(reason: str) -> Cause | None:
    return cause_of(W.CONTAINER_WAITING, reason)


def terminated_cause(reason: str, exit_code: int) -> Cause | None:
    """The cause of a terminated container: none for exit code 0, whatever the reason."""
    return None if exit_code == 0 else cause_of(W.CONTAINER_TERMINATED, reason)


# --------------------------------------------------------------------------------------------
# The table in docs/events.md

DOC_FILE = "docs/events.md"
BEGIN = "<!-- reason table: generated by python -m dispatch_kubeflow.reasons --write -->"
END = "<!-- end of reason table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """The reason table as Markdown, one section per object and field."""
    lines: list[str] = []
    for where in Where:
        rows = [row for row in TABLE if row.where is where]
        if not rows:
            continue
        lines += ["", f"**{where.value}**", "", "| reason | message | cause | why | set by |"]
        lines.append("|---|---|---|---|---|")
        for row in rows:
            suffix = "…" if row.prefix else ""
            reason = ", ".join(
                "(any other)" if name == ANY else f"`{name}{suffix}`" for name in row.reasons
            )
            message = f"`{_cell(row.message)}`" if row.message else ""
            if row.after_queue_stop:
                message += " after a queue stop" if message else "after a queue stop"
            cause = f"`{row.cause.value}`" if row.cause is not None else "ignored"
            lines.append(f"| {reason} | {message} | {cause} | {_cell(row.why)} | {row.source} |")
    return "\n".join(lines[1:]) + "\n"


def render(document: str) -> str:
    """``document`` with the text between the markers replaced by the current table."""
    start, end = document.find(BEGIN), document.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC_FILE} lacks the markers {BEGIN!r} ... {END!r}")
    return f"{document[: start + len(BEGIN)]}\n\n{markdown()}\n{document[end:]}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_kubeflow.reasons",
        description=f"Write or check the reason table in {DOC_FILE}.",
    )
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the table")
    action.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args(argv)
    path: Path = args.root / DOC_FILE
    current = path.read_text()
    wanted = render(current)
    if args.write:
        path.write_text(wanted)
        return 0
    if current != wanted:
        print(
            f"{DOC_FILE}: the reason table is stale: run python -m dispatch_kubeflow.reasons "
            "--write",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
