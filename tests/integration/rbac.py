"""A user that holds exactly a chart's rules, for tests that run code under them."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client


@contextlib.asynccontextmanager
async def user_with_rules(
    cluster: Any, kube_api: client.ApiClient, rules: list[dict[str, Any]], prefix: str
) -> AsyncIterator[Path]:
    """Bind `rules` (PolicyRules) to a new user; yield that user's kubeconfig."""
    user = f"{prefix}-{secrets.token_hex(3)}"
    rbac = client.RbacAuthorizationV1Api(kube_api)
    await rbac.create_cluster_role({"metadata": {"name": user}, "rules": rules})
    await rbac.create_cluster_role_binding(
        {
            "metadata": {"name": user},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": user,
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
    )
    try:
        yield Path(cluster.kubeconfig_for(user))
    finally:
        await rbac.delete_cluster_role_binding(user)
        await rbac.delete_cluster_role(user)
