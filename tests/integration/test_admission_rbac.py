"""The admission controller works with exactly the permissions the chart grants it, and no more.

It runs as a restricted identity holding the rules of the chart's rendered ClusterRole and of its
Role in the Lease's namespace (the test namespace here), and nothing else, on the real
kube-apiserver with RBAC enforced.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.constants import (
    ADMISSION_FIELD_MANAGER,
    LEASE_GROUP,
    LEASE_VERSION,
    LEASES,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    CheckState,
)
from dispatch_kubeflow.kube.workloads import check_entry
from tests.integration.rbac import user_with_rules
from tests.integration.test_admission import (
    LEASE,
    OTHER_CHECK,
    Scene,
    _holder_is,
    eventually,
    managed_by,
    running,
)
from tests.integration.test_chart import helm as helm  # the fixture
from tests.integration.test_chart import render

ADMISSION = "dispatch-dispatch-kubeflow-admission"


@pytest.fixture
async def restricted_api(
    helm: Path, cluster: Any, kube_api: client.ApiClient, namespace: str
) -> AsyncIterator[client.ApiClient]:
    """An ApiClient for a user that holds only the chart's admission rules, its Lease in
    ``namespace``."""
    docs = render(
        helm,
        "--set",
        "admission.enabled=true",
        "--set",
        f"admission.lease.namespace={namespace}",
        "--set",
        f"admission.lease.name={LEASE}",
    )
    mine = {d["kind"]: d for d in docs if d["metadata"]["name"] == ADMISSION}
    assert mine["Role"]["metadata"]["namespace"] == namespace
    cluster_rules, lease_rules = mine["ClusterRole"]["rules"], mine["Role"]["rules"]
    roles = {namespace: lease_rules}
    async with user_with_rules(cluster, kube_api, cluster_rules, "admission", roles) as kubeconfig:
        api = await config.new_client_from_config(config_file=str(kubeconfig))
        try:
            yield api
        finally:
            await api.close()


async def test_the_chart_rules_are_enough_to_lead_mark_active_and_decide(
    kube_api: client.ApiClient, restricted_api: client.ApiClient, namespace: str
) -> None:
    admin = Scene(kube_api, namespace)
    await admin.create_admission_check()
    await admin.serve()
    try:
        trainjob = await admin.trainjob("job-1")
        name = await admin.workload_for(trainjob)
        await admin.other_controller_decides(name)
        restricted = Scene(restricted_api, namespace)

        async with running(restricted.controller("restricted")):
            await eventually(lambda: _holder_is(admin, "restricted"), "the Lease")
            await admin.kueue_reserves(name)
            decided = await admin.wait_for_state(name, CheckState.READY)

            async def active() -> bool:
                check = await admin.admission_check()
                return bool(managed_by(check, ADMISSION_FIELD_MANAGER))

            await eventually(active, "Active on the AdmissionCheck")

        assert (check_entry(decided, OTHER_CHECK) or {}).get("state") == "Ready"
        assert await admin.lease_holder() == ""  # released on the way out, by update
    finally:
        await admin.delete_admission_check()


async def test_the_chart_rules_do_not_let_it_write_trainjobs(
    restricted_api: client.ApiClient, namespace: str
) -> None:
    objects: Any = client.CustomObjectsApi(restricted_api)  # its signature omits _content_type
    with pytest.raises(ApiException) as refused:
        await objects.patch_namespaced_custom_object(
            TRAINER_GROUP,
            TRAINER_VERSION,
            namespace,
            TRAINJOBS,
            "anything",
            {"metadata": {"annotations": {"x": "y"}}},
            _content_type="application/merge-patch+json",
        )
    assert refused.value.status == 403


def lease(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{LEASE_GROUP}/{LEASE_VERSION}",
        "kind": "Lease",
        "metadata": {"name": name},
        "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 40},
    }


async def test_the_chart_rules_refuse_leases_it_does_not_own(
    kube_api: client.ApiClient, restricted_api: client.ApiClient, namespace: str
) -> None:
    """A node's heartbeat in kube-node-lease, and another Lease beside its own, are out of reach:
    it may not read or update them, nor create Leases outside its Lease's namespace."""
    admin: Any = client.CustomObjectsApi(kube_api)  # takes a plain dict as the body
    restricted: Any = client.CustomObjectsApi(restricted_api)
    node = f"node-{namespace[-6:]}"
    await admin.create_namespaced_custom_object(
        LEASE_GROUP, LEASE_VERSION, "kube-node-lease", LEASES, lease(node)
    )
    await admin.create_namespaced_custom_object(
        LEASE_GROUP, LEASE_VERSION, namespace, LEASES, lease("kube-scheduler")
    )
    try:
        for where, name in (("kube-node-lease", node), (namespace, "kube-scheduler")):
            taken = lease(name)
            taken["spec"]["holderIdentity"] = "admission"
            for call in (
                restricted.get_namespaced_custom_object(
                    LEASE_GROUP, LEASE_VERSION, where, LEASES, name
                ),
                restricted.replace_namespaced_custom_object(
                    LEASE_GROUP, LEASE_VERSION, where, LEASES, name, taken
                ),
            ):
                with pytest.raises(ApiException) as refused:
                    await call
                assert refused.value.status == 403, f"{where}/{name}"
        with pytest.raises(ApiException) as refused:
            await restricted.create_namespaced_custom_object(
                LEASE_GROUP, LEASE_VERSION, "kube-node-lease", LEASES, lease("mine")
            )
        assert refused.value.status == 403
        still = await admin.get_namespaced_custom_object(
            LEASE_GROUP, LEASE_VERSION, "kube-node-lease", LEASES, node
        )
        assert still["spec"]["holderIdentity"] == "someone-else"
    finally:
        await admin.delete_namespaced_custom_object(
            LEASE_GROUP, LEASE_VERSION, "kube-node-lease", LEASES, node
        )
