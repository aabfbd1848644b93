"""The operator's own API calls: status writes and reads of our two resources.

The adapter library talks to the cluster its settings name; the operator's handlers talk to the
cluster the operator runs against (in-cluster service account, else the kubeconfig loading rules),
and kopf logs in with the same identity. Status is written as a JSON merge patch carrying the
resourceVersion it was computed from, so two writers never silently overwrite each other: a
conflict re-reads.
"""

from __future__ import annotations

import asyncio
import inspect
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import aiohttp
import kopf
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.constants import GROUP, JSON_PATCH, MERGE_PATCH, VERSION
from dispatch_kubeflow.kube.apierrors import is_conflict, is_invalid, is_not_found
from dispatch_kubeflow.kube.connection import (
    CONNECTIONS_PER_CLIENT,
    bound_tls_read_buffers,
    read_environment_once,
)

CONFLICT_RETRIES: Final = 10
# kopf's own session has no bound on its connections: a burst of DispatchJobs (each object's
# worker patching on its own) opened 700 to 1,100 TLS connections at about 160 KiB each, most
# of the operator's peak memory. Its requests wait for one of these places.
KOPF_REQUESTS_IN_FLIGHT: Final = 32


async def load_configuration() -> Any:
    """The operator's identity: the pod's service account, else the kubeconfig loading rules.

    ``KUBECONFIG`` is read now: kubernetes_asyncio's own default is read once, at import.
    """
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except config.ConfigException:
        await config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG") or None,
            client_configuration=configuration,
        )
    return configuration


async def open_api_client() -> client.ApiClient:
    configuration = await load_configuration()
    configuration.connection_pool_maxsize = CONNECTIONS_PER_CLIENT
    return read_environment_once(client.ApiClient(configuration))


async def connection_info(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """kopf's credentials for the same identity as ``open_api_client``."""
    configuration = await load_configuration()
    header = configuration.get_api_key_with_prefix("BearerToken")
    if inspect.isawaitable(header):
        header = await header
    parts: list[str] = header.split(" ", 1) if header else []
    scheme, token = (None, None) if not parts else (None, parts[0]) if len(parts) == 1 else parts
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        proxy_url=configuration.proxy,
        trust_env=settings.networking.trust_env,
    )


