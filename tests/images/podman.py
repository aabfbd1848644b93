"""podman, as the build machines can run it.

crun refuses the machines' hybrid cgroups, so every command names runc; the default ulimits of a
container exceed the machines' hard limits, so `run` sets its own.
"""

from __future__ import annotations

import subprocess

RUNTIME = ["--runtime", "runc"]
ULIMITS = ["--ulimit", "nofile=20000:20000", "--ulimit", "nproc=4096:4096"]
TIMEOUT_S = 600


class PodmanError(RuntimeError):
    """A podman command failed."""


def podman(*args: str, timeout: float = TIMEOUT_S, check: bool = True) -> str:
    """Run `podman <args>` and return its standard output."""
    command = ["podman", *RUNTIME, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise PodmanError(
            f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-4000:]}"
        )
    return result.stdout.strip()


def image_exists(name: str) -> bool:
    return subprocess.run(["podman", "image", "exists", name], check=False).returncode == 0
