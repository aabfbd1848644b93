"""The adapter's settings object: typed, immutable, every default applied.

The models here are the shape of a parsed settings document. ``parse_settings`` is the only way
in from text; it enforces every rule of the settings document before a model is built.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from dispatch_kubeflow.constants import PUBLISH_INIT_CONTAINER_DEFAULT


class _Frozen(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        strict=True,
        alias_generator=to_camel,
        populate_by_name=True,
    )


class RuntimeRef(_Frozen):
    kind: Literal["ClusterTrainingRuntime", "TrainingRuntime"]
    name: str


class Cluster(_Frozen):
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool = False


class AdmissionLease(_Frozen):
    namespace: str = "dispatch-system"
    name: str = "dispatch-admission"


class Kueue(_Frozen):
    local_queue: str
    priority_class: str | None = None
    admission_check: str | None = None
    admission_lease: AdmissionLease = AdmissionLease()


class Credential(_Frozen):
    secret_name: str
    mount_path: str


class Timeouts(_Frozen):
    request: timedelta = timedelta(seconds=30)
    apiserver_request: timedelta = timedelta(seconds=60)
    workload: timedelta = timedelta(seconds=60)
    stop_job: timedelta = timedelta(minutes=10)


class Publish(_Frozen):
    image: str
    via: Literal["imageVolume", "initContainer"] = "imageVolume"
    # Set to PUBLISH_INIT_CONTAINER_DEFAULT by the parser under via=initContainer; None otherwise.
    init_container: str | None = None


class Declarations(_Frozen):
    node_loss_window: timedelta
    call_bound: timedelta
    polled_loss: tuple[str, ...] = ()


class Settings(_Frozen):
    namespace: str
    cluster: Cluster = Cluster()
    runtimes: tuple[RuntimeRef, ...] = ()
    # The parser fills this in with the first of ``runtimes`` when it is absent.
    probe_runtime: RuntimeRef
    kueue: Kueue | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    gpu_resource: str = "nvidia.com/gpu"
    credentials: tuple[Credential, ...] = ()
    node_loss_window: timedelta = timedelta(minutes=5)
    node_loss_taints: tuple[str, ...] = ()
    allow_rank_restart: bool = False
    timeouts: Timeouts = Timeouts()
    publish: Publish | None = None

    @property
    def kueue_mode(self) -> bool:
        return self.kueue is not None

    @property
    def readmission_gate(self) -> Literal["yes", "no"]:
        return "yes" if self.kueue is not None and self.kueue.admission_check else "no"

    def declarations(self) -> Declarations:
        return Declarations(
            node_loss_window=self.node_loss_window,
            call_bound=self.timeouts.apiserver_request + timedelta(seconds=5),
        )


__all__ = [
    "PUBLISH_INIT_CONTAINER_DEFAULT",
    "AdmissionLease",
    "Cluster",
    "Credential",
    "Declarations",
    "Kueue",
    "Publish",
    "RuntimeRef",
    "Settings",
    "Timeouts",
]
