"""The local Debian bases of the images, made with debootstrap and imported into podman.

No image registry is reachable from the build machines, so `python:3.11-slim` cannot be pulled.
One debootstrap of a minimal Debian with `python3` and `python3-venv` gives two bases:

- the build base, as installed (the Dockerfile's build stage needs `python3 -m venv` and pip);
- the run base, the same less `python3-venv` and what only it pulled in (ensurepip's wheels,
  distutils, lib2to3) and less glibc's iconv modules (Python has codecs of its own), because
  every byte of it is in the operator image.

Making them takes minutes, so each root filesystem is kept as a tar under the cache folder, named
for a hash of everything that decides its contents (suite, variant, packages, mirror, pruning,
recipe); podman imports a kept tar again in seconds.

The publish target's base is a third, tiny one: Debian's statically linked busybox and its applet
links, so that the chart's init container can run `cp`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.images.podman import image_exists, podman

CACHE_ROOT = Path(
    os.environ.get("DISPATCH_KUBEFLOW_CACHE", Path.home() / ".cache" / "dispatch-kubeflow")
)
MIRROR = os.environ.get("DISPATCH_KUBEFLOW_DEBIAN_MIRROR", "http://deb.debian.org/debian")
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv")
# Purged from the run base: they serve `python3 -m venv` only, which runs in the build stage.
BUILD_ONLY_PACKAGES = (
    "python3-venv",
    "python3.11-venv",
    "python3-pip-whl",
    "python3-setuptools-whl",
    "python3-distutils",
    "python3-lib2to3",
)
BUSYBOX_PACKAGE = "busybox-static"
# What a container never needs: documentation, manuals, translations, apt's downloads and lists.
PRUNED = (
    "usr/share/doc",
    "usr/share/man",
    "usr/share/info",
    "usr/share/locale",
    "usr/share/lintian",
    "var/cache/apt",
    "var/lib/apt/lists",
    "var/log",
)
# Pruned from the run base only: iconv's modules, which nothing in the operator loads.
RUN_PRUNED = ("usr/lib/x86_64-linux-gnu/gconv",)
DEBOOTSTRAP_TIMEOUT_S = 1800
# Bump when the way a base is made changes, so cached ones are not reused.
RECIPE = "2"


class BaseError(RuntimeError):
    """A base could not be made."""


@dataclass(frozen=True)
class Base:
    """A base image in podman's store, and what it cost to get it there."""

    name: str
    made: bool  # made now (debootstrap), rather than imported from the cache or already there
    seconds: float


def _key(*parts: str) -> str:
    digest = hashlib.sha256("\0".join((RECIPE, SUITE, MIRROR, *parts)).encode())
    return digest.hexdigest()[:12]


def _python_key() -> str:
    return _key("minbase", *PACKAGES, *PRUNED, "less", *BUILD_ONLY_PACKAGES, *RUN_PRUNED)


def run_base_name() -> str:
    return f"localhost/dispatch-kubeflow-base:{SUITE}-{_python_key()}"


def build_base_name() -> str:
    return f"localhost/dispatch-kubeflow-build-base:{SUITE}-{_python_key()}"


def busybox_base_name() -> str:
    return f"localhost/dispatch-kubeflow-busybox:{SUITE}-{_key(BUSYBOX_PACKAGE)}"


def cached_tar(name: str) -> Path:
    repository, tag = name.rsplit(":", 1)
    return CACHE_ROOT / "images" / f"{repository.rsplit('/', 1)[1]}-{tag}.tar"


def ensure_python_bases() -> tuple[Base, Base]:
    """The run and build bases in podman's store: already there, imported from the cache, or
    made (one debootstrap for both)."""
    names = (run_base_name(), build_base_name())
    made = _ensure(names, _make_python_tars)
    return made[0], made[1]


