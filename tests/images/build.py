"""Build the two images of the Dockerfile locally, from local bases and the locked wheels.

The bases come from `tests.images.base` (debootstrap, cached); the wheels pinned by
requirements.lock and requirements-build.lock are downloaded once into a wheelhouse named for a
hash of the two files, and the build itself runs with no network (`--network=none`): pip installs
from the wheelhouse only (`--no-index`), with the locks' hashes checked.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tests.images import base, locks, tools
from tests.images.podman import podman

ROOT = Path(__file__).resolve().parents[2]
LOCKS = (locks.RUNTIME_LOCK, locks.BUILD_LOCK)
OPERATOR = "localhost/dispatch-kubeflow"
PUBLISH = "localhost/dispatch-publish"
TAG = "local"
# The base's Python and C library (bookworm: glibc 2.36), for which binary wheels are chosen.
PYTHON_VERSION = "3.11"
GLIBC_MINOR = 36
# pip takes explicit platforms literally: every manylinux tag that glibc 2.36 runs is named.
PLATFORMS = (
    "manylinux2014_x86_64",
    *(f"manylinux_2_{minor}_x86_64" for minor in range(17, GLIBC_MINOR + 1)),
)
BUILD_TIMEOUT_S = 1800


class BuildError(RuntimeError):
    """An image could not be built."""


@dataclass(frozen=True)
class Image:
    """A built image: its name, where it can be pulled from by digest, and what it cost."""

    target: str
    name: str
    digest: str
    size_bytes: int
    seconds: float

    @property
    def repository(self) -> str:
        return self.name.rsplit(":", 1)[0]

    @property
    def reference(self) -> str:
        """The image by digest, as the chart names it."""
        return f"{self.repository}@{self.digest}"

    def describe(self) -> str:
        return (
            f"{self.target}: {self.reference} ({self.size_bytes / 1e6:.1f} MB, "
            f"built in {self.seconds:.0f} s)"
        )


@dataclass(frozen=True)
class Built:
    operator: Image
    publish: Image
    bases: list[base.Base]
    wheelhouse_seconds: float


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def wheelhouse() -> Path:
    """The locked wheels, downloaded once per version of the lock files."""
    digest = hashlib.sha256(" ".join(PLATFORMS).encode())
    for lock in LOCKS:
        digest.update(lock.read_bytes())
    folder = base.CACHE_ROOT / "wheels" / digest.hexdigest()[:12]
    complete = folder / ".complete"
    if complete.is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    _say(f"downloading the locked wheels into {folder}")
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes"]
    command += ["--only-binary=:all:", f"--python-version={PYTHON_VERSION}", "--implementation=cp"]
    command += [f"--platform={platform}" for platform in PLATFORMS]
    command += ["--dest", str(folder)]
    for lock in LOCKS:
        command += ["-r", str(lock)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        raise BuildError(f"pip download of the locked wheels failed:\n{result.stderr[-4000:]}")
    complete.touch()
    return folder


def _build_target(target: str, name: str, build_args: dict[str, str], wheels: Path) -> Image:
    started = time.monotonic()
    command = ["build", "--target", target, "--tag", name, "--network=none"]
    command += ["--volume", f"{wheels}:/wheels:ro", "--file", str(ROOT / "Dockerfile")]
    for key, value in build_args.items():
        command += ["--build-arg", f"{key}={value}"]
    podman(*command, str(ROOT), timeout=BUILD_TIMEOUT_S)
    seconds = round(time.monotonic() - started, 1)
    inspected = json.loads(podman("image", "inspect", name))[0]
    return Image(target, name, inspected["Digest"], int(inspected["Size"]), seconds)


def build() -> Built:
    """Both images, built (or found in podman's layer cache) from this checkout."""
    tools.ensure()
    lock_path = base.CACHE_ROOT / "images" / ".build.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        run_base, build_base = base.ensure_python_bases()
        busybox_base = base.ensure_busybox_base()
        started = time.monotonic()
        wheels = wheelhouse()
        wheelhouse_seconds = round(time.monotonic() - started, 1)
        operator = _build_target(
            "operator",
            f"{OPERATOR}:{TAG}",
            {
                "BASE": run_base.name,
                "BUILD_BASE": build_base.name,
                "PIP_OPTIONS": "--no-index --find-links=/wheels",
            },
            wheels,
        )
        publish = _build_target(
            "publish", f"{PUBLISH}:{TAG}", {"BUSYBOX_IMAGE": busybox_base.name}, wheels
        )
    return Built(operator, publish, [run_base, build_base, busybox_base], wheelhouse_seconds)


def summary(built: Built) -> list[str]:
    """Names, sizes, digests and times, one line each."""
    return [
        *(
            f"base {b.name}: {'made' if b.made else 'reused'} in {b.seconds:.0f} s"
            for b in built.bases
        ),
        f"wheelhouse: {built.wheelhouse_seconds:.0f} s",
        built.operator.describe(),
        built.publish.describe(),
    ]


def report(built: Built) -> str:
    """The summary, then the images as JSON."""
    as_json = json.dumps(
        {
            "operator": {**asdict(built.operator), "reference": built.operator.reference},
            "publish": {**asdict(built.publish), "reference": built.publish.reference},
        },
        indent=2,
    )
    return "\n".join([*summary(built), as_json])
