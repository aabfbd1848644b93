"""Where one adapter works: its settings, its name and its API clients, in one value.

``Adapter`` is a facade over modules that each carry out one operation of SPEC §3: ``probe``
(the preflight probe of ``open``), ``starting`` (``start``), ``stopping`` (``stop_job``),
``finding`` (``find``) and ``gate`` (``readmit``, ``reject``). Each takes a ``Scope`` rather than
the adapter, so none of them depends on the facade or on another operation's state.
"""

from __future__ import annotations

from kubernetes_asyncio import client

from dispatch_kubeflow.kube.connection import ApiClientWithTimeouts
from dispatch_kubeflow.settings import Settings


class Scope:
    """One adapter's settings, its name (the value of its label on everything it creates) and
    the API clients of its one connection."""

    def __init__(self, settings: Settings, api: ApiClientWithTimeouts, adapter_name: str) -> None:
        self.settings = settings
        self.api = api
        self.adapter_name = adapter_name
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    @property
    def namespace(self) -> str:
        return self.settings.namespace
