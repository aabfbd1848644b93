"""Sharding by namespace: operator processes serving disjoint namespaces stay out of each other's.

Each operator is ``dispatch-kubeflow run --namespace NS`` as its own process, as one of several
Deployments would run it (docs/operator.md, "Many namespaces").
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from tests.integration.test_admission import another_namespace
from tests.integration.test_operator import Scene, event_lines
from tests.integration.test_operator_cli import command, process


def run_for(namespace: str, events: Path) -> list[str]:
    return [
        command("dispatch-kubeflow"),
        "run",
        "--namespace",
        namespace,
        "--events-to",
        str(events),
    ]


async def test_operators_of_disjoint_namespaces_never_touch_each_others_dispatchjobs(
    cluster: Any, kube_api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    ours = Scene(kube_api, namespace)
    await ours.ensure_runtime()
    async with another_namespace(kube_api, namespace) as other_namespace:
        theirs = Scene(kube_api, other_namespace)
        ours_events, theirs_events = tmp_path / "ours.jsonl", tmp_path / "theirs.jsonl"
        async with process(
            run_for(namespace, ours_events),
            cluster.kubeconfig,
            tmp_path / "a.out",
            tmp_path / "a.err",
        ):
            async with process(
                run_for(other_namespace, theirs_events),
                cluster.kubeconfig,
                tmp_path / "b.out",
                tmp_path / "b.err",
            ):
                for scene in (ours, theirs):
                    await scene.apply_adapter(scene.adapter_spec())
                await asyncio.gather(ours.ready_adapter(), theirs.ready_adapter())
                await ours.create_job("ours")
                await theirs.create_job("theirs")
                await asyncio.gather(
                    ours.job_in_state("ours", "Pending"), theirs.job_in_state("theirs", "Pending")
                )
            # Only ours runs now: a DispatchJob in the other namespace is left exactly as created.
            await theirs.create_job("unserved")
            await ours.create_job("served")
            # Created after the unserved one: an operator watching both namespaces would have
            # put its finalizer on the unserved job before this one is Pending.
            await ours.job_in_state("served", "Pending")
            unserved = await theirs.job("unserved")
            assert unserved is not None
            assert "status" not in unserved
            assert not unserved["metadata"].get("finalizers")
            assert await theirs.trainjob("unserved-1") is None

    assert {(e["namespace"], e["job"]) for e in event_lines(ours_events)} == {
        (namespace, "ours"),
        (namespace, "served"),
    }
    assert {(e["namespace"], e["job"]) for e in event_lines(theirs_events)} == {
        (other_namespace, "theirs")
    }
