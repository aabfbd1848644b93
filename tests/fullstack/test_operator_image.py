"""The operator image, run by podman exactly as the chart's Deployment runs it, on the full stack.

The chart is installed with the built image's name and digest; its Deployment is read back and
turned into `podman run` arguments (tests/images/deployment.py: command, arguments, environment,
user 65532, read-only root with a tmpfs for the /tmp emptyDir, no capabilities, memory limit).
What a kubelet would add is all that is added: the host's network, on which the full stack
listens, and a kubeconfig holding the chart's ServiceAccount identity in place of its token.
The container then serves examples/adapter.yaml and examples/job.yaml, unchanged, to Succeeded.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.constants import GROUP, VERSION
from tests.cluster.controlplane import ControlPlane, free_port
from tests.cluster.fullstack.stack import FullStack
from tests.fullstack.kube import wait_for
from tests.images import deployment as podman_run
from tests.images.build import Built
from tests.images.fixtures import BUILD_TIMEOUT_S, images
from tests.images.podman import podman
from tests.integration.test_chart import helm

__all__ = ["helm", "images"]  # fixtures

pytestmark = [pytest.mark.image, pytest.mark.cluster, pytest.mark.timeout(BUILD_TIMEOUT_S)]

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dispatch-kubeflow"
ADAPTER_FILE = ROOT / "examples" / "adapter.yaml"
JOB_FILE = ROOT / "examples" / "job.yaml"
RELEASE = "dispatch"
CONTAINER = "operator"
KUBECONFIG_IN_CONTAINER = "/etc/dispatch-kubeflow/kubeconfig"
START_TIMEOUT = 60.0
JOB_TIMEOUT = 180.0


def _example(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text())
    return document


def _helm(helm: Path, cluster: ControlPlane, *args: str) -> str:
    result = subprocess.run(
        [str(helm), *args, "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


@contextlib.contextmanager
def _installed_chart(
    helm: Path, cluster: ControlPlane, images: Built, namespaces: list[str], port: int
) -> Iterator[dict[str, Any]]:
    """The chart installed in the adapter's namespace; yields its Deployment as stored."""
    release_namespace = namespaces[0]
    _helm(
        helm,
        cluster,
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        release_namespace,
        "--create-namespace",
        "--set",
        f"image.repository={images.operator.repository}",
        "--set",
        f"image.digest={images.operator.digest}",
        "--set",
        f"operator.livenessPort={port}",
        "--set-json",
        f"operator.namespaces={json.dumps(namespaces)}",
    )
    try:
        stored = cluster.kubectl(
            "get", "deployment", f"{RELEASE}-dispatch-kubeflow", "-n", release_namespace, "-o=json"
        )
        yield json.loads(stored)
    finally:
        _helm(helm, cluster, "uninstall", RELEASE, "--namespace", release_namespace)


def _service_account_kubeconfig(
    cluster: ControlPlane, deployment: dict[str, Any], folder: Path
) -> Path:
    """A kubeconfig authenticating as the Deployment's ServiceAccount, readable by uid 65532."""
    namespace = deployment["metadata"]["namespace"]
    account = podman_run.pod_spec(deployment)["serviceAccountName"]
    made = cluster.kubeconfig_for(
        f"system:serviceaccount:{namespace}:{account}",
        ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
    )
    readable = folder / "kubeconfig"
    shutil.copyfile(made, readable)
    readable.chmod(0o644)
    return readable


@contextlib.contextmanager
def _running(arguments: list[str]) -> Iterator[str]:
    name = f"dispatch-operator-{secrets.token_hex(3)}"
    podman("run", "--detach", f"--name={name}", *arguments)
    try:
        yield name
    finally:
        podman("rm", "--force", "--time=10", name, check=False)


def _liveness(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            status: int = answer.status
            return status
    except (urllib.error.URLError, ConnectionError):
        return 0


def _logs(name: str) -> str:
    return podman("logs", "--tail=60", name, check=False)


async def _wait_live(name: str, port: int) -> None:
    async def read() -> tuple[int, str]:
        state = await asyncio.to_thread(podman, "inspect", "--format={{.State.Status}}", name)
        if state != "running":
            raise AssertionError(f"the operator container is {state}:\n{_logs(name)}")
        return await asyncio.to_thread(_liveness, port), state

    await wait_for(read, lambda found: found[0] == 200, START_TIMEOUT, "the liveness endpoint")


async def _delete_and_wait(
    objects: client.CustomObjectsApi, namespace: str, plural: str, name: str
) -> None:
    """Delete while the operator runs, so its finalizer is released; wait until gone."""
    with contextlib.suppress(ApiException):
        await objects.delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)

    async def read() -> bool:
        try:
            await objects.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        except ApiException as error:
            if error.status == 404:
                return True
            raise
        return False

    await wait_for(read, bool, JOB_TIMEOUT, f"{plural}/{name} to be deleted")


async def test_the_operator_image_serves_the_examples_to_succeeded_as_the_chart_runs_it(
    fullstack: FullStack,
    cluster: ControlPlane,
    kube_api: client.ApiClient,
    helm: Path,
    images: Built,
    tmp_path: Path,
) -> None:
    adapter, job = _example(ADAPTER_FILE), _example(JOB_FILE)
    adapter_namespace = adapter["metadata"]["namespace"]
    served = adapter["spec"]["namespace"]
    assert job["metadata"]["namespace"] == served
    core, objects = client.CoreV1Api(kube_api), client.CustomObjectsApi(kube_api)
    await core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=served)))
    port = free_port()
    try:
        with _installed_chart(helm, cluster, images, [adapter_namespace, served], port) as stored:
            kubeconfig = _service_account_kubeconfig(cluster, stored, tmp_path)
            standins = podman_run.Standins(
                env={"KUBECONFIG": KUBECONFIG_IN_CONTAINER},
                mounts={kubeconfig: KUBECONFIG_IN_CONTAINER},
            )
            arguments = podman_run.run_arguments(stored, CONTAINER, standins)
            spec = podman_run.container(stored, CONTAINER)
            assert spec["image"] == images.operator.reference
            assert podman_run.liveness_port(spec) == port
            with _running(arguments) as name:
                await _wait_live(name, port)
                await asyncio.to_thread(cluster.kubectl, "apply", "-f", str(ADAPTER_FILE))
                await asyncio.to_thread(cluster.kubectl, "apply", "-f", str(JOB_FILE))

                async def status() -> dict[str, Any]:
                    body = await objects.get_namespaced_custom_object(
                        GROUP, VERSION, served, "dispatchjobs", job["metadata"]["name"]
                    )
                    found: dict[str, Any] = body.get("status") or {}
                    return found

                try:
                    done = await wait_for(
                        status,
                        lambda s: s.get("state") == "Succeeded",
                        JOB_TIMEOUT,
                        "the example DispatchJob to succeed",
                    )
                except AssertionError as error:
                    raise AssertionError(f"{error}\noperator log:\n{_logs(name)}") from None
                assert done.get("cause") is None
                assert await asyncio.to_thread(_liveness, port) == 200
                user = await asyncio.to_thread(podman, "exec", name, "id", "-u")
                assert user == "65532"
                await _delete_and_wait(objects, served, "dispatchjobs", job["metadata"]["name"])
                await _delete_and_wait(
                    objects, adapter_namespace, "kubeflowadapters", adapter["metadata"]["name"]
                )
    finally:
        for namespace in (served, adapter_namespace):
            with contextlib.suppress(ApiException):
                await core.delete_namespace(namespace)
