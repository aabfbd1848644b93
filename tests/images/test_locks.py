"""The lock files agree with pyproject.toml, and pin every file by hash (nothing is built)."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.images import locks

REMAKE = "make the locks again: python -m tests.images lock"


@pytest.mark.parametrize(
    ("lock", "requirements"),
    [
        (locks.RUNTIME_LOCK, locks.runtime_requirements()),
        (locks.BUILD_LOCK, locks.build_requirements()),
    ],
    ids=["runtime", "build"],
)
def test_every_requirement_of_pyproject_is_pinned_in_its_lock_within_its_range(
    lock: Path, requirements: list[str]
) -> None:
    pinned = locks.pins(lock)
    for text in requirements:
        requirement = Requirement(text)
        name = locks.normalized(requirement.name)
        assert name in pinned, f"{lock.name} does not pin {name}; {REMAKE}"
        version, _ = pinned[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{lock.name} pins {name}=={version}, outside {requirement.specifier}; {REMAKE}"
        )


@pytest.mark.parametrize("lock", [locks.RUNTIME_LOCK, locks.BUILD_LOCK], ids=lambda p: p.name)
def test_every_pin_has_hashes_and_no_line_is_unpinned(lock: Path) -> None:
    pinned = locks.pins(lock)
    assert pinned
    assert all(count >= 1 for _, count in pinned.values())
    requirement_lines = [
        line for line in lock.read_text().splitlines() if line and line[0].isalnum()
    ]
    assert len(requirement_lines) == len(pinned), "a requirement without ==version and hashes"
