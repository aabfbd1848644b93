"""Every loop that retries on errors ends when its task is cancelled, even when the cancellation
arrives as an error.

When the operator stops, it closes its API clients while its tasks are being cancelled; a request
in flight can then fail ("Connector is closed") in place of the cancellation, and asyncio does not
raise the cancellation again at the next await. A loop that took that failure for one to retry
would run on, and the process would not stop. Each loop here is cancelled while its call waits,
the call fails instead of ending cancelled, and the loop must end cancelled without calling again.
The calls are stand-ins (``tests/unit/cancelling.py``): a real apiserver cannot be made to fail a
request at the moment of a cancellation.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiohttp
import kopf
import pytest
from kubernetes_asyncio import client

from dispatch_kubeflow.admission.controller import AdmissionConfig, AdmissionController
from dispatch_kubeflow.clock import SYSTEM_CLOCK
from dispatch_kubeflow.constants import KIND_TRAINJOB
from dispatch_kubeflow.errors import ErrOutcomeUnknown
from dispatch_kubeflow.handlers import recovery
from dispatch_kubeflow.handlers.adapters import AdapterSession, AdapterStatus
from dispatch_kubeflow.handlers.registry import AdapterRegistry, EventLines
from dispatch_kubeflow.kube.informer import Informer
from tests.unit.cancelling import FailsWhenCancelled

# Longer than any first retry's wait: a loop that retries has called again by then.
PATIENCE = 60.0

pytestmark = pytest.mark.looptime(start=0)


async def assert_ends_cancelled(loop: Coroutine[Any, Any, Any], call: FailsWhenCancelled) -> None:
    task = asyncio.ensure_future(loop)
    await asyncio.wait_for(call.waiting.wait(), PATIENCE)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=PATIENCE)
    if not done:
        task.cancel()
        await asyncio.wait({task})
    assert done, f"the loop went on after its cancellation became {call.error!r}"
    assert task.cancelled()
    assert call.calls == 1


async def test_an_informer_whose_list_fails_as_it_is_cancelled_ends() -> None:
    listing = FailsWhenCancelled(aiohttp.ClientConnectionError("Connector is closed."))

    async def emit(_: object) -> None:
        raise AssertionError("nothing was listed")

    await assert_ends_cancelled(Informer(KIND_TRAINJOB, listing, emit).run(), listing)


async def test_the_admission_controllers_watch_whose_informer_fails_as_it_is_cancelled_ends() -> (
    None
):
    config = AdmissionConfig(
        check="gate",
        lease_namespace="dispatch-system",
        lease_name="dispatch-admission",
        identity="a",
        retry_backoff=0.2,
    )
    unconnected = client.ApiClient(client.Configuration(host="http://127.0.0.1:9"))
    controller = AdmissionController(unconnected, config)
    watching = FailsWhenCancelled(RuntimeError("Session is closed"))
    informer = Informer(KIND_TRAINJOB, watching, controller._noticed)
    informer.run = watching  # type: ignore[method-assign]
    try:
        await assert_ends_cancelled(controller._keep_watching(informer), watching)
    finally:
        await unconnected.close()


@dataclass
class Session(AdapterSession):
    """A serving session whose status writes are kept here instead of sent."""

    written: list[AdapterStatus] = field(default_factory=list)

    async def write(self, status: AdapterStatus) -> None:
        self.written.append(status)


def session(opener: Callable[[Any], Awaitable[Any]]) -> Session:
    return Session(
        api=None,  # type: ignore[arg-type]
        name="adapter",
        namespace="dispatch-system",
        generation=1,
        spec={"namespace": "team-a", "runtimes": [{"kind": "ClusterTrainingRuntime", "name": "r"}]},
        registry=AdapterRegistry(),
        event_lines=EventLines(None),
        post_event=lambda *_: None,
        logger=logging.getLogger("test"),
        opener=opener,
    )


async def test_an_adapter_session_whose_opening_fails_as_it_is_cancelled_ends() -> None:
    opener = FailsWhenCancelled(RuntimeError("Session is closed"))
    served = session(opener)
    await assert_ends_cancelled(served._serve(), opener)
    assert len(served.written) == 1, "only the opening is shown, no failure to open"


class Opened:
    """An open adapter whose watch fails as it is cancelled."""

    def __init__(self) -> None:
        self.watching = FailsWhenCancelled(RuntimeError("Session is closed"))
        self.closed = False

    async def watch(self) -> AsyncIterator[Any]:
        await self.watching()
        yield None

    def watch_problems(self) -> list[str]:
        return []

    async def close(self) -> None:
        self.closed = True


async def test_an_adapter_session_whose_watch_fails_as_it_is_cancelled_ends() -> None:
    adapter = Opened()

    async def opener(_: object) -> Opened:
        return adapter

    served = session(opener)
    await assert_ends_cancelled(served._serve(), adapter.watching)
    assert len(served.written) == 2, "the opening and Ready are shown, no failed watch"
    assert adapter.closed
    assert served.registry.adapters == {}


async def test_a_due_recovery_that_fails_as_it_is_cancelled_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    carrying_out = FailsWhenCancelled(ErrOutcomeUnknown("reading the DispatchJob: closed"))
    monkeypatch.setattr(recovery, "carry_out", carrying_out)
    decision = recovery.Decision("Retried", "Restarted", 2, datetime.now(UTC), "a retry")
    when_due = recovery._when_due(kopf.Memo(), "team-a", "job", decision, SYSTEM_CLOCK)
    await assert_ends_cancelled(when_due, carrying_out)
