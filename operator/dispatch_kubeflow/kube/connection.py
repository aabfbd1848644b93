"""How the adapter reaches the apiserver, the way client-go would.

The caller names a kubeconfig (and context), or the pod's service account, or nothing,
in which case client-go's loading rules apply: ``KUBECONFIG`` (a colon-separated list, missing
files skipped), then ``~/.kube/config``, then the service account when running in a pod. A
bearer token given to the adapter replaces whatever credentials the kubeconfig carries (client
certificates, basic auth, exec plugins are not used at all).

The client counts its requests and bounds every non-streaming one by ``timeouts.request``;
watches are bounded by their own ``timeoutSeconds`` instead. Like client-go, it sends a request
again when the apiserver answers 429 (it did not act on it), after ``Retry-After``.

kubernetes_asyncio's HTTP session trusts the environment, which makes aiohttp look up the proxy
variables and read ``~/.netrc`` in a thread on every request (7% of the operator's CPU under
load). ``read_environment_once`` gives a client a session that takes the proxy for the
apiserver from the environment once, as client-go's ``ProxyFromEnvironment`` does; ``.netrc``,
which client-go never reads, is not read.
"""

from __future__ import annotations

import asyncio
import os
from asyncio import sslproto
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio.client import ApiClient, Configuration
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config import ConfigException
from kubernetes_asyncio.config.incluster_config import (
    SERVICE_HOST_ENV_NAME,
    SERVICE_PORT_ENV_NAME,
    load_incluster_config,
)
from kubernetes_asyncio.config.kube_config import (
    ENV_KUBECONFIG_PATH_SEPARATOR,
    KubeConfigLoader,
    KubeConfigMerger,
)
from yarl import URL

from dispatch_kubeflow.errors import ErrUnsupported
from dispatch_kubeflow.kube.apierrors import HTTP_TOO_MANY_REQUESTS

DEFAULT_KUBECONFIG = Path("~/.kube/config")
# Where Kubernetes mounts a pod's service account token and the cluster CA.
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOO_MANY_REQUESTS_RETRIES = 5
LONGEST_RETRY_AFTER = 2.0


class ApiClientWithTimeouts(ApiClient):
    """An ``ApiClient`` that bounds each non-streaming request and counts every request."""

    def __init__(self, configuration: Any, request_timeout: timedelta) -> None:
        configuration.connection_pool_maxsize = CONNECTIONS_PER_CLIENT
        super().__init__(configuration)
        read_environment_once(self)
        self.request_timeout = request_timeout.total_seconds()
        self.requests = 0

    async def request(
        self,
        method: str,
        url: str,
        query_params: Sequence[tuple[str, Any]] | None = None,
        headers: Any = None,
        post_params: Any = None,
        body: Any = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
    ) -> Any:
        if _request_timeout is None and not _is_watch(query_params):
            _request_timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        for retry in range(TOO_MANY_REQUESTS_RETRIES + 1):
            self.requests += 1
            try:
                return await super().request(
                    method,
                    url,
                    query_params=query_params,
                    headers=headers,
                    post_params=post_params,
                    body=body,
                    _preload_content=_preload_content,
                    _request_timeout=_request_timeout,
                )
            except ApiException as error:
                # 429 means the apiserver did not act on the request (priority and fairness,
                # or storage still initialising): safe to send again, as client-go does.
                if error.status != HTTP_TOO_MANY_REQUESTS or retry == TOO_MANY_REQUESTS_RETRIES:
                    raise
                await asyncio.sleep(_retry_after(error))
        raise AssertionError("unreachable")


READ_BUFFER = 2**21  # as kubernetes_asyncio's: a watch event may carry a 1.5 MiB object
# Connections a client keeps open at most (kubernetes_asyncio's default is 100): the watches
# (seven per adapter) and the starts in flight (20) fit, and a burst beyond waits for one.
CONNECTIONS_PER_CLIENT = 32
# asyncio gives every TLS connection a zero-filled read buffer of ``SSLProtocol.max_size``
# (256 KiB), resident for the connection's life. With its watches, starts and writes in flight
# the operator holds about 100 connections: 25 MiB of buffers at 256 KiB, 3 MiB at 32 KiB. A TLS
# record carries at most 16 KiB, so 32 KiB still takes two whole records per read.
TLS_READ_BUFFER = 32 * 1024


def bound_tls_read_buffers(size: int = TLS_READ_BUFFER) -> None:
    """TLS connections opened from now on, in this process, read through ``size`` bytes at most.

    asyncio has no per-connection setting for it; the class attribute is the one it reads.
    """
    sslproto.SSLProtocol.max_size = min(sslproto.SSLProtocol.max_size, size)


