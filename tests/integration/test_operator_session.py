"""kopf's session: the operator's identity, its requests in flight bounded, its watches never held.

kopf's own session opens a connection for every request in flight; the operator's login gives it
one whose requests wait for a place, while its watches (which stream for minutes) pass by.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp
import kopf
import pytest

from dispatch_kubeflow.handlers.kube import (
    KOPF_REQUESTS_IN_FLIGHT,
    RequestsInFlight,
    connection_info,
    kopf_session,
)
from dispatch_kubeflow.handlers.startup import login
from tests.cluster.controlplane import ControlPlane
from tests.integration.test_operator import kubeconfig

WAIT = 30.0


async def session_with(cluster: ControlPlane, bound: RequestsInFlight) -> kopf.AiohttpSession:
    with kubeconfig(cluster.kubeconfig):
        return kopf_session(await connection_info(kopf.OperatorSettings()), bound)


@pytest.fixture
async def bounded(
    cluster: ControlPlane,
) -> AsyncIterator[tuple[str, aiohttp.ClientSession, RequestsInFlight]]:
    bound = RequestsInFlight(2)
    context = await session_with(cluster, bound)
    try:
        yield context.server, context.aiohttp_session, bound
    finally:
        await context.aiohttp_session.close()


async def status_of(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url) as response:
        await response.read()
        return response.status


async def test_the_login_gives_kopf_a_bounded_session_as_the_operators_identity(
    cluster: ControlPlane, namespace: str
) -> None:
    with kubeconfig(cluster.kubeconfig):
        # kopf types its handlers as what it calls them with; the login is a plain coroutine.
        context = await cast(Any, login)(settings=kopf.OperatorSettings())
    assert isinstance(context, kopf.AiohttpSession)
    try:
        url = f"{context.server}/api/v1/namespaces/{namespace}"
        assert await status_of(context.aiohttp_session, url) == 200
        middlewares = context.aiohttp_session._middlewares
        assert [m.limit for m in middlewares if isinstance(m, RequestsInFlight)] == [
            KOPF_REQUESTS_IN_FLIGHT
        ]
    finally:
        await context.aiohttp_session.close()


async def test_kopfs_requests_in_flight_never_exceed_the_bound(
    bounded: tuple[str, aiohttp.ClientSession, RequestsInFlight], namespace: str
) -> None:
    server, session, bound = bounded
    url = f"{server}/api/v1/namespaces/{namespace}"
    answers = await asyncio.wait_for(
        asyncio.gather(*(status_of(session, url) for _ in range(40))), WAIT
    )
    assert answers == [200] * 40
    assert bound.peak == 2, f"{bound.peak} requests were in flight at once, with 2 places"
    assert bound.in_flight == 0


async def test_kopfs_watches_neither_wait_for_a_place_nor_hold_one(
    bounded: tuple[str, aiohttp.ClientSession, RequestsInFlight], namespace: str
) -> None:
    """Five watches stream at once beside two places; requests still pass while they stream."""
    server, session, bound = bounded
    watch = f"{server}/api/v1/namespaces/{namespace}/configmaps?watch=true&timeoutSeconds=60"
    watches = await asyncio.wait_for(asyncio.gather(*(session.get(watch) for _ in range(5))), WAIT)
    try:
        assert [response.status for response in watches] == [200] * 5
        url = f"{server}/api/v1/namespaces/{namespace}"
        answers = await asyncio.wait_for(
            asyncio.gather(*(status_of(session, url) for _ in range(6))), WAIT
        )
        assert answers == [200] * 6
        assert bound.peak <= 2
    finally:
        for response in watches:
            response.close()
