"""``python -m dispatch_kubeflow.admission`` as a process: it leads, decides, answers its health
endpoint and its metrics, logs JSON lines, and on SIGTERM releases its Lease and exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client

from dispatch_kubeflow.admission.controller import AdmissionController
from dispatch_kubeflow.admission.health import serving_health
from dispatch_kubeflow.constants import CheckState
from tests.integration.test_admission import (
    LEASE,
    WAIT,
    Scene,
    _holder_is,
    _true,
    eventually,
    running,
)
from tests.integration.test_admission import scene as scene  # the fixture
from tests.integration.test_admission import unserved as unserved  # the fixture scene takes
from tests.integration.test_operator import Samples, sample, scrape


async def get_json(url: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.json()


async def test_the_module_runs_leads_decides_and_releases_on_sigterm(
    cluster: Any,
    kube_api: client.ApiClient,
    namespace: str,
    unused_tcp_port_factory: Callable[[], int],
) -> None:
    scene = Scene(kube_api, namespace)
    await scene.create_admission_check()
    await scene.serve()
    port, metrics_port = unused_tcp_port_factory(), unused_tcp_port_factory()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatch_kubeflow.admission",
        "--kubeconfig",
        str(cluster.kubeconfig),
        "--admission-check",
        scene.check,
        "--lease-namespace",
        namespace,
        "--lease-name",
        LEASE,
        "--health-address",
        f"127.0.0.1:{port}",
        "--metrics-address",
        f"127.0.0.1:{metrics_port}",
        "--identity",
        "process",
        "--lease-duration=2",
        "--renew-deadline=1",
        "--retry-period=0.2",
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await eventually(lambda: _holder_is(scene, "process"), "the process to take the Lease")
        name = await scene.workload_for(await scene.trainjob("job-1"))
        await scene.kueue_reserves(name)
        await scene.wait_for_state(name, CheckState.READY)
        assert await get_json(f"http://127.0.0.1:{port}/healthz") == (200, {"alive": True})
        status, ready = await get_json(f"http://127.0.0.1:{port}/readyz")
        assert (status, ready["ready"], ready["leading"]) == (200, True, True)
        assert namespace in ready["served"]

        async def decided() -> Samples | None:  # counted once the write has returned
            samples = await scrape(metrics_port)
            ready = sample(samples, "dispatch_kubeflow_admission_decisions_total", verdict="Ready")
            return samples if ready == 1 else None

        samples = await eventually(decided, "the Ready decision counted in /metrics")
        assert sample(samples, "dispatch_kubeflow_admission_leader") == 1

        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
        assert await scene.lease_holder() == ""
        lines = [json.loads(line) for line in stderr.decode().splitlines()]
        assert lines, "the process logged nothing"
        assert all({"message", "timestamp", "severity"} <= set(line) for line in lines)
        assert any(
            line["severity"] == "info" and "controls AdmissionCheck" in line["message"]
            for line in lines
        )
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await scene.delete_admission_check()


async def test_readiness_is_leading_or_standing_by_with_a_fresh_view(
    scene: Scene, kube_api: client.ApiClient
) -> None:
    """The leader and a synced standby are ready; a replica that cannot list is not, and is
    still alive."""
    leader, standby = scene.controller("a"), scene.controller("b")
    unreachable = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    cut_off = AdmissionController(unreachable, scene.config("c"))
    try:
        async with (
            running(leader),
            serving_health("127.0.0.1:0", leader.health) as leader_port,
            serving_health("127.0.0.1:0", standby.health) as standby_port,
            serving_health("127.0.0.1:0", cut_off.health) as cut_off_port,
        ):
            await eventually(lambda: _holder_is(scene, "a"), "replica a to take the Lease")
            async with running(standby, cut_off):
                await eventually(_true(standby.is_ready), "the standby's informers listed")
                await eventually(
                    _true(lambda: cut_off.workloads.last_failure is not None),
                    "the cut-off replica's failed list",
                )
                answers = [
                    await get_json(f"http://127.0.0.1:{port}/readyz")
                    for port in (leader_port, standby_port, cut_off_port)
                ]
                alive = await get_json(f"http://127.0.0.1:{cut_off_port}/healthz")
    finally:
        await unreachable.close()

    (leader_status, leading), (standby_status, standing_by), (cut_status, cut) = answers
    assert (leader_status, leading["ready"], leading["leading"]) == (200, True, True)
    assert (standby_status, standing_by["ready"], standing_by["leading"]) == (200, True, False)
    assert all(standing_by["synced"].values())
    assert (cut_status, cut["ready"], cut["leading"]) == (503, False, False)
    assert not any(cut["synced"].values())
    assert alive == (200, {"alive": True})
