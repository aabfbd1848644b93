"""The operator's TLS connections read through ``TLS_READ_BUFFER`` bytes, not asyncio's 256 KiB.

asyncio zero-fills a read buffer of ``SSLProtocol.max_size`` for every TLS connection and keeps
it for the connection's life, so its size times the connections open is memory the operator
holds. Building either of the operator's clients bounds it; a response many times the buffer
still arrives whole.

The connections are found among the live ``SSLProtocol`` objects and their buffer read from
asyncio's private ``_ssl_buffer``: asyncio offers no public view of either.
"""

from __future__ import annotations

import gc
import secrets
from asyncio import sslproto
from typing import Any

import kopf
import pytest
from kubernetes_asyncio import client

from dispatch_kubeflow.handlers.kube import connection_info, kopf_session, open_api_client
from dispatch_kubeflow.kube.connection import TLS_READ_BUFFER
from tests.cluster.controlplane import ControlPlane
from tests.integration.test_operator import kubeconfig

ASYNCIO_DEFAULT = 256 * 1024
# Most of a ConfigMap's 1 MiB: thirty times the bounded buffer.
LARGE_VALUE = 900 * 1024


@pytest.fixture
def asyncio_default_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    """asyncio's own buffer size until a client is built, whatever earlier tests set."""
    monkeypatch.setattr(sslproto.SSLProtocol, "max_size", ASYNCIO_DEFAULT)


def large_config_map(name: str, value: str) -> client.V1ConfigMap:
    return client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name), data={"value": value})


def tls_protocols() -> list[Any]:
    return [o for o in gc.get_objects() if isinstance(o, sslproto.SSLProtocol)]


def buffers_opened_since(before: list[Any]) -> list[int]:
    known = {id(protocol) for protocol in before}
    return [len(p._ssl_buffer) for p in tls_protocols() if id(p) not in known]


@pytest.mark.usefixtures("asyncio_default_buffer")
async def test_the_operators_client_reads_a_large_object_through_the_bounded_buffer(
    cluster: ControlPlane, namespace: str
) -> None:
    before = tls_protocols()
    value = secrets.token_hex(LARGE_VALUE // 2)
    name = "large"
    with kubeconfig(cluster.kubeconfig):
        api = await open_api_client()
    try:
        core = client.CoreV1Api(api)
        await core.create_namespaced_config_map(namespace, large_config_map(name, value))
        read = await core.read_namespaced_config_map(name, namespace)
        assert read.data["value"] == value
        buffers = buffers_opened_since(before)
        assert buffers, "no TLS connection was opened: the apiserver is not served over TLS"
        assert max(buffers) <= TLS_READ_BUFFER, f"read buffers of {buffers} bytes"
    finally:
        await api.close()


@pytest.mark.usefixtures("asyncio_default_buffer")
async def test_kopfs_session_reads_a_large_object_through_the_bounded_buffer(
    cluster: ControlPlane, namespace: str
) -> None:
    value = secrets.token_hex(LARGE_VALUE // 2)
    name = "large"
    with kubeconfig(cluster.kubeconfig):
        api = await open_api_client()
        try:
            body = large_config_map(name, value)
            await client.CoreV1Api(api).create_namespaced_config_map(namespace, body)
        finally:
            await api.close()
        sslproto.SSLProtocol.max_size = ASYNCIO_DEFAULT
        before = tls_protocols()
        context = kopf_session(await connection_info(kopf.OperatorSettings()))
    try:
        url = f"{context.server}/api/v1/namespaces/{namespace}/configmaps/{name}"
        async with context.aiohttp_session.get(url) as response:
            assert response.status == 200
            read = await response.json()
        assert read["data"]["value"] == value
        buffers = buffers_opened_since(before)
        assert buffers, "no TLS connection was opened: the apiserver is not served over TLS"
        assert max(buffers) <= TLS_READ_BUFFER, f"read buffers of {buffers} bytes"
    finally:
        await context.aiohttp_session.close()
