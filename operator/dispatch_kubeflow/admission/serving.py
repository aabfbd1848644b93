"""Which namespaces are dispatch's, read from the KubeflowAdapter resources of one check.

One controller decides one AdmissionCheck for every namespace. A namespace is *served* when a
KubeflowAdapter whose ``kueue.admissionCheck`` names that check serves it (``spec.namespace``,
wherever the resource itself lives): its Workloads are dispatch jobs and go through the gate.
Every other Workload that carries the check is not held.

Each such adapter also reads a Lease as the controller's heartbeat (``kueue.admissionLease``);
one that names another Lease than the controller holds would report the gate closed while it is
open, so the mismatch is named (``lease_mismatches``).

An adapter whose spec does not parse still serves the namespace its raw spec names, when it
names this check: holding a dispatch job after an eviction is the safe side of a typo, since a
gate opened by mistake cannot be closed again for that admission.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from dispatch_kubeflow.kube.objects import Obj, dig, name_of, namespace_of
from dispatch_kubeflow.settings import InvalidSettings, parse_settings_object


@dataclass(frozen=True)
class Serving:
    """One KubeflowAdapter of the check: where it lives, what it serves, the Lease it reads."""

    adapter: str  # namespace/name of the KubeflowAdapter
    namespace: str  # the namespace it serves
    lease: tuple[str, str] | None  # (namespace, name) it reads; None when its spec is invalid
    invalid: str = ""  # why its spec does not parse, when it does not


def serving_of(adapter: Obj, check: str) -> Serving | None:
    """What ``adapter`` (a KubeflowAdapter) serves with ``check``, or None when another check."""
    where = f"{namespace_of(adapter)}/{name_of(adapter)}"
    spec = adapter.get("spec")
    try:
        settings = parse_settings_object(spec, pointer="/spec")
    except InvalidSettings as error:
        served = dig(spec, "namespace")
        if dig(spec, "kueue", "admissionCheck") != check or not isinstance(served, str):
            return None
        return Serving(where, served, None, str(error))
    kueue = settings.kueue
    if kueue is None or kueue.admission_check != check:
        return None
    lease = kueue.admission_lease
    return Serving(where, settings.namespace, (lease.namespace, lease.name))


def lease_mismatches(servings: Iterable[Serving], lease: tuple[str, str]) -> list[str]:
    """One line per adapter of the check that reads another Lease than ``lease``, sorted."""
    held = "/".join(lease)
    return sorted(
        f"KubeflowAdapter {s.adapter} reads Lease {'/'.join(s.lease)}, not {held} "
        f"that this controller holds: its AdmissionHealthy follows the wrong heartbeat"
        for s in servings
        if s.lease is not None and s.lease != lease
    )


def invalid_adapters(servings: Iterable[Serving]) -> list[str]:
    """One line per adapter of the check whose spec does not parse, sorted."""
    return sorted(
        f"KubeflowAdapter {s.adapter} is invalid ({s.invalid}); namespace {s.namespace} stays "
        f"served"
        for s in servings
        if s.lease is None
    )
