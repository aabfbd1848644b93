"""The runtime rules of SPEC §5, each refusal naming the runtime and the rule."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch_kubeflow.errors import ErrUnsupported
from dispatch_kubeflow.runtimes import check_runtime
from dispatch_kubeflow.settings import Publish, RuntimeRef, Settings

REF = RuntimeRef(kind="ClusterTrainingRuntime", name="dispatch-torch")
IMAGE = "registry.example/publish@sha256:" + "b" * 64
EXAMPLE = Path(__file__).parents[2] / "examples" / "runtime.yaml"


def settings(**changes: Any) -> Settings:
    return Settings(namespace="team-a", probe_runtime=REF, **changes)


def example() -> dict[str, Any]:
    runtime: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return runtime


def node_job(runtime: dict[str, Any]) -> dict[str, Any]:
    job: dict[str, Any] = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    return job


def pod_spec(runtime: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = node_job(runtime)["template"]["spec"]["template"]["spec"]
    return spec


def changed(change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    runtime = copy.deepcopy(example())
    change(runtime)
    return runtime


def test_the_example_runtime_passes() -> None:
    check_runtime(example(), REF, settings())


Change = Callable[[dict[str, Any]], None]

REFUSALS: list[tuple[str, Change, str]] = [
    (
        "no-node-job",
        lambda r: node_job(r).update(name="trainer"),
        "no replicatedJob named 'node'",
    ),
    (
        "no-node-container",
        lambda r: pod_spec(r)["containers"][0].update(name="trainer"),
        "no container named 'node'",
    ),
    (
        "backoff-limit-absent",
        lambda r: node_job(r)["template"]["spec"].pop("backoffLimit"),
        "must set backoffLimit: 0 explicitly, it has none",
    ),
    (
        "backoff-limit-six",
        lambda r: node_job(r)["template"]["spec"].update(backoffLimit=6),
        "must set backoffLimit: 0 explicitly, it has 6",
    ),
    (
        "backoff-limit-per-index",
        lambda r: node_job(r)["template"]["spec"].update(backoffLimitPerIndex=1),
        "backoffLimitPerIndex 1",
    ),
    (
        "pod-failure-policy-ignore",
        lambda r: node_job(r)["template"]["spec"].update(
            podFailurePolicy={
                "rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
            }
        ),
        "podFailurePolicy rule with action Ignore",
    ),
    (
        "restart-policy-absent",
        lambda r: pod_spec(r).pop("restartPolicy"),
        "must set restartPolicy: Never explicitly, it has none",
    ),
    (
        "restart-policy-on-failure",
        lambda r: pod_spec(r).update(restartPolicy="OnFailure"),
        "must set restartPolicy: Never explicitly, it has 'OnFailure'",
    ),
    (
        "max-restarts",
        lambda r: r["spec"]["template"]["spec"].update(failurePolicy={"maxRestarts": 3}),
        "maxRestarts: 3",
    ),
    (
        "restart-ignoring-max",
        lambda r: r["spec"]["template"]["spec"].update(
            failurePolicy={
                "maxRestarts": 0,
                "rules": [{"name": "always", "action": "RestartJobSetAndIgnoreMaxRestarts"}],
            }
        ),
        "rule 'always' has action RestartJobSetAndIgnoreMaxRestarts",
    ),
]


@pytest.mark.parametrize(
    ("change", "message"),
    [pytest.param(change, message, id=name) for name, change, message in REFUSALS],
)
def test_each_rule_refuses_naming_runtime_and_rule(change: Change, message: str) -> None:
    with pytest.raises(ErrUnsupported) as refused:
        check_runtime(changed(change), REF, settings())
    assert str(refused.value).startswith("runtime ClusterTrainingRuntime 'dispatch-torch'")
    assert message in str(refused.value)


def test_max_restarts_zero_and_fail_rules_pass() -> None:
    runtime = changed(
        lambda r: r["spec"]["template"]["spec"].update(
            failurePolicy={"maxRestarts": 0, "rules": [{"action": "FailJobSet"}]}
        )
    )
    check_runtime(runtime, REF, settings())


@pytest.mark.parametrize(
    "change",
    [change for name, change, _ in REFUSALS if name not in ("no-node-job", "no-node-container")],
)
def test_allow_rank_restart_lifts_the_restart_rules(change: Change) -> None:
    check_runtime(changed(change), REF, settings(allow_rank_restart=True))


def test_allow_rank_restart_keeps_the_node_rules() -> None:
    with pytest.raises(ErrUnsupported, match="no container named 'node'"):
        check_runtime(
            changed(lambda r: pod_spec(r)["containers"][0].update(name="x")),
            REF,
            settings(allow_rank_restart=True),
        )


class TestPublishInitContainer:
    PUBLISH = Publish(image=IMAGE, via="initContainer", init_container="dispatch-publish")

    def with_init(self, image: str) -> dict[str, Any]:
        return changed(
            lambda r: pod_spec(r).update(
                initContainers=[{"name": "dispatch-publish", "image": image}]
            )
        )

    def test_passes_with_the_exact_image(self) -> None:
        check_runtime(self.with_init(IMAGE), REF, settings(publish=self.PUBLISH))

    def test_refuses_a_missing_init_container(self) -> None:
        with pytest.raises(ErrUnsupported, match="no init container named 'dispatch-publish'"):
            check_runtime(example(), REF, settings(publish=self.PUBLISH))

    def test_refuses_another_image(self) -> None:
        with pytest.raises(ErrUnsupported, match="must use exactly the publish image"):
            check_runtime(
                self.with_init("registry.example/publish:latest"),
                REF,
                settings(publish=self.PUBLISH),
            )

    def test_image_volume_needs_no_init_container(self) -> None:
        check_runtime(example(), REF, settings(publish=Publish(image=IMAGE)))
