"""The lock files the images install from, and how they are made again.

requirements.lock pins the package's dependencies (pyproject.toml's [project] dependencies, with
everything they need), requirements-build.lock the tools that build its wheel (pyproject.toml's
[build-system] requires); both with the hash of every file, so two builds from one commit install
the same bytes. `python -m tests.images lock` makes both again with pip-tools after a change to
pyproject.toml (tests/images/test_locks.py fails until then).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME_LOCK = ROOT / "requirements.lock"
BUILD_LOCK = ROOT / "requirements-build.lock"
COMMON = ["--quiet", "--generate-hashes", "--strip-extras", "--no-emit-index-url"]
COMMON += ["--no-emit-find-links", "--allow-unsafe"]
PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+) \\\n((?:\s+--hash=sha256:[0-9a-f]{64}.*\n?)+)", re.M)


def pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def runtime_requirements() -> list[str]:
    project = pyproject()["project"]
    assert isinstance(project, dict)
    return list(project["dependencies"])


def build_requirements() -> list[str]:
    system = pyproject()["build-system"]
    assert isinstance(system, dict)
    return list(system["requires"])


def pins(lock: Path) -> dict[str, tuple[str, int]]:
    """Normalized name -> (version, number of hashes) of every pin in a lock file."""
    return {
        normalized(name): (version, hashes.count("--hash="))
        for name, version, hashes in PIN.findall(lock.read_text())
    }


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def make() -> None:
    """Both lock files again, from pyproject.toml (needs pip-tools: `pip install pip-tools`)."""
    compile_ = [sys.executable, "-m", "piptools", "compile", *COMMON]
    # The locks' headers name this command; find-links would leak a local folder into them.
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}
    env["CUSTOM_COMPILE_COMMAND"] = "python -m tests.images lock"
    subprocess.run(
        [*compile_, f"--output-file={RUNTIME_LOCK.name}", "pyproject.toml"],
        cwd=ROOT,
        env=env,
        check=True,
    )
    subprocess.run(
        [*compile_, f"--output-file={BUILD_LOCK.name}", "-"],
        input="\n".join(build_requirements()) + "\n",
        text=True,
        cwd=ROOT,
        env=env,
        check=True,
    )
