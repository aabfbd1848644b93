"""The preflight probe (SPEC §3, open): an adapter that opened is one that can start a job.

The probe checks, in order, what a first ``start`` would otherwise find out too late: the
Trainer serves a TrainJob with ``spec.runtimePatches`` (v2.2 or later, read from the group's
OpenAPI v3 document, which every authenticated user may read, rather than the CRD, which would
need a permission on CustomResourceDefinitions); the probe runtime is one of the adapter's and
passes the runtime rules; a suspended probe TrainJob can be created and (in Kueue mode) gets its
Workload; and it can be stopped again. Any failure is a ``ProbeError`` whose message begins
``preflight probe: `` (the contract's wording) and says which step failed.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

from dispatch_kubeflow.constants import (
    KIND_TRAINJOB,
    LABEL_PROBE,
    PROBE_JOB_PREFIX,
    TRAINER_GROUP,
    TRAINER_VERSION,
)
from dispatch_kubeflow.errors import DispatchError, ProbeError, UnsupportedError
from dispatch_kubeflow.kube.apierrors import REQUEST_ERRORS, is_not_found, to_dispatch_error
from dispatch_kubeflow.kube.connection import ApiClientWithTimeouts
from dispatch_kubeflow.runtimes import describe
from dispatch_kubeflow.scope import Scope
from dispatch_kubeflow.starting import start
from dispatch_kubeflow.stopping import stop
from dispatch_kubeflow.trainjob import JobSpec

PROBE_PREFIX = "preflight probe: "
# How deep $ref and allOf wrappers are followed in the OpenAPI document.
_RESOLVE_DEPTH = 8


async def preflight_probe(scope: Scope) -> None:
    """Check that the adapter can start a job; ``ProbeError`` saying why not."""
    settings = scope.settings
    try:
        await check_trainer_api(scope.api)
        probe = settings.probe_runtime
        if settings.runtimes and probe not in settings.runtimes:
            raise UnsupportedError(
                f"probeRuntime {describe(probe)} is not one of the adapter's runtimes; "
                "add it to runtimes or pick one of them"
            )
        job = JobSpec(job_id=f"{PROBE_JOB_PREFIX}{secrets.token_hex(4)}", runtime=probe)
        await start(scope, job, suspend=True, extra_labels={LABEL_PROBE: "true"})
        await stop(scope, job.job_id, settings.timeouts.workload)
    except DispatchError as error:
        raise ProbeError(f"{PROBE_PREFIX}{error}") from error


async def check_trainer_api(
    api: ApiClientWithTimeouts, group: str = TRAINER_GROUP, version: str = TRAINER_VERSION
) -> None:
    """Refuse a Trainer whose served TrainJob has no ``spec.runtimePatches`` (before v2.2)."""
    path = f"/openapi/v3/apis/{group}/{version}"
    try:
        document: dict[str, Any] = await api.call_api(
            path,
            "GET",
            header_params={"Accept": "application/json"},
            response_types_map={200: "object"},
            auth_settings=["BearerToken"],
            _return_http_data_only=True,
        )
    except REQUEST_ERRORS as error:
        if is_not_found(error):
            raise ProbeError(
                f"the Trainer API {group}/{version} is not served; "
                "install Kubeflow Trainer v2.2 or later"
            ) from None
        raise to_dispatch_error(f"reading {path}", error, verb="get") from None
    check_trainjob_schema(document, group, version)


def check_trainjob_schema(document: Mapping[str, Any], group: str, version: str) -> None:
    """Refuse an OpenAPI document whose TrainJob of ``group/version`` lacks runtimePatches."""
    schemas = (document.get("components") or {}).get("schemas") or {}
    trainjob = _schema_of_kind(schemas, group, version, KIND_TRAINJOB)
    if trainjob is None:
        raise ProbeError(
            f"the Trainer API {group}/{version} serves no TrainJob; "
            "install Kubeflow Trainer v2.2 or later"
        )
    spec = _resolve(schemas, (trainjob.get("properties") or {}).get("spec"))
    if "runtimePatches" not in (spec.get("properties") or {}):
        raise ProbeError(
            "the served TrainJob has no spec.runtimePatches, so Kubeflow Trainer is older than "
            "v2.2; upgrade Kubeflow Trainer to v2.2 or later"
        )


def _schema_of_kind(
    schemas: Mapping[str, Any], group: str, version: str, kind: str
) -> Mapping[str, Any] | None:
    wanted = {"group": group, "version": version, "kind": kind}
    for schema in schemas.values():
        if isinstance(schema, Mapping) and wanted in (
            schema.get("x-kubernetes-group-version-kind") or ()
        ):
            return schema
    return None


def _resolve(schemas: Mapping[str, Any], node: Any) -> Mapping[str, Any]:
    """Follow ``$ref`` and single-entry ``allOf`` wrappers to the schema they name."""
    for _ in range(_RESOLVE_DEPTH):
        if not isinstance(node, Mapping):
            return {}
        if "$ref" in node:
            node = schemas.get(str(node["$ref"]).rsplit("/", 1)[-1])
        elif "properties" not in node and len(node.get("allOf") or ()) == 1:
            node = node["allOf"][0]
        else:
            return node
    return {}
