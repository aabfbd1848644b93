"""A start the adapter refuses ends the DispatchJob Failed with a cause, never a bare failure.

Issue 12, items 10 and 15, through the operator (kopf, in-process) on the real kube-apiserver.
"""

from __future__ import annotations

from pathlib import Path

import kopf

from tests.integration.test_operator import (
    ADAPTER,
    RUNTIME_NAME,
    Scene,
    eventually,
    operator,
    operator_memo,
    sample,
    scene,
    scrape,
)

__all__ = ["operator", "operator_memo", "scene"]  # fixtures used below, from test_operator


async def test_item10_and_item15_refused_starts_fail_with_a_cause(
    scene: Scene, operator: Path, operator_memo: kopf.Memo
) -> None:
    await scene.apply_adapter(scene.adapter_spec())
    await scene.ready_adapter()
    await scene.create_job("unlisted", runtime={"kind": "TrainingRuntime", "name": "unlisted"})
    # numNodes 2: the pods are named <id>-1-node-0-1-<5 characters>; 47 characters are too many.
    too_long = "l" * 47
    await scene.create_job(too_long)

    unsupported = (await scene.job_in_state("unlisted", "Failed", "RuntimeUnsupported"))["status"]
    assert unsupported["reason"] == "Unsupported"
    assert "unlisted" in unsupported["message"]

    invalid = (await scene.job_in_state(too_long, "Failed", "ConfigError"))["status"]
    assert invalid["reason"] == "InvalidJob"
    assert "at most 63" in invalid["message"]
    assert await scene.trainjob(f"{too_long}-1") is None

    # Each refusal is one finished attempt in the operator's metrics, by cause and runtime.
    def finished(cause: str, runtime: str) -> dict[str, str]:
        return {
            "namespace": scene.namespace,
            "adapter": ADAPTER,
            "state": "Failed",
            "cause": cause,
            "runtime": runtime,
        }

    async def counted() -> dict[str, float | None] | None:
        samples = await scrape(operator_memo.metrics_port)
        found = {
            cause: sample(samples, "dispatch_kubeflow_jobs_finished_total", **labels)
            for cause, labels in (
                ("RuntimeUnsupported", finished("RuntimeUnsupported", "unlisted")),
                ("ConfigError", finished("ConfigError", RUNTIME_NAME)),
            )
        }
        return found if None not in found.values() else None

    counts = await eventually(counted, "both refusals counted in /metrics")
    assert counts == {"RuntimeUnsupported": 1.0, "ConfigError": 1.0}
