"""The two images, built for real and run with podman: what they hold and how they run.

The operator image serving jobs on the full stack is tests/fullstack/test_operator_image.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dispatch_kubeflow.constants import PUBLISH_DIR, PUBLISH_MAX_BYTES
from dispatch_kubeflow.publish import encode
from tests.images import base, locks
from tests.images.build import Built
from tests.images.deployment import publish_init_container
from tests.images.fixtures import BUILD_TIMEOUT_S
from tests.images.podman import ULIMITS, podman

pytestmark = [pytest.mark.image, pytest.mark.cluster, pytest.mark.timeout(BUILD_TIMEOUT_S)]

OPERATOR_SIZE_LIMIT = 200_000_000
LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m, json; "
    "print(json.dumps(sorted((d.metadata['Name'], d.version) for d in m.distributions())))"
)


def _run(image: str, *args: str, options: tuple[str, ...] = ()) -> str:
    return podman("run", "--rm", "--pull=never", *ULIMITS, *options, image, *args)


def test_the_operator_image_is_under_200_mb(images: Built) -> None:
    assert images.operator.size_bytes < OPERATOR_SIZE_LIMIT, images.operator.describe()


def test_the_operator_image_holds_exactly_the_locked_packages_and_the_project(
    images: Built,
) -> None:
    listed = _run(
        images.operator.reference,
        "-c",
        LIST_DISTRIBUTIONS,
        options=("--entrypoint=python3",),
    )
    installed = {locks.normalized(name): version for name, version in json.loads(listed)}
    locked = {name: version for name, (version, _) in locks.pins(locks.RUNTIME_LOCK).items()}
    assert installed == {**locked, "dispatch-kubeflow": "0.1.0"}


def test_the_operator_image_has_no_pip_and_runs_as_65532(images: Built) -> None:
    found = _run(
        images.operator.reference,
        "-c",
        "id -u; id -g; command -v pip pip3 || true",
        options=("--entrypoint=sh",),
    )
    assert found.split() == ["65532", "65532"]


def test_the_publish_program_copied_by_the_charts_init_container_writes_a_termination_message(
    images: Built, tmp_path: Path
) -> None:
    init = publish_init_container()
    shared = tmp_path / "shared"  # the pod's emptyDir, writable by any user as emptyDirs are
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    _run(
        images.publish.reference,
        options=(f"--volume={shared}:{PUBLISH_DIR}", f"--entrypoint={json.dumps(init['command'])}"),
    )
    copied = shared / "publish"
    assert copied.is_file()
    assert copied.stat().st_mode & 0o555 == 0o555

    # A trainer-like image: a Debian with python3 and nothing of the project's.
    message = tmp_path / "termination-log"
    message.touch(mode=0o666)
    message.chmod(0o666)
    record = '{"loss": 0.12, "checkpoint": "s3://bucket/run-7/ckpt"}'
    _run(
        base.run_base_name(),
        f"{PUBLISH_DIR}/publish",
        record,
        options=(
            "--user=1000:1000",
            "--read-only",
            f"--volume={shared}:{PUBLISH_DIR}:ro",
            f"--volume={message}:/dev/termination-log",
        ),
    )
    written = message.read_bytes()
    assert written == encode(record)  # the compact JSON the adapter reads back
    assert json.loads(written) == json.loads(record)
    assert len(written) <= PUBLISH_MAX_BYTES
