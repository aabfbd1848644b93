"""The adapter against the real kube-apiserver of the test control plane.

The upstream Trainer v2.3.0, JobSet and Kueue CRDs are installed, so every TrainJob the adapter
creates has passed the real schema and CEL rules before a test reads it back. No Trainer, JobSet
or Kueue controller runs: where a test needs a Kueue Workload, it plays Kueue's TrainJob
integration itself (``KueueStandIn``), and where it needs a JobSet or pods it creates them with the
owner references the controllers would set. kube-controller-manager runs where a test needs the
garbage collector to take a TrainJob's dependents.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow import gate, stopping
from dispatch_kubeflow.adapter import Adapter, AdapterConfig
from dispatch_kubeflow.constants import (
    ANNOTATION_READMIT,
    ANNOTATION_REJECT,
    ANNOTATION_SPEC_HASH,
    LABEL_ADAPTER,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_KUEUE_JOB_UID,
    LABEL_PRIORITY_CLASS,
    LABEL_QUEUE_NAME,
    RUNTIME_PATCH_MANAGER,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    State,
)
from dispatch_kubeflow.errors import ErrInvalid, ErrNotFound, ErrOutcomeUnknown, ErrUnsupported
from dispatch_kubeflow.kube import connection
from dispatch_kubeflow.kube.connection import connect
from dispatch_kubeflow.kube.informer import Informer
from dispatch_kubeflow.probe import check_trainer_api
from dispatch_kubeflow.settings import (
    Cluster,
    Credential,
    Kueue,
    Publish,
    RuntimeRef,
    Settings,
    Timeouts,
)
from dispatch_kubeflow.starting import create_trainjob
from dispatch_kubeflow.tasks import cancel_and_wait
from dispatch_kubeflow.trainjob import EnvVar, JobSpec, build_trainjob, spec_hash
from tests.cluster.controlplane import ControlPlane

ROOT = Path(__file__).parents[2]
EXAMPLE_RUNTIME = ROOT / "examples" / "runtime.yaml"
TRAINER = ("trainer.kubeflow.org", "v1alpha1")
RUNTIMES = "trainingruntimes"
KUEUE = ("kueue.x-k8s.io", "v1beta2")
JOBSET = ("jobset.x-k8s.io", "v1alpha2")
RUNTIME = RuntimeRef(kind="TrainingRuntime", name="dispatch-torch")
PUBLISH_IMAGE = "registry.example/dispatch-publish@sha256:" + "c" * 64
HOLD = "test.dispatch.example/hold"
MERGE_PATCH = "application/merge-patch+json"

Obj = dict[str, Any]


# ---------------------------------------------------------------------------------------------
# Helpers


# Kueue-mode tests whose probe waits for the garbage collector to take its Workload: that can
# take longer than the 5 s the other tests wait for a Workload that never comes.
COLLECTED = Timeouts(workload=timedelta(seconds=30), stop_job=timedelta(seconds=20))


def settings_for(plane: ControlPlane, namespace: str, **changes: Any) -> Settings:
    values: dict[str, Any] = {
        "namespace": namespace,
        "cluster": Cluster(kubeconfig=str(plane.kubeconfig)),
        "runtimes": (RUNTIME,),
        "probe_runtime": RUNTIME,
        "timeouts": Timeouts(workload=timedelta(seconds=5), stop_job=timedelta(seconds=20)),
    }
    values.update(changes)
    return Settings(**values)


def example_runtime(name: str = "dispatch-torch", kind: str = "TrainingRuntime") -> Obj:
    runtime: Obj = yaml.safe_load(EXAMPLE_RUNTIME.read_text())
    runtime["kind"] = kind
    runtime["metadata"] = {"name": name}
    return runtime


def node_pod_spec(runtime: Obj) -> Obj:
    spec: Obj = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    pod: Obj = spec["template"]["spec"]
    return pod


async def create_runtime(api: client.ApiClient, namespace: str, runtime: Obj) -> None:
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        *TRAINER, namespace, "trainingruntimes", runtime
    )


async def read_trainjob(api: client.ApiClient, namespace: str, name: str) -> Obj:
    trainjob: Obj = await client.CustomObjectsApi(api).get_namespaced_custom_object(
        *TRAINER, namespace, "trainjobs", name
    )
    return trainjob


async def list_trainjobs(api: client.ApiClient, namespace: str) -> list[Obj]:
    listed = await client.CustomObjectsApi(api).list_namespaced_custom_object(
        *TRAINER, namespace, "trainjobs"
    )
    items: list[Obj] = listed["items"]
    return items


def own_labels(job: str, attempt: int = 1) -> dict[str, str]:
    return {LABEL_ADAPTER: "default", LABEL_JOB: job, LABEL_ATTEMPT: str(attempt)}


def owner(obj: Obj, kind: str, api_version: str) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def workload_for(trainjob: Obj, queue: str = "lq") -> Obj:
    """The Workload Kueue's TrainJob integration makes: owned by the TrainJob, labelled by uid."""
    name = trainjob["metadata"]["name"]
    uid = trainjob["metadata"]["uid"]
    return {
        "apiVersion": "/".join(KUEUE),
        "kind": "Workload",
        "metadata": {
            "name": f"trainjob-{name}-{uid[:5]}",
            "labels": {LABEL_KUEUE_JOB_UID: uid},
            "ownerReferences": [owner(trainjob, "TrainJob", "/".join(TRAINER))],
        },
        "spec": {
            "queueName": queue,
            "podSets": [
                {
                    "name": "node",
                    "count": 1,
                    "template": {"spec": {"containers": [{"name": "node", "image": "x"}]}},
                }
            ],
        },
    }


class KueueStandIn:
    """Plays Kueue's TrainJob integration: a Workload for every TrainJob that appears."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.seen: set[str] = set()

    async def run(self) -> None:
        while True:
            for trainjob in await self._trainjobs():
                uid = trainjob["metadata"]["uid"]
                if uid in self.seen or trainjob["metadata"].get("deletionTimestamp"):
                    continue
                self.seen.add(uid)
                await self.custom.create_namespaced_custom_object(
                    *KUEUE, self.namespace, "workloads", workload_for(trainjob)
                )
            await asyncio.sleep(0.05)

    async def _trainjobs(self) -> list[Obj]:
        listed = await self.custom.list_namespaced_custom_object(
            *TRAINER, self.namespace, "trainjobs"
        )
        items: list[Obj] = listed["items"]
        return items


@contextlib.asynccontextmanager
async def kueue_stand_in(api: client.ApiClient, namespace: str) -> AsyncIterator[KueueStandIn]:
    stand_in = KueueStandIn(api, namespace)
    task = asyncio.create_task(stand_in.run())
    try:
        yield stand_in
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def create_local_queue(api: client.ApiClient, namespace: str, name: str = "lq") -> None:
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        *KUEUE,
        namespace,
        "localqueues",
        {
            "apiVersion": "/".join(KUEUE),
            "kind": "LocalQueue",
            "metadata": {"name": name},
            "spec": {"clusterQueue": "cq"},
        },
    )


async def whoami(api: client.ApiClient) -> str:
    authentication: Any = client.AuthenticationV1Api(api)  # takes a plain dict as the body
    review = await authentication.create_self_subject_review(
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    )
    username: str = review.status.user_info.username
    return username


async def raises(error: type[Exception], call: Awaitable[Any]) -> str:
    with pytest.raises(error) as caught:
        await call
    return str(caught.value)


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture
async def runtime(kube_api: client.ApiClient, namespace: str) -> Obj:
    """The example runtime, as a TrainingRuntime in the test's namespace."""
    body = example_runtime()
    await create_runtime(kube_api, namespace, body)
    return body


