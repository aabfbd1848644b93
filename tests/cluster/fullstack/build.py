"""Build the full stack's binaries from the Go module proxy and cache them outside the work tree.

Trainer, JobSet, Kueue and KWOK each pin their own Kubernetes and controller-runtime versions, so
each is built from its own wrapper module (a go.mod that requires only the upstream module, so the
upstream go.mod decides every other version). kube-scheduler is built from the control plane's
wrapper module so that it is the same Kubernetes release as the apiserver.

The cache folder is keyed by every go.mod/go.sum involved and a recipe number: a second run
builds nothing, a changed pin rebuilds.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import binaries as controlplane_binaries

HERE = Path(__file__).resolve().parent
# Bump when the way the binaries are built changes, so cached builds are not reused.
RECIPE = "1"
# `go build -p`: parallel compile jobs. CI has the machine to itself; a shared machine sets 1.
BUILD_JOBS = os.environ.get("DISPATCH_KUBEFLOW_GO_BUILD_JOBS", "2")


class BuildError(controlplane_binaries.BuildError):
    """The Go toolchain could not produce a full-stack binary."""


@dataclass(frozen=True)
class Component:
    """One binary: where its wrapper go.mod lives, its main package and the module pinned."""

    name: str
    module_dir: Path
    package: str
    module: str
    version_package: str | None = None

    def version(self) -> str:
        text = (self.module_dir / "go.mod").read_text()
        match = re.search(
            rf"^\s*(?:require\s+)?{re.escape(self.module)}\s+(v\S+)", text, re.MULTILINE
        )
        if match is None:
            raise BuildError(f"{self.module_dir / 'go.mod'}: no require line for {self.module}")
        return match.group(1)

    def ldflags(self) -> str:
        flags = ["-s", "-w"]
        version = self.version()
        if self.module == "k8s.io/kubernetes":
            match = re.fullmatch(r"v(\d+)\.(\d+)\.\d+", version)
            if match is None:
                raise BuildError(f"k8s.io/kubernetes version {version!r} is not vMAJOR.MINOR.PATCH")
            major, minor = match.groups()
            values = {
                "gitVersion": version,
                "gitMajor": major,
                "gitMinor": minor,
                "gitTreeState": "clean",
                "buildDate": _now(),
            }
            for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
                flags += [f"-X '{package}.{key}={value}'" for key, value in values.items()]
        elif self.version_package is not None:
            flags.append(f"-X '{self.version_package}={version}'")
        return " ".join(flags)


COMPONENTS: tuple[Component, ...] = (
    Component(
        "kube-scheduler",
        controlplane_binaries.MODULE_DIR,
        "k8s.io/kubernetes/cmd/kube-scheduler",
        "k8s.io/kubernetes",
    ),
    Component(
        "jobset-controller",
        HERE / "jobset",
        "sigs.k8s.io/jobset",
        "sigs.k8s.io/jobset",
        "sigs.k8s.io/jobset/pkg/version.GitVersion",
    ),
    Component(
        "trainer-controller-manager",
        HERE / "trainer",
        "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
        "github.com/kubeflow/trainer/v2",
    ),
    Component(
        "kueue",
        HERE / "kueue",
        "sigs.k8s.io/kueue/cmd/kueue",
        "sigs.k8s.io/kueue",
        "sigs.k8s.io/kueue/pkg/version.GitVersion",
    ),
    Component("kwok", HERE / "kwok", "sigs.k8s.io/kwok/cmd/kwok", "sigs.k8s.io/kwok"),
)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def component(name: str) -> Component:
    for item in COMPONENTS:
        if item.name == name:
            return item
    raise KeyError(f"no full-stack component named {name!r}")


def versions() -> dict[str, str]:
    """Binary name -> pinned upstream module version (e.g. kueue -> v0.19.2)."""
    return {item.name: item.version() for item in COMPONENTS}


def binary_dir() -> Path:
    digest = hashlib.sha256(RECIPE.encode())
    for item in COMPONENTS:
        digest.update(item.name.encode())
        for name in ("go.mod", "go.sum"):
            digest.update((item.module_dir / name).read_bytes())
    return controlplane_binaries.CACHE_ROOT / f"fullstack-{digest.hexdigest()[:12]}"


def binary(name: str) -> Path:
    return binary_dir() / name


def is_built() -> bool:
    return all((binary_dir() / item.name).is_file() for item in COMPONENTS)


def _go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        raise BuildError(
            "the Go toolchain (`go`) is not on PATH; install Go 1.26+ to build the stack"
        )
    return go


def build(force: bool = False, log: bool = True, only: tuple[str, ...] = ()) -> Path:
    """Build every missing binary into the cache folder and return the folder.

    Each binary is moved into place as soon as it is built, so an interrupted build keeps what
    it finished. `build-times.json` there records how long each took and how big it is.
    `only` limits the build to the named binaries.
    """
    target = binary_dir()
    target.mkdir(parents=True, exist_ok=True)
    times_file = target / "build-times.json"
    times: dict[str, dict[str, float | str]] = (
        json.loads(times_file.read_text()) if times_file.exists() else {}
    )
    env = dict(os.environ, CGO_ENABLED="0")
    for item in COMPONENTS:
        final = target / item.name
        if (final.is_file() and not force) or (only and item.name not in only):
            continue
        if log:
            print(
                f"building {item.name} ({item.module} {item.version()})",
                file=sys.stderr,
                flush=True,
            )
        with tempfile.TemporaryDirectory(dir=target, prefix=".build-") as scratch:
            out = Path(scratch) / item.name
            command = [
                _go(),
                "build",
                "-trimpath",
                "-p",
                BUILD_JOBS,
                "-ldflags",
                item.ldflags(),
                "-o",
                str(out),
                item.package,
            ]
            started = time.monotonic()
            result = subprocess.run(command, cwd=item.module_dir, env=env, check=False)
            if result.returncode != 0:
                raise BuildError(
                    f"`go build {item.package}` in {item.module_dir} failed with exit code "
                    f"{result.returncode}"
                )
            out.rename(final)
        seconds = time.monotonic() - started
        times[item.name] = {
            "version": item.version(),
            "seconds": round(seconds, 1),
            "bytes": final.stat().st_size,
        }
        times_file.write_text(json.dumps(times, indent=2))
        if log:
            print(
                f"  {item.name}: {seconds:.0f} s, {final.stat().st_size / 2**20:.0f} MiB",
                file=sys.stderr,
                flush=True,
            )
    return target
