"""The DispatchJob CRD's rules on a real kube-apiserver: which spec changes it refuses, and where.

Every spec field but `attempt`, `readmit`, `reject` and `recovery` is immutable: changed, added or
removed, the apiserver refuses the write and names the field. `attempt` and `readmit` only go up,
and `reject` cannot change once set. The rules are split between the fields and the spec (see
`handlers/crds.py`), so each way of changing a field is tried here against the apiserver, with no
operator running.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.constants import DISPATCH_JOB_KIND, DISPATCH_JOBS, GROUP, VERSION
from dispatch_kubeflow.handlers import crds

MERGE_PATCH = "application/merge-patch+json"
IMMUTABLE = "is immutable; only spec.attempt, spec.readmit, spec.reject and spec.recovery"
RAISED = "may only be raised"
REJECT_SET = "spec.reject cannot change once set"

MINIMAL: dict[str, Any] = {"adapter": "team"}
FULL: dict[str, Any] = {
    "adapter": "team",
    "attempt": 2,
    "runtime": {"kind": "ClusterTrainingRuntime", "name": "torch-distributed"},
    "image": "trainer:1",
    "command": ["python", "train.py"],
    "args": ["--epochs", "3"],
    "env": [{"name": "SEED", "value": "1"}],
    "numNodes": 2,
    "gpusPerNode": 8,
    "activeDeadlineSeconds": 3600,
    "readmit": 2,
    "reject": "no capacity this week",
    "recovery": {"retryOn": ["NodeLost"]},
}
CHANGED: dict[str, Any] = {
    "adapter": "other",
    "runtime": {"kind": "TrainingRuntime", "name": "torch-distributed"},
    "image": "trainer:2",
    "command": ["python", "other.py"],
    "args": ["--epochs", "4"],
    "env": [{"name": "SEED", "value": "2"}],
    "numNodes": 3,
    "gpusPerNode": 4,
    "activeDeadlineSeconds": 7200,
}
# Absent from MINIMAL, and neither required nor defaulted: they can be added or removed.
OPTIONAL = ("runtime", "image", "command", "args", "env", "activeDeadlineSeconds")


async def created(api: client.ApiClient, namespace: str, spec: dict[str, Any]) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": DISPATCH_JOB_KIND,
        "metadata": {"name": "job"},
        "spec": spec,
    }
    await client.CustomObjectsApi(api).create_namespaced_custom_object(
        GROUP, VERSION, namespace, DISPATCH_JOBS, body
    )


async def patched(
    api: client.ApiClient, namespace: str, patch: dict[str, Any], *, status: bool = False
) -> dict[str, Any]:
    objects: Any = client.CustomObjectsApi(api)  # its signature omits _content_type
    write = (
        objects.patch_namespaced_custom_object_status
        if status
        else objects.patch_namespaced_custom_object
    )
    result: dict[str, Any] = await write(
        GROUP, VERSION, namespace, DISPATCH_JOBS, "job", patch, _content_type=MERGE_PATCH
    )
    return result


async def refusal(api: client.ApiClient, namespace: str, spec_patch: dict[str, Any]) -> Any:
    with pytest.raises(ApiException) as refused:
        await patched(api, namespace, {"spec": spec_patch})
    assert refused.value.status == 422, refused.value.body
    return json.loads(refused.value.body or "{}")


def causes(body: Any) -> list[tuple[str, str]]:
    return [(c["field"], c["message"]) for c in body["details"]["causes"]]


def test_the_cases_below_cover_every_field_of_the_spec() -> None:
    (version,) = crds.dispatchjob_crd()["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert set(spec["properties"]) == set(FULL)
    assert set(CHANGED) == set(crds.IMMUTABLE_FIELDS)
    optional = {
        name
        for name, schema in spec["properties"].items()
        if name in crds.IMMUTABLE_FIELDS
        and name not in spec["required"]
        and "default" not in schema
    }
    assert optional == set(OPTIONAL)


@pytest.mark.parametrize("field", sorted(CHANGED))
async def test_an_immutable_field_changed_is_refused_and_named(
    kube_api: client.ApiClient, namespace: str, field: str
) -> None:
    await created(kube_api, namespace, FULL)
    body = await refusal(kube_api, namespace, {field: CHANGED[field]})
    ((where, message),) = causes(body)
    assert where == f"spec.{field}"
    assert message.startswith("Invalid value: ")
    assert message.endswith(f": spec.{field} {IMMUTABLE} may change")


@pytest.mark.parametrize("field", OPTIONAL)
async def test_an_immutable_field_removed_is_refused(
    kube_api: client.ApiClient, namespace: str, field: str
) -> None:
    await created(kube_api, namespace, FULL)
    body = await refusal(kube_api, namespace, {field: None})
    ((where, message),) = causes(body)
    assert where == "spec"
    assert message.endswith(f": spec.{field} {IMMUTABLE} may change")


@pytest.mark.parametrize("field", OPTIONAL)
async def test_an_immutable_field_added_is_refused(
    kube_api: client.ApiClient, namespace: str, field: str
) -> None:
    await created(kube_api, namespace, MINIMAL)
    body = await refusal(kube_api, namespace, {field: CHANGED[field]})
    ((where, message),) = causes(body)
    assert where == "spec"
    assert message.endswith(f": spec.{field} {IMMUTABLE} may change")


@pytest.mark.parametrize("field", ["numNodes", "gpusPerNode"])
async def test_a_defaulted_field_removed_is_defaulted_and_so_refused_unless_it_had_the_default(
    kube_api: client.ApiClient, namespace: str, field: str
) -> None:
    await created(kube_api, namespace, FULL)
    body = await refusal(kube_api, namespace, {field: None})
    assert [where for where, _ in causes(body)] == [f"spec.{field}"]

    await client.CustomObjectsApi(kube_api).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, DISPATCH_JOBS, "job"
    )
    await created(kube_api, namespace, MINIMAL)
    kept = await patched(kube_api, namespace, {"spec": {field: None}})
    assert (
        kept["spec"][field]
        == crds.dispatchjob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
            "spec"
        ]["properties"][field]["default"]
    )


@pytest.mark.parametrize(
    ("spec_patch", "field", "message"),
    [
        ({"attempt": 1}, "spec.attempt", f"spec.attempt {RAISED}"),
        ({"readmit": 1}, "spec.readmit", f"spec.readmit {RAISED}"),
        ({"readmit": None}, "spec", f"spec.readmit {RAISED}"),
        ({"reject": "another reason"}, "spec.reject", REJECT_SET),
        ({"reject": None}, "spec", REJECT_SET),
    ],
    ids=[
        "attempt-lowered",
        "readmit-lowered",
        "readmit-removed",
        "reject-changed",
        "reject-removed",
    ],
)
async def test_the_gate_fields_never_go_back(
    kube_api: client.ApiClient,
    namespace: str,
    spec_patch: dict[str, Any],
    field: str,
    message: str,
) -> None:
    await created(kube_api, namespace, FULL)
    body = await refusal(kube_api, namespace, spec_patch)
    ((where, said),) = causes(body)
    assert where == field
    assert said.endswith(f": {message}")


@pytest.mark.parametrize(
    ("spec", "spec_patch"),
    [
        (FULL, {"attempt": 3}),
        (FULL, {"readmit": 5}),
        (MINIMAL, {"readmit": 0}),
        (MINIMAL, {"reject": "turned away"}),
        (FULL, {"recovery": {"retryOn": ["Preempted"], "maxAttempts": 5}}),
        (FULL, {"recovery": None}),
        (FULL, {name: FULL[name] for name in CHANGED}),
    ],
    ids=[
        "attempt-raised",
        "readmit-raised",
        "readmit-set",
        "reject-set",
        "recovery-changed",
        "recovery-removed",
        "the-same-values-again",
    ],
)
async def test_what_may_change_is_accepted(
    kube_api: client.ApiClient, namespace: str, spec: dict[str, Any], spec_patch: dict[str, Any]
) -> None:
    await created(kube_api, namespace, spec)
    after = await patched(kube_api, namespace, {"spec": spec_patch})
    for name, value in spec_patch.items():
        if value is None:
            assert name not in after["spec"]
        elif name != "recovery":
            assert after["spec"][name] == value


async def test_metadata_and_status_writes_pass_the_rules(
    kube_api: client.ApiClient, namespace: str
) -> None:
    await created(kube_api, namespace, FULL)
    labelled = await patched(kube_api, namespace, {"metadata": {"labels": {"team": "a"}}})
    assert labelled["metadata"]["labels"] == {"team": "a"}
    shown = await patched(kube_api, namespace, {"status": {"state": "Pending"}}, status=True)
    assert shown["status"]["state"] == "Pending"
    assert shown["spec"] == {**FULL, "recovery": shown["spec"]["recovery"]}