@pytest.fixture
async def adapter(cluster: ControlPlane, namespace: str, runtime: Obj) -> AsyncIterator[Adapter]:
    async with await Adapter.open(AdapterConfig(settings=settings_for(cluster, namespace))) as a:
        yield a


@pytest.fixture
def garbage_collector(cluster: ControlPlane) -> None:
    """kube-controller-manager, for its garbage collector: deleted owners take dependents."""
    cluster.start_controller_manager()


# ---------------------------------------------------------------------------------------------
# open and the preflight probe


async def test_open_probes_and_leaves_nothing_behind(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str
) -> None:
    assert adapter.readmission_gate == "no"
    assert adapter.declarations.call_bound == timedelta(seconds=65)
    assert await list_trainjobs(kube_api, namespace) == []


async def test_open_parses_settings_given_as_json_text(
    cluster: ControlPlane, namespace: str, runtime: Obj
) -> None:
    text = (
        f'{{"namespace": "{namespace}", "cluster": {{"kubeconfig": "{cluster.kubeconfig}"}},'
        ' "runtimes": [{"kind": "TrainingRuntime", "name": "dispatch-torch"}]}'
    )
    async with await Adapter.open(AdapterConfig(settings=text)) as opened:
        assert opened.settings.probe_runtime == RUNTIME


async def test_open_refuses_invalid_settings_text(namespace: str) -> None:
    with pytest.raises(ErrInvalid):
        await Adapter.open(AdapterConfig(settings='{"namespace": "x", "bogus": 1}'))


async def test_probe_fails_for_a_missing_runtime(cluster: ControlPlane, namespace: str) -> None:
    message = await raises(
        ErrUnsupported, Adapter.open(AdapterConfig(settings=settings_for(cluster, namespace)))
    )
    assert message.startswith("preflight probe: ")
    assert "TrainingRuntime 'dispatch-torch' does not exist" in message


async def test_probe_fails_for_a_probe_runtime_outside_the_runtimes(
    cluster: ControlPlane, namespace: str, runtime: Obj
) -> None:
    other = RuntimeRef(kind="TrainingRuntime", name="other")
    s = settings_for(cluster, namespace, probe_runtime=other)
    message = await raises(ErrUnsupported, Adapter.open(AdapterConfig(settings=s)))
    assert message.startswith("preflight probe: probeRuntime TrainingRuntime 'other' is not one")


async def test_probe_fails_for_a_runtime_breaking_the_rules(
    cluster: ControlPlane, namespace: str, kube_api: client.ApiClient
) -> None:
    body = example_runtime()
    node_pod_spec(body).pop("restartPolicy")
    await create_runtime(kube_api, namespace, body)
    s = settings_for(cluster, namespace)
    message = await raises(ErrUnsupported, Adapter.open(AdapterConfig(settings=s)))
    assert message.startswith("preflight probe: runtime TrainingRuntime 'dispatch-torch'")
    assert "restartPolicy: Never" in message


async def test_probe_fails_under_init_container_publish_without_the_init_container(
    cluster: ControlPlane, namespace: str, runtime: Obj
) -> None:
    publish = Publish(image=PUBLISH_IMAGE, via="initContainer", init_container="dispatch-publish")
    s = settings_for(cluster, namespace, publish=publish)
    message = await raises(ErrUnsupported, Adapter.open(AdapterConfig(settings=s)))
    assert message.startswith("preflight probe: ")
    assert "no init container named 'dispatch-publish'" in message


async def test_probe_fails_when_kueue_makes_no_workload(
    cluster: ControlPlane, namespace: str, runtime: Obj, kube_api: client.ApiClient
) -> None:
    await create_local_queue(kube_api, namespace)
    s = settings_for(cluster, namespace, kueue=Kueue(local_queue="lq"))
    message = await raises(ErrUnsupported, Adapter.open(AdapterConfig(settings=s)))
    assert message.startswith(
        "preflight probe: Kueue made no Workload for TrainJob dispatch-probe-"
    )
    assert "TrainJob integration" in message
    assert await list_trainjobs(kube_api, namespace) == []


async def test_probe_names_a_missing_local_queue(
    cluster: ControlPlane, namespace: str, runtime: Obj, kube_api: client.ApiClient
) -> None:
    s = settings_for(cluster, namespace, kueue=Kueue(local_queue="missing"))
    message = await raises(ErrUnsupported, Adapter.open(AdapterConfig(settings=s)))
    assert message.startswith("preflight probe: ")
    assert f"LocalQueue 'missing' does not exist in namespace '{namespace}'" in message


async def test_probe_passes_in_kueue_mode_when_a_workload_comes(
    cluster: ControlPlane,
    namespace: str,
    runtime: Obj,
    kube_api: client.ApiClient,
    garbage_collector: None,
) -> None:
    s = settings_for(cluster, namespace, kueue=Kueue(local_queue="lq"), timeouts=COLLECTED)
    async with (
        kueue_stand_in(kube_api, namespace) as stand_in,
        await Adapter.open(AdapterConfig(settings=s)),
    ):
        pass
    assert len(stand_in.seen) == 1
    assert await list_trainjobs(kube_api, namespace) == []


OLD_TRAINER_GROUP = "trainer-v21.dispatch.test"


@pytest.fixture
async def trainer_v21_crd(kube_api: client.ApiClient) -> AsyncIterator[str]:
    """Kubeflow Trainer v2.1.0's real TrainJob CRD, served under another API group.

    The session's control plane serves Trainer v2.3.0 for every other test, and a served
    group cannot hold two schemas at once; swapping the CRD would disturb tests running
    after this one. The v2.1.0 schema (which has no runtimePatches) is therefore installed
    under ``OLD_TRAINER_GROUP``, and the probe's check, which reads a group's OpenAPI
    document, is pointed at that group. Everything but the group name is upstream v2.1.0.
    """
    from tests.cluster.crds import module_dir

    folder = module_dir("github.com/kubeflow/trainer/v2", "v2.1.0") / "manifests/base/crds"
    crd = yaml.safe_load((folder / "trainer.kubeflow.org_trainjobs.yaml").read_text())
    crd["metadata"] = {"name": f"trainjobs.{OLD_TRAINER_GROUP}"}
    crd["spec"]["group"] = OLD_TRAINER_GROUP
    extensions = client.ApiextensionsV1Api(kube_api)
    with contextlib.suppress(ApiException):
        await extensions.create_custom_resource_definition(crd)
    for _ in range(200):
        served = await extensions.read_custom_resource_definition(crd["metadata"]["name"])
        if any(
            c.type == "Established" and c.status == "True" for c in served.status.conditions or ()
        ):
            break
        await asyncio.sleep(0.05)
    yield OLD_TRAINER_GROUP
    with contextlib.suppress(ApiException):
        await extensions.delete_custom_resource_definition(crd["metadata"]["name"])


