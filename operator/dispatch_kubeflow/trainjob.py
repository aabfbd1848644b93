"""What a dispatch job is, and the TrainJob that carries it.

``JobSpec`` is the dispatcher's request; ``build_trainjob`` turns it, with the adapter's settings,
into the one TrainJob body the adapter creates (SPEC §4). Building is pure, so the exact object
can be asserted without a cluster, and the spec hash that makes ``start`` idempotent is computed
from the request alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    ValidationError,
    model_validator,
)
from pydantic.alias_generators import to_camel

from dispatch_kubeflow.constants import (
    ANCESTOR_TRAINER,
    ANNOTATION_SPEC_HASH,
    LABEL_ADAPTER,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_PRIORITY_CLASS,
    LABEL_QUEUE_NAME,
    LABEL_TRAINJOB_ANCESTOR,
    PUBLISH_DIR,
    PUBLISH_INIT_CONTAINER_DEFAULT,
    PUBLISH_VOLUME,
    RUNTIME_PATCH_MANAGER,
    TRAINER_GROUP,
    TRAINER_NODE,
    TRAINER_VERSION,
)
from dispatch_kubeflow.errors import ErrInvalid
from dispatch_kubeflow.kube.objects import as_int, dig, mappings, text
from dispatch_kubeflow.settings import RuntimeRef, Settings
from dispatch_kubeflow.settings.names import is_object_name, is_rfc1035_label

MAX_NAME_LENGTH = 63
# What the five random characters of a pod's name look like to JobSet's webhook.
JOBSET_POD_SUFFIX = "-abcde"
CREDENTIAL_VOLUME_PREFIX = "dispatch-credential-"
# Secret volumes are readable by the owner only: 0o400.
CREDENTIAL_MODE = 0o400
MAX_LIST_ITEMS = 128  # the TrainJob CRD's bound on command, args and env
MAX_IMAGE_LENGTH = 500  # the TrainJob CRD's bound on trainer.image

StrictStr = Annotated[str, Field(strict=True)]


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class EnvVar(_Model):
    """One environment variable of the trainer container, given by value."""

    name: Annotated[str, Field(strict=True, min_length=1, pattern=r"^[^=]+$")]
    value: StrictStr = ""

    @model_validator(mode="wrap")
    @classmethod
    def _refuse_as_invalid(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        try:
            return handler(data)
        except ValidationError as error:
            raise ErrInvalid(f"job spec: env: {_first_error(error)}") from None


class JobSpec(_Model):
    """A dispatch job's request: what to run, on how many nodes, under which runtime.

    Any refusal is ``ErrInvalid`` naming the field, never a pydantic ``ValidationError``.
    """

    job_id: StrictStr
    attempt: Annotated[int, Field(strict=True, ge=1)] = 1
    # None: the first of the adapter's runtimes.
    runtime: RuntimeRef | None = None
    # None: the image the runtime's container ``node`` names.
    image: Annotated[str, Field(strict=True, min_length=1, max_length=MAX_IMAGE_LENGTH)] | None = (
        None
    )
    command: Annotated[tuple[StrictStr, ...], Field(max_length=MAX_LIST_ITEMS)] = ()
    args: Annotated[tuple[StrictStr, ...], Field(max_length=MAX_LIST_ITEMS)] = ()
    env: Annotated[tuple[EnvVar, ...], Field(max_length=MAX_LIST_ITEMS)] = ()
    num_nodes: Annotated[int, Field(strict=True, ge=1)] = 1
    gpus_per_node: Annotated[int, Field(strict=True, ge=0)] = 0
    active_deadline_seconds: Annotated[int, Field(strict=True, ge=1)] | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _refuse_as_invalid(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        try:
            return handler(data)
        except ValidationError as error:
            raise ErrInvalid(f"job spec: {_first_error(error)}") from None

    @model_validator(mode="after")
    def _check_names(self) -> Self:
        if not is_rfc1035_label(self.job_id):
            raise ErrInvalid(
                f"job spec: jobId {self.job_id!r} is not an RFC 1035 label "
                "(lower-case letters, digits and '-', starting with a letter)"
            )
        name = trainjob_name(self.job_id, self.attempt)
        if len(name) > MAX_NAME_LENGTH:
            raise ErrInvalid(
                f"job spec: jobId {self.job_id!r} is too long: the TrainJob name {name!r} "
                f"has {len(name)} characters, at most {MAX_NAME_LENGTH} are allowed"
            )
        if self.runtime is not None and not is_object_name(self.runtime.name):
            raise ErrInvalid(
                f"job spec: runtime.name {self.runtime.name!r} is not a Kubernetes object name"
            )
        seen: set[str] = set()
        for variable in self.env:
            if variable.name in seen:
                raise ErrInvalid(f"job spec: env: {variable.name!r} is given twice")
            seen.add(variable.name)
        return self


class JobRef(_Model):
    """The TrainJob that carries one attempt of a dispatch job."""

    job_id: str
    attempt: int
    name: str
    namespace: str
    uid: str
    runtime: RuntimeRef
    spec_hash: str
    workload: str | None = None


def _first_error(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(root)"
    return f"{where}: {first['msg']}"


def trainjob_name(job_id: str, attempt: int) -> str:
    return f"{job_id}-{attempt}"


def generated_names(job: JobSpec, runtime: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """The longest name of each kind JobSet will give the children of ``job``'s JobSet.

    As JobSet v0.12.0's webhook computes them (it refuses the JobSet when one is not a DNS-1035
    label): per replicatedJob, the Job ``<jobset>-<replicatedJob>-<replicas - 1>`` and, for an
    Indexed Job (JobSet's default), the pod ``<job>-<completions - 1>`` plus the five characters
    of the pod's random suffix. Trainer names the JobSet after the TrainJob and gives every
    replicatedJob ``completions = parallelism`` (default 1), the trainer step ``numNodes``.
    """
    jobset = trainjob_name(job.job_id, job.attempt)
    for replicated in mappings(dig(runtime, "spec", "template", "spec", "replicatedJobs")):
        replicas = replicated.get("replicas", 1)
        job_name = f"{jobset}-{text(replicated.get('name'))}-{as_int(replicas) - 1}"
        yield f"Job of replicatedJob {text(replicated.get('name'))!r}", job_name
        spec = dig(replicated, "template", "spec")
        if dig(spec, "completionMode") not in (None, "Indexed"):
            continue
        labels = dig(replicated, "template", "metadata", "labels")
        if isinstance(labels, Mapping) and labels.get(LABEL_TRAINJOB_ANCESTOR) == ANCESTOR_TRAINER:
            pods = job.num_nodes
        else:
            parallelism = dig(spec, "parallelism")
            pods = 1 if parallelism is None else as_int(parallelism)
        pod = f"{job_name}-{pods - 1}{JOBSET_POD_SUFFIX}"
        yield f"pod of replicatedJob {text(replicated.get('name'))!r}", pod


def check_generated_names(job: JobSpec, runtime: Mapping[str, Any]) -> None:
    """``ErrInvalid`` when a name JobSet would give a child of ``job`` exceeds 63 characters.

    JobSet's webhook refuses such a JobSet, so the job would stay Pending forever.
    """
    for what, name in generated_names(job, runtime):
        if len(name) > MAX_NAME_LENGTH:
            excess = len(name) - MAX_NAME_LENGTH
            raise ErrInvalid(
                f"job spec: jobId {job.job_id!r} is too long for its runtime: the {what} would "
                f"be named like {name!r}, {len(name)} characters, and JobSet allows at most "
                f"{MAX_NAME_LENGTH}; shorten jobId by {excess} or more"
            )


def resolve_runtime(job: JobSpec, settings: Settings) -> RuntimeRef:
    """The job's runtime, or the first of the adapter's when the job names none."""
    if job.runtime is not None:
        return job.runtime
    if settings.runtimes:
        return settings.runtimes[0]
    raise ErrInvalid("job spec: runtime: required, because the adapter's settings list no runtimes")


def spec_hash(job: JobSpec, runtime: RuntimeRef) -> str:
    """SHA-256 of the canonical JSON of the request, with its runtime resolved.

    The request rather than the TrainJob body is hashed, so that a change of the adapter's
    settings (a new label, another credential) does not make an existing attempt look different.
    """
    resolved = job.model_copy(update={"runtime": runtime})
    canonical = json.dumps(
        resolved.model_dump(mode="json", by_alias=True),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def adapter_labels(adapter_name: str, job_id: str, attempt: int) -> dict[str, str]:
    return {LABEL_ADAPTER: adapter_name, LABEL_JOB: job_id, LABEL_ATTEMPT: str(attempt)}


def job_selector(adapter_name: str, job_id: str) -> str:
    """The label selector of everything of one job, across its attempts."""
    return f"{LABEL_ADAPTER}={adapter_name},{LABEL_JOB}={job_id}"


def adapter_selector(adapter_name: str) -> str:
    return f"{LABEL_ADAPTER}={adapter_name}"


def build_trainjob(
    job: JobSpec,
    settings: Settings,
    adapter_name: str,
    *,
    suspend: bool = False,
    extra_labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The TrainJob body for one attempt of ``job``, as SPEC §4 lays it out.

    ``suspend`` asks for a suspended TrainJob (the preflight probe). In Kueue mode ``suspend``
    is left out unless asked for, because Kueue's webhook suspends the TrainJob itself.
    ``extra_labels`` go wherever the adapter's own labels go (the probe marks itself with them).
    """
    runtime = resolve_runtime(job, settings)
    own_labels = {**adapter_labels(adapter_name, job.job_id, job.attempt), **(extra_labels or {})}
    labels = {**settings.labels, **own_labels}
    if settings.kueue is not None:
        labels[LABEL_QUEUE_NAME] = settings.kueue.local_queue
        if settings.kueue.priority_class:
            labels[LABEL_PRIORITY_CLASS] = settings.kueue.priority_class
    spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": TRAINER_GROUP, "kind": runtime.kind, "name": runtime.name},
        "trainer": _trainer(job, settings),
    }
    if job.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = job.active_deadline_seconds
    if suspend:
        spec["suspend"] = True
    elif settings.kueue is None:
        spec["suspend"] = False
    spec["runtimePatches"] = [_runtime_patch(own_labels, settings)]
    return {
        "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
        "kind": "TrainJob",
        "metadata": {
            "name": trainjob_name(job.job_id, job.attempt),
            "namespace": settings.namespace,
            "labels": labels,
            "annotations": {**settings.annotations, ANNOTATION_SPEC_HASH: spec_hash(job, runtime)},
        },
        "spec": spec,
    }


