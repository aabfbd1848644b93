"""How the stack rewrites upstream manifests for loopback (no control plane needed).

Most read upstream manifests from the Go module cache (`go mod download`), so they carry the
`cluster` marker.
"""

from __future__ import annotations

import base64

import pytest

from tests.cluster.fullstack import build, webhooks
from tests.cluster.fullstack.stack import FullStack

CA = b"-----BEGIN CERTIFICATE-----\nstack CA\n-----END CERTIFICATE-----\n"


def test_json_patch_adds_and_replaces_like_kustomize() -> None:
    document = {"metadata": {"name": "a"}, "webhooks": [{"name": "x"}, {"name": "y"}]}
    patched = webhooks.apply_json_patch(
        document,
        [
            {"op": "replace", "path": "/metadata/name", "value": "b"},
            {"op": "add", "path": "/webhooks/1/objectSelector", "value": {"k": "v"}},
            {"op": "add", "path": "/webhooks/-", "value": {"name": "z"}},
        ],
    )
    assert patched == {
        "metadata": {"name": "b"},
        "webhooks": [{"name": "x"}, {"name": "y", "objectSelector": {"k": "v"}}, {"name": "z"}],
    }
    assert document["metadata"] == {"name": "a"}


def test_json_patch_refuses_other_operations() -> None:
    with pytest.raises(webhooks.ManifestError, match="'remove' at '/a'"):
        webhooks.apply_json_patch({"a": 1}, [{"op": "remove", "path": "/a"}])


@pytest.mark.cluster
@pytest.mark.parametrize("component", sorted(webhooks.SOURCES))
def test_every_webhook_points_at_loopback_with_the_stack_ca(component: str) -> None:
    version = build.component(component).version()
    documents = webhooks.loopback_configurations(component, version, 9443, CA)

    hooks = [hook for document in documents for hook in document["webhooks"]]
    assert hooks
    for hook in hooks:
        assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:9443/")
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == CA
        assert "service" not in hook["clientConfig"]
    assert {d["metadata"]["name"] for d in documents} == {
        f"{component}-mutating",
        f"{component}-validating",
    }


@pytest.mark.cluster
def test_kueue_installs_only_its_own_and_trainjob_webhooks() -> None:
    documents = webhooks.loopback_configurations("kueue", build.component("kueue").version(), 1, CA)
    groups = {
        group
        for document in documents
        for hook in document["webhooks"]
        for rule in hook["rules"]
        for group in rule["apiGroups"]
    }
    assert groups == {"kueue.x-k8s.io", "trainer.kubeflow.org"}
    trainjob_hooks = [
        hook
        for document in documents
        for hook in document["webhooks"]
        if hook["name"] in {"mtrainjob.kb.io", "vtrainjob.kb.io"}
    ]
    assert len(trainjob_hooks) == 2
    for hook in trainjob_hooks:
        (expression,) = hook["namespaceSelector"]["matchExpressions"]
        assert expression["values"] == ["kube-system", "kueue-system"]


@pytest.mark.cluster
def test_jobset_pod_webhooks_keep_upstream_object_selector() -> None:
    version = build.component("jobset-controller").version()
    documents = webhooks.loopback_configurations("jobset-controller", version, 1, CA)
    pod_hooks = [
        hook
        for document in documents
        for hook in document["webhooks"]
        if hook["name"] in {"mpod.kb.io", "vpod.kb.io"}
    ]
    assert len(pod_hooks) == 2
    for hook in pod_hooks:
        (expression,) = hook["objectSelector"]["matchExpressions"]
        assert (expression["key"], expression["operator"]) == (
            "jobset.sigs.k8s.io/jobset-name",
            "Exists",
        )


@pytest.mark.cluster
def test_kwok_stages_end_pods_from_their_environment() -> None:
    stack = FullStack.__new__(FullStack)
    stages = {stage["metadata"]["name"]: stage for stage in stack._kwok_stages()}

    assert {"node-initialize", "node-heartbeat-with-lease", "pod-ready"} <= set(stages)
    assert {"sim-pod-succeed", "sim-pod-fail"} <= set(stages)
    for name in ("pod-create", "pod-ready", "pod-delete"):
        delay = stages[name]["spec"].get("delay") or {}
        assert "jitterDurationMilliseconds" not in delay
    outcome = {e["key"]: e for e in stages["sim-pod-fail"]["spec"]["selector"]["matchExpressions"]}
    (fail,) = [e for key, e in outcome.items() if "SIM_OUTCOME" in key]
    assert (fail["operator"], fail["values"]) == ("In", ["fail"])


@pytest.mark.cluster
def test_a_pod_the_kubelet_refuses_never_starts() -> None:
    stack = FullStack.__new__(FullStack)
    stages = {stage["metadata"]["name"]: stage for stage in stack._kwok_stages()}

    def outcome(stage: str) -> tuple[str, list[str]]:
        expressions = stages[stage]["spec"]["selector"]["matchExpressions"]
        (found,) = [e for e in expressions if "SIM_OUTCOME" in e["key"]]
        return found["operator"], found["values"]

    assert outcome("sim-pod-refuse") == ("In", ["refuse"])
    assert outcome("pod-create") == ("NotIn", ["refuse"])