async def test_probe_refuses_a_trainer_without_runtime_patches(
    adapter: Adapter, trainer_v21_crd: str
) -> None:
    await check_trainer_api(adapter.api)  # v2.3.0 passes
    message = "no spec.runtimePatches"
    for _ in range(100):  # the OpenAPI document of a new CRD is published a moment later
        try:
            await check_trainer_api(adapter.api, group=trainer_v21_crd)
        except ErrUnsupported as error:
            if "is not served" not in str(error):
                break
        await asyncio.sleep(0.1)
    with pytest.raises(ErrUnsupported, match=message):
        await check_trainer_api(adapter.api, group=trainer_v21_crd)


async def test_probe_refuses_a_cluster_without_the_trainer_api(adapter: Adapter) -> None:
    with pytest.raises(ErrUnsupported, match=r"is not served; install Kubeflow Trainer v2\.2"):
        await check_trainer_api(adapter.api, group="trainer.absent.dispatch.test")


# ---------------------------------------------------------------------------------------------
# The TrainJob, as the apiserver accepted it


FULL_JOB = JobSpec(
    job_id="train",
    attempt=2,
    image="registry.example/trainer:1",
    command=("torchrun",),
    args=("main.py", "--lr=0.1"),
    env=(EnvVar(name="SEED", value="7"),),
    num_nodes=3,
    gpus_per_node=8,
    active_deadline_seconds=3600,
)


def expected_patch(job: str, attempt: int, pod_spec: Obj | None) -> Obj:
    labels = own_labels(job, attempt)
    pod_template: Obj = {"metadata": {"labels": labels}}
    if pod_spec is not None:
        pod_template["spec"] = pod_spec
    return {
        "manager": RUNTIME_PATCH_MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": labels},
                                "spec": {"template": pod_template},
                            },
                        }
                    ]
                },
            }
        },
    }


async def test_plain_trainjob_as_accepted_by_the_apiserver(
    cluster: ControlPlane, namespace: str, runtime: Obj, kube_api: client.ApiClient
) -> None:
    s = settings_for(
        cluster,
        namespace,
        labels={"team": "a"},
        annotations={"cost-centre": "42"},
        credentials=(Credential(secret_name="s3", mount_path="/var/run/s3"),),
    )
    async with await Adapter.open(AdapterConfig(settings=s)) as opened:
        ref = await opened.start(FULL_JOB)
    trainjob = await read_trainjob(kube_api, namespace, "train-2")
    assert (ref.name, ref.uid, ref.attempt) == ("train-2", trainjob["metadata"]["uid"], 2)
    metadata = trainjob["metadata"]
    assert metadata["labels"] == {"team": "a", **own_labels("train", 2)}
    assert metadata["annotations"] == {
        "cost-centre": "42",
        ANNOTATION_SPEC_HASH: spec_hash(FULL_JOB, RUNTIME),
    }
    spec = trainjob["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": "dispatch-torch",
    }
    assert spec["trainer"] == {
        "image": "registry.example/trainer:1",
        "command": ["torchrun"],
        "args": ["main.py", "--lr=0.1"],
        "env": [{"name": "SEED", "value": "7"}],
        "numNodes": 3,
        "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
    }
    assert spec["activeDeadlineSeconds"] == 3600
    assert spec["suspend"] is False
    assert spec["runtimePatches"] == [
        expected_patch(
            "train",
            2,
            {
                "volumes": [
                    {
                        "name": "dispatch-credential-0",
                        "secret": {"secretName": "s3", "defaultMode": 256, "optional": True},
                    }
                ],
                "containers": [
                    {
                        "name": "node",
                        "volumeMounts": [
                            {
                                "name": "dispatch-credential-0",
                                "mountPath": "/var/run/s3",
                                "readOnly": True,
                            }
                        ],
                    }
                ],
            },
        )
    ]


async def test_kueue_trainjob_as_accepted_by_the_apiserver(
    cluster: ControlPlane,
    namespace: str,
    runtime: Obj,
    kube_api: client.ApiClient,
    garbage_collector: None,
) -> None:
    s = settings_for(cluster, namespace, kueue=Kueue(local_queue="lq", priority_class="low"))
    async with (
        kueue_stand_in(kube_api, namespace),
        await Adapter.open(AdapterConfig(settings=s)) as opened,
    ):
        ref = await opened.start(JobSpec(job_id="queued"))
    trainjob = await read_trainjob(kube_api, namespace, "queued-1")
    assert trainjob["metadata"]["labels"] == {
        **own_labels("queued"),
        LABEL_QUEUE_NAME: "lq",
        LABEL_PRIORITY_CLASS: "low",
    }
    # Kueue suspends the TrainJob itself; the adapter leaves suspend to it (the CRD default).
    assert trainjob["spec"].get("suspend", False) is False
    assert trainjob["spec"]["trainer"] == {"numNodes": 1}
    assert trainjob["spec"]["runtimePatches"] == [expected_patch("queued", 1, None)]
    assert ref.workload == f"trainjob-queued-1-{ref.uid[:5]}"


async def test_publish_by_image_volume_as_accepted_by_the_apiserver(
    cluster: ControlPlane, namespace: str, runtime: Obj, kube_api: client.ApiClient
) -> None:
    s = settings_for(cluster, namespace, publish=Publish(image=PUBLISH_IMAGE))
    async with await Adapter.open(AdapterConfig(settings=s)) as opened:
        await opened.start(JobSpec(job_id="published"))
    trainjob = await read_trainjob(kube_api, namespace, "published-1")
    assert trainjob["spec"]["runtimePatches"] == [
        expected_patch(
            "published",
            1,
            {
                "volumes": [
                    {
                        "name": "dispatch-publish",
                        "image": {"reference": PUBLISH_IMAGE, "pullPolicy": "IfNotPresent"},
                    }
                ],
                "containers": [
                    {
                        "name": "node",
                        "volumeMounts": [
                            {
                                "name": "dispatch-publish",
                                "mountPath": "/opt/dispatch",
                                "readOnly": True,
                            }
                        ],
                    }
                ],
            },
        )
    ]


async def test_publish_by_init_container_as_accepted_by_the_apiserver(
    cluster: ControlPlane, namespace: str, kube_api: client.ApiClient
) -> None:
    body = example_runtime()
    node_pod_spec(body)["initContainers"] = [
        {
            "name": "dispatch-publish",
            "image": PUBLISH_IMAGE,
            "command": ["cp", "/publish", "/opt/dispatch/publish"],
        }
    ]
    await create_runtime(kube_api, namespace, body)
    publish = Publish(image=PUBLISH_IMAGE, via="initContainer", init_container="dispatch-publish")
    s = settings_for(cluster, namespace, publish=publish)
    async with await Adapter.open(AdapterConfig(settings=s)) as opened:
        await opened.start(JobSpec(job_id="published"))
    trainjob = await read_trainjob(kube_api, namespace, "published-1")
    mount = {"name": "dispatch-publish", "mountPath": "/opt/dispatch"}
    assert trainjob["spec"]["runtimePatches"] == [
        expected_patch(
            "published",
            1,
            {
                "volumes": [{"name": "dispatch-publish", "emptyDir": {}}],
                "initContainers": [{"name": "dispatch-publish", "volumeMounts": [mount]}],
                "containers": [{"name": "node", "volumeMounts": [{**mount, "readOnly": True}]}],
            },
        )
    ]


# ---------------------------------------------------------------------------------------------
# start: refusals and idempotence