def _trainer(job: JobSpec, settings: Settings) -> dict[str, Any]:
    trainer: dict[str, Any] = {}
    if job.image is not None:
        trainer["image"] = job.image
    if job.command:
        trainer["command"] = list(job.command)
    if job.args:
        trainer["args"] = list(job.args)
    if job.env:
        trainer["env"] = [{"name": v.name, "value": v.value} for v in job.env]
    trainer["numNodes"] = job.num_nodes
    if job.gpus_per_node > 0:
        trainer["resourcesPerNode"] = {"limits": {settings.gpu_resource: job.gpus_per_node}}
    return trainer


def _runtime_patch(own_labels: dict[str, str], settings: Settings) -> dict[str, Any]:
    """The adapter's one ``runtimePatches`` entry: labels, credentials, the publish route."""
    volumes: list[dict[str, Any]] = []
    node_mounts: list[dict[str, Any]] = []
    for index, credential in enumerate(settings.credentials):
        name = f"{CREDENTIAL_VOLUME_PREFIX}{index}"
        volumes.append(
            {
                "name": name,
                "secret": {
                    "secretName": credential.secret_name,
                    "defaultMode": CREDENTIAL_MODE,
                    "optional": True,
                },
            }
        )
        node_mounts.append({"name": name, "mountPath": credential.mount_path, "readOnly": True})
    init_containers: list[dict[str, Any]] = []
    if settings.publish is not None:
        node_mounts.append({"name": PUBLISH_VOLUME, "mountPath": PUBLISH_DIR, "readOnly": True})
        if settings.publish.via == "imageVolume":
            volumes.append(
                {
                    "name": PUBLISH_VOLUME,
                    "image": {"reference": settings.publish.image, "pullPolicy": "IfNotPresent"},
                }
            )
        else:
            volumes.append({"name": PUBLISH_VOLUME, "emptyDir": {}})
            init_containers.append(
                {
                    "name": publish_init_container(settings),
                    "volumeMounts": [{"name": PUBLISH_VOLUME, "mountPath": PUBLISH_DIR}],
                }
            )
    pod_spec: dict[str, Any] = {}
    if volumes:
        pod_spec["volumes"] = volumes
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if node_mounts:
        pod_spec["containers"] = [{"name": TRAINER_NODE, "volumeMounts": node_mounts}]
    pod_template: dict[str, Any] = {"metadata": {"labels": dict(own_labels)}}
    if pod_spec:
        pod_template["spec"] = pod_spec
    node_job = {
        "name": TRAINER_NODE,
        "template": {
            "metadata": {"labels": dict(own_labels)},
            "spec": {"template": pod_template},
        },
    }
    return {
        "manager": RUNTIME_PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "metadata": {"labels": dict(own_labels)},
                "spec": {"replicatedJobs": [node_job]},
            }
        },
    }


def publish_init_container(settings: Settings) -> str:
    """The init container that fills the publish volume under ``publish.via: initContainer``."""
    if settings.publish is None or settings.publish.init_container is None:
        return PUBLISH_INIT_CONTAINER_DEFAULT
    return settings.publish.init_container
