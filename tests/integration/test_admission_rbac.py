"""The admission controller works with exactly the permissions the chart grants it.

It runs as a restricted identity bound to a ClusterRole made of the chart's
``files/rbac-admission.yaml`` and nothing else, on the real kube-apiserver with RBAC enforced.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.constants import (
    ADMISSION_FIELD_MANAGER,
    TRAINER_GROUP,
    TRAINER_VERSION,
    TRAINJOBS,
    CheckState,
)
from dispatch_kubeflow.kube.workloads import check_entry
from tests.integration.rbac import user_with_rules
from tests.integration.test_admission import (
    OTHER_CHECK,
    Scene,
    _holder_is,
    eventually,
    managed_by,
    running,
)

RULES = Path(__file__).resolve().parents[2] / "charts/dispatch-kubeflow/files/rbac-admission.yaml"
CHART_RULES = yaml.safe_load(RULES.read_text())


@pytest.fixture
async def restricted_api(
    cluster: Any, kube_api: client.ApiClient
) -> AsyncIterator[client.ApiClient]:
    """An ApiClient for a user that holds only the chart's admission rules."""
    async with user_with_rules(cluster, kube_api, CHART_RULES, "admission") as kubeconfig:
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
