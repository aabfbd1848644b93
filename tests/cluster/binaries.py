"""Build etcd, kube-apiserver, kube-controller-manager and kubectl from the Go module proxy.

No registry the project reaches ships these binaries, so they are compiled from the wrapper
module in this directory. The result is cached outside the work tree in a folder keyed by the
Kubernetes release and a hash of go.mod/go.sum, so a second run (or a changed pin) either reuses
or rebuilds exactly what is needed.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODULE_DIR = Path(__file__).resolve().parent
CACHE_ROOT = Path(
    os.environ.get("DISPATCH_KUBEFLOW_CACHE", Path.home() / ".cache" / "dispatch-kubeflow")
)

# Binary name -> Go main package. etcd's main is the root package of its server module.
PACKAGES: dict[str, str] = {
    "etcd": "go.etcd.io/etcd/server/v3",
    "kube-apiserver": "k8s.io/kubernetes/cmd/kube-apiserver",
    "kube-controller-manager": "k8s.io/kubernetes/cmd/kube-controller-manager",
    "kubectl": "k8s.io/kubernetes/cmd/kubectl",
}
# `go build -p`: parallel compile jobs (CI's 2 cores by default).
BUILD_PARALLELISM = os.environ.get("DISPATCH_KUBEFLOW_GO_BUILD_JOBS", "2")
ABANDONED_AFTER_S = 3 * 3600
# Bump when the way the binaries are built changes, so cached builds are not reused.
RECIPE = "1"


class BuildError(RuntimeError):
    """The Go toolchain could not produce the control-plane binaries."""


def required_version(module: str) -> str:
    """The version go.mod requires for `module` (e.g. k8s.io/kubernetes -> v1.37.2)."""
    text = (MODULE_DIR / "go.mod").read_text()
    match = re.search(rf"^\s*{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if match is None:
        raise BuildError(f"{MODULE_DIR / 'go.mod'}: no require line for {module}")
    return match.group(1)


def kubernetes_version() -> str:
    return required_version("k8s.io/kubernetes")


def etcd_version() -> str:
    return required_version("go.etcd.io/etcd/server/v3")


def binary_dir() -> Path:
    """The cache folder for the current pin: k8s-<version>-<hash of go.mod, go.sum, recipe>."""
    digest = hashlib.sha256(RECIPE.encode())
    for name in ("go.mod", "go.sum"):
        digest.update((MODULE_DIR / name).read_bytes())
    return CACHE_ROOT / f"k8s-{kubernetes_version()}-{digest.hexdigest()[:12]}"


def binary(name: str) -> Path:
    return binary_dir() / name


def is_built() -> bool:
    return all((binary_dir() / name).is_file() for name in PACKAGES)


def _version_ldflags(version: str) -> str:
    """The -X flags Kubernetes' own build sets, so /version and `kubectl version` are right."""
    match = re.fullmatch(r"v(\d+)\.(\d+)\.\d+", version)
    if match is None:
        raise BuildError(f"k8s.io/kubernetes version {version!r} is not a vMAJOR.MINOR.PATCH tag")
    values = {
        "gitVersion": version,
        "gitMajor": match.group(1),
        "gitMinor": match.group(2),
        "gitTreeState": "clean",
        "buildDate": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    flags = ["-s", "-w"]
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X '{package}.{key}={value}'" for key, value in values.items()]
    return " ".join(flags)


def go_command() -> str:
    go = shutil.which("go")
    if go is None and Path("/usr/local/go/bin/go").exists():
        go = "/usr/local/go/bin/go"
    if go is None:
        raise BuildError("`go` is not on PATH: install Go 1.26+ to build the test control plane")
    return go


def build(force: bool = False, log: bool = True) -> Path:
    """Build all binaries into the cache folder (nothing to do if they are there) and return it.

    A lock file makes concurrent callers (several pytest runs on one machine) wait for one
    build instead of compiling the same thing side by side.
    """
    target = binary_dir()
    if is_built() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with (target.parent / ".k8s-build.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log:
                _say(f"waiting for another process building {target.name}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        if is_built() and not force:
            return target
        _remove_abandoned_scratch(target.parent)
        _build_into(target, log)
    return target


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _remove_abandoned_scratch(cache_root: Path) -> None:
    """Scratch folders left by killed builds: untouched for longer than any build takes."""
    for scratch in cache_root.glob(".build-*"):
        if time.time() - scratch.stat().st_mtime > ABANDONED_AFTER_S:
            shutil.rmtree(scratch, ignore_errors=True)


def _build_into(target: Path, log: bool) -> None:
    version = kubernetes_version()
    env = dict(os.environ, CGO_ENABLED="0")
    started = time.monotonic()
    if log:
        _say(f"building Kubernetes {version} and etcd {etcd_version()} into {target} (slow once)")
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as scratch:
        out = Path(scratch)
        for name, package in PACKAGES.items():
            command = [
                go_command(),
                "build",
                "-trimpath",
                "-p",
                BUILD_PARALLELISM,
                "-ldflags",
                _version_ldflags(version),
                "-o",
                str(out / name),
                package,
            ]
            step = time.monotonic()
            result = subprocess.run(command, cwd=MODULE_DIR, env=env, check=False)
            if result.returncode != 0:
                raise BuildError(
                    f"`go build {package}` ({name}) in {MODULE_DIR} failed with exit code "
                    f"{result.returncode}; the Go output above says why"
                )
            seconds[name] = round(time.monotonic() - step, 1)
            if log:
                _say(f"  {name}: {seconds[name]:.0f} s")
        seconds["total"] = round(time.monotonic() - started, 1)
        (out / "build-seconds.json").write_text(json.dumps(seconds, indent=2))
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
        # TemporaryDirectory's cleanup tolerates the folder having moved away.
        out.mkdir()
    if log:
        _say(f"built in {seconds['total']:.0f} s")
