"""The CustomResourceDefinitions the test control plane serves.

Upstream CRDs (Kubeflow Trainer, JobSet, Kueue) are read at test time from the Go module cache
(`go mod download` of a pinned module version), so no upstream file is committed. The project's
own CRDs come from `crds/*.yaml` in the work tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.binaries import BuildError, go_command

# libyaml's loader when present: the upstream CRDs are several megabytes of YAML.
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

PROJECT_CRDS = Path(__file__).resolve().parents[2] / "crds"


@dataclass(frozen=True)
class UpstreamCRDs:
    """CRD files shipped inside one Go module at one pinned version."""

    module: str
    version: str
    folder: str
    files: tuple[str, ...]
    # Serve only the storage version: set where upstream converts between versions with a
    # webhook that does not run here (see docs/control-plane.md).
    storage_version_only: bool = False


UPSTREAM: tuple[UpstreamCRDs, ...] = (
    UpstreamCRDs(
        "github.com/kubeflow/trainer/v2",
        "v2.3.0",
        "manifests/base/crds",
        (
            "trainer.kubeflow.org_trainjobs.yaml",
            "trainer.kubeflow.org_trainingruntimes.yaml",
            "trainer.kubeflow.org_clustertrainingruntimes.yaml",
        ),
    ),
    UpstreamCRDs(
        "sigs.k8s.io/jobset",
        "v0.12.0",
        "config/components/crd/bases",
        ("jobset.x-k8s.io_jobsets.yaml",),
    ),
    UpstreamCRDs(
        "sigs.k8s.io/kueue",
        "v0.19.2",
        "config/components/crd/bases",
        (
            "kueue.x-k8s.io_workloads.yaml",
            "kueue.x-k8s.io_admissionchecks.yaml",
            "kueue.x-k8s.io_localqueues.yaml",
            "kueue.x-k8s.io_clusterqueues.yaml",
            "kueue.x-k8s.io_cohorts.yaml",
            "kueue.x-k8s.io_workloadpriorityclasses.yaml",
            "kueue.x-k8s.io_resourceflavors.yaml",
            "kueue.x-k8s.io_topologies.yaml",
        ),
        storage_version_only=True,
    ),
)


def module_dir(module: str, version: str) -> Path:
    """Download `module@version` into the module cache (a no-op when it is there) and locate it."""
    with tempfile.TemporaryDirectory() as outside_any_module:
        result = subprocess.run(
            [go_command(), "mod", "download", "-json", f"{module}@{version}"],
            cwd=outside_any_module,
            env=dict(os.environ, GOWORK="off", GOFLAGS="-mod=mod"),
            capture_output=True,
            text=True,
            check=False,
        )
    info: dict[str, Any] = json.loads(result.stdout) if result.stdout.strip() else {}
    if result.returncode != 0 or "Dir" not in info:
        reason = info.get("Error") or result.stderr.strip()
        raise BuildError(f"go mod download {module}@{version} failed: {reason}")
    return Path(info["Dir"])


def serve_storage_version_only(crd: dict[str, Any]) -> dict[str, Any]:
    for version in crd["spec"]["versions"]:
        version["served"] = bool(version.get("storage"))
    crd["spec"].pop("conversion", None)
    return crd


def upstream_documents() -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for source in UPSTREAM:
        folder = module_dir(source.module, source.version) / source.folder
        for name in source.files:
            crd = yaml.load((folder / name).read_text(), Loader=_Loader)
            if source.storage_version_only:
                crd = serve_storage_version_only(crd)
            documents.append(crd)
    return documents


def project_documents() -> list[dict[str, Any]]:
    documents: list[dict[str, Any]] = []
    for path in sorted(PROJECT_CRDS.glob("*.yaml")):
        documents += [doc for doc in yaml.load_all(path.read_text(), Loader=_Loader) if doc]
    return documents


def write_manifests(target: Path) -> list[Path]:
    """Write every CRD the control plane serves into `target`, one JSON file each, for kubectl."""
    target.mkdir(parents=True, exist_ok=True)
    paths = []
    for document in upstream_documents() + project_documents():
        path = target / f"{document['metadata']['name']}.json"
        path.write_text(json.dumps(document))
        paths.append(path)
    return paths


def names(paths: list[Path]) -> list[str]:
    return [path.stem for path in paths]


def list_paths(paths: list[Path]) -> list[str]:
    """The collection URL path of every served version of the CRDs written to `paths`."""
    urls = []
    for path in paths:
        spec = json.loads(path.read_text())["spec"]
        for version in spec["versions"]:
            if version.get("served"):
                urls.append(f"/apis/{spec['group']}/{version['name']}/{spec['names']['plural']}")
    return urls
