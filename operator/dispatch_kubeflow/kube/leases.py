"""The one model of a coordination.k8s.io Lease, for the elector that writes it and the
heartbeat that reads it.

A holder is alive while ``now < renewTime + leaseDurationSeconds (+ a skew allowance)``; an
empty ``holderIdentity`` means the Lease was released.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict

from dispatch_kubeflow.clock import format_micro_time, parse_time
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