def ensure_busybox_base() -> Base:
    """A busybox-only base (Debian's static busybox), for the publish target."""
    (made,) = _ensure((busybox_base_name(),), _make_busybox_tar)
    return made


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def _locked() -> Iterator[None]:
    """One maker of bases on this machine; a second caller waits, then finds them made."""
    lock_path = CACHE_ROOT / "images" / ".lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _say("waiting for another process making the image bases")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _ensure(names: tuple[str, ...], make_tars: Callable[[Path], list[Path]]) -> list[Base]:
    started = time.monotonic()
    made = False
    if not all(image_exists(name) for name in names):
        with _locked():
            tars = [cached_tar(name) for name in names]
            if not all(tar.is_file() for tar in tars):
                with tempfile.TemporaryDirectory(dir=tars[0].parent, prefix=".make-") as scratch:
                    for made_tar, tar in zip(make_tars(Path(scratch)), tars, strict=True):
                        made_tar.replace(tar)
                made = True
            for name, tar in zip(names, tars, strict=True):
                if not image_exists(name):
                    _say(f"importing {tar.name} as {name}")
                    podman("import", str(tar), name, timeout=600)
    seconds = round(time.monotonic() - started, 1)
    return [Base(name, made=made, seconds=seconds) for name in names]


def _make_python_tars(scratch: Path) -> list[Path]:
    """Debootstrap once; tar the run base and the build base."""
    root = scratch / "root"
    root.mkdir()
    _say(f"making the Debian {SUITE} bases with {', '.join(PACKAGES)} (a few minutes, once)")
    started = time.monotonic()
    include = f"--include={','.join(PACKAGES)}"
    _run(
        ["debootstrap", "--variant=minbase", include, SUITE, str(root), MIRROR],
        timeout=DEBOOTSTRAP_TIMEOUT_S,
    )
    _say(f"  debootstrap: {time.monotonic() - started:.0f} s")
    _prune(root, PRUNED)
    _record_packages(root)
    build_tar = _tar(root, scratch / "build-base.tar")
    _run(["chroot", str(root), "dpkg", "--purge", *BUILD_ONLY_PACKAGES], timeout=300)
    _prune(root, (*PRUNED, *RUN_PRUNED))
    _record_packages(root)
    run_tar = _tar(root, scratch / "run-base.tar")
    return [run_tar, build_tar]


def _make_busybox_tar(scratch: Path) -> list[Path]:
    root = scratch / "root"
    (root / "bin").mkdir(parents=True)
    download = ["apt-get", "download", BUSYBOX_PACKAGE]
    try:
        _run(download, timeout=300, cwd=scratch)
    except BaseError:  # package lists never fetched, or too old for the mirror
        _run(["apt-get", "update", "-qq"], timeout=600)
        _run(download, timeout=300, cwd=scratch)
    (deb,) = scratch.glob("*.deb")
    _run(["dpkg-deb", "-x", str(deb), str(scratch / "deb")], timeout=120)
    shutil.copy2(scratch / "deb" / "bin" / "busybox", root / "bin" / "busybox")
    for applet in _run([str(root / "bin" / "busybox"), "--list"], timeout=30).split():
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    for directory in ("etc", "dev", "proc", "sys", "tmp"):
        (root / directory).mkdir(exist_ok=True)
    (root / "tmp").chmod(0o1777)
    return [_tar(root, scratch / "busybox.tar")]


def _prune(root: Path, relatives: tuple[str, ...]) -> None:
    for relative in relatives:
        path = root / relative
        if path.is_dir():
            shutil.rmtree(path)
            path.mkdir()


def _record_packages(root: Path) -> None:
    """The base's package versions, kept in it (the base is cached by its package *names*)."""
    versions = _run(["chroot", str(root), "dpkg-query", "-W"], timeout=60).split("\n")
    record = {"suite": SUITE, "mirror": MIRROR, "packages": versions}
    (root / "etc" / "dispatch-kubeflow-base.json").write_text(json.dumps(record, indent=1))


def _tar(root: Path, tar: Path) -> Path:
    # Numeric owners and a sorted listing: the tar depends on the files, not on this machine.
    _run(
        ["tar", "--numeric-owner", "--sort=name", "-C", str(root), "-cf", str(tar), "."],
        timeout=600,
    )
    return tar


def _run(command: list[str], timeout: float, cwd: Path | None = None) -> str:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=cwd, check=False
    )
    if result.returncode != 0:
        raise BaseError(
            f"{' '.join(command)} failed ({result.returncode}):\n{result.stderr[-4000:]}"
        )
    return result.stdout.strip()
