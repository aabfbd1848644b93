"""The `images` fixture: both images built once per run, their figures shown in the run's output."""

from __future__ import annotations

import contextlib
import sys

import pytest

from tests.images import build

# A cold build makes the Debian bases with debootstrap (minutes); later ones reuse the cache.
BUILD_TIMEOUT_S = 1800
# Built once per run, though two folders' tests import the fixture (two fixture definitions).
_built: build.Built | None = None


@pytest.fixture(scope="session")
def images(request: pytest.FixtureRequest) -> build.Built:
    """The operator and publish images, built from this checkout (or found in podman's cache)."""
    global _built
    if _built is None:
        try:
            _built = build.build()
        except RuntimeError as error:  # BuildError, and the tools', bases' and podman's errors
            pytest.fail(f"the images could not be built: {error}")
        capture = request.config.pluginmanager.getplugin("capturemanager")
        visible = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
        with visible:
            print("", *build.summary(_built), sep="\n", file=sys.stderr, flush=True)
    return _built
