"""The one Lease model: reading a Lease as the API sends it, its expiry, and writing its spec."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from dispatch_kubeflow.kube.leases import Lease

RENEWED = datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=UTC)
API_LEASE: dict[str, Any] = {
    "metadata": {
        "name": "dispatch-admission",
        "namespace": "dispatch-system",
        "resourceVersion": "7",
    },
    "spec": {
        "holderIdentity": "ctl-0",
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-01-01T11:00:00.000000Z",
        "renewTime": "2026-01-01T12:00:00.250000Z",
        "leaseTransitions": 3,
    },
}


def test_a_lease_is_read_as_the_api_sends_it() -> None:
    lease = Lease.from_object(API_LEASE)
    assert (lease.name, lease.namespace, lease.resource_version) == (
        "dispatch-admission",
        "dispatch-system",
        "7",
    )
    assert (lease.holder_identity, lease.lease_duration_seconds) == ("ctl-0", 15)
    assert lease.renew_time == RENEWED
    assert lease.acquire_time == datetime(2026, 1, 1, 11, tzinfo=UTC)
    assert lease.lease_transitions == 3
    assert lease.held
    assert lease.duration == timedelta(seconds=15)


def test_unreadable_fields_read_as_absent() -> None:
    lease = Lease.from_object(
        {"spec": {"leaseDurationSeconds": "soon", "renewTime": "yesterday", "holderIdentity": None}}
    )
    assert (lease.lease_duration_seconds, lease.renew_time, lease.held) == (0, None, False)
    assert lease.resource_version is None


def test_the_holder_counts_as_gone_after_renewal_plus_duration_plus_skew() -> None:
    lease = Lease.from_object(API_LEASE)
    assert lease.expiry() == RENEWED + timedelta(seconds=15)
    assert lease.expiry(timedelta(seconds=2)) == RENEWED + timedelta(seconds=17)


def test_a_released_or_never_renewed_lease_has_no_expiry() -> None:
    released = Lease.from_object({**API_LEASE, "spec": {**API_LEASE["spec"], "holderIdentity": ""}})
    assert released.expiry() is None
    assert Lease(holder_identity="a", lease_duration_seconds=15).expiry() is None
    assert Lease(holder_identity="a", renew_time=RENEWED).expiry() is None


def test_the_election_state_ignores_where_the_lease_is_and_its_version() -> None:
    lease = Lease.from_object(API_LEASE)
    moved = lease.model_copy(update={"resource_version": "8", "namespace": "other"})
    assert lease.same_election_state(moved)
    assert not lease.same_election_state(lease.model_copy(update={"holder_identity": "ctl-1"}))
    assert not lease.same_election_state(None)


def test_the_spec_is_written_with_micro_times_as_read() -> None:
    spec = Lease.from_object(API_LEASE).to_spec()
    assert spec == API_LEASE["spec"]
    assert Lease(holder_identity="a").to_spec() == {
        "holderIdentity": "a",
        "leaseDurationSeconds": 0,
        "leaseTransitions": 0,
    }
