"""The KubeflowAdapter CRD on a real kube-apiserver: what it refuses, and that nulls survive.

The apiserver checks the CRD's structural schema and CEL rules on create; the operator's own
parse of ``spec`` then refuses what the apiserver lets through (a null, an unclean path). These
run against the `cluster` fixture's etcd + kube-apiserver with the project's CRDs installed.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from dispatch_kubeflow.constants import GROUP, KUBEFLOW_ADAPTER_KIND, KUBEFLOW_ADAPTERS, VERSION
from dispatch_kubeflow.settings import InvalidSettings, parse_settings_object

RUNTIME = {"kind": "ClusterTrainingRuntime", "name": "torch-distributed"}
IMAGE = "registry.example/dispatch-publish@sha256:" + "0123456789abcdef" * 4
# The seed's example, kept as examples/settings.json.
EXAMPLE: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "examples/settings.json").read_text()
)


async def create(
    api: client.ApiClient, namespace: str, name: str, spec: Any, *, strict: bool = False
) -> dict[str, Any]:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KUBEFLOW_ADAPTER_KIND,
        "metadata": {"name": name},
        "spec": spec,
    }
    objects = client.CustomObjectsApi(api)
    if strict:
        created: dict[str, Any] = await objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, KUBEFLOW_ADAPTERS, body, field_validation="Strict"
        )
    else:
        created = await objects.create_namespaced_custom_object(
            GROUP, VERSION, namespace, KUBEFLOW_ADAPTERS, body
        )
    return created


async def refusal(
    api: client.ApiClient, namespace: str, spec: Any, *, strict: bool = False, status: int = 422
) -> str:
    with pytest.raises(ApiException) as info:
        await create(api, namespace, "refused", spec, strict=strict)
    assert info.value.status == status, info.value.body
    message: str = json.loads(info.value.body or "{}")["message"]
    return message


def changed(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(EXAMPLE)
    for key, value in changes.items():
        if value is ...:
            del spec[key]
        else:
            spec[key] = value
    return spec


async def test_the_seeds_example_is_stored_as_written(
    kube_api: client.ApiClient, namespace: str
) -> None:
    created = await create(kube_api, namespace, "example", EXAMPLE)
    assert created["spec"] == EXAMPLE
    assert parse_settings_object(created["spec"], pointer="/spec").namespace == "team-a"


async def test_a_minimal_spec_gets_no_defaults_from_the_apiserver(
    kube_api: client.ApiClient, namespace: str
) -> None:
    spec = {"namespace": "team-a", "runtimes": [RUNTIME]}
    created = await create(kube_api, namespace, "minimal", spec)
    assert created["spec"] == spec


@pytest.mark.parametrize(
    ("key", "pointer"),
    [
        ("nodeLossWindow", "/spec/nodeLossWindow"),
        ("kueue", "/spec/kueue"),
        ("labels", "/spec/labels"),
        ("timeouts", "/spec/timeouts"),
    ],
)
async def test_a_null_reaches_the_parser_which_refuses_it(
    kube_api: client.ApiClient, namespace: str, key: str, pointer: str
) -> None:
    created = await create(kube_api, namespace, "null", changed(**{key: None}))
    assert key in created["spec"]
    assert created["spec"][key] is None
    with pytest.raises(InvalidSettings) as info:
        parse_settings_object(created["spec"], pointer="/spec")
    assert info.value.pointer == pointer


async def test_a_null_label_value_reaches_the_parser(
    kube_api: client.ApiClient, namespace: str
) -> None:
    created = await create(kube_api, namespace, "null-label", changed(labels={"team": None}))
    with pytest.raises(InvalidSettings) as info:
        parse_settings_object(created["spec"], pointer="/spec")
    assert info.value.pointer == "/spec/labels/team"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            changed(cluster={"inCluster": True, "context": "c"}),
            "inCluster: true is refused together",
        ),
        (
            changed(cluster={"inCluster": True, "kubeconfig": ""}),
            "inCluster: true is refused together",
        ),
        (changed(publish={"image": IMAGE, "initContainer": "x"}), "initContainer is refused"),
        (
            changed(publish={"image": IMAGE, "via": "imageVolume", "initContainer": "x"}),
            "initContainer is refused",
        ),
        (changed(runtimes=..., probeRuntime=...), "probeRuntime is required"),
        (changed(runtimes=[], probeRuntime=...), "probeRuntime is required"),
        (changed(runtimes=[RUNTIME, RUNTIME]), "Duplicate value"),
        (changed(nodeLossTaints=["a/b", "a/b"]), "Duplicate value"),
        (changed(namespace="Team-A"), "spec.namespace"),
        (changed(nodeLossWindow="0s"), "spec.nodeLossWindow"),
        (changed(nodeLossWindow="-5m"), "spec.nodeLossWindow"),
        (changed(cluster={"context": ""}), "spec.cluster.context"),
        (changed(publish={"image": "registry.example/p:v1"}), "spec.publish.image"),
        (changed(credentials=[{"secretName": "s", "mountPath": "/opt/dispatch/x"}]), "mountPath"),
        (changed(kueue={"priorityClass": "low"}), "spec.kueue.localQueue"),
        (changed(namespace=...), "spec.namespace"),
        (changed(namespace=None), "spec.namespace: Required value"),
        (changed(kueue={"localQueue": None}), "spec.kueue.localQueue: Required value"),
    ],
)
async def test_the_apiserver_refuses(
    kube_api: client.ApiClient, namespace: str, spec: dict[str, Any], words: str
) -> None:
    assert words in await refusal(kube_api, namespace, spec)


async def test_unknown_fields_are_refused_under_strict_field_validation(
    kube_api: client.ApiClient, namespace: str
) -> None:
    spec = changed(nodeLossWindows="5m")
    message = await refusal(kube_api, namespace, spec, strict=True, status=400)
    assert 'unknown field "spec.nodeLossWindows"' in message


async def test_without_strict_validation_unknown_fields_are_pruned(
    kube_api: client.ApiClient, namespace: str
) -> None:
    """The limit the docs state: a client that does not ask for Strict loses the unknown key."""
    created = await create(kube_api, namespace, "pruned", changed(nodeLossWindows="5m"))
    assert created["spec"] == EXAMPLE


async def test_what_only_the_parser_refuses_is_stored_and_then_refused(
    kube_api: client.ApiClient, namespace: str
) -> None:
    spec = changed(credentials=[{"secretName": "s", "mountPath": "/a/"}])
    created = await create(kube_api, namespace, "unclean", spec)
    with pytest.raises(InvalidSettings) as info:
        parse_settings_object(created["spec"], pointer="/spec")
    assert info.value.pointer == "/spec/credentials/0/mountPath"


# The words kubectl shows for each refused value: what it must be, never a regular expression.
@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (
            changed(timeouts={"request": "30"}),
            'spec.timeouts.request: Invalid value: "30": must be a positive Go duration such '
            "as 30s or 1h30m",
        ),
        (changed(nodeLossWindow="5m\n"), "must be a positive Go duration"),
        (
            changed(namespace="Team-A"),
            'spec.namespace: Invalid value: "Team-A": must be an RFC 1123 label',
        ),
        (changed(runtimes=[{**RUNTIME, "name": "Torch"}]), "must be an RFC 1123 subdomain"),
        (changed(labels={"team": "a b"}), "must be a label value"),
        (changed(gpuResource="a/b/c"), "must be a qualified name"),
        (changed(nodeLossTaints=["-x"]), "must be a qualified name"),
        (changed(publish={"image": "registry.example/p:v1"}), "must be an image reference pinned"),
        (
            changed(credentials=[{"secretName": "s", "mountPath": "relative"}]),
            "must be an absolute path",
        ),
        (
            changed(credentials=[{"secretName": "s", "mountPath": "/opt/dispatch"}]),
            "must not be /opt/dispatch or inside it",
        ),
        (
            changed(credentials=[{"secretName": "s", "mountPath": "/opt/dispatch/x"}]),
            "must not be /opt/dispatch or inside it",
        ),
    ],
)
async def test_a_refused_pattern_is_told_in_words(
    kube_api: client.ApiClient, namespace: str, spec: dict[str, Any], words: str
) -> None:
    message = await refusal(kube_api, namespace, spec)
    assert words in message
    assert "^" not in message
    assert "a-z0-9]" not in message


BOUND = 64


@pytest.mark.parametrize(
    ("key", "entries"),
    [
        ("runtimes", lambda n: [{"kind": "TrainingRuntime", "name": f"r{i}"} for i in range(n)]),
        (
            "credentials",
            lambda n: [{"secretName": f"s{i}", "mountPath": f"/c/{i}"} for i in range(n)],
        ),
        ("nodeLossTaints", lambda n: [f"example.com/t{i}" for i in range(n)]),
        ("labels", lambda n: {f"example.com/k{i}": "v" for i in range(n)}),
        ("annotations", lambda n: {f"example.com/k{i}": "v" * 100 for i in range(n)}),
    ],
)
async def test_lists_and_maps_hold_the_bound_and_no_more(
    kube_api: client.ApiClient, namespace: str, key: str, entries: Any
) -> None:
    full = changed(**{key: entries(BOUND)})
    created = await create(kube_api, namespace, f"full-{key.lower()}", full)
    assert parse_settings_object(created["spec"], pointer="/spec").namespace == "team-a"
    message = await refusal(kube_api, namespace, changed(**{key: entries(BOUND + 1)}))
    assert f"spec.{key}: Too many: {BOUND + 1}: must have at most {BOUND}" in message


async def test_the_longest_values_pass_every_rule(
    kube_api: client.ApiClient, namespace: str
) -> None:
    """Values at their bounds: the CEL rules run within the apiserver's cost budget."""
    long_name = ("p" * 63 + ".") * 3 + "p" * 61  # 253
    qualified = long_name + "/" + "n" * 63  # 317
    spec = changed(
        nodeLossWindow="1h" + "0" * 60 + "1s",
        gpuResource=qualified,
        nodeLossTaints=[qualified],
        labels={"team": "v" * 63},
        runtimes=[{"kind": "TrainingRuntime", "name": long_name}],
        publish={"image": "r" * 255 + "@sha256:" + "0" * 64},
    )
    created = await create(kube_api, namespace, "longest", spec)
    assert parse_settings_object(created["spec"], pointer="/spec").gpu_resource == qualified


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"nodeLossWindow": "1" * 64 + "s"}, "spec.nodeLossWindow"),
        ({"gpuResource": "n" * 318}, "spec.gpuResource"),
        ({"publish": {"image": "r" * 256 + "@sha256:" + "0" * 64}}, "spec.publish.image"),
        ({"credentials": [{"secretName": "s", "mountPath": "/" + "a" * 4096}]}, "mountPath"),
    ],
)
async def test_longer_values_are_refused(
    kube_api: client.ApiClient, namespace: str, changes: dict[str, Any], field: str
) -> None:
    message = await refusal(kube_api, namespace, changed(**changes))
    assert f"{field}: Too long" in message
    with pytest.raises(InvalidSettings):
        parse_settings_object(changed(**changes))