def broken(change: Callable[[Obj], None]) -> Obj:
    body = example_runtime()
    change(body)
    return body


def _job_spec(body: Obj) -> Obj:
    spec: Obj = body["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    return spec


RULES: list[tuple[str, Callable[[Obj], None], str]] = [
    (
        "node-job",
        lambda b: b["spec"]["template"]["spec"]["replicatedJobs"][0].update(name="trainer"),
        "no replicatedJob named 'node'",
    ),
    (
        "node-container",
        lambda b: node_pod_spec(b)["containers"][0].update(name="main"),
        "no container named 'node'",
    ),
    (
        "backoff-limit",
        lambda b: _job_spec(b).pop("backoffLimit"),
        "must set backoffLimit: 0 explicitly",
    ),
    (
        "backoff-limit-per-index",
        lambda b: _job_spec(b).update(backoffLimitPerIndex=2, completionMode="Indexed"),
        "backoffLimitPerIndex 2",
    ),
    (
        "pod-failure-ignore",
        lambda b: _job_spec(b).update(
            podFailurePolicy={
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
            }
        ),
        "podFailurePolicy rule with action Ignore",
    ),
    (
        "restart-policy",
        lambda b: node_pod_spec(b).update(restartPolicy="OnFailure"),
        "must set restartPolicy: Never explicitly, it has 'OnFailure'",
    ),
    (
        "max-restarts",
        lambda b: b["spec"]["template"]["spec"].update(failurePolicy={"maxRestarts": 2}),
        "maxRestarts: 2",
    ),
    (
        "ignore-max",
        lambda b: b["spec"]["template"]["spec"].update(
            failurePolicy={
                "rules": [{"name": "again", "action": "RestartJobSetAndIgnoreMaxRestarts"}]
            }
        ),
        "rule 'again' has action RestartJobSetAndIgnoreMaxRestarts",
    ),
]


async def test_each_runtime_rule_refuses_a_start_naming_runtime_and_rule(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str
) -> None:
    refs = []
    for name, change, _ in RULES:
        await create_runtime(kube_api, namespace, {**broken(change), "metadata": {"name": name}})
        refs.append(RuntimeRef(kind="TrainingRuntime", name=name))
    permissive = adapter.settings.model_copy(update={"runtimes": (RUNTIME, *refs)})
    adapter.scope.settings = permissive
    for (name, _, rule), ref in zip(RULES, refs, strict=True):
        message = await raises(ErrUnsupported, adapter.start(JobSpec(job_id=name, runtime=ref)))
        assert message.startswith(f"runtime TrainingRuntime '{name}' is refused: "), message
        assert rule in message
    assert await list_trainjobs(kube_api, namespace) == []


async def test_a_cluster_training_runtime_is_read_cluster_wide(
    cluster: ControlPlane, namespace: str, kube_api: client.ApiClient, runtime: Obj
) -> None:
    name = f"dispatch-torch-{secrets.token_hex(3)}"
    custom = client.CustomObjectsApi(kube_api)
    await custom.create_cluster_custom_object(
        *TRAINER, "clustertrainingruntimes", example_runtime(name, "ClusterTrainingRuntime")
    )
    try:
        cluster_ref = RuntimeRef(kind="ClusterTrainingRuntime", name=name)
        s = settings_for(cluster, namespace, runtimes=(RUNTIME, cluster_ref))
        async with await Adapter.open(AdapterConfig(settings=s)) as opened:
            await opened.start(JobSpec(job_id="wide", runtime=cluster_ref))
        trainjob = await read_trainjob(kube_api, namespace, "wide-1")
        assert trainjob["spec"]["runtimeRef"]["kind"] == "ClusterTrainingRuntime"
    finally:
        await custom.delete_cluster_custom_object(*TRAINER, "clustertrainingruntimes", name)


async def test_a_runtime_outside_the_allow_list_is_refused(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str
) -> None:
    await create_runtime(kube_api, namespace, example_runtime("elsewhere"))
    other = RuntimeRef(kind="TrainingRuntime", name="elsewhere")
    message = await raises(ErrUnsupported, adapter.start(JobSpec(job_id="x", runtime=other)))
    assert "TrainingRuntime 'elsewhere' is not in the adapter's runtimes" in message
    assert await list_trainjobs(kube_api, namespace) == []


async def test_start_is_idempotent_for_the_same_spec(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str
) -> None:
    job = JobSpec(job_id="again", image="trainer:1")
    first = await adapter.start(job)
    second = await adapter.start(JobSpec(job_id="again", image="trainer:1", runtime=RUNTIME))
    assert first == second
    assert [t["metadata"]["name"] for t in await list_trainjobs(kube_api, namespace)] == ["again-1"]


async def test_start_refuses_a_changed_spec_for_the_same_attempt(adapter: Adapter) -> None:
    await adapter.start(JobSpec(job_id="again", image="trainer:1"))
    message = await raises(ErrInvalid, adapter.start(JobSpec(job_id="again", image="trainer:2")))
    assert "TrainJob again-1 already exists with another spec" in message
    second = await adapter.start(JobSpec(job_id="again", image="trainer:2", attempt=2))
    assert second.name == "again-2"


async def test_a_create_that_cannot_be_confirmed_is_outcome_unknown(
    adapter: Adapter, cluster: ControlPlane
) -> None:
    """The apiserver goes away between reading the runtime and creating the TrainJob: the
    create fails without an answer and the read-back cannot reach the apiserver either."""
    job = JobSpec(job_id="unsure")
    body = build_trainjob(job, adapter.settings, adapter.adapter_name)
    cluster.stop_apiserver()
    try:
        message = await raises(ErrOutcomeUnknown, create_trainjob(adapter.scope, body))
    finally:
        cluster.start_apiserver()
    assert "creating TrainJob unsure-1" in message
    assert "start again to find out" in message


# ---------------------------------------------------------------------------------------------
# find and stop_job


async def test_find_reads_back_the_job(adapter: Adapter) -> None:
    with pytest.raises(ErrNotFound):
        await adapter.find("nothing")
    await adapter.start(JobSpec(job_id="seen"))
    found = await adapter.find("seen")
    assert found.job_id == "seen"
    assert [a.attempt for a in found.attempts] == [1]
    assert found.current.train_job is not None
    assert found.current.train_job["metadata"]["name"] == "seen-1"
    assert found.state == State.PENDING
    assert found.remaining() == ["TrainJob/seen-1"]


async def make_jobset_and_pod(
    api: client.ApiClient, namespace: str, trainjob: Obj, finalizers: list[str] | None = None
) -> tuple[Obj, Obj]:
    """What Trainer, JobSet and the Job controller make of a TrainJob, with their owners."""
    name = trainjob["metadata"]["name"]
    labels = trainjob["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["metadata"][
        "labels"
    ]
    jobset = await client.CustomObjectsApi(api).create_namespaced_custom_object(
        *JOBSET,
        namespace,
        "jobsets",
        {
            "apiVersion": "/".join(JOBSET),
            "kind": "JobSet",
            "metadata": {
                "name": name,
                "labels": labels,
                "finalizers": finalizers or [],
                "ownerReferences": [owner(trainjob, "TrainJob", "/".join(TRAINER))],
            },
            "spec": {"replicatedJobs": []},
        },
    )
    core: Any = client.CoreV1Api(api)  # takes a plain dict as the body
    pod = await core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": f"{name}-node-0-0",
                "labels": labels,
                "ownerReferences": [owner(jobset, "JobSet", "/".join(JOBSET))],
            },
            "spec": {"containers": [{"name": "node", "image": "trainer:1"}]},
        },
    )
    return jobset, api.sanitize_for_serialization(pod)


