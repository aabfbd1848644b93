"""The Dockerfile, read (no container engine runs here to build it): targets and their promises."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def stages() -> dict[str, list[str]]:
    """Instructions of each named stage, in order."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+\s+AS\s+(\S+)", line, re.IGNORECASE)
        if match:
            current = found.setdefault(match.group(1), [])
        elif current is not None:
            current.append(line)
    return found


def test_there_are_operator_and_publish_targets() -> None:
    assert {"build", "operator", "publish"} <= set(stages())


def test_the_operator_runs_dispatch_kubeflow_run_as_a_non_root_user_without_pip() -> None:
    operator = stages()["operator"]
    assert 'ENTRYPOINT ["dispatch-kubeflow", "run"]' in operator
    (user,) = [line for line in operator if line.startswith("USER ")]
    assert not user.split()[1].startswith(("0", "root"))
    assert any("rm -rf" in line and "pip" in line for line in operator)
    assert not any(line.startswith("RUN pip") or "apt-get" in line for line in operator)


def test_the_publish_image_carries_the_publish_program_at_its_root() -> None:
    publish = stages()["publish"]
    assert any(
        line.startswith("COPY") and line.endswith("operator/dispatch_kubeflow/publish.py /publish")
        for line in publish
    )
    assert (
        (ROOT / "operator" / "dispatch_kubeflow" / "publish.py")
        .read_text()
        .startswith("#!/usr/bin/env python3")
    )
