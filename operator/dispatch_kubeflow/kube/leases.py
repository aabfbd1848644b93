"""The one model of a coordination.k8s.io Lease, for the elector that writes it and the
heartbeat that reads it, and ``ApiLeaseStore``, the reads and writes of one Lease over the API.

A holder is alive while ``now < renewTime + leaseDurationSeconds (+ a skew allowance)``; an
empty ``holderIdentity`` means the Lease was released. Every write the store makes carries the
resourceVersion it was read at, so two writers racing on one Lease cannot both win: the second
gets ``LeaseConflict``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Protocol

from kubernetes_asyncio import client
from pydantic import BaseModel, ConfigDict

from dispatch_kubeflow.clock import format_micro_time, parse_time
from dispatch_kubeflow.constants import KIND_LEASE, LEASE_GROUP, LEASE_VERSION, LEASES
from dispatch_kubeflow.errors import DispatchError
from dispatch_kubeflow.kube.apierrors import (
    REQUEST_ERRORS,
    is_conflict,
    is_not_found,
    to_dispatch_error,
)
from dispatch_kubeflow.kube.objects import as_int, dig, name_of, namespace_of, text


class Lease(BaseModel):
    """The election fields of a Lease's spec, plus where it is and the version they were read at."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = ""
    namespace: str = ""
    holder_identity: str = ""
    lease_duration_seconds: int = 0
    acquire_time: datetime | None = None
    renew_time: datetime | None = None
    lease_transitions: int = 0
    resource_version: str | None = None

    @classmethod
    def from_object(cls, lease: Mapping[str, Any]) -> Lease:
        """Read a Lease as the API sends it; unreadable fields read as absent."""
        spec = dig(lease, "spec")
        return cls(
            name=name_of(lease),
            namespace=namespace_of(lease),
            holder_identity=text(dig(spec, "holderIdentity")),
            lease_duration_seconds=as_int(dig(spec, "leaseDurationSeconds")),
            acquire_time=parse_time(dig(spec, "acquireTime")),
            renew_time=parse_time(dig(spec, "renewTime")),
            lease_transitions=as_int(dig(spec, "leaseTransitions")),
            resource_version=text(dig(lease, "metadata", "resourceVersion")) or None,
        )

    @property
    def held(self) -> bool:
        return bool(self.holder_identity)

    @property
    def duration(self) -> timedelta:
        return timedelta(seconds=self.lease_duration_seconds)

    def expiry(self, skew: timedelta = timedelta(0)) -> datetime | None:
        """The instant after which the holder counts as gone; None when nobody holds it."""
        if not self.held or self.renew_time is None or self.lease_duration_seconds <= 0:
            return None
        return self.renew_time + self.duration + skew

    def same_election_state(self, other: Lease | None) -> bool:
        """Whether ``other`` says the same about who holds the Lease, whatever its version."""
        ignored = {"resource_version", "name", "namespace"}
        return other is not None and self.model_dump(exclude=ignored) == other.model_dump(
            exclude=ignored
        )

    def to_spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "holderIdentity": self.holder_identity,
            "leaseDurationSeconds": self.lease_duration_seconds,
            "leaseTransitions": self.lease_transitions,
        }
        if self.acquire_time is not None:
            spec["acquireTime"] = format_micro_time(self.acquire_time)
        if self.renew_time is not None:
            spec["renewTime"] = format_micro_time(self.renew_time)
        return spec


class LeaseConflict(Exception):
    """Someone else wrote the Lease since it was read (HTTP 409)."""


class LeaseStore(Protocol):
    """Reads and writes one Lease.

    ``update`` carries the given Lease's resourceVersion; a write that lost a race raises
    ``LeaseConflict``, any other failure the error family (``DispatchError``).
    """

    async def get(self) -> Lease | None: ...

    async def create(self, lease: Lease) -> Lease: ...

    async def update(self, lease: Lease) -> Lease: ...


class ApiLeaseStore:
    """A ``LeaseStore`` over the Kubernetes API, for the Lease ``namespace/name``."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        request_timeout: float = 10.0,
    ) -> None:
        self._objects = client.CustomObjectsApi(api)
        self.namespace = namespace
        self.name = name
        self._timeout = request_timeout

    async def get(self) -> Lease | None:
        try:
            found = await self._objects.get_namespaced_custom_object(
                LEASE_GROUP,
                LEASE_VERSION,
                self.namespace,
                LEASES,
                self.name,
                _request_timeout=self._timeout,
            )
        except REQUEST_ERRORS as error:
            if is_not_found(error):
                return None
            raise self._failure("get", error) from error
        return Lease.from_object(found)

    async def create(self, lease: Lease) -> Lease:
        try:
            created = await self._objects.create_namespaced_custom_object(
                LEASE_GROUP,
                LEASE_VERSION,
                self.namespace,
                LEASES,
                self._body(lease, resource_version=None),
                _request_timeout=self._timeout,
            )
        except REQUEST_ERRORS as error:
            if is_conflict(error):
                raise LeaseConflict(f"Lease {self._where} already exists") from error
            raise self._failure("create", error) from error
        return Lease.from_object(created)

    async def update(self, lease: Lease) -> Lease:
        try:
            replaced = await self._objects.replace_namespaced_custom_object(
                LEASE_GROUP,
                LEASE_VERSION,
                self.namespace,
                LEASES,
                self.name,
                self._body(lease, resource_version=lease.resource_version),
                _request_timeout=self._timeout,
            )
        except REQUEST_ERRORS as error:
            if is_conflict(error):
                raise LeaseConflict(
                    f"Lease {self._where} changed since resourceVersion {lease.resource_version}"
                ) from error
            raise self._failure("update", error) from error
        return Lease.from_object(replaced)

    @property
    def _where(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _body(self, lease: Lease, *, resource_version: str | None) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {
            "apiVersion": f"{LEASE_GROUP}/{LEASE_VERSION}",
            "kind": KIND_LEASE,
            "metadata": metadata,
            "spec": lease.to_spec(),
        }

    def _failure(self, verb: str, error: BaseException) -> DispatchError:
        return to_dispatch_error(f"{verb} Lease {self._where}", error, verb=verb, resource=LEASES)
