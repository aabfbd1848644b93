"""Job ids whose JobSet children could never be named are refused at start (issue 12, item 15).

The expected names follow JobSet v0.12.0's webhook (pkg/webhooks/jobset_webhook.go): the Job
``<jobset>-<replicatedJob>-<replicas - 1>``, and for an Indexed Job the pod
``<job>-<completions - 1>`` plus ``-abcde`` for the random suffix, each at most 63 characters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch_kubeflow.errors import ErrInvalid
from dispatch_kubeflow.trainjob import JobSpec, check_generated_names, generated_names

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = yaml.safe_load(
    (ROOT / "charts" / "dispatch-kubeflow" / "files" / "example-runtime.yaml").read_text()
)


def job_id(length: int) -> str:
    return "j" + "a" * (length - 1)


def with_replicated(*extra: dict[str, Any]) -> dict[str, Any]:
    runtime: dict[str, Any] = yaml.safe_load(yaml.safe_dump(EXAMPLE))
    runtime["spec"]["template"]["spec"]["replicatedJobs"].extend(extra)
    return runtime


def test_item15_the_example_runtimes_names_are_jobsets() -> None:
    job = JobSpec(job_id="train", num_nodes=4)
    assert list(generated_names(job, EXAMPLE)) == [
        ("Job of replicatedJob 'node'", "train-1-node-0"),
        ("pod of replicatedJob 'node'", "train-1-node-0-3-abcde"),
    ]


@pytest.mark.parametrize(("num_nodes", "longest"), [(1, 46), (10, 46), (11, 45), (100, 45)])
def test_item15_the_longest_id_that_can_run_depends_on_num_nodes(
    num_nodes: int, longest: int
) -> None:
    check_generated_names(JobSpec(job_id=job_id(longest), num_nodes=num_nodes), EXAMPLE)
    too_long = JobSpec(job_id=job_id(longest + 1), num_nodes=num_nodes)
    with pytest.raises(ErrInvalid) as refused:
        check_generated_names(too_long, EXAMPLE)
    message = str(refused.value)
    assert "at most 63" in message
    assert f"{job_id(longest + 1)}-1-node-0-{num_nodes - 1}-abcde" in message


def test_item15_the_runtimes_other_replicated_jobs_count_too() -> None:
    launcher = {
        "name": "dataset-initializer",
        "replicas": 3,
        "template": {"spec": {"parallelism": 12, "template": {"spec": {}}}},
    }
    runtime = with_replicated(launcher)
    names = dict(generated_names(JobSpec(job_id="x"), runtime))
    assert names["Job of replicatedJob 'dataset-initializer'"] == "x-1-dataset-initializer-2"
    assert names["pod of replicatedJob 'dataset-initializer'"] == (
        "x-1-dataset-initializer-2-11-abcde"
    )
    # 46 characters fit the trainer step, not the longer initializer's pods.
    with pytest.raises(ErrInvalid, match="dataset-initializer"):
        check_generated_names(JobSpec(job_id=job_id(46)), runtime)


def test_item15_a_non_indexed_job_has_no_pod_name_check() -> None:
    runtime = with_replicated(
        {
            "name": "launcher",
            "template": {"spec": {"completionMode": "NonIndexed", "template": {"spec": {}}}},
        }
    )
    assert [what for what, _ in generated_names(JobSpec(job_id="x"), runtime)] == [
        "Job of replicatedJob 'node'",
        "pod of replicatedJob 'node'",
        "Job of replicatedJob 'launcher'",
    ]