async def test_stop_job_removes_everything_of_the_job(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str, garbage_collector: None
) -> None:
    await adapter.start(JobSpec(job_id="gone"))
    await adapter.start(JobSpec(job_id="gone", attempt=2))
    await adapter.start(JobSpec(job_id="kept"))
    trainjob = await read_trainjob(kube_api, namespace, "gone-2")
    await make_jobset_and_pod(kube_api, namespace, trainjob)
    found = await adapter.find("gone")
    assert sorted(found.remaining()) == [
        "JobSet/gone-2",
        "Pod/gone-2-node-0-0",
        "TrainJob/gone-1",
        "TrainJob/gone-2",
    ]
    await adapter.stop_job("gone")
    with pytest.raises(ErrNotFound):
        await adapter.find("gone")
    assert (await adapter.find("kept")).remaining() == ["TrainJob/kept-1"]


async def test_stop_job_of_nothing_succeeds(adapter: Adapter) -> None:
    await adapter.stop_job("never-started")


async def test_stop_job_reports_what_a_finalizer_holds(
    cluster: ControlPlane,
    namespace: str,
    runtime: Obj,
    kube_api: client.ApiClient,
    garbage_collector: None,
) -> None:
    s = settings_for(
        cluster,
        namespace,
        timeouts=Timeouts(workload=timedelta(seconds=5), stop_job=timedelta(seconds=1)),
    )
    async with await Adapter.open(AdapterConfig(settings=s)) as opened:
        await opened.start(JobSpec(job_id="held"))
        trainjob = await read_trainjob(kube_api, namespace, "held-1")
        await make_jobset_and_pod(kube_api, namespace, trainjob, finalizers=[HOLD])
        try:
            message = await raises(ErrOutcomeUnknown, opened.stop_job("held"))
            assert message.startswith("stop_job held: after 1s these remain: ")
            assert f"JobSet/held-1 (finalizers: {HOLD})" in message
        finally:
            objects: Any = client.CustomObjectsApi(kube_api)  # its signature omits _content_type
            await objects.patch_namespaced_custom_object(
                *JOBSET,
                namespace,
                "jobsets",
                "held-1",
                {"metadata": {"finalizers": None}},
                _content_type=MERGE_PATCH,
            )
        await opened.stop_job("held")


async def test_stop_job_waits_for_the_workload_in_kueue_mode(
    cluster: ControlPlane,
    namespace: str,
    runtime: Obj,
    kube_api: client.ApiClient,
    garbage_collector: None,
) -> None:
    s = settings_for(cluster, namespace, kueue=Kueue(local_queue="lq"), timeouts=COLLECTED)
    async with (
        kueue_stand_in(kube_api, namespace),
        await Adapter.open(AdapterConfig(settings=s)) as opened,
    ):
        ref = await opened.start(JobSpec(job_id="queued"))
        found = await opened.find("queued")
        assert found.current.workload is not None
        assert found.remaining() == ["TrainJob/queued-1", f"Workload/{ref.workload}"]
        await opened.stop_job("queued")
        with pytest.raises(ErrNotFound):
            await opened.find("queued")


async def hold_workload(api: client.ApiClient, namespace: str, name: str, hold: bool) -> None:
    objects: Any = client.CustomObjectsApi(api)  # its signature omits _content_type
    await objects.patch_namespaced_custom_object(
        *KUEUE,
        namespace,
        "workloads",
        name,
        {"metadata": {"finalizers": [HOLD] if hold else None}},
        _content_type=MERGE_PATCH,
    )


def workload_selectors(adapter: Adapter, *, watches: bool = False) -> list[str]:
    """The label selectors of the adapter's Workload LISTs (and WATCHes, with ``watches``) from
    now on, outside its own watch of the namespace (the calls go through)."""
    custom = adapter.scope.custom
    listed: list[str] = []
    original = custom.list_namespaced_custom_object

    async def recording(*args: Any, **kwargs: Any) -> Any:
        if args[3] == "workloads" and (watches or not kwargs.get("watch")):
            listed.append(kwargs.get("label_selector", ""))
        return await original(*args, **kwargs)

    custom.list_namespaced_custom_object = recording  # type: ignore[method-assign]
    return listed


async def test_a_start_sees_its_workload_on_the_adapters_own_watch(
    cluster: ControlPlane,
    namespace: str,
    runtime: Obj,
    kube_api: client.ApiClient,
) -> None:
    """While the adapter watches, a Kueue-mode start asks the apiserver nothing about Workloads;
    once the watch is gone, it lists and watches for its Workload itself."""
    s = settings_for(cluster, namespace, kueue=Kueue(local_queue="lq"), timeouts=COLLECTED)
    async with (
        kueue_stand_in(kube_api, namespace),
        await Adapter.open(AdapterConfig(settings=s)) as opened,
    ):
        stream = opened.watch()
        consumer = asyncio.ensure_future(stream.__anext__())
        deadline = asyncio.get_running_loop().time() + 30
        informers = opened.supervisor.informers
        while not (informers and all(i.synced.is_set() for i in informers)):
            informers = opened.supervisor.informers
            assert asyncio.get_running_loop().time() < deadline, "the watch did not list"
            await asyncio.sleep(0.05)
        calls = workload_selectors(opened, watches=True)
        watched = await opened.start(JobSpec(job_id="watched"))
        assert watched.workload is not None
        assert calls == []
        consumer.cancel()
        await stream.aclose()
        unwatched = await opened.start(JobSpec(job_id="unwatched"))
        assert unwatched.workload is not None
        assert f"{LABEL_KUEUE_JOB_UID}={unwatched.uid}" in calls


def runtime_reads(adapter: Adapter) -> list[str]:
    """The names of the TrainingRuntimes the adapter reads from now on (the reads go through)."""
    custom = adapter.scope.custom
    read: list[str] = []
    original = custom.get_namespaced_custom_object

    async def recording(*args: Any, **kwargs: Any) -> Any:
        if args[3] == "trainingruntimes":
            read.append(args[4])
        return await original(*args, **kwargs)

    custom.get_namespaced_custom_object = recording  # type: ignore[method-assign]
    return read


@contextlib.asynccontextmanager
async def watching(adapter: Adapter) -> AsyncIterator[None]:
    """The adapter's watch runs, every kind it watches listed, the runtimes included."""
    stream = adapter.watch()
    consumer = asyncio.ensure_future(stream.__anext__())
    supervisor = adapter.supervisor

    def listed() -> bool:
        informers = [*supervisor.informers, *supervisor.runtimes.informers.values()]
        return bool(supervisor.informers) and all(i.synced.is_set() for i in informers)

    try:
        await until(listed, "the adapter's watch to list every kind")
        yield
    finally:
        await cancel_and_wait(consumer)
        await stream.aclose()