class RequestsInFlight:
    """An aiohttp client middleware: at most ``limit`` requests in flight at once.

    A request holds its place until its answer's headers arrive. A watch's answer then streams
    for minutes without one, so kopf's watches (one per resource and namespace) never starve
    its patches, however many namespaces it serves.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self.peak = 0
        self._places = asyncio.Semaphore(limit)

    async def __call__(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        async with self._places:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                return await handler(request)
            finally:
                self.in_flight -= 1


def kopf_session(
    info: kopf.ConnectionInfo, bound: RequestsInFlight | None = None
) -> kopf.AiohttpSession:
    """kopf's session for ``info``, as kopf builds it, but with its requests in flight bounded.

    ``bound`` defaults to ``KOPF_REQUESTS_IN_FLIGHT`` places. Its TLS connections read through
    ``TLS_READ_BUFFER`` bytes, as the operator's own client's do.
    """
    bound_tls_read_buffers()
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context()),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        middlewares=(bound or RequestsInFlight(KOPF_REQUESTS_IN_FLIGHT),),
    )
    return kopf.AiohttpSession(
        server=info.server,
        default_namespace=info.default_namespace,
        priority=info.priority,
        expiration=info.expiration,
        aiohttp_session=session,
    )


async def read_object(
    api: client.ApiClient, plural: str, namespace: str, name: str
) -> dict[str, Any] | None:
    """The object, or None when it does not exist."""
    try:
        found: dict[str, Any] = await client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, name
        )
    except ApiException as error:
        if is_not_found(error):
            return None
        raise
    return found


async def patch_status(
    api: client.ApiClient,
    plural: str,
    namespace: str,
    name: str,
    status: Mapping[str, Any],
    *,
    resource_version: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"status": dict(status)}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    # The generated stubs do not declare the client's request options.
    options: dict[str, Any] = {"_content_type": MERGE_PATCH}
    patched: dict[str, Any] = await client.CustomObjectsApi(
        api
    ).patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, plural, name, body, **options
    )
    return patched


StatusChange = Callable[[dict[str, Any]], Awaitable[Mapping[str, Any] | None]]


async def update_status(
    api: client.ApiClient, plural: str, namespace: str, name: str, change: StatusChange
) -> dict[str, Any] | None:
    """Read the object, compute its new status with ``change``, write it; retry on conflicts.

    ``change`` returns the status patch, or None to write nothing. Returns the object as written
    (or as read when nothing was written), or None when the object does not exist.
    """
    for _ in range(CONFLICT_RETRIES):
        current = await read_object(api, plural, namespace, name)
        if current is None:
            return None
        patch = await change(current)
        if patch is None:
            return current
        try:
            return await patch_status(
                api,
                plural,
                namespace,
                name,
                patch,
                resource_version=current["metadata"]["resourceVersion"],
            )
        except ApiException as error:
            if is_not_found(error):
                return None
            if not is_conflict(error):
                raise
    raise RuntimeError(f"{plural}/{name} in {namespace}: status kept changing under the writer")


# The JSON patch that makes a change of an object's finalizers, from the object's metadata as
# known; None when the finalizers already are as wanted.
FinalizersChange = Callable[[Mapping[str, Any]], list[dict[str, Any]] | None]


async def change_finalizers(
    api: client.ApiClient,
    plural: str,
    namespace: str,
    name: str,
    change: FinalizersChange,
    known: Mapping[str, Any] | None = None,
) -> bool:
    """Write ``change`` of the object's finalizers as a JSON patch that tests what it assumes.

    ``known`` (the object as a watch event showed it) spares the first read; when the patch's
    test fails (the object changed), it re-reads. Returns False when the object does not exist.
    """
    current = known
    for _ in range(CONFLICT_RETRIES):
        if current is None:
            current = await read_object(api, plural, namespace, name)
            if current is None:
                return False
        ops = change(current.get("metadata") or {})
        if ops is None:
            return True
        # The generated stubs do not declare the client's request options.
        options: dict[str, Any] = {"_content_type": JSON_PATCH}
        try:
            await client.CustomObjectsApi(api).patch_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name, ops, **options
            )
            return True
        except ApiException as error:
            if is_not_found(error):
                return False
            if not (is_conflict(error) or is_invalid(error)):  # a failed test is 422
                raise
            current = None
    raise RuntimeError(f"{plural}/{name} in {namespace}: finalizers kept changing under the writer")


def with_finalizer(finalizer: str) -> FinalizersChange:
    """Add ``finalizer``, if the object is still the version known (no other write is lost)."""

    def change(metadata: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        finalizers = list(metadata.get("finalizers") or ())
        if finalizer in finalizers:
            return None
        version = metadata.get("resourceVersion")
        return [
            {"op": "test", "path": "/metadata/resourceVersion", "value": version},
            {"op": "add", "path": "/metadata/finalizers", "value": [*finalizers, finalizer]},
        ]

    return change


def without_finalizer(finalizer: str) -> FinalizersChange:
    """Remove ``finalizer`` where it was known to be, if it still is: no resourceVersion is
    needed, so writes of the status meanwhile cost no read."""

    def change(metadata: Mapping[str, Any]) -> list[dict[str, Any]] | None:
        finalizers = list(metadata.get("finalizers") or ())
        if finalizer not in finalizers:
            return None
        where = f"/metadata/finalizers/{finalizers.index(finalizer)}"
        return [{"op": "test", "path": where, "value": finalizer}, {"op": "remove", "path": where}]

    return change
