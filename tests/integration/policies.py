"""A ValidatingAdmissionPolicy that refuses chosen writes in one namespace, for fault tests.

A real apiserver refuses a write only when something tells it to; a policy (and its binding)
is the least of such things, and removing it makes the same write pass again.
"""

from __future__ import annotations

import secrets
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException


class DenyingPolicy:
    """Refuses ``operations`` on ``resources`` of ``group``/``version`` in ``namespace`` when
    the CEL ``expression`` is false, with ``message``; used as ``async with``."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        *,
        group: str,
        version: str,
        resources: list[str],
        operations: list[str],
        expression: str,
        message: str,
    ) -> None:
        self.api: Any = client.AdmissionregistrationV1Api(api)
        self.namespace = namespace
        self.message = message
        self.name = f"deny-{secrets.token_hex(4)}"
        self._rule = {
            "apiGroups": [group],
            "apiVersions": [version],
            "operations": operations,
            "resources": resources,
        }
        self._expression = expression

    async def __aenter__(self) -> DenyingPolicy:
        await self.api.create_validating_admission_policy(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": self.name},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {"resourceRules": [self._rule]},
                    "validations": [{"expression": self._expression, "message": self.message}],
                },
            }
        )
        await self.api.create_validating_admission_policy_binding(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": self.name},
                "spec": {
                    "policyName": self.name,
                    "validationActions": ["Deny"],
                    "matchResources": {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": self.namespace}
                        }
                    },
                },
            }
        )
        return self

    def refused(self, error: ApiException) -> bool:
        """The error is this policy's refusal."""
        return self.message in str(error.body)

    async def remove(self) -> None:
        for delete in (
            self.api.delete_validating_admission_policy_binding,
            self.api.delete_validating_admission_policy,
        ):
            try:
                await delete(self.name)
            except ApiException as error:
                if error.status != 404:
                    raise

    async def __aexit__(self, *_: object) -> None:
        await self.remove()
