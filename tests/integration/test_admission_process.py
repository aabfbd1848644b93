"""``python -m dispatch_kubeflow.admission`` as a process: it leads, decides, and on SIGTERM
releases its Lease and exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from dispatch_kubeflow.constants import CheckState
from tests.integration.test_admission import (
    LEASE,
    WAIT,
    Scene,
    _holder_is,
    eventually,
)


async def test_the_module_runs_leads_decides_and_releases_on_sigterm(
    cluster: Any, kube_api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    scene = Scene(kube_api, namespace)
    await scene.create_admission_check()
    settings = tmp_path / "adapter.json"
    settings.write_text(
        json.dumps(
            {
                "namespace": namespace,
                "cluster": {"kubeconfig": str(cluster.kubeconfig)},
                "probeRuntime": {"kind": "ClusterTrainingRuntime", "name": "torch-distributed"},
                "kueue": {
                    "localQueue": "lq",
                    "admissionCheck": scene.check,
                    "admissionLease": {"namespace": namespace, "name": LEASE},
                },
            }
        )
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatch_kubeflow.admission",
        "--settings",
        str(settings),
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

        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(WAIT):
            _, stderr = await process.communicate()
        assert process.returncode == 0, stderr.decode()
        assert await scene.lease_holder() == ""
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await scene.delete_admission_check()
