"""pytest fixtures for tests against a real etcd + kube-apiserver.

`cluster` starts the control plane of `tests/cluster` once per session, and only when some
selected test asks for it: a run of pure unit tests builds and starts nothing. Tests that use it,
or any other fixture that builds from the Go module proxy or starts a process (`BUILDING_FIXTURES`),
get the `cluster` marker automatically, so `-m "not cluster"` skips them all. At the session's
end no process the suite started may still run: one that does fails the run and is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from tests.cluster import binaries, processes
from tests.cluster.controlplane import ControlPlane

_build_error: binaries.BuildError | None = None

# Fixtures that need the Go toolchain, the module proxy or a started process: a test using one
# (directly or through another fixture) is a `cluster` test. `helm` is test_chart.py's.
CONTROL_PLANE_FIXTURES = frozenset({"cluster", "control_plane_binaries"})
BUILDING_FIXTURES = CONTROL_PLANE_FIXTURES | {"helm"}


def _uses(item: pytest.Item, fixtures: frozenset[str]) -> bool:
    return not fixtures.isdisjoint(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # tryfirst: the marker must be there before `-m` deselects by it.
    for item in items:
        if _uses(item, BUILDING_FIXTURES):
            item.add_marker(pytest.mark.cluster)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the binaries before the first test, outside every per-test timeout."""
    global _build_error
    if session.config.option.collectonly:
        return
    needed = any(_uses(item, CONTROL_PLANE_FIXTURES) for item in session.items)
    if needed and not binaries.is_built():
        # Show the build's progress: it can take many minutes the first time.
        capture = session.config.pluginmanager.getplugin("capturemanager")
        visible = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
        try:
            with visible:
                binaries.build()
        except binaries.BuildError as error:
            _build_error = error


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session) -> Iterator[None]:
    """Fail the run if a process it started outlived it, and kill that process.

    A wrapper, so this runs after every fixture's teardown (pytest tears down what is left,
    after `-x` for instance, in its own `pytest_sessionfinish`).
    """
    yield
    left = {**processes.descendants(os.getpid()), **processes.started_and_running()}
    if not left:
        return
    processes.kill(left)
    names = ", ".join(f"{name} (pid {pid})" for pid, name in sorted(left.items()))
    message = f"processes the suite started still ran at its end (now killed): {names}"
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(message, red=True, bold=True)
    else:
        print(message, file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _built_binaries() -> Path:
    if _build_error is not None:
        pytest.fail(f"the test control plane could not be built: {_build_error}")
    return binaries.build()


@pytest.fixture(scope="session")
def control_plane_binaries() -> Path:
    """The folder of the control plane's binaries, built before the first test."""
    return _built_binaries()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A running etcd + kube-apiserver with the project's and the upstream CRDs installed."""
    yield from running_control_plane(tmp_path_factory, "control-plane")


def running_control_plane(
    tmp_path_factory: pytest.TempPathFactory, name: str, *, install_crds: bool = True
) -> Iterator[ControlPlane]:
    """Start a control plane of its own in a fresh folder; stop it when the caller is done.

    Its folder's name starts with `control-plane` so a later session finds it should this one
    be killed before it stops the control plane.
    """
    if not name.startswith("control-plane"):
        raise ValueError(f"running_control_plane: {name!r} must start with 'control-plane'")
    # pytest keeps the last few session folders: stop what a killed earlier session left running.
    sessions = tmp_path_factory.getbasetemp().parent
    ControlPlane.stop_orphans(sessions.glob("pytest-*/control-plane*"))
    plane = ControlPlane(tmp_path_factory.mktemp(name), _built_binaries(), owner_pid=os.getpid())
    # Also on interpreter exit, should the session end without running fixture teardown.
    atexit.register(plane.stop)
    plane.start(install_crds=install_crds)
    try:
        yield plane
    finally:
        plane.stop()
        atexit.unregister(plane.stop)


@pytest.fixture(autouse=True)
def _apiserver_running_after_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that stops kube-apiserver and then fails must not take the next tests with it."""
    plane = request.getfixturevalue("cluster") if "cluster" in request.fixturenames else None
    yield
    if plane is not None:
        plane.start_apiserver()


def _namespace_name(test_name: str) -> str:
    stem = re.sub(r"[^a-z0-9]+", "-", test_name.lower()).strip("-")[:48].rstrip("-")
    return f"{stem or 'test'}-{secrets.token_hex(3)}"


@pytest.fixture
async def namespace(cluster: ControlPlane, request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A fresh namespace for one test, deleted afterwards."""
    name = _namespace_name(request.node.name)
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        await client.CoreV1Api(api).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
        )
        yield name
        cluster.start_apiserver()
        try:
            await client.CoreV1Api(api).delete_namespace(name)
        except ApiException as error:
            if error.status != 404:
                raise
    finally:
        await api.close()


@pytest.fixture
async def kube_api(cluster: ControlPlane) -> AsyncIterator[client.ApiClient]:
    """An ApiClient authenticated as the admin (system:masters)."""
    api = await config.new_client_from_config(config_file=str(cluster.kubeconfig))
    try:
        yield api
    finally:
        await api.close()