def read_environment_once(api: ApiClient) -> ApiClient:
    """Give ``api`` a session that does not consult the environment on every request.

    Its TLS connections (and every one opened after it in the process) read through
    ``TLS_READ_BUFFER`` bytes.
    """
    bound_tls_read_buffers()
    rest = api.rest_client
    old: aiohttp.ClientSession = rest.pool_manager
    rest.pool_manager = aiohttp.ClientSession(
        connector=old.connector, trust_env=False, read_bufsize=READ_BUFFER
    )
    old.detach()
    if not rest.proxy and api.configuration.host:
        try:
            proxy, auth = get_env_proxy_for_url(URL(api.configuration.host))
        except LookupError:
            return api
        rest.proxy = str(proxy)
        if auth is not None:
            headers = dict(rest.proxy_headers or {})
            rest.proxy_headers = {**headers, "Proxy-Authorization": auth.encode()}
    return api


def _retry_after(error: ApiException) -> float:
    try:
        headers: Any = error.headers or {}
        seconds = float(headers.get("Retry-After", 1))
    except (TypeError, ValueError):
        seconds = 1.0
    return min(max(seconds, 0.1), LONGEST_RETRY_AFTER)


def _is_watch(query_params: Sequence[tuple[str, Any]] | None) -> bool:
    return any(key == "watch" and value for key, value in query_params or ())


class ClusterLocation(Protocol):
    """Where the cluster is: the settings document's ``cluster`` object has these fields."""

    @property
    def kubeconfig(self) -> str | None: ...

    @property
    def context(self) -> str | None: ...

    @property
    def in_cluster(self) -> bool: ...


async def connect(
    cluster: ClusterLocation, *, token: str | None, request_timeout: timedelta
) -> ApiClientWithTimeouts:
    """An API client for ``cluster``, or ``ErrUnsupported`` saying why there can be none."""
    kubeconfig, context = cluster.kubeconfig, cluster.context
    configuration = Configuration()
    if cluster.in_cluster:
        _load_service_account(configuration)
    else:
        paths = _kubeconfig_paths(kubeconfig)
        if paths:
            await _load_kubeconfig(configuration, paths, context, token)
        elif context is not None:
            raise ErrUnsupported(
                f"connect: cluster.context {context!r} is set, but no kubeconfig was "
                "found (KUBECONFIG is unset or names no existing file, ~/.kube/config is missing)"
            )
        elif _in_a_pod():
            _load_service_account(configuration)
        else:
            raise ErrUnsupported(
                "connect: no kubeconfig found (KUBECONFIG is unset or names no existing file, "
                "~/.kube/config is missing) and not running in a pod; set cluster.kubeconfig"
            )
    if token is not None:
        _use_bearer_token(configuration, token)
    return ApiClientWithTimeouts(configuration, request_timeout)


def _kubeconfig_paths(explicit: str | None) -> str:
    """The kubeconfig files to merge, ``ENV_KUBECONFIG_PATH_SEPARATOR``-joined; empty for none."""
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ErrUnsupported(f"connect: cluster.kubeconfig {explicit!r} does not exist")
        return str(path)
    listed = os.environ.get("KUBECONFIG", "")
    if listed:
        existing = [
            str(Path(p).expanduser())
            for p in listed.split(ENV_KUBECONFIG_PATH_SEPARATOR)
            if p and Path(p).expanduser().is_file()
        ]
        return ENV_KUBECONFIG_PATH_SEPARATOR.join(existing)
    default = DEFAULT_KUBECONFIG.expanduser()
    return str(default) if default.is_file() else ""


async def _load_kubeconfig(
    configuration: Any, paths: str, context: str | None, token: str | None
) -> None:
    merged = KubeConfigMerger(paths)
    try:
        loader = KubeConfigLoader(
            config_dict=merged.config, config_base_path=None, active_context=context
        )
        if token is None:
            await loader.load_and_set(configuration)
        else:
            # Only the cluster half of the kubeconfig: its credentials (exec plugins included)
            # are replaced by the token, so they are never evaluated.
            loader._load_cluster_info()
            loader._set_config(configuration)
    except (ConfigException, KeyError, TypeError, ValueError) as error:
        where = f"context {context!r} of " if context else ""
        raise ErrUnsupported(f"connect: cannot use {where}kubeconfig {paths}: {error}") from None


def _load_service_account(configuration: Any) -> None:
    try:
        load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration,
            token_filename=str(SERVICE_ACCOUNT_DIR / "token"),
            cert_filename=str(SERVICE_ACCOUNT_DIR / "ca.crt"),
        )
    except ConfigException as error:
        raise ErrUnsupported(f"connect: cannot use the pod's service account: {error}") from None


def _in_a_pod() -> bool:
    return (
        bool(os.environ.get(SERVICE_HOST_ENV_NAME))
        and bool(os.environ.get(SERVICE_PORT_ENV_NAME))
        and (SERVICE_ACCOUNT_DIR / "token").is_file()
    )


def _use_bearer_token(configuration: Any, token: str) -> None:
    configuration.api_key = {"BearerToken": f"Bearer {token}"}
    configuration.api_key_prefix = {}
    configuration.refresh_api_key_hook = None
    configuration.cert_file = None
    configuration.key_file = None
    configuration.username = None
    configuration.password = None
