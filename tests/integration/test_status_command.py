"""``dispatch-kubeflow status`` as a process, reading the real kube-apiserver.

The KubeflowAdapter and DispatchJobs are written with the status an operator would have given
them (no operator runs: the command only reads), so the test knows every cell of the tables.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes_asyncio import client

from dispatch_kubeflow.constants import GROUP, VERSION
from tests.integration.test_operator import MERGE_PATCH


def at(seconds_ago: float) -> str:
    """A time ``seconds_ago`` before now, as the apiserver writes times."""
    moment = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=seconds_ago)
    return moment.isoformat().replace("+00:00", "Z")


def condition(kind: str, status: str, reason: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": at(0),
    }


def event(kind: str, seconds_ago: float, attempt: int, **extra: Any) -> dict[str, Any]:
    return {"type": kind, "attempt": attempt, "time": at(seconds_ago), **extra}


async def put(api: client.ApiClient, namespace: str, plural: str, body: dict[str, Any]) -> None:
    objects: Any = client.CustomObjectsApi(api)
    status = body.pop("status")
    await objects.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
    await objects.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        plural,
        body["metadata"]["name"],
        {"status": status},
        _content_type=MERGE_PATCH,
    )


def job(name: str, attempt: int, status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "DispatchJob",
        "metadata": {"name": name},
        "spec": {"adapter": "team", "image": "busybox:1.37", "attempt": attempt},
        "status": {"attempt": attempt, **status},
    }


async def status_command(cluster: Any, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dispatch_kubeflow.cli",
        "status",
        *args,
        env=dict(os.environ, KUBECONFIG=str(cluster.kubeconfig)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def test_status_prints_adapters_and_jobs_sorted_aligned_and_as_json(
    cluster: Any, namespace: str, kube_api: client.ApiClient
) -> None:
    await put(
        kube_api,
        namespace,
        "kubeflowadapters",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "KubeflowAdapter",
            "metadata": {"name": "team"},
            "spec": {
                "namespace": namespace,
                "runtimes": [{"kind": "ClusterTrainingRuntime", "name": "torch"}],
                "kueue": {"localQueue": "lq"},
            },
            "status": {
                "mode": "kueue",
                "conditions": [
                    condition("Ready", "True", "Watching"),
                    condition("AdmissionHealthy", "False", "GateClosed"),
                ],
            },
        },
    )
    # Created first, listed second: rows are sorted by name.
    await put(
        kube_api,
        namespace,
        "dispatchjobs",
        job(
            "waiting",
            1,
            {
                "state": "Pending",
                "cause": "NoCapacity",
                "events": [event("Submitted", 90, 1, state="Pending")],
                "conditions": [condition("Admitted", "False", "WaitingForQuota")],
            },
        ),
    )
    await put(
        kube_api,
        namespace,
        "dispatchjobs",
        job(
            "oom",
            2,
            {
                "state": "Failed",
                "cause": "OutOfMemory",
                "events": [
                    event("Submitted", 600, 1),
                    event("Admitted", 590, 1),
                    event("Submitted", 300, 2),
                    event("Admitted", 288, 2),
                    event("Running", 280, 2),
                    event("Finished", 100, 2, state="Failed", cause="OutOfMemory"),
                ],
                "conditions": [
                    condition("Admitted", "True", "Admitted"),
                    condition("Finished", "True", "OOMKilled"),
                ],
            },
        ),
    )

    data = json.loads(await status_command(cluster, "-n", namespace, "-o", "json"))
    (adapter,) = data["adapters"]
    assert adapter | {"ageSeconds": None} == {
        "namespace": namespace,
        "name": "team",
        "serves": namespace,
        "mode": "kueue",
        "ready": "True",
        "admissionHealthy": "False",
        "ageSeconds": None,
    }
    oom, waiting = data["jobs"]
    assert (oom["name"], oom["state"], oom["cause"], oom["attempt"]) == (
        "oom",
        "Failed",
        "OutOfMemory",
        2,
    )
    assert oom["admissionWaitSeconds"] == 12  # attempt 2's own wait, not attempt 1's
    assert (waiting["name"], waiting["state"], waiting["cause"]) == (
        "waiting",
        "Pending",
        "NoCapacity",
    )
    assert 90 <= waiting["admissionWaitSeconds"] < 150  # still waiting: counted up to now
    assert waiting["admitted"] == "False"

    text = await status_command(cluster, "-n", namespace)
    adapters, jobs = text.rstrip("\n").split("\n\n")
    header, *rows = jobs.splitlines()
    assert header.split() == [
        "NAMESPACE",
        "JOB",
        "ADAPTER",
        "STATE",
        "CAUSE",
        "ATTEMPT",
        "AGE",
        "ADMITTED",
        "WAITED-FOR-ADMISSION",
    ]
    assert [row.split()[1] for row in rows] == ["oom", "waiting"]
    assert rows[0].split()[3:6] == ["Failed", "OutOfMemory", "2"]
    assert rows[0].split()[-1] == "12s"
    # Aligned: every column starts where its header does.
    for column in ("STATE", "CAUSE", "ATTEMPT"):
        start = header.index(column)
        assert all(row[start - 1] == " " and row[start] != " " for row in rows), column
    assert adapters.splitlines()[1].split() == [
        namespace,
        "team",
        namespace,
        "kueue",
        "True",
        "False",
        adapters.splitlines()[1].split()[-1],
    ]
