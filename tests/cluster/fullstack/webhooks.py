"""The upstream webhook configurations, pointed at controllers that listen on loopback.

In a cluster each controller's webhooks are reached through a Service; here every controller is
a local process, so, as envtest does, each webhook's `clientConfig` becomes
`url: https://127.0.0.1:PORT/<path>` with the stack's CA as `caBundle`. The configurations are
read from the module cache at the pinned version and the kustomize patches that upstream applies
to them (object and namespace selectors) are applied here, so what runs is upstream's own rules.
"""

from __future__ import annotations

import base64
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.crds import module_dir

KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
# Kueue's kustomization keeps its job webhooks away from these namespaces.
KUEUE_SYSTEM_NAMESPACES = ("kube-system", "kueue-system")


@dataclass(frozen=True)
class WebhookSource:
    """Where one module keeps its webhook manifests and which JSON patches upstream applies."""

    module: str
    folder: str
    patches: dict[str, str] = field(default_factory=dict)
    # Only webhooks for these API groups are installed (None: all of them).
    api_groups: frozenset[str] | None = None
    # Webhooks whose rules cover these groups get upstream's namespace selector.
    namespace_selected_groups: frozenset[str] = frozenset()


SOURCES: dict[str, WebhookSource] = {
    "trainer-controller-manager": WebhookSource(
        "github.com/kubeflow/trainer/v2",
        "manifests/base/webhook",
        {
            "MutatingWebhookConfiguration": "patch_mutating.yaml",
            "ValidatingWebhookConfiguration": "patch_validating.yaml",
        },
    ),
    "jobset-controller": WebhookSource(
        "sigs.k8s.io/jobset",
        "config/components/webhook",
        {
            "MutatingWebhookConfiguration": "patches/mutating-patch.yaml",
            "ValidatingWebhookConfiguration": "patches/validating-patch.yaml",
        },
    ),
    # Kueue ships webhooks for every integration; only the TrainJob integration is enabled, so
    # only its webhooks and those of Kueue's own API are installed.
    "kueue": WebhookSource(
        "sigs.k8s.io/kueue",
        "config/components/webhook",
        api_groups=frozenset({"kueue.x-k8s.io", "trainer.kubeflow.org"}),
        namespace_selected_groups=frozenset({"trainer.kubeflow.org"}),
    ),
}


class ManifestError(RuntimeError):
    """An upstream manifest is not shaped the way this module expects."""


def _pointer_parts(path: str) -> list[str]:
    return [part.replace("~1", "/").replace("~0", "~") for part in path.lstrip("/").split("/")]


def apply_json_patch(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply RFC 6902 `add` and `replace` operations (all kustomize patches here use)."""
    result = copy.deepcopy(document)
    for operation in operations:
        op, path = operation.get("op"), operation.get("path", "")
        if op not in ("add", "replace"):
            raise ManifestError(f"JSON patch op {op!r} at {path!r} is not supported")
        *parents, last = _pointer_parts(path)
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        value = copy.deepcopy(operation["value"])
        if isinstance(target, list):
            index = len(target) if last == "-" else int(last)
            if op == "add":
                target.insert(index, value)
            else:
                target[index] = value
        else:
            target[last] = value
    return result


def _covers(webhook: dict[str, Any], groups: frozenset[str]) -> bool:
    return any(set(rule.get("apiGroups", [])) & groups for rule in webhook.get("rules", []))


def upstream_configurations(component: str, version: str) -> list[dict[str, Any]]:
    """The component's webhook configurations as upstream's kustomization renders them."""
    source = SOURCES[component]
    folder = module_dir(source.module, version) / source.folder
    documents = [d for d in yaml.safe_load_all((folder / "manifests.yaml").read_text()) if d]
    rendered = []
    for document in documents:
        kind = document.get("kind")
        if kind not in KINDS:
            continue
        patch_file = source.patches.get(kind)
        if patch_file is not None:
            document = apply_json_patch(document, yaml.safe_load((folder / patch_file).read_text()))
        webhooks = document.get("webhooks", [])
        if source.api_groups is not None:
            webhooks = [w for w in webhooks if _covers(w, source.api_groups)]
        for webhook in webhooks:
            if _covers(webhook, source.namespace_selected_groups):
                webhook["namespaceSelector"] = {
                    "matchExpressions": [
                        {
                            "key": "kubernetes.io/metadata.name",
                            "operator": "NotIn",
                            "values": list(KUEUE_SYSTEM_NAMESPACES),
                        }
                    ]
                }
        document["webhooks"] = webhooks
        rendered.append(document)
    if not rendered:
        raise ManifestError(f"{folder / 'manifests.yaml'}: no webhook configuration found")
    return rendered


def point_at_loopback(
    documents: list[dict[str, Any]], component: str, port: int, ca_pem: bytes
) -> list[dict[str, Any]]:
    """Rename each configuration after its component and send its webhooks to 127.0.0.1:port."""
    ca_bundle = base64.b64encode(ca_pem).decode()
    result = []
    for document in documents:
        document = copy.deepcopy(document)
        kind_word = "mutating" if document["kind"] == KINDS[0] else "validating"
        document["metadata"] = {"name": f"{component}-{kind_word}"}
        for webhook in document["webhooks"]:
            service = webhook.get("clientConfig", {}).get("service")
            if service is None or "path" not in service:
                raise ManifestError(
                    f"{component}: webhook {webhook.get('name')} has no service path"
                )
            webhook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{service['path']}",
                "caBundle": ca_bundle,
            }
        result.append(document)
    return result


def loopback_configurations(
    component: str, version: str, port: int, ca_pem: bytes
) -> list[dict[str, Any]]:
    return point_at_loopback(upstream_configurations(component, version), component, port, ca_pem)


def write(documents: list[dict[str, Any]], path: Path) -> Path:
    path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    return path
