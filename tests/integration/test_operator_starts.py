"""When the operator starts a DispatchJob's attempt, on the real kube-apiserver.

An attempt starts once the KubeflowAdapter serving the DispatchJob's namespace is open, and a raised
attempt once the current one has finished. A DispatchJob waiting for either says why in its status.
The operator runs in-process (``running_operator``) and the test plays Trainer, as in
``test_operator``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dispatch_kubeflow.constants import (
    GROUP,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    VERSION,
)
from tests.integration.test_operator import (
    MERGE_PATCH,
    Scene,
    condition,
    operator,
    scene,
)

__all__ = ["operator", "scene"]  # fixtures used by the tests below


async def raise_attempt(scene: Scene, name: str, attempt: int) -> None:
    await scene.objects.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        scene.namespace,
        "dispatchjobs",
        name,
        {"spec": {"attempt": attempt}},
        _content_type=MERGE_PATCH,
    )


async def test_item8_a_vanished_attempt_lets_a_raised_attempt_start(
    scene: Scene, operator: Path
) -> None:
    await scene.apply_adapter(scene.adapter_spec())
    await scene.ready_adapter()
    await scene.create_job("lost")
    await scene.job_in_state("lost", "Pending")
    await scene.play_running("lost-1")
    await scene.job_in_state("lost", "Running")
    # Everything of the attempt goes behind the adapter's back: it is Vanished, state Unknown.
    await scene.objects.delete_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, scene.namespace, TRAINJOBS, "lost-1"
    )
    vanished = await scene.job_in_state("lost", "Unknown", "EvidenceLost")
    assert vanished["status"]["events"][-1]["type"] == "Vanished"

    await raise_attempt(scene, "lost", 2)
    second = await scene.job_in_state("lost", "Pending")
    assert second["status"]["attempt"] == 2
    assert second["status"]["trainJob"] == "lost-2"
    finished: Any = condition(second, "Finished")
    assert finished["status"] == "False"
    assert await scene.trainjob("lost-2") is not None
