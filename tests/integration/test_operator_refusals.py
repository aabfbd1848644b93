"""A start the adapter refuses ends the DispatchJob Failed with a cause, never a bare failure.

Issue 12, items 10 and 15, through the operator (kopf, in-process) on the real kube-apiserver.
"""

from __future__ import annotations

from pathlib import Path

from tests.integration.test_operator import Scene, operator, scene

__all__ = ["operator", "scene"]  # fixtures used by the test below, from test_operator


async def test_item10_and_item15_refused_starts_fail_with_a_cause(
    scene: Scene, operator: Path
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
