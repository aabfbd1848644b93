"""The JobSpec rules and the TrainJob body of SPEC §4, built without a cluster."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch_kubeflow.constants import (
    ANNOTATION_SPEC_HASH,
    LABEL_ADAPTER,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_PRIORITY_CLASS,
    LABEL_QUEUE_NAME,
    RUNTIME_PATCH_MANAGER,
)
from dispatch_kubeflow.errors import ErrInvalid
from dispatch_kubeflow.settings import Credential, Kueue, Publish, RuntimeRef, Settings
from dispatch_kubeflow.trainjob import (
    EnvVar,
    JobSpec,
    build_trainjob,
    resolve_runtime,
    spec_hash,
)

TORCH = RuntimeRef(kind="ClusterTrainingRuntime", name="dispatch-torch")
LOCAL = RuntimeRef(kind="TrainingRuntime", name="local")
IMAGE = "registry.example/publish@sha256:" + "a" * 64


def settings(**changes: Any) -> Settings:
    values: dict[str, Any] = {
        "namespace": "team-a",
        "runtimes": (TORCH, LOCAL),
        "probe_runtime": TORCH,
    }
    values.update(changes)
    return Settings(**values)


def own_labels(job: str = "train", attempt: int = 1) -> dict[str, str]:
    return {LABEL_ADAPTER: "default", LABEL_JOB: job, LABEL_ATTEMPT: str(attempt)}


def node_pod(body: dict[str, Any]) -> dict[str, Any]:
    [patch] = body["spec"]["runtimePatches"]
    [node] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node"
    pod: dict[str, Any] = node["template"]["spec"]["template"]
    return pod


class TestJobSpec:
    def test_accepts_camel_case_as_the_dispatch_job_spells_it(self) -> None:
        job = JobSpec.model_validate(
            {"jobId": "train", "attempt": 2, "numNodes": 4, "gpusPerNode": 8}
        )
        assert (job.num_nodes, job.gpus_per_node, job.attempt) == (4, 8, 2)

    @pytest.mark.parametrize(
        ("data", "field"),
        [
            ({"jobId": "Train"}, "jobId"),
            ({"jobId": "1train"}, "jobId"),
            ({"jobId": "train-"}, "jobId"),
            ({"jobId": "train\n"}, "jobId"),
            ({"jobId": "train", "attempt": 0}, "attempt"),
            ({"jobId": "train", "attempt": "1"}, "attempt"),
            ({"jobId": "train", "numNodes": 0}, "numNodes"),
            ({"jobId": "train", "gpusPerNode": -1}, "gpusPerNode"),
            ({"jobId": "train", "activeDeadlineSeconds": 0}, "activeDeadlineSeconds"),
            ({"jobId": "train", "image": ""}, "image"),
            ({"jobId": "train", "env": [{"name": "A=B", "value": "x"}]}, "env"),
            ({"jobId": "train", "env": [{"name": "A"}, {"name": "A"}]}, "env"),
            ({"jobId": "train", "command": ["x"] * 129}, "command"),
            ({"jobId": "train", "runtime": {"kind": "Other", "name": "x"}}, "runtime"),
            ({"jobId": "train", "numnodes": 2}, "numnodes"),
            ({"jobId": "train", "runtime": {"kind": "TrainingRuntime", "name": "A_b"}}, "runtime"),
            ({"jobId": "train", "runtime": {"kind": "TrainingRuntime", "name": "a\n"}}, "runtime"),
        ],
    )
    def test_refuses_a_bad_field_naming_it(self, data: dict[str, Any], field: str) -> None:
        with pytest.raises(ErrInvalid, match=field):
            JobSpec.model_validate(data)

    def test_an_env_var_alone_is_refused_as_invalid_too(self) -> None:
        with pytest.raises(ErrInvalid, match="job spec: env: name"):
            EnvVar.model_validate({"name": ""})

    def test_job_id_is_limited_so_that_job_and_attempt_fit_63_characters(self) -> None:
        JobSpec(job_id="a" * 61, attempt=9)
        with pytest.raises(ErrInvalid, match="at most 63"):
            JobSpec(job_id="a" * 61, attempt=10)

    def test_runtime_defaults_to_the_first_of_the_adapters_runtimes(self) -> None:
        assert resolve_runtime(JobSpec(job_id="train"), settings()) == TORCH
        assert resolve_runtime(JobSpec(job_id="train", runtime=LOCAL), settings()) == LOCAL

    def test_no_runtime_and_no_runtimes_is_refused(self) -> None:
        with pytest.raises(ErrInvalid, match="runtime: required"):
            resolve_runtime(JobSpec(job_id="train"), settings(runtimes=()))


class TestSpecHash:
    def test_same_request_same_hash_and_defaults_do_not_matter(self) -> None:
        explicit = JobSpec(job_id="train", runtime=TORCH, num_nodes=1)
        implicit = JobSpec(job_id="train")
        assert spec_hash(explicit, TORCH) == spec_hash(implicit, TORCH)

    @given(
        st.sampled_from(
            [
                {"image": "other"},
                {"num_nodes": 3},
                {"gpus_per_node": 1},
                {"command": ("python",)},
                {"args": ("--x",)},
                {"env": (EnvVar(name="A", value="1"),)},
                {"active_deadline_seconds": 60},
            ]
        )
    )
    def test_any_change_of_the_request_changes_the_hash(self, change: dict[str, Any]) -> None:
        base = JobSpec(job_id="train", image="img")
        assert spec_hash(base, TORCH) != spec_hash(base.model_copy(update=change), TORCH)

    def test_runtime_is_part_of_the_hash(self) -> None:
        job = JobSpec(job_id="train")
        assert spec_hash(job, TORCH) != spec_hash(job, LOCAL)


class TestPlainTrainJob:
    def test_the_whole_body(self) -> None:
        job = JobSpec(
            job_id="train",
            attempt=3,
            image="trainer:1",
            command=("torchrun",),
            args=("main.py",),
            env=(EnvVar(name="LR", value="0.1"),),
            num_nodes=2,
            gpus_per_node=8,
            active_deadline_seconds=3600,
        )
        s = settings(labels={"team": "a"}, annotations={"cost-centre": "42"})
        body = build_trainjob(job, s, "default")
        assert body == {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {
                "name": "train-3",
                "namespace": "team-a",
                "labels": {"team": "a", **own_labels("train", 3)},
                "annotations": {"cost-centre": "42", ANNOTATION_SPEC_HASH: spec_hash(job, TORCH)},
            },
            "spec": {
                "runtimeRef": {
                    "apiGroup": "trainer.kubeflow.org",
                    "kind": "ClusterTrainingRuntime",
                    "name": "dispatch-torch",
                },
                "trainer": {
                    "image": "trainer:1",
                    "command": ["torchrun"],
                    "args": ["main.py"],
                    "env": [{"name": "LR", "value": "0.1"}],
                    "numNodes": 2,
                    "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
                },
                "activeDeadlineSeconds": 3600,
                "suspend": False,
                "runtimePatches": [
                    {
                        "manager": RUNTIME_PATCH_MANAGER,
                        "trainingRuntimeSpec": {
                            "template": {
                                "metadata": {"labels": own_labels("train", 3)},
                                "spec": {
                                    "replicatedJobs": [
                                        {
                                            "name": "node",
                                            "template": {
                                                "metadata": {"labels": own_labels("train", 3)},
                                                "spec": {
                                                    "template": {
                                                        "metadata": {
                                                            "labels": own_labels("train", 3)
                                                        }
                                                    }
                                                },
                                            },
                                        }
                                    ]
                                },
                            }
                        },
                    }
                ],
            },
        }

    def test_no_gpus_means_no_resources_and_empty_lists_are_left_to_the_runtime(self) -> None:
        trainer = build_trainjob(JobSpec(job_id="train"), settings(), "default")["spec"]["trainer"]
        assert trainer == {"numNodes": 1}

    def test_gpu_resource_comes_from_the_settings(self) -> None:
        body = build_trainjob(
            JobSpec(job_id="train", gpus_per_node=1), settings(gpu_resource="amd.com/gpu"), "x"
        )
        assert body["spec"]["trainer"]["resourcesPerNode"] == {"limits": {"amd.com/gpu": 1}}

    def test_the_probe_is_suspended(self) -> None:
        body = build_trainjob(JobSpec(job_id="train"), settings(), "default", suspend=True)
        assert body["spec"]["suspend"] is True

    def test_credentials_are_read_only_optional_secret_volumes_on_node(self) -> None:
        s = settings(
            credentials=(
                Credential(secret_name="s3", mount_path="/var/run/s3"),
                Credential(secret_name="wandb", mount_path="/var/run/wandb"),
            )
        )
        pod = node_pod(build_trainjob(JobSpec(job_id="train"), s, "default"))
        assert pod["spec"]["volumes"] == [
            {
                "name": "dispatch-credential-0",
                "secret": {"secretName": "s3", "defaultMode": 0o400, "optional": True},
            },
            {
                "name": "dispatch-credential-1",
                "secret": {"secretName": "wandb", "defaultMode": 0o400, "optional": True},
            },
        ]
        assert pod["spec"]["containers"] == [
            {
                "name": "node",
                "volumeMounts": [
                    {"name": "dispatch-credential-0", "mountPath": "/var/run/s3", "readOnly": True},
                    {
                        "name": "dispatch-credential-1",
                        "mountPath": "/var/run/wandb",
                        "readOnly": True,
                    },
                ],
            }
        ]
        trainer = build_trainjob(JobSpec(job_id="train"), s, "default")["spec"]["trainer"]
        assert "env" not in trainer

    def test_publish_by_image_volume(self) -> None:
        pod = node_pod(
            build_trainjob(JobSpec(job_id="train"), settings(publish=Publish(image=IMAGE)), "d")
        )
        assert pod["spec"] == {
            "volumes": [
                {
                    "name": "dispatch-publish",
                    "image": {"reference": IMAGE, "pullPolicy": "IfNotPresent"},
                }
            ],
            "containers": [
                {
                    "name": "node",
                    "volumeMounts": [
                        {"name": "dispatch-publish", "mountPath": "/opt/dispatch", "readOnly": True}
                    ],
                }
            ],
        }

    def test_publish_by_init_container(self) -> None:
        publish = Publish(image=IMAGE, via="initContainer", init_container="fill")
        pod = node_pod(build_trainjob(JobSpec(job_id="train"), settings(publish=publish), "d"))
        assert pod["spec"] == {
            "volumes": [{"name": "dispatch-publish", "emptyDir": {}}],
            "initContainers": [
                {
                    "name": "fill",
                    "volumeMounts": [{"name": "dispatch-publish", "mountPath": "/opt/dispatch"}],
                }
            ],
            "containers": [
                {
                    "name": "node",
                    "volumeMounts": [
                        {"name": "dispatch-publish", "mountPath": "/opt/dispatch", "readOnly": True}
                    ],
                }
            ],
        }


class TestKueueTrainJob:
    def test_queue_and_priority_labels_and_no_suspend(self) -> None:
        s = settings(kueue=Kueue(local_queue="lq", priority_class="low"))
        body = build_trainjob(JobSpec(job_id="train"), s, "default")
        assert body["metadata"]["labels"] == {
            **own_labels(),
            LABEL_QUEUE_NAME: "lq",
            LABEL_PRIORITY_CLASS: "low",
        }
        assert "suspend" not in body["spec"]

    def test_no_priority_class_no_label(self) -> None:
        s = settings(kueue=Kueue(local_queue="lq"))
        labels = build_trainjob(JobSpec(job_id="train"), s, "default")["metadata"]["labels"]
        assert LABEL_PRIORITY_CLASS not in labels
        assert labels[LABEL_QUEUE_NAME] == "lq"
