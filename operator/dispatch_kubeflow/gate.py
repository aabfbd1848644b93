"""The readmission gate's dispatch side (SPEC §7): readmit and reject a job.

With ``kueue.admissionCheck`` set, Kueue holds an evicted job's Workload until the admission
controller marks its check Ready again, and the controller does so only when dispatch says so:
``readmit`` writes the Workload's eviction count to the current TrainJob's
``dispatch.phpboyscout.uk/readmit`` annotation (open the gate for this eviction), ``reject``
writes a reason to ``dispatch.phpboyscout.uk/reject`` (make the check Rejected). Both are one
merge patch of the TrainJob; the controller does the rest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatch_kubeflow.constants import (
    ANNOTATION_READMIT,
    ANNOTATION_REJECT,
    TRAINJOBS,
)
from dispatch_kubeflow.errors import InvalidError, NotFoundError, UnsupportedError
from dispatch_kubeflow.finding import Found, find
from dispatch_kubeflow.kube.apierrors import REQUEST_ERRORS, to_dispatch_error
from dispatch_kubeflow.kube.objects import name_of
from dispatch_kubeflow.kube.trainjobs import annotate_trainjob
from dispatch_kubeflow.kube.workloads import eviction_count
from dispatch_kubeflow.scope import Scope

Obj = dict[str, Any]


async def readmit(scope: Scope, job_id: str) -> None:
    """Open the readmission gate of the job's current TrainJob for its latest eviction."""
    trainjob, found = await _gate_target(scope, "readmit", job_id)
    evictions = eviction_count(found.current.workload or {})
    await _annotate(scope, trainjob, {ANNOTATION_READMIT: str(evictions)})


async def reject(scope: Scope, job_id: str, reason: str) -> None:
    """Make the job's admission check ``Rejected`` with ``reason``."""
    if not reason.strip():
        raise InvalidError("reject: reason must not be empty")
    trainjob, _ = await _gate_target(scope, "reject", job_id)
    await _annotate(scope, trainjob, {ANNOTATION_REJECT: reason})


async def _gate_target(scope: Scope, what: str, job_id: str) -> tuple[Obj, Found]:
    if scope.settings.readmission_gate == "no":
        raise UnsupportedError(
            f"{what}: this adapter has no readmission gate (kueue.admissionCheck is not set)"
        )
    found = await find(scope, job_id)
    trainjob = found.current.train_job
    if trainjob is None:
        raise NotFoundError(f"{what}: job {job_id} has no TrainJob left")
    return trainjob, found


async def _annotate(scope: Scope, trainjob: Obj, annotations: Mapping[str, str]) -> None:
    name = name_of(trainjob)
    try:
        annotated = await annotate_trainjob(scope.custom, scope.namespace, trainjob, annotations)
    except REQUEST_ERRORS as error:
        raise to_dispatch_error(
            f"annotating TrainJob {name}", error, verb="patch", resource=TRAINJOBS
        ) from None
    if not annotated:
        raise NotFoundError(f"TrainJob {name} is gone")
