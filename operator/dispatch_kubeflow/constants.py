"""Every name the adapter writes or reads on the wire, in one place.

Labels, annotations, API groups, condition types and reasons, event types, states and causes.
Other modules import these names rather than spelling strings themselves.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

# Our own API.
GROUP: Final = "dispatch.phpboyscout.uk"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
PREFIX: Final = f"{GROUP}/"

LABEL_ADAPTER: Final = f"{PREFIX}adapter"
LABEL_JOB: Final = f"{PREFIX}job"
LABEL_ATTEMPT: Final = f"{PREFIX}attempt"
ANNOTATION_SPEC_HASH: Final = f"{PREFIX}spec-hash"
ANNOTATION_REPORTED: Final = f"{PREFIX}reported"
ANNOTATION_READMIT: Final = f"{PREFIX}readmit"
ANNOTATION_REJECT: Final = f"{PREFIX}reject"
RUNTIME_PATCH_MANAGER: Final = f"{PREFIX}adapter"
ADMISSION_CONTROLLER_NAME: Final = f"{PREFIX}admission"
# kopf's finalizer: on KubeflowAdapters (their daemons), and on DispatchJobs made before the
# stop finalizer, until the operator puts that on.
FINALIZER: Final = f"{PREFIX}finalizer"
# The operator's own on DispatchJobs: put on before a job's first start, taken off once stopped.
STOP_FINALIZER: Final = f"{PREFIX}stop"

# Label and annotation prefixes that dispatch, Kueue, Trainer and JobSet read.
RESERVED_PREFIXES: Final = (
    PREFIX,
    "kueue.x-k8s.io/",
    "trainer.kubeflow.org/",
    "jobset.sigs.k8s.io/",
)

# Kubeflow Trainer.
TRAINER_GROUP: Final = "trainer.kubeflow.org"
TRAINER_VERSION: Final = "v1alpha1"
TRAINJOBS: Final = "trainjobs"
TRAINING_RUNTIMES: Final = "trainingruntimes"
CLUSTER_TRAINING_RUNTIMES: Final = "clustertrainingruntimes"
TRAINER_NODE: Final = "node"  # replicatedJob and container name of the trainer
# Trainer gives the replicatedJob labelled so ``numNodes`` pods (its "trainer" ancestor step).
LABEL_TRAINJOB_ANCESTOR: Final = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER: Final = "trainer"

# JobSet.
JOBSET_GROUP: Final = "jobset.x-k8s.io"
JOBSET_VERSION: Final = "v1alpha2"
JOBSETS: Final = "jobsets"
LABEL_JOBSET_NAME: Final = "jobset.sigs.k8s.io/jobset-name"
LABEL_RESTART_ATTEMPT: Final = "jobset.sigs.k8s.io/restart-attempt"

# Kueue.
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"
WORKLOADS: Final = "workloads"
ADMISSION_CHECKS: Final = "admissionchecks"
LABEL_QUEUE_NAME: Final = "kueue.x-k8s.io/queue-name"
LABEL_PRIORITY_CLASS: Final = "kueue.x-k8s.io/priority-class"
LABEL_KUEUE_JOB_UID: Final = "kueue.x-k8s.io/job-uid"

# Kubernetes' own node-loss taints.
TAINT_UNREACHABLE: Final = "node.kubernetes.io/unreachable"
TAINT_NOT_READY: Final = "node.kubernetes.io/not-ready"
TAINT_OUT_OF_SERVICE: Final = "node.kubernetes.io/out-of-service"
BUILTIN_LOSS_TAINTS: Final = (TAINT_UNREACHABLE, TAINT_NOT_READY, TAINT_OUT_OF_SERVICE)

# Where the publish binary lives in the trainer container.
PUBLISH_DIR: Final = "/opt/dispatch"
PUBLISH_BINARY: Final = f"{PUBLISH_DIR}/publish"
PUBLISH_VOLUME: Final = "dispatch-publish"
PUBLISH_INIT_CONTAINER_DEFAULT: Final = "dispatch-publish"
PUBLISH_MAX_BYTES: Final = 4096

# Settings defaults that other code names too.
GPU_RESOURCE_DEFAULT: Final = "nvidia.com/gpu"
ADMISSION_LEASE_NAMESPACE_DEFAULT: Final = "dispatch-system"
ADMISSION_LEASE_NAME_DEFAULT: Final = "dispatch-admission"

# Our resources.
KUBEFLOW_ADAPTER_KIND: Final = "KubeflowAdapter"
KUBEFLOW_ADAPTERS: Final = "kubeflowadapters"
DISPATCH_JOB_KIND: Final = "DispatchJob"
DISPATCH_JOBS: Final = "dispatchjobs"

# Kinds, as they appear in evidence and owner references.
KIND_TRAINJOB: Final = "TrainJob"
KIND_JOBSET: Final = "JobSet"
KIND_POD: Final = "Pod"
KIND_WORKLOAD: Final = "Workload"
KIND_NODE: Final = "Node"
KIND_LEASE: Final = "Lease"
KIND_ADMISSION_CHECK: Final = "AdmissionCheck"

# Coordination (Leases).
LEASE_GROUP: Final = "coordination.k8s.io"
LEASE_VERSION: Final = "v1"
LEASES: Final = "leases"

# Patch content types.
MERGE_PATCH: Final = "application/merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
APPLY_PATCH: Final = "application/apply-patch+yaml"

# TrainJob conditions read by derivation (their reasons, and every other upstream reason, are
# the reason table's: reasons.py).
TRAINJOB_COMPLETE: Final = "Complete"
TRAINJOB_FAILED: Final = "Failed"
TRAINJOB_SUSPENDED: Final = "Suspended"

# Pod conditions read by derivation.
POD_DISRUPTION_TARGET: Final = "DisruptionTarget"
POD_SCHEDULED: Final = "PodScheduled"
LABEL_COMPLETION_INDEX: Final = "batch.kubernetes.io/job-completion-index"
EFFECT_NO_EXECUTE: Final = "NoExecute"


class State(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"
    UNKNOWN = "Unknown"


class Cause(StrEnum):
    """Typed causes, in precedence order: when several apply, the first wins."""

    PREEMPTED = "Preempted"
    NODE_LOST = "NodeLost"
    OUT_OF_MEMORY = "OutOfMemory"
    TIMEOUT = "Timeout"
    NO_CAPACITY = "NoCapacity"
    PODS_READY_TIMEOUT = "PodsReadyTimeout"
    ADMISSION_REJECTED = "AdmissionRejected"
    IMAGE_PULL = "ImagePull"
    CONFIG_ERROR = "ConfigError"
    RUNTIME_UNSUPPORTED = "RuntimeUnsupported"
    PROGRAM_ERROR = "ProgramError"
    STOPPED = "Stopped"
    EVIDENCE_LOST = "EvidenceLost"


CAUSE_PRECEDENCE: Final = tuple(Cause)


class EventType(StrEnum):
    SUBMITTED = "Submitted"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    EVICTED = "Evicted"
    NODE_LOST = "NodeLost"
    RESTARTED = "Restarted"
    FINISHED = "Finished"
    VANISHED = "Vanished"
    ADMISSION_HEARTBEAT = "AdmissionHeartbeat"


class AdapterCondition(StrEnum):
    VALID = "Valid"
    CONNECTED = "Connected"
    PROBED = "Probed"
    ADMISSION_HEALTHY = "AdmissionHealthy"
    READY = "Ready"


class JobCondition(StrEnum):
    ADMITTED = "Admitted"
    RUNNING = "Running"
    FINISHED = "Finished"


REASON_INVALID_SETTINGS: Final = "InvalidSettings"
# A DispatchJob's Admitted=False while the KubeflowAdapter it names does not serve it.
REASON_ADAPTER_NOT_FOUND: Final = "AdapterNotFound"
REASON_ADAPTER_NOT_READY: Final = "AdapterNotReady"


# Kueue Workload conditions and reasons.
WORKLOAD_QUOTA_RESERVED: Final = "QuotaReserved"
WORKLOAD_ADMITTED: Final = "Admitted"
WORKLOAD_EVICTED: Final = "Evicted"
WORKLOAD_FINISHED: Final = "Finished"
WORKLOAD_DEACTIVATION_TARGET: Final = "DeactivationTarget"
ADMISSION_CHECK_ACTIVE: Final = "Active"
ADMISSION_FIELD_MANAGER: Final = ADMISSION_CONTROLLER_NAME


class CheckState(StrEnum):
    """The state of one entry of a Workload's ``status.admissionChecks``."""

    PENDING = "Pending"
    READY = "Ready"
    RETRY = "Retry"
    REJECTED = "Rejected"


# The preflight probe's TrainJob carries this label, so watches can tell it from a dispatch job.
LABEL_PROBE: Final = f"{PREFIX}probe"
PROBE_JOB_PREFIX: Final = "dispatch-probe-"
LOCAL_QUEUES: Final = "localqueues"
# DispatchJob status field holding each attempt's reported record (the operator's ReportStore).
STATUS_REPORTED: Final = "reported"
