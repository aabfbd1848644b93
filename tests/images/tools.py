"""The container tools the image builds and tests need, installed from Debian when missing.

A fresh CI machine has none of them; they come from Debian's packages (the only source the build
machines reach for them). Installing needs root, as the build machines run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

# command -> Debian package providing it
TOOLS: dict[str, str] = {
    "podman": "podman",
    "runc": "runc",
    "debootstrap": "debootstrap",
}
APT_TIMEOUT_S = 900


class ToolsError(RuntimeError):
    """The container tools are missing and could not be installed."""


def missing() -> list[str]:
    """The Debian packages whose command is not on PATH (or in /usr/sbin, for debootstrap)."""
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [package for tool, package in TOOLS.items() if shutil.which(tool, path=search) is None]


def ensure() -> None:
    """Install the missing tools with apt-get (updating the package lists first)."""
    packages = missing()
    if not packages:
        return
    if os.geteuid() != 0:
        raise ToolsError(f"{', '.join(packages)} missing; installing them needs root (apt-get)")
    print(f"installing {' '.join(packages)} from Debian", file=sys.stderr, flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
    ):
        result = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S, check=False
        )
        if result.returncode != 0:
            raise ToolsError(f"{' '.join(command)} failed:\n{result.stderr[-4000:]}")
