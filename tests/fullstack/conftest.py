"""pytest fixtures for the full-stack scenarios.

`fullstack` (package scope) starts kube-scheduler, KWOK with its simulated GPU nodes and the real
Trainer, JobSet and Kueue controllers on top of a control plane of their own (`cluster` is
overridden here), once per run and only when a selected test asks for it. Tests that use it
get the `fullstack` marker, so `-m "not fullstack"` runs the rest of the suite without building
or starting any of it.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator

import pytest

from tests.cluster.controlplane import ControlPlane
from tests.cluster.fullstack import build
from tests.cluster.fullstack.stack import KUEUE_CONFIGURATIONS, FullStack
from tests.conftest import running_control_plane

_build_error: build.BuildError | None = None


def _uses_fullstack(item: pytest.Item) -> bool:
    return "fullstack" in getattr(item, "fixturenames", ())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _uses_fullstack(item):
            item.add_marker(pytest.mark.fullstack)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Build the binaries before the first test, outside every per-test timeout."""
    global _build_error
    if any(_uses_fullstack(item) for item in session.items) and not build.is_built():
        try:
            build.build()
        except build.BuildError as error:
            _build_error = error


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of the scenarios' own, stopped when they are done.

    The controllers install webhooks and taint nodes cluster-wide; on the suite's shared control
    plane they would change what every later test sees (Trainer's webhook refusing TrainJobs
    whose runtime a test has not created, Kueue suspending them).
    """
    yield from running_control_plane(tmp_path_factory, "control-plane-fullstack")


@pytest.fixture(scope="package")
def fullstack(cluster: ControlPlane) -> Iterator[FullStack]:
    """kube-scheduler, KWOK nodes and the Trainer, JobSet and Kueue controllers, running."""
    if _build_error is not None:
        pytest.fail(f"the full stack could not be built: {_build_error}")
    stack = FullStack(cluster)
    atexit.register(stack.stop)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
        atexit.unregister(stack.stop)


@pytest.fixture(scope="package", params=sorted(KUEUE_CONFIGURATIONS))
def kueue_configuration(request: pytest.FixtureRequest, fullstack: FullStack) -> str:
    """Run a Kueue test once per Kueue configuration (``KUEUE_CONFIGURATIONS``).

    Package scope makes pytest group the tests by configuration, so Kueue restarts once per
    configuration rather than per test.
    """
    name: str = request.param
    fullstack.configure_kueue(KUEUE_CONFIGURATIONS[name])
    return name


@pytest.fixture
def queues(fullstack: FullStack, namespace: str, kueue_configuration: str) -> Iterator[str]:
    """A ClusterQueue with 8 GPUs of quota for this test's namespace and a LocalQueue `lq`."""
    name = fullstack.create_queues(namespace, gpus=8)
    try:
        yield "lq"
    finally:
        fullstack.delete_queues(name)
