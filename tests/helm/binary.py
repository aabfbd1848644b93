"""Build the `helm` command from the Go module proxy for the chart tests.

No registry the project reaches ships a helm binary, so it is compiled from the wrapper module in
this directory, the same way tests/cluster builds the control plane. The result is cached outside
the work tree in a folder named for the helm release, so later runs reuse it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MODULE_DIR = Path(__file__).resolve().parent
CACHE_ROOT = Path(
    os.environ.get("DISPATCH_KUBEFLOW_CACHE", Path.home() / ".cache" / "dispatch-kubeflow")
)
PACKAGE = "helm.sh/helm/v4/cmd/helm"


class BuildError(RuntimeError):
    """The Go toolchain could not produce the helm binary."""


def helm_version() -> str:
    """The helm.sh/helm/v4 version go.mod requires (e.g. v4.3.2)."""
    text = (MODULE_DIR / "go.mod").read_text()
    match = re.search(r"^\s*(?:require\s+)?helm\.sh/helm/v4\s+(v\S+)", text, re.MULTILINE)
    if match is None:
        raise BuildError(f"{MODULE_DIR / 'go.mod'}: no require line for helm.sh/helm/v4")
    return match.group(1)


def binary() -> Path:
    return CACHE_ROOT / f"helm-{helm_version()}" / "helm"


def build(log: bool = True) -> Path:
    """Build helm into the cache folder unless it is already there, and return its path."""
    target = binary()
    if target.is_file():
        return target
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        raise BuildError("the Go toolchain (`go`) is not on PATH; install Go 1.26+ to build helm")
    version = helm_version()
    if log:
        print(f"building helm {version} into {target.parent}", file=sys.stderr, flush=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    ldflags = f"-s -w -X helm.sh/helm/v4/internal/version.version={version}"
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as scratch:
        out = Path(scratch) / "helm"
        result = subprocess.run(
            [go, "build", "-trimpath", "-p", "2", "-ldflags", ldflags, "-o", str(out), PACKAGE],
            cwd=MODULE_DIR,
            env=dict(os.environ, CGO_ENABLED="0"),
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise BuildError(f"go build {PACKAGE} failed:\n{result.stderr[-4000:]}")
        out.replace(target)
    return target


if __name__ == "__main__":
    print(build())
