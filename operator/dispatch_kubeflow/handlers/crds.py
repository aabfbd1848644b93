"""The DispatchJob CustomResourceDefinition, rendered from code.

The committed ``crds/dispatchjobs.dispatch.phpboyscout.uk.yaml`` (and the chart's copy) are
generated from ``dispatchjob_crd()``; a unit test fails when they are stale. Regenerate with
``python -m dispatch_kubeflow.handlers.crds crds/``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Final

from dispatch_kubeflow.constants import (
    DISPATCH_JOB_KIND,
    DISPATCH_JOBS,
    GROUP,
    STATUS_REPORTED,
    Cause,
    JobCondition,
)
from dispatch_kubeflow.schema import (
    AGE_COLUMN,
    OBSERVED_GENERATION,
    WIDE,
    condition_column,
    condition_schema,
    kopf_status_schema,
    render_crd,
    render_yaml,
)
from dispatch_kubeflow.settings.models import POSITIVE_DURATION_PATTERN

KIND: Final = DISPATCH_JOB_KIND
PLURAL: Final = DISPATCH_JOBS
SINGULAR: Final = "dispatchjob"
SHORT_NAME: Final = "dj"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"
FILE_NAME: Final = f"{CRD_NAME}.yaml"

# Spec fields that never change after creation; only `attempt` may (and only upwards).
IMMUTABLE_FIELDS: Final = (
    "adapter",
    "runtime",
    "image",
    "command",
    "args",
    "env",
    "numNodes",
    "gpusPerNode",
    "activeDeadlineSeconds",
)


def _string(description: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, **extra}


def _strings(description: str) -> dict[str, Any]:
    return {"type": "array", "description": description, "items": {"type": "string"}}


# The causes a recovery policy may act on: those after which the same program can run again.
RECOVERABLE_CAUSES: Final = (
    Cause.PREEMPTED,
    Cause.NODE_LOST,
    Cause.PODS_READY_TIMEOUT,
    Cause.NO_CAPACITY,
    Cause.TIMEOUT,
    Cause.OUT_OF_MEMORY,
    Cause.PROGRAM_ERROR,
    Cause.IMAGE_PULL,
)
RECOVERY_BACKOFF_DEFAULT: Final = "30s"
RECOVERY_MAX_ATTEMPTS_DEFAULT: Final = 3
RECOVERY_MAX_READMISSIONS_DEFAULT: Final = 3


IMMUTABLE_MESSAGE: Final = (
    "spec.{field} is immutable; only spec.attempt, spec.readmit, spec.reject and spec.recovery "
    "may change"
)
RAISED_MESSAGE: Final = "spec.{field} may only be raised"
REJECT_MESSAGE: Final = "spec.reject cannot change once set"

# A rule on a field compares its old and new value, and runs only when both exist; a rule of the
# spec catches a field added or removed. The split is for the apiserver's sake: it runs these
# rules on every write of a DispatchJob, status writes included, and each `self.field` a rule of
# the spec reads costs it a fresh copy of the spec's property schemas.
FIELD_RULES: Final = {
    **{
        field: ("self == oldSelf", IMMUTABLE_MESSAGE.format(field=field))
        for field in IMMUTABLE_FIELDS
    },
    "attempt": ("self >= oldSelf", RAISED_MESSAGE.format(field="attempt")),
    "readmit": ("self >= oldSelf", RAISED_MESSAGE.format(field="readmit")),
    "reject": ("self == oldSelf", REJECT_MESSAGE),
}


def _rule(rule: str, message: str) -> dict[str, str]:
    return {"rule": rule, "message": message}


def _with_field_rules(properties: dict[str, Any]) -> dict[str, Any]:
    return {
        name: (
            {**schema, "x-kubernetes-validations": [_rule(*FIELD_RULES[name])]}
            if name in FIELD_RULES
            else schema
        )
        for name, schema in properties.items()
    }


def _presence_rules(properties: dict[str, Any], required: list[str]) -> list[dict[str, str]]:
    """The spec's rules: an immutable field that may be absent is never added nor removed, and
    `readmit` and `reject` are never removed (a required or defaulted field is always there)."""
    optional = [
        name
        for name, schema in properties.items()
        if name in FIELD_RULES and name not in required and "default" not in schema
    ]
    return [
        _rule(f"has(self.{name}) == has(oldSelf.{name})", FIELD_RULES[name][1])
        if name in IMMUTABLE_FIELDS
        else _rule(f"!has(oldSelf.{name}) || has(self.{name})", FIELD_RULES[name][1])
        for name in optional
    ]


def _causes(description: str) -> dict[str, Any]:
    return {
        "type": "array",
        "description": description,
        "maxItems": len(RECOVERABLE_CAUSES),
        "x-kubernetes-list-type": "set",
        "items": _string("A typed cause.", enum=[c.value for c in RECOVERABLE_CAUSES]),
    }


def _recovery_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": (
            "What the operator does by itself when the job is disrupted; absent, it only "
            "reports. Each decision is a Kubernetes Event and an entry of status.recovery."
        ),
        "properties": {
            "readmitOn": _causes(
                "Causes of an eviction after which the job held at the readmission gate is "
                "readmitted (the same attempt runs again). Needs kueue.admissionCheck."
            ),
            "retryOn": _causes(
                "Causes of a failed attempt after which spec.attempt is raised by one."
            ),
            "maxAttempts": {
                "type": "integer",
                "minimum": 1,
                "maximum": 100,
                "default": RECOVERY_MAX_ATTEMPTS_DEFAULT,
                "description": "retryOn raises spec.attempt up to this number, never past it.",
            },
            "maxReadmissions": {
                "type": "integer",
                "minimum": 0,
                "maximum": 100,
                "default": RECOVERY_MAX_READMISSIONS_DEFAULT,
                "description": "readmitOn readmits one attempt at most this many times.",
            },
            "backoff": _string(
                "How long after the disruption a decision is carried out (a Go duration).",
                pattern=POSITIVE_DURATION_PATTERN,
                default=RECOVERY_BACKOFF_DEFAULT,
            ),
        },
    }


def _spec_properties() -> dict[str, Any]:
    return {
        "adapter": _string("Name of the KubeflowAdapter that serves this namespace.", minLength=1),
        "attempt": {
            "type": "integer",
            "minimum": 1,
            "default": 1,
            "description": (
                "Attempt number. Raising it on a finished job starts that attempt; "
                "it never goes down."
            ),
        },
        "runtime": {
            "type": "object",
            "description": "Runtime reference; absent = the first of the adapter's runtimes.",
            "required": ["kind", "name"],
            "properties": {
                "kind": _string(
                    "ClusterTrainingRuntime or TrainingRuntime.",
                    enum=["ClusterTrainingRuntime", "TrainingRuntime"],
                ),
                "name": _string("Name of the runtime.", minLength=1),
            },
        },
        "image": _string(
            "Container image of the trainer; absent = the image the runtime names.",
            minLength=1,
        ),
        "command": _strings("Entrypoint of the trainer container."),
        "args": _strings("Arguments of the trainer container."),
        "env": {
            "type": "array",
            "description": "Plain environment variables of the trainer (no secret values).",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": _string("Variable name.", minLength=1),
                    "value": _string("Variable value."),
                },
            },
        },
        "numNodes": {
            "type": "integer",
            "minimum": 1,
            "default": 1,
            "description": "Number of training nodes (ranks).",
        },
        "gpusPerNode": {
            "type": "integer",
            "minimum": 0,
            "default": 0,
            "description": "GPUs per node, as limits of the adapter's gpuResource.",
        },
        "activeDeadlineSeconds": {
            "type": "integer",
            "minimum": 1,
            "description": "Deadline of the TrainJob; past it the job fails with Timeout.",
        },
        "readmit": {
            "type": "integer",
            "minimum": 0,
            "description": (
                "Raise it to readmit the current attempt held at the readmission gate after "
                "an eviction (kueue.admissionCheck); it never goes down."
            ),
        },
        "reject": _string(
            "Set it (a reason) to turn the current attempt away at the readmission gate; "
            "once set it cannot change.",
            minLength=1,
            maxLength=1024,
        ),
        "recovery": _recovery_schema(),
    }


def _spec_schema() -> dict[str, Any]:
    properties = _spec_properties()
    required = ["adapter"]
    return {
        "type": "object",
        "description": "The job to run. Immutable but for `attempt`.",
        "required": required,
        "properties": _with_field_rules(properties),
        "x-kubernetes-validations": _presence_rules(properties, required),
    }


CAUSE_DESCRIPTION: Final = (
    "Whose fault, and what next: the typed cause of the current attempt's failure or "
    "disruption, one of " + ", ".join(c.value for c in Cause) + ". When several apply the "
    "first of this list wins. Null while nothing went wrong."
)


def _status_schema() -> dict[str, Any]:
    return {
        "type": "object",
        "description": "What the adapter reported of the job's current attempt.",
        "properties": {
            "attempt": {"type": "integer", "description": "The attempt the status describes."},
            "state": _string(
                "Coarse state of the current attempt; the cause says why it failed or was "
                "disrupted.",
                enum=["Pending", "Running", "Succeeded", "Failed", "Stopped", "Unknown"],
            ),
            "cause": _string(CAUSE_DESCRIPTION, nullable=True),
            "reason": _string(
                "The reason of the upstream condition or container state the status was derived "
                "from, verbatim (DeadlineExceeded, OOMKilled, Preempted, ...).",
                nullable=True,
            ),
            "message": _string(
                "The message of that upstream condition, verbatim (at most 4 KiB).", nullable=True
            ),
            "trainJob": _string("Name of the TrainJob of the current attempt.", nullable=True),
            "observedGeneration": OBSERVED_GENERATION,
            "truncated": _string(
                "Set when the status was shortened to stay under 256 KiB: what was cut.",
                nullable=True,
            ),
            "conditions": condition_schema(
                [c.value for c in JobCondition],
                "Admitted (the current attempt has its capacity), Running (its ranks run) and "
                "Finished (it ended; the state and cause say how).",
            ),
            "events": {
                "type": "array",
                "description": "The last 50 dispatch events of the job, oldest first.",
                "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            },
            "recovery": {
                "type": "array",
                "description": (
                    "The recovery policy's decisions and the gate requests carried out, the "
                    "last 20, oldest first."
                ),
                "items": {
                    "type": "object",
                    "properties": {
                        "event": _string("The id of the dispatch event decided on."),
                        "action": _string(
                            "What was done.", enum=["Readmitted", "Retried", "Rejected"]
                        ),
                        "attempt": {"type": "integer", "description": "The attempt acted on."},
                        "time": _string("When it was done (RFC 3339)."),
                        "message": _string("Why, in words."),
                    },
                },
            },
            STATUS_REPORTED: {
                "type": "object",
                "description": (
                    "How far each attempt's events have been reported, by attempt number: the "
                    "adapter's record, kept here so that an operator restart neither repeats "
                    "nor loses a transition."
                ),
                "additionalProperties": {"type": "string"},
            },
            "kopf": kopf_status_schema(),
        },
    }


def _column(
    name: str, description: str, path: str, kind: str = "string", *, wide: bool = False
) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": kind, "description": description}
    if wide:
        column["priority"] = WIDE
    column["jsonPath"] = path
    return column


def dispatchjob_crd() -> dict[str, Any]:
    return render_crd(
        kind=KIND,
        plural=PLURAL,
        short_names=(SHORT_NAME,),
        spec=_spec_schema(),
        status=_status_schema(),
        printer_columns=(
            _column("State", "Coarse state of the current attempt.", ".status.state"),
            _column("Cause", "Typed cause of a failure or disruption.", ".status.cause"),
            _column("Attempt", "The attempt asked for.", ".spec.attempt", "integer"),
            _column("Reason", "The upstream reason, verbatim.", ".status.reason", wide=True),
            _column("TrainJob", "The current attempt's TrainJob.", ".status.trainJob", wide=True),
            condition_column(
                JobCondition.ADMITTED, "Whether the current attempt is admitted.", WIDE
            ),
            AGE_COLUMN,
        ),
        description="A dispatch job, run as Kubeflow Trainer TrainJobs. Its name is the job id.",
    )


def render() -> bytes:
    return render_yaml(dispatchjob_crd())


def write(directory: Path) -> Path:
    target = directory / FILE_NAME
    target.write_bytes(render())
    return target


if __name__ == "__main__":
    print(write(Path(sys.argv[1] if len(sys.argv) > 1 else "crds")))
