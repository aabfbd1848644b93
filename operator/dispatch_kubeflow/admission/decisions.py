"""What the admission controller decides: pure functions of the objects it sees.

The rules (``decide``):

* A Workload's check is decided only while its entry is ``Pending`` and the Workload holds quota
  (``QuotaReserved=True``), is active, is not being evicted, and has not finished. A decision is
  final for that admission: Kueue itself resets every check to ``Pending`` when it evicts, which
  starts the next round. So the controller never changes a decision it made, and never writes one
  twice.
* The *eviction count* of a Workload (``kube.workloads.eviction_count``) is the sum of
  ``status.schedulingStats.evictions[].count``, which Kueue increments in the same write that sets
  ``Evicted=True`` and resets the checks; at least 1 when an ``Evicted`` condition exists at all,
  at least ``status.requeueState.count``. A *first admission* is one with eviction count 0.
* A Workload of a namespace that no KubeflowAdapter of this check serves is not held: ``Ready``
  at once, so listing the check on a ClusterQueue shared with other teams blocks nobody.
* A Workload not owned by a dispatch TrainJob (a TrainJob carrying the ``job`` label) is not held:
  ``Ready``.
* ``reject``: the TrainJob's ``dispatch.phpboyscout.uk/reject`` annotation, when not empty, makes
  the check ``Rejected`` with its value as the message. Kueue then deactivates the Workload.
* A first admission is ``Ready``.
* After an eviction the check stays ``Pending`` until the TrainJob's
  ``dispatch.phpboyscout.uk/readmit`` annotation holds a decimal integer at least the eviction
  count: the dispatch side readmits "the job as of its N-th eviction" by writing N. A later eviction
  raises the count and closes the gate again without anyone touching the annotation.

A decision is written as a server-side apply body (``workload_apply_body``) holding only this
controller's entry of ``status.admissionChecks`` (a list map keyed by ``name``, so other
controllers' entries are not touched) and the ``resourceVersion`` the decision was made from.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dispatch_kubeflow.clock import format_time
from dispatch_kubeflow.constants import (
    ADMISSION_CHECK_ACTIVE,
    ADMISSION_CONTROLLER_NAME,
    ANNOTATION_READMIT,
    ANNOTATION_REJECT,
    KIND_ADMISSION_CHECK,
    KIND_WORKLOAD,
    KUEUE_GROUP,
    KUEUE_VERSION,
    LABEL_JOB,
    CheckState,
)
from dispatch_kubeflow.kube.objects import (
    STATUS_TRUE,
    Obj,
    annotations_of,
    condition,
    dig,
    is_true,
    labels_of,
    name_of,
    namespace_of,
    resource_version_of,
    text,
)
from dispatch_kubeflow.kube.workloads import (
    check_entry,
    eviction_count,
    has_quota_reservation,
    is_active,
    is_evicted,
    is_finished,
)

KUEUE_API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
MAX_MESSAGE = 1024  # Kueue allows 32 KiB; a reason longer than this is a mistake, not a reason.


@dataclass(frozen=True)
class Decision:
    """What this controller's entry on one Workload should say."""

    state: CheckState
    message: str


def _readmitted_up_to(value: str | None) -> int | None:
    if value is None:
        return None
    digits = value.strip()
    return int(digits) if digits.isdigit() else None


def decide(
    workload: Obj, trainjob: Obj | None, check: str, *, served: bool = True
) -> Decision | None:
    """The decision for ``check`` on ``workload``, or None when there is nothing to write.

    ``trainjob`` is the dispatch TrainJob that owns the Workload, or None when the Workload has no
    TrainJob owner at all (the caller waits when the owner exists but is not in view yet).
    ``served`` says whether a KubeflowAdapter of ``check`` serves the Workload's namespace; when
    none does, the Workload is no dispatch job's and is not held.
    """
    entry = check_entry(workload, check)
    if entry is None or entry.get("state") != CheckState.PENDING:
        return None
    if not has_quota_reservation(workload):
        return None
    if is_finished(workload) or is_evicted(workload):
        return None  # an eviction in progress is decided at the requeue, when quota is reserved
    if not is_active(workload):
        return None
    decision = _decide_pending(workload, trainjob) if served else _not_served(workload, check)
    if decision.state == CheckState.PENDING and decision.message == entry.get("message"):
        return None
    return decision