async def until(done: Callable[[], bool], what: str, within: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not done():
        assert asyncio.get_running_loop().time() < deadline, f"waited {within} s for {what}"
        await asyncio.sleep(0.05)


def trainjob_read_backs(adapter: Adapter, job: str) -> list[float]:
    """When the adapter lists the TrainJobs of ``job`` from now on, outside its own watch (each
    read-back of a stop lists them first; the calls go through)."""
    custom = adapter.scope.custom
    listed: list[float] = []
    original = custom.list_namespaced_custom_object

    async def recording(*args: Any, **kwargs: Any) -> Any:
        selector = kwargs.get("label_selector", "")
        if args[3] == TRAINJOBS and not kwargs.get("watch") and f"{LABEL_JOB}={job}" in selector:
            listed.append(asyncio.get_running_loop().time())
        return await original(*args, **kwargs)

    custom.list_namespaced_custom_object = recording  # type: ignore[method-assign]
    return listed


@contextlib.asynccontextmanager
async def held_and_watched(
    adapter: Adapter, api: client.ApiClient, namespace: str, job: str
) -> AsyncIterator[tuple[Informer, str, list[float]]]:
    """``job`` started with a JobSet and a pod that a finalizer holds once deleted, and the
    adapter's watch showing the pod. Yields the watch's pods, the pod's name, and the job's
    read-backs from then on."""
    await adapter.start(JobSpec(job_id=job))
    trainjob = await read_trainjob(api, namespace, f"{job}-1")
    _, pod = await make_jobset_and_pod(api, namespace, trainjob)
    name = str(pod["metadata"]["name"])
    await hold_pod(api, namespace, name, hold=True)
    reads = trainjob_read_backs(adapter, job)
    async with watching(adapter):
        pods = next(i for i in adapter.supervisor.informers if i.kind == "Pod")
        await until(lambda: bool(pods.indexed(job)), "the watch to see the pod")
        yield pods, name, reads


async def hold_pod(api: client.ApiClient, namespace: str, name: str, hold: bool) -> None:
    core: Any = client.CoreV1Api(api)  # its signature omits _content_type
    patch = {"metadata": {"finalizers": [HOLD] if hold else None}}
    await core.patch_namespaced_pod(name, namespace, patch, _content_type=MERGE_PATCH)


async def test_while_the_adapter_watches_a_stop_reads_back_once_its_job_is_gone(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str, garbage_collector: None
) -> None:
    """However long a pod takes to go, the stop reads back once: when the watch shows it gone."""
    async with held_and_watched(adapter, kube_api, namespace, "slow") as (pods, pod, reads):
        stopping = asyncio.ensure_future(adapter.stop_job("slow"))

        def deleting() -> bool:
            seen = pods.indexed("slow")
            return bool(seen) and "deletionTimestamp" in seen[0]["metadata"]

        await until(deleting, "the garbage collector to delete the pod")
        assert not stopping.done()
        assert reads == []
        await hold_pod(kube_api, namespace, pod, hold=False)
        await stopping
    assert len(reads) == 1
    with pytest.raises(ErrNotFound):
        await adapter.find("slow")


async def test_a_stop_whose_watch_lags_reads_back_until_the_job_is_gone(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str, garbage_collector: None
) -> None:
    """The watch shows the job gone while the apiserver still has its pod (here the watch is
    made to lose it): the stop goes on reading back, and returns only once the pod is gone."""
    async with held_and_watched(adapter, kube_api, namespace, "lagged") as (pods, pod, reads):
        pods._pop(f"{namespace}/{pod}")
        stopping = asyncio.ensure_future(adapter.stop_job("lagged"))
        await until(lambda: len(reads) >= 2, "the stop to read back again")
        assert not stopping.done()
        await hold_pod(kube_api, namespace, pod, hold=False)
        await stopping
    with pytest.raises(ErrNotFound):
        await adapter.find("lagged")


async def test_a_stop_whose_watch_shows_what_is_gone_reads_back_anyway(
    adapter: Adapter, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watch keeps showing a pod the apiserver no longer has (here one put in its cache): the
    stop reads back after ``WATCHED_POLL`` and returns, instead of waiting out its bound."""
    monkeypatch.setattr(stopping, "WATCHED_POLL", timedelta(seconds=0.2))
    await adapter.start(JobSpec(job_id="ghost"))
    reads = trainjob_read_backs(adapter, "ghost")
    async with watching(adapter):
        pods = next(i for i in adapter.supervisor.informers if i.kind == "Pod")
        labels = {LABEL_ADAPTER: "default", LABEL_JOB: "ghost", LABEL_ATTEMPT: "1"}
        pods._put(f"{namespace}/ghost-1-node-0-0", {"metadata": {"labels": labels}})
        async with asyncio.timeout(10):
            await adapter.stop_job("ghost")
        assert pods.indexed("ghost")
    assert len(reads) == 1


def watched_runtime(adapter: Adapter, name: str) -> Obj | None:
    return adapter.supervisor.cached_runtime(RuntimeRef(kind="TrainingRuntime", name=name))


async def test_a_start_checks_its_runtime_on_the_adapters_own_watch(adapter: Adapter) -> None:
    """While the adapter watches, a start reads no runtime; once the watch is gone, it does."""
    reads = runtime_reads(adapter)
    async with watching(adapter):
        await adapter.start(JobSpec(job_id="watched"))
        assert reads == []
    await adapter.start(JobSpec(job_id="unwatched"))
    assert reads == [RUNTIME.name]


async def test_a_runtime_the_watch_has_not_seen_is_read(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str
) -> None:
    """A runtime created a moment ago (here: one the watch is made to lag behind) is read from
    the apiserver, never refused as missing."""
    await create_runtime(kube_api, namespace, example_runtime("fresh"))
    fresh = RuntimeRef(kind="TrainingRuntime", name="fresh")
    adapter.scope.settings = adapter.settings.model_copy(update={"runtimes": (RUNTIME, fresh)})
    reads = runtime_reads(adapter)
    async with watching(adapter):
        await until(lambda: watched_runtime(adapter, "fresh") is not None, "the watch to see it")
        informer = adapter.supervisor.runtimes.informers["TrainingRuntime"]
        del informer.cache[f"{namespace}/fresh"]
        await adapter.start(JobSpec(job_id="new", runtime=fresh))
    assert reads == ["fresh"]
    assert (await read_trainjob(kube_api, namespace, "new-1"))["spec"]["runtimeRef"]["name"] == (
        "fresh"
    )


async def test_a_start_is_refused_only_on_the_runtime_as_the_apiserver_has_it(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str
) -> None:
    """The watch's copy breaking a rule (a runtime fixed a moment ago) does not refuse a start:
    the runtime is read and the start goes on. A runtime broken for real is refused, on a read,
    naming the rule."""
    name, change, rule = RULES[0]
    await create_runtime(kube_api, namespace, example_runtime(name))
    ref = RuntimeRef(kind="TrainingRuntime", name=name)
    adapter.scope.settings = adapter.settings.model_copy(update={"runtimes": (RUNTIME, ref)})
    reads = runtime_reads(adapter)
    async with watching(adapter):
        await until(lambda: watched_runtime(adapter, name) is not None, "the watch to see it")
        informer = adapter.supervisor.runtimes.informers["TrainingRuntime"]
        informer.cache[f"{namespace}/{name}"] = {**broken(change), "metadata": {"name": name}}
        await adapter.start(JobSpec(job_id="fixed", runtime=ref))
        assert reads == [name]

        custom = client.CustomObjectsApi(kube_api)
        current = await custom.get_namespaced_custom_object(*TRAINER, namespace, RUNTIMES, name)
        replaced = await custom.replace_namespaced_custom_object(
            *TRAINER, namespace, RUNTIMES, name, {**current, "spec": broken(change)["spec"]}
        )

        def seen_broken() -> bool:
            seen = watched_runtime(adapter, name)
            version = replaced["metadata"]["resourceVersion"]
            return seen is not None and seen["metadata"].get("resourceVersion") == version

        await until(seen_broken, "the watch to see the runtime broken")
        message = await raises(ErrUnsupported, adapter.start(JobSpec(job_id="broken", runtime=ref)))
        assert rule in message
        assert reads == [name, name]

        await custom.delete_namespaced_custom_object(*TRAINER, namespace, RUNTIMES, name)
        await until(lambda: watched_runtime(adapter, name) is None, "the watch to see it go")
        message = await raises(ErrUnsupported, adapter.start(JobSpec(job_id="gone", runtime=ref)))
        assert f"TrainingRuntime {name!r} does not exist" in message
    assert [t["metadata"]["name"] for t in await list_trainjobs(kube_api, namespace)] == ["fixed-1"]


async def test_a_workload_that_outlives_its_trainjob_is_found_by_its_uid(
    cluster: ControlPlane,
    namespace: str,
    runtime: Obj,
    kube_api: client.ApiClient,
    garbage_collector: None,
) -> None:
    """Kueue's finalizer can hold a Workload after its TrainJob is gone: stop_job waits for it,
    and a later adapter, which never saw the TrainJob, still finds it."""
    s = settings_for(
        cluster,
        namespace,
        kueue=Kueue(local_queue="lq"),
        timeouts=Timeouts(workload=timedelta(seconds=30), stop_job=timedelta(seconds=3)),
    )
    async with kueue_stand_in(kube_api, namespace):
        async with await Adapter.open(AdapterConfig(settings=s)) as opened:
            held = await opened.start(JobSpec(job_id="held"))
            other = await opened.start(JobSpec(job_id="other"))
            assert held.workload is not None
            await hold_workload(kube_api, namespace, held.workload, hold=True)
            selectors = workload_selectors(opened)
            message = await raises(ErrOutcomeUnknown, opened.stop_job("held"))
            # Each read-back asked for this job's Workloads only, never the namespace's.
            assert selectors
            assert set(selectors) == {f"{LABEL_KUEUE_JOB_UID} in ({held.uid})"}
            assert message.endswith(f"Workload/{held.workload} (finalizers: {HOLD})")
            names = [t["metadata"]["name"] for t in await list_trainjobs(kube_api, namespace)]
            assert names == ["other-1"]
        async with await Adapter.open(AdapterConfig(settings=s)) as later:
            found = await later.find("held")
            assert found.remaining() == [f"Workload/{held.workload} (finalizers: {HOLD})"]
            await hold_workload(kube_api, namespace, held.workload, hold=False)
            await later.stop_job("held")
            with pytest.raises(ErrNotFound):
                await later.find("held")
            assert (await later.find("other")).remaining() == [
                "TrainJob/other-1",
                f"Workload/{other.workload}",
            ]


async def test_while_the_adapter_watches_a_stop_waits_for_a_held_workload_on_the_watch(
    cluster: ControlPlane,
    namespace: str,
    runtime: Obj,
    kube_api: client.ApiClient,
    garbage_collector: None,
) -> None:
    """A Workload that Kueue's finalizer holds after its TrainJob went: the stop reads back once,
    when the watch shows the Workload gone too."""
    s = settings_for(cluster, namespace, kueue=Kueue(local_queue="lq"), timeouts=COLLECTED)
    async with (
        kueue_stand_in(kube_api, namespace),
        await Adapter.open(AdapterConfig(settings=s)) as opened,
    ):
        held = await opened.start(JobSpec(job_id="held"))
        assert held.workload is not None
        await hold_workload(kube_api, namespace, held.workload, hold=True)
        reads = trainjob_read_backs(opened, "held")
        async with watching(opened):
            trainjobs, workloads = (
                next(i for i in opened.supervisor.informers if i.kind == kind)
                for kind in ("TrainJob", "Workload")
            )
            stopping = asyncio.ensure_future(opened.stop_job("held"))

            def only_the_workload_left() -> bool:
                left = workloads.indexed(held.uid)
                return not trainjobs.indexed("held") and bool(left)

            await until(only_the_workload_left, "the TrainJob to go before its Workload")
            assert not stopping.done()
            assert reads == []
            await hold_workload(kube_api, namespace, held.workload, hold=False)
            await stopping
        assert len(reads) == 1
        with pytest.raises(ErrNotFound):
            await opened.find("held")


async def test_start_in_kueue_mode_deletes_the_trainjob_when_no_workload_comes(
    cluster: ControlPlane,
    namespace: str,
    runtime: Obj,
    kube_api: client.ApiClient,
    garbage_collector: None,
) -> None:
    await create_local_queue(kube_api, namespace)
    s = settings_for(cluster, namespace, kueue=Kueue(local_queue="lq"))
    async with kueue_stand_in(kube_api, namespace) as stand_in:
        opened = await Adapter.open(AdapterConfig(settings=s))
    try:
        assert len(stand_in.seen) == 1  # the probe's
        message = await raises(ErrUnsupported, opened.start(JobSpec(job_id="lonely")))
        assert message.startswith("Kueue made no Workload for TrainJob lonely-1 within 5s")
        assert "the TrainJob was deleted" in message
        assert await list_trainjobs(kube_api, namespace) == []
    finally:
        await opened.close()


# ---------------------------------------------------------------------------------------------
# The readmission gate


async def test_readmit_and_reject_annotate_the_current_trainjob(
    cluster: ControlPlane,
    namespace: str,
    runtime: Obj,
    kube_api: client.ApiClient,
    garbage_collector: None,
) -> None:
    s = settings_for(cluster, namespace, kueue=Kueue(local_queue="lq", admission_check="gate"))
    async with (
        kueue_stand_in(kube_api, namespace),
        await Adapter.open(AdapterConfig(settings=s)) as opened,
    ):
        assert opened.readmission_gate == "yes"
        await opened.start(JobSpec(job_id="gated"))
        ref = await opened.start(JobSpec(job_id="gated", attempt=2))
        objects: Any = client.CustomObjectsApi(kube_api)  # its signature omits _content_type
        await objects.patch_namespaced_custom_object_status(
            *KUEUE,
            namespace,
            "workloads",
            ref.workload,
            {
                "status": {
                    "schedulingStats": {
                        "evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 2}]
                    }
                }
            },
            _content_type=MERGE_PATCH,
        )
        await opened.readmit("gated")
        await opened.reject("gated", "dispatch gave up on this job")
    current = await read_trainjob(kube_api, namespace, "gated-2")
    assert current["metadata"]["annotations"][ANNOTATION_READMIT] == "2"
    assert current["metadata"]["annotations"][ANNOTATION_REJECT] == "dispatch gave up on this job"
    earlier = await read_trainjob(kube_api, namespace, "gated-1")
    assert ANNOTATION_READMIT not in earlier["metadata"]["annotations"]


async def test_a_gate_annotation_for_a_deleted_trainjob_never_reaches_its_namesake(
    adapter: Adapter, kube_api: client.ApiClient, namespace: str
) -> None:
    # readmit and reject annotate the TrainJob they found; it may be deleted, and a new job
    # created under its name, before the patch arrives.
    await adapter.start(JobSpec(job_id="renamed"))
    deleted = await read_trainjob(kube_api, namespace, "renamed-1")
    objects: Any = client.CustomObjectsApi(kube_api)
    await objects.delete_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, namespace, TRAINJOBS, "renamed-1"
    )
    await objects.create_namespaced_custom_object(
        TRAINER_GROUP,
        TRAINER_VERSION,
        namespace,
        TRAINJOBS,
        {k: deleted[k] for k in ("apiVersion", "kind", "spec")}
        | {"metadata": {"name": "renamed-1", "labels": deleted["metadata"]["labels"]}},
    )
    message = await raises(
        ErrNotFound, gate._annotate(adapter.scope, deleted, {ANNOTATION_REJECT: "too late"})
    )
    assert message == "TrainJob renamed-1 is gone"
    current = await read_trainjob(kube_api, namespace, "renamed-1")
    assert ANNOTATION_REJECT not in current["metadata"].get("annotations", {})


async def test_readmit_is_unsupported_without_a_gate(adapter: Adapter) -> None:
    await adapter.start(JobSpec(job_id="plain"))
    assert "no readmission gate" in await raises(ErrUnsupported, adapter.readmit("plain"))
    assert "no readmission gate" in await raises(ErrUnsupported, adapter.reject("plain", "x"))


# ---------------------------------------------------------------------------------------------
# Connection routes


def two_context_kubeconfig(cluster: ControlPlane, path: Path, user: str) -> Path:
    """One file, two contexts: ``admin`` and ``restricted`` (current)."""
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    restricted = yaml.safe_load(cluster.kubeconfig_for(user).read_text())
    merged = copy.deepcopy(admin)
    merged["users"] = [
        {"name": "admin", "user": admin["users"][0]["user"]},
        {"name": "restricted", "user": restricted["users"][0]["user"]},
    ]
    cluster_name = admin["clusters"][0]["name"]
    merged["contexts"] = [
        {"name": "admin", "context": {"cluster": cluster_name, "user": "admin"}},
        {"name": "restricted", "context": {"cluster": cluster_name, "user": "restricted"}},
    ]
    merged["current-context"] = "restricted"
    path.write_text(yaml.safe_dump(merged))
    return path


async def identity(cluster_settings: Cluster, token: str | None = None) -> str:
    api = await connect(cluster_settings, token=token, request_timeout=timedelta(seconds=10))
    try:
        return await whoami(api)
    finally:
        await api.close()


async def test_kubeconfig_context_selects_the_identity(
    cluster: ControlPlane, tmp_path: Path
) -> None:
    path = two_context_kubeconfig(cluster, tmp_path / "config", "alice")
    admin_name = await identity(Cluster(kubeconfig=str(cluster.kubeconfig)))
    assert await identity(Cluster(kubeconfig=str(path))) == "alice"
    assert await identity(Cluster(kubeconfig=str(path), context="admin")) == admin_name
    with pytest.raises(ErrUnsupported, match="context 'nope'"):
        await identity(Cluster(kubeconfig=str(path), context="nope"))


async def test_loading_rules_kubeconfig_list_then_home(
    cluster: ControlPlane, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = two_context_kubeconfig(cluster, tmp_path / "config", "bob")
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'missing'}:{path}")
    assert await identity(Cluster()) == "bob"
    assert await identity(Cluster(context="restricted")) == "bob"
    monkeypatch.delenv("KUBECONFIG")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text(cluster.kubeconfig_for("carol").read_text())
    monkeypatch.setenv("HOME", str(home))
    assert await identity(Cluster()) == "carol"


async def test_a_missing_kubeconfig_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ErrUnsupported, match=r"cluster\.kubeconfig '/nowhere/config' does not"):
        await identity(Cluster(kubeconfig="/nowhere/config"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ErrUnsupported, match=r"no kubeconfig found .* not running in a pod"):
        await identity(Cluster())


async def test_the_proxy_is_read_from_the_environment_once(
    cluster: ControlPlane, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTPS_PROXY and NO_PROXY count when the client is made, as in client-go; not per request."""
    admin = Cluster(kubeconfig=str(cluster.kubeconfig))
    for name in ("NO_PROXY", "no_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setenv("HTTPS_PROXY", nowhere)
    api = await connect(admin, token=None, request_timeout=timedelta(seconds=5))
    session = api.rest_client.pool_manager
    assert not session.trust_env
    assert session.connector is not None
    assert session.connector.limit == connection.CONNECTIONS_PER_CLIENT
    try:
        with pytest.raises(aiohttp.ClientProxyConnectionError):
            await whoami(api)
        monkeypatch.delenv("HTTPS_PROXY")
        with pytest.raises(aiohttp.ClientProxyConnectionError):
            await whoami(api)
    finally:
        await api.close()
    monkeypatch.setenv("HTTPS_PROXY", nowhere)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    assert await identity(admin)


async def service_account_token(api: client.ApiClient, namespace: str, name: str) -> str:
    core: Any = client.CoreV1Api(api)  # takes a plain dict as the body
    await core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    issued = await core.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 600}}
    )
    token: str = issued.status.token
    return token


