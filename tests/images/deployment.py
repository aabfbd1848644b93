"""Run a container with podman exactly as a rendered Kubernetes pod spec says.

The chart is the one source of the operator container's command, arguments, environment, user,
security context and mounts: the image test installs the chart, reads its Deployment back and
turns it into `podman run` arguments here, so what the test ran and what a cluster runs cannot
drift apart. Anything in the pod spec this module cannot reproduce is refused, not skipped.

What a kubelet adds and a local run cannot have (the ServiceAccount's token, the cluster's
network) is passed in by the caller as `Standins`, and is all that differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.images.podman import ULIMITS

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_RUNTIME = ROOT / "charts" / "dispatch-kubeflow" / "files" / "example-runtime.yaml"
INIT_CONTAINER_INTRO = "also add to the pod template:"


class Unsupported(ValueError):
    """The pod spec asks for something a local podman run would not reproduce."""


@dataclass(frozen=True)
class Standins:
    """What the kubelet would provide: extra environment, mounts (host path -> container path)."""

    env: dict[str, str] = field(default_factory=dict)
    mounts: dict[Path, str] = field(default_factory=dict)
    network: str = "host"


def container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    """The named container of a Deployment's pod template."""
    found: list[dict[str, Any]] = [
        c for c in pod_spec(deployment)["containers"] if c["name"] == name
    ]
    (only,) = found
    return only


def pod_spec(deployment: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def liveness_port(spec: dict[str, Any]) -> int:
    """The container port the liveness probe's httpGet names (by name or number)."""
    port = spec["livenessProbe"]["httpGet"]["port"]
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in spec.get("ports", []) if p.get("name") == port]
    return int(number)


def run_arguments(
    deployment: dict[str, Any], name: str, standins: Standins | None = None
) -> list[str]:
    """`podman run` arguments (after `run`) for container `name` of the Deployment's pod."""
    pod = pod_spec(deployment)
    spec = container(deployment, name)
    standins = standins or Standins()
    arguments = [f"--network={standins.network}", "--pull=never", *ULIMITS]
    arguments += _identity(pod.get("securityContext", {}), spec.get("securityContext", {}))
    arguments += _confinement(spec.get("securityContext", {}))
    arguments += _volumes(pod.get("volumes", []), spec.get("volumeMounts", []))
    arguments += _memory_limit(spec.get("resources", {}))
    arguments += _environment(spec.get("env", []), standins.env)
    for host, target in standins.mounts.items():
        arguments.append(f"--volume={host}:{target}:ro")
    if "command" in spec:
        arguments.append(f"--entrypoint={json.dumps(spec['command'])}")
    return [*arguments, spec["image"], *spec.get("args", [])]


def _identity(pod: dict[str, Any], container: dict[str, Any]) -> list[str]:
    merged = {**pod, **container}
    user, group = merged.get("runAsUser"), merged.get("runAsGroup")
    if user is None:
        raise Unsupported("no runAsUser: the image's own user would decide who runs")
    if merged.get("runAsNonRoot") and user == 0:
        raise Unsupported("runAsNonRoot with runAsUser 0 would not start")
    arguments = [f"--user={user}" if group is None else f"--user={user}:{group}"]
    if "fsGroup" in pod:
        arguments.append(f"--group-add={pod['fsGroup']}")
    seccomp = merged.get("seccompProfile", {"type": "RuntimeDefault"})
    if seccomp.get("type") != "RuntimeDefault":
        raise Unsupported(f"seccompProfile {seccomp} (podman's default profile is RuntimeDefault)")
    return arguments


def _confinement(context: dict[str, Any]) -> list[str]:
    arguments = []
    if context.get("readOnlyRootFilesystem"):
        # podman would add tmpfs mounts of its own (/tmp, /run, /var/tmp); a pod has none.
        arguments += ["--read-only", "--read-only-tmpfs=false"]
    if context.get("allowPrivilegeEscalation") is False:
        arguments.append("--security-opt=no-new-privileges")
    if context.get("privileged"):
        raise Unsupported("privileged containers")
    capabilities = context.get("capabilities", {})
    arguments += [f"--cap-drop={cap}" for cap in capabilities.get("drop", [])]
    arguments += [f"--cap-add={cap}" for cap in capabilities.get("add", [])]
    return arguments


def _volumes(volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> list[str]:
    by_name = {volume["name"]: volume for volume in volumes}
    arguments = []
    for mount in mounts:
        volume = by_name[mount["name"]]
        if set(volume) != {"name", "emptyDir"}:
            raise Unsupported(f"volume {volume} (only emptyDir volumes are reproduced)")
        # An emptyDir is a fresh, empty, world-writable folder for the pod's life.
        mode = "ro" if mount.get("readOnly") else "rw"
        arguments.append(f"--tmpfs={mount['mountPath']}:{mode},mode=1777")
    return arguments


def _memory_limit(resources: dict[str, Any]) -> list[str]:
    limit = resources.get("limits", {}).get("memory")
    if limit is None:
        return []
    units = {"Ki": "k", "Mi": "m", "Gi": "g"}
    for suffix, unit in units.items():
        if str(limit).endswith(suffix):
            return [f"--memory={str(limit)[: -len(suffix)]}{unit}"]
    raise Unsupported(f"memory limit {limit!r} (only Ki, Mi and Gi are translated)")


def _environment(env: list[dict[str, Any]], extra: dict[str, str]) -> list[str]:
    arguments = []
    for variable in env:
        if "value" not in variable:
            raise Unsupported(f"environment variable {variable} (only plain values)")
        arguments.append(f"--env={variable['name']}={variable['value']}")
    arguments += [f"--env={key}={value}" for key, value in extra.items()]
    return arguments


def publish_init_container() -> dict[str, Any]:
    """The init container the chart's example runtime tells users to add for the publish image.

    It is given in the runtime file's leading comment (the runtime itself runs under
    `publish.via: imageVolume`); this reads that block as YAML.
    """
    lines = EXAMPLE_RUNTIME.read_text().splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.endswith(INIT_CONTAINER_INTRO)]
    block = []
    for line in lines[start + 1 :]:
        if not line.startswith("#   "):
            break
        block.append(line[len("#   ") :])
    document = yaml.safe_load("\n".join(block))
    (init,) = document["initContainers"]
    found: dict[str, Any] = init
    return found
