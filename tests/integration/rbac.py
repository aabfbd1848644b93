"""A user that holds exactly a chart's rules, for tests that run code under them."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any, Final

import yaml
from kubernetes_asyncio import client

RBAC_GROUP: Final = "rbac.authorization.k8s.io"
CHART_FILES: Final = Path(__file__).resolve().parents[2] / "charts" / "dispatch-kubeflow" / "files"
# The files the chart's ClusterRole is made of when the operator serves every namespace.
OPERATOR_CLUSTER_ROLE: Final = (
    "operator-cluster",
    "adapter-cluster",
    "operator",
    "adapter",
    "adapter-lease",
)
# A PolicyRule's fields, as YAML spells them.
RULE_FIELDS: Final = frozenset(
    {"apiGroups", "resources", "resourceNames", "nonResourceURLs", "verbs"}
)


def chart_rules(*names: str) -> list[dict[str, Any]]:
    """The PolicyRules of the chart's ``files/rbac-<name>.yaml``, in order."""
    rules: list[dict[str, Any]] = []
    for name in names:
        rules += yaml.safe_load((CHART_FILES / f"rbac-{name}.yaml").read_text())
    return rules


def policy_rule(rule: Mapping[str, Any]) -> client.V1PolicyRule:
    """A PolicyRule written as YAML (a chart's), as the client's model.

    A field the model does not know is refused rather than dropped: dropping ``resourceNames``,
    say, would grant more than the chart does.
    """
    unknown = set(rule) - RULE_FIELDS
    if unknown:
        raise ValueError(f"PolicyRule fields {sorted(unknown)} are not known here")
    return client.V1PolicyRule(
        api_groups=rule.get("apiGroups"),
        resources=rule.get("resources"),
        resource_names=rule.get("resourceNames"),
        non_resource_urls=rule.get("nonResourceURLs"),
        verbs=rule.get("verbs"),
    )


@contextlib.asynccontextmanager
async def user_with_rules(
    cluster: Any,
    kube_api: client.ApiClient,
    rules: list[dict[str, Any]],
    prefix: str,
    roles: Mapping[str, list[dict[str, Any]]] | None = None,
) -> AsyncIterator[Path]:
    """Bind `rules` (PolicyRules) cluster-wide and each of `roles` (namespace to PolicyRules) in
    its namespace to a new user; yield that user's kubeconfig."""
    user = f"{prefix}-{secrets.token_hex(3)}"
    rbac = client.RbacAuthorizationV1Api(kube_api)
    metadata = client.V1ObjectMeta(name=user)
    subjects = [client.RbacV1Subject(api_group=RBAC_GROUP, kind="User", name=user)]
    await rbac.create_cluster_role(
        client.V1ClusterRole(metadata=metadata, rules=[policy_rule(rule) for rule in rules])
    )
    await rbac.create_cluster_role_binding(
        client.V1ClusterRoleBinding(
            metadata=metadata,
            role_ref=client.V1RoleRef(api_group=RBAC_GROUP, kind="ClusterRole", name=user),
            subjects=subjects,
        )
    )
    for namespace, namespaced in (roles or {}).items():
        await rbac.create_namespaced_role(
            namespace,
            client.V1Role(metadata=metadata, rules=[policy_rule(rule) for rule in namespaced]),
        )
        await rbac.create_namespaced_role_binding(
            namespace,
            client.V1RoleBinding(
                metadata=metadata,
                role_ref=client.V1RoleRef(api_group=RBAC_GROUP, kind="Role", name=user),
                subjects=subjects,
            ),
        )
    try:
        yield Path(cluster.kubeconfig_for(user))
    finally:
        for namespace in roles or {}:
            await rbac.delete_namespaced_role_binding(user, namespace)
            await rbac.delete_namespaced_role(user, namespace)
        await rbac.delete_cluster_role_binding(user)
        await rbac.delete_cluster_role(user)
