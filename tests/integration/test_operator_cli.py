"""``dispatch-kubeflow run`` and plain ``kopf run -m dispatch_kubeflow.handlers``, as processes.

Both are started the way a user would, against the test control plane's kubeconfig, and must bring
a KubeflowAdapter to Ready. ``dispatch-kubeflow run`` must also serve the liveness endpoint and
the metrics, log JSON lines on stderr and write each dispatch event as one JSON line on the
chosen stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import urllib.request
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.cluster import binaries
from tests.integration.test_operator import (
    ADAPTER,
    Scene,
    eventually,
    running_operator,
    sample,
    scrape,
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.asynccontextmanager
async def process(
    command: Sequence[str], kubeconfig: Path, stdout: Path, stderr: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    env = dict(os.environ, KUBECONFIG=str(kubeconfig))
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(*command, env=env, stdout=out, stderr=err)
        try:
            yield proc
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()


@pytest.fixture
async def scene(kube_api: Any, namespace: str) -> Scene:
    scene = Scene(kube_api, namespace)
    await scene.ensure_runtime()
    return scene


def command(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    return found


async def test_dispatch_kubeflow_run_serves_liveness_metrics_json_logs_and_event_lines(
    cluster: Any, scene: Scene, tmp_path: Path
) -> None:
    port, metrics_port = free_port(), free_port()
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    run = [
        command("dispatch-kubeflow"),
        "run",
        "--namespace",
        scene.namespace,
        f"--liveness=http://127.0.0.1:{port}/healthz",
        f"--metrics-address=127.0.0.1:{metrics_port}",
        "--events-to",
        "stdout",
    ]
    async with process(run, cluster.kubeconfig, stdout, stderr):
        await scene.apply_adapter(scene.adapter_spec())
        await scene.ready_adapter()

        def probe() -> dict[str, Any] | None:
            url = f"http://127.0.0.1:{port}/healthz"
            try:
                with urllib.request.urlopen(url, timeout=5) as answer:
                    body: dict[str, Any] = json.loads(answer.read())
            except OSError:
                return None
            return body if body.get("adapters") == 1 else None

        health = await eventually(lambda: asyncio.to_thread(probe), "the liveness endpoint")
        assert health["adapters"] == 1

        await scene.create_job("piped")
        await scene.job_in_state("piped", "Pending")

        async def piped_events() -> list[dict[str, Any]] | None:
            lines = [json.loads(line) for line in stdout.read_text().splitlines() if line]
            found = [e for e in lines if e.get("job") == "piped"]
            return found if [e["type"] for e in found][:2] == ["Submitted", "Admitted"] else None

        events = await eventually(piped_events, "the job's events as JSON lines on stdout")
        assert events[0]["namespace"] == scene.namespace
        assert events[0]["trainJob"] == "piped-1"
        samples = await scrape(metrics_port)
        submitted = {"namespace": scene.namespace, "adapter": ADAPTER, "cause": ""}
        assert sample(samples, "dispatch_kubeflow_events_total", **submitted, type="Submitted") == 1
        assert sample(samples, "dispatch_kubeflow_adapters", condition="Ready", status="True") == 1

    logs = [line for line in stderr.read_text().splitlines() if line.strip()]
    assert logs, "the operator logged nothing"
    parsed = [json.loads(line) for line in logs]  # every log line is one JSON object
    assert all("message" in entry for entry in parsed)


async def test_dispatch_kubeflow_run_exits_1_when_its_metrics_port_is_taken(
    cluster: Any, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = await asyncio.create_subprocess_exec(
            command("dispatch-kubeflow"),
            "run",
            f"--metrics-address=127.0.0.1:{port}",
            env=dict(os.environ, KUBECONFIG=str(cluster.kubeconfig)),
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            _, stderr = await run.communicate()
    assert run.returncode == 1
    assert f"cannot serve metrics on 127.0.0.1:{port}" in stderr.decode()


async def test_plain_kopf_run_of_the_handlers_module_serves_adapters(
    cluster: Any, scene: Scene, tmp_path: Path
) -> None:
    run = [
        command("kopf"),
        "run",
        "--standalone",
        "-m",
        "dispatch_kubeflow.handlers",
        "--namespace",
        scene.namespace,
    ]
    async with process(run, cluster.kubeconfig, tmp_path / "stdout", tmp_path / "stderr"):
        await scene.apply_adapter(scene.adapter_spec())
        body = await scene.ready_adapter()
    assert body["status"]["mode"] == "plain"


async def test_kubectl_wait_for_condition_finished_returns_when_the_job_finishes(
    cluster: Any, scene: Scene, tmp_path: Path
) -> None:
    async with running_operator(cluster.kubeconfig, [scene.namespace], tmp_path / "events"):
        await scene.apply_adapter(scene.adapter_spec())
        await scene.ready_adapter()
        await scene.create_job("awaited")
        await scene.job_in_state("awaited", "Pending")
        wait = await asyncio.create_subprocess_exec(
            str(binaries.binary("kubectl")), "--kubeconfig", str(cluster.kubeconfig),
            "wait", "--for=condition=Finished", "dj/awaited", "-n", scene.namespace,
            "--timeout=60s",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(wait.wait()), 2)
        assert wait.returncode is None, "kubectl wait returned before the job finished"
        await scene.play_deadline_exceeded("awaited-1")
        output, _ = await asyncio.wait_for(wait.communicate(), 60)
    assert wait.returncode == 0, output.decode()
    assert b"condition met" in output