def _not_served(workload: Obj, check: str) -> Decision:
    return Decision(
        CheckState.READY,
        f"no KubeflowAdapter of AdmissionCheck {check} serves namespace "
        f"{namespace_of(workload)}: not held by the readmission gate",
    )


def _decide_pending(workload: Obj, trainjob: Obj | None) -> Decision:
    if trainjob is None or LABEL_JOB not in labels_of(trainjob):
        return Decision(CheckState.READY, "not a dispatch job: not held by the readmission gate")
    name = name_of(trainjob)
    annotations = annotations_of(trainjob)
    reason = text(annotations.get(ANNOTATION_REJECT)).strip()
    if reason:
        return Decision(CheckState.REJECTED, reason[:MAX_MESSAGE])
    evictions = eviction_count(workload)
    if evictions == 0:
        return Decision(CheckState.READY, "first admission")
    raw = annotations.get(ANNOTATION_READMIT)
    readmitted = _readmitted_up_to(raw)
    if readmitted is not None and readmitted >= evictions:
        return Decision(CheckState.READY, f"readmitted by dispatch after eviction {evictions}")
    if raw is not None and readmitted is None:
        return Decision(
            CheckState.PENDING,
            f"held after eviction {evictions}: annotation {ANNOTATION_READMIT} on TrainJob "
            f"{name} is {raw[:64]!r}, not a decimal eviction count",
        )
    return Decision(
        CheckState.PENDING,
        f"held after eviction {evictions}: waiting for dispatch to readmit TrainJob {name} "
        f"({ANNOTATION_READMIT}: {evictions!r})",
    )


def workload_apply_body(
    workload: Obj, check: str, decision: Decision, now: datetime
) -> dict[str, Any]:
    """The server-side apply body of one decision: only our entry, and the version it rests on.

    ``lastTransitionTime`` moves only when the state does.
    """
    entry = check_entry(workload, check) or {}
    moved = entry.get("state") != decision.state or not entry.get("lastTransitionTime")
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": KIND_WORKLOAD,
        "metadata": {
            "name": name_of(workload),
            "namespace": namespace_of(workload),
            "resourceVersion": resource_version_of(workload),
        },
        "status": {
            "admissionChecks": [
                {
                    "name": check,
                    "state": str(decision.state),
                    "message": decision.message,
                    "lastTransitionTime": format_time(now)
                    if moved
                    else entry["lastTransitionTime"],
                }
            ]
        },
    }


ACTIVE_MESSAGE = f"{ADMISSION_CONTROLLER_NAME} is deciding this check"


def active_apply_body(
    admission_check: Obj, now: datetime, message: str = ACTIVE_MESSAGE
) -> dict[str, Any] | None:
    """The apply body that marks our AdmissionCheck ``Active=True`` with ``message``, or None
    when it already says so."""
    generation = dig(admission_check, "metadata", "generation")
    current = condition(admission_check, ADMISSION_CHECK_ACTIVE)
    already_true = is_true(current)
    message = message[:MAX_MESSAGE]
    if (
        already_true
        and current is not None
        and current.get("observedGeneration") == generation
        and current.get("message") == message
    ):
        return None
    active: dict[str, Any] = {
        "type": ADMISSION_CHECK_ACTIVE,
        "status": STATUS_TRUE,
        "reason": "Active",
        "message": message,
        "lastTransitionTime": current["lastTransitionTime"]
        if already_true and current is not None
        else format_time(now),
    }
    if generation is not None:
        active["observedGeneration"] = generation
    return {
        "apiVersion": KUEUE_API_VERSION,
        "kind": KIND_ADMISSION_CHECK,
        "metadata": {"name": name_of(admission_check)},
        "status": {"conditions": [active]},
    }
