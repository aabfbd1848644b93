"""Predicates on Kueue Workloads, for every part of the project that reads them.

Kueue keeps these in its own ``pkg/workload`` (``HasQuotaReservation``, ``IsAdmitted``,
``IsEvicted``, ``IsFinished``, ``HasAllChecksReady``...); the adapter's derivation, its gate
and the admission controller ask the same questions, so they ask them here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatch_kubeflow.constants import (
    KIND_TRAINJOB,
    LABEL_KUEUE_JOB_UID,
    TRAINER_GROUP,
    WORKLOAD_ADMITTED,
    WORKLOAD_EVICTED,
    WORKLOAD_FINISHED,
    WORKLOAD_QUOTA_RESERVED,
    CheckState,
)
from dispatch_kubeflow.kube.objects import (
    as_int,
    condition,
    condition_true,
    dig,
    is_true,
    labels_of,
    mappings,
    owner_reference,
    text,
)

Workload = Mapping[str, Any]


def has_quota_reservation(workload: Workload) -> bool:
    return condition_true(workload, WORKLOAD_QUOTA_RESERVED)


def is_evicted(workload: Workload) -> bool:
    return condition_true(workload, WORKLOAD_EVICTED)


def is_finished(workload: Workload) -> bool:
    return condition_true(workload, WORKLOAD_FINISHED)


def is_active(workload: Workload) -> bool:
    """False once someone (or Kueue) set ``spec.active: false``."""
    return dig(workload, "spec", "active") is not False


def is_admitted(workload: Workload) -> bool:
    """Admitted now: ``Admitted=True`` and newer than any ``Evicted=True``.

    Kueue leaves ``Admitted=True`` for a moment after an eviction, until the job has stopped.
    """
    admitted = condition(workload, WORKLOAD_ADMITTED)
    if admitted is None or not is_true(admitted):
        return False
    evicted = condition(workload, WORKLOAD_EVICTED)
    if evicted is None or not is_true(evicted):
        return True
    return text(admitted.get("lastTransitionTime")) > text(evicted.get("lastTransitionTime"))


def check_entry(workload: Workload, check: str) -> Mapping[str, Any] | None:
    """The entry of admission check ``check`` in ``status.admissionChecks``, if there is one."""
    return next(
        (e for e in mappings(dig(workload, "status", "admissionChecks")) if e.get("name") == check),
        None,
    )


def rejected_checks(workload: Workload) -> list[Mapping[str, Any]]:
    return [
        entry
        for entry in mappings(dig(workload, "status", "admissionChecks"))
        if entry.get("state") == CheckState.REJECTED
    ]


def eviction_count(workload: Workload) -> int:
    """How many times Kueue has evicted this Workload; 0 means it was never evicted.

    The value the dispatch side writes to ``dispatch.phpboyscout.uk/readmit`` to open the gate.
    """
    counted = sum(
        as_int(entry.get("count"))
        for entry in mappings(dig(workload, "status", "schedulingStats", "evictions"))
    )
    requeued = as_int(dig(workload, "status", "requeueState", "count"))
    seen = 1 if condition(workload, WORKLOAD_EVICTED) is not None else 0
    return max(counted, requeued, seen)


def owner_trainjob(workload: Workload) -> Mapping[str, Any] | None:
    """The ownerReference to the TrainJob Kueue made this Workload for, if there is one."""
    return owner_reference(workload, kind=KIND_TRAINJOB, group=TRAINER_GROUP)


def job_uid_label(workload: Workload) -> str | None:
    """Kueue's ``job-uid`` label: the UID of the job the Workload was made for."""
    label = labels_of(workload).get(LABEL_KUEUE_JOB_UID)
    return str(label) if label else None


def owner_trainjob_uids(workload: Workload) -> set[str]:
    """UIDs of the TrainJobs this Workload stands for: owner references and Kueue's job-uid."""
    uids = {
        text(ref.get("uid"))
        for ref in mappings(dig(workload, "metadata", "ownerReferences"))
        if ref.get("kind") == KIND_TRAINJOB and ref.get("uid")
    }
    label = job_uid_label(workload)
    if label:
        uids.add(label)
    return uids