async def test_a_token_replaces_the_kubeconfig_credentials(
    cluster: ControlPlane, namespace: str, kube_api: client.ApiClient
) -> None:
    token = await service_account_token(kube_api, namespace, "dispatcher")
    admin = Cluster(kubeconfig=str(cluster.kubeconfig))
    expected = f"system:serviceaccount:{namespace}:dispatcher"
    assert await identity(admin, token=token) == expected
    with pytest.raises(ApiException) as refused:
        await identity(admin, token="not-a-token")
    assert refused.value.status == 401


async def test_in_cluster_uses_the_pods_service_account(
    cluster: ControlPlane,
    namespace: str,
    kube_api: client.ApiClient,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The token and CA a pod would find mounted, and the service environment variables."""
    mounted = tmp_path / "serviceaccount"
    mounted.mkdir()
    (mounted / "token").write_text(await service_account_token(kube_api, namespace, "in-pod"))
    (mounted / "ca.crt").write_bytes((cluster.run_dir / "pki" / "ca.crt").read_bytes())
    monkeypatch.setattr(connection, "SERVICE_ACCOUNT_DIR", mounted)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(cluster.apiserver_port))
    expected = f"system:serviceaccount:{namespace}:in-pod"
    assert await identity(Cluster(in_cluster=True)) == expected
    # With no kubeconfig anywhere, the loading rules fall back to the service account.
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert await identity(Cluster()) == expected


async def test_requests_are_bounded_by_the_request_timeout(cluster: ControlPlane) -> None:
    """A stopped apiserver refuses at once; a listening socket that never answers is what
    the request timeout is for, so the test points the client at one."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    try:
        api = await connect(
            Cluster(kubeconfig=str(cluster.kubeconfig)),
            token=None,
            request_timeout=timedelta(seconds=0.5),
        )
        api.configuration.host = f"https://127.0.0.1:{silent.getsockname()[1]}"
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(TimeoutError):
            await client.CoreV1Api(api).list_namespace()
        assert loop.time() - began < 5
        assert api.requests == 1
        await api.close()
    finally:
        silent.close()
