"""The settings object's JSON Schema and the KubeflowAdapter CRD, from one source.

``settings_schema()`` is the JSON Schema (2020-12) a host validates its own configuration
against; ``schema.json`` at the repository root holds exactly ``schema_bytes()``. The CRD's
``spec`` schema is derived from the same tree by ``structural()``: the apiserver wants a
structural OpenAPI v3 schema, so ``$ref``s are inlined, the cross-field rules become CEL
``x-kubernetes-validations`` and list uniqueness becomes ``x-kubernetes-list-type``.

The patterns and bounds come from ``settings`` so the parser and the schemas spell every shape
once. In the JSON Schema every pattern that ends in ``$`` goes with a guard against newlines, so
that validators on Python's ``re`` (whose ``$`` also matches before a final newline) agree with
ECMA-262 and the parser; every pattern is unambiguous, so backtracking engines stay linear. In
the CRD every pattern becomes a CEL rule with a message in words, so that a refused manifest
says what a value must be instead of showing a regular expression.

``python -m dispatch_kubeflow.schema --write`` rewrites ``schema.json`` and the CRD files;
``--check`` exits 1 when a committed file is not current.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import yaml

from dispatch_kubeflow.constants import (
    ADMISSION_LEASE_NAME_DEFAULT,
    ADMISSION_LEASE_NAMESPACE_DEFAULT,
    GPU_RESOURCE_DEFAULT,
    GROUP,
    KUBEFLOW_ADAPTER_KIND,
    KUBEFLOW_ADAPTERS,
    PUBLISH_DIR,
    PUBLISH_INIT_CONTAINER_DEFAULT,
    RESERVED_PREFIXES,
    VERSION,
    AdapterCondition,
)
from dispatch_kubeflow.settings.models import (
    DURATION_MAX,
    ENTRIES_MAX,
    NODE_LOSS_WINDOW_DEFAULT,
    POSITIVE_DURATION_PATTERN,
)
from dispatch_kubeflow.settings.names import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    IMAGE_DIGEST_PATTERN,
    IMAGE_MAX,
    LABEL_MAX,
    LABEL_VALUE_PATTERN,
    MOUNT_PATH_MAX,
    MOUNT_PATH_PATTERN,
    PUBLISH_DIR_INSIDE_PATTERN,
    QUALIFIED_NAME_MAX,
    QUALIFIED_NAME_PATTERN,
    RESERVED_PREFIX_PATTERN,
    SUBDOMAIN_MAX,
)

SCHEMA_ID: Final = "https://gitlab.com/phpboyscout/go/dispatch-kubeflow/schema.json"
SCHEMA_DIALECT: Final = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILE: Final = "schema.json"
CRD_DIR: Final = "crds"
CHART_CRD_DIR: Final = "charts/dispatch-kubeflow/crds"
# Refuses a string holding a newline: what '$' lets through in Python's re and nowhere else.
NEWLINE_PATTERN: Final = r"\n"

Schema = dict[str, Any]


# --- Shapes -------------------------------------------------------------------------------------


def _string(description: str, **keywords: Any) -> Schema:
    return {"type": "string", "description": description, **keywords}


def _shaped(description: str, pattern: str, max_length: int, **keywords: Any) -> Schema:
    """A string of at most ``max_length`` matching ``pattern``, with no newline anywhere."""
    return _string(
        description,
        maxLength=max_length,
        pattern=pattern,
        **{"not": {"pattern": NEWLINE_PATTERN}},
        **keywords,
    )


def _object(
    description: str,
    properties: Mapping[str, Schema],
    required: Sequence[str] = (),
    **keywords: Any,
) -> Schema:
    node: Schema = {"type": "object", "description": description}
    if required:
        node["required"] = list(required)
    node["properties"] = dict(properties)
    node["additionalProperties"] = False
    node.update(keywords)
    return node


def _dns_label(description: str) -> Schema:
    return _shaped(description, DNS_LABEL_PATTERN, LABEL_MAX)


def _object_name(description: str) -> Schema:
    return _shaped(description, DNS_SUBDOMAIN_PATTERN, SUBDOMAIN_MAX)


def _queue_name(description: str) -> Schema:
    return _shaped(description, DNS_SUBDOMAIN_PATTERN, LABEL_MAX)


def _list(description: str, items: Schema, **keywords: Any) -> Schema:
    return {
        "type": "array",
        "description": description,
        "maxItems": ENTRIES_MAX,
        "items": items,
        **keywords,
    }


def _duration(description: str, default: str) -> Schema:
    return {"$ref": "#/$defs/duration", "description": description, "default": default}


def _qualified_name(description: str, **keywords: Any) -> Schema:
    return {"$ref": "#/$defs/qualifiedName", "description": description, **keywords}


def _metadata(description: str, values: Schema) -> Schema:
    return {
        "type": "object",
        "description": description,
        "maxProperties": ENTRIES_MAX,
        "propertyNames": {
            "$ref": "#/$defs/qualifiedName",
            "not": {"pattern": RESERVED_PREFIX_PATTERN},
        },
        "additionalProperties": values,
    }


_RESERVED_TEXT: Final = ", ".join(RESERVED_PREFIXES)


def _defs() -> Schema:
    return {
        "duration": _shaped(
            "A positive Go duration string, such as 30s or 1h30m "
            "(units ns, us, \u00b5s, ms, s, m, h).",
            POSITIVE_DURATION_PATTERN,
            DURATION_MAX,
        ),
        "qualifiedName": _shaped(
            "A Kubernetes qualified name: an optional DNS subdomain prefix and '/', then a "
            "name of letters, digits, '-', '_' and '.', beginning and ending with a letter or "
            "digit.",
            QUALIFIED_NAME_PATTERN,
            QUALIFIED_NAME_MAX,
        ),
        "runtimeRef": _object(
            "A training runtime. A TrainingRuntime is read from namespace.",
            {
                "kind": {
                    "type": "string",
                    "description": "The runtime's kind.",
                    "enum": ["ClusterTrainingRuntime", "TrainingRuntime"],
                },
                "name": _object_name("The runtime's name: a Kubernetes object name."),
            },
            required=("kind", "name"),
        ),
    }


_IN_CLUSTER_EXCLUSIVE: Final[Schema] = {
    "if": {"properties": {"inCluster": {"const": True}}, "required": ["inCluster"]},
    "then": {"not": {"anyOf": [{"required": ["kubeconfig"]}, {"required": ["context"]}]}},
}


def _cluster() -> Schema:
    return _object(
        "How to reach the apiserver: a kubeconfig, or the pod's service account. Absent "
        "follows client-go's loading rules.",
        {
            "kubeconfig": _string(
                "A kubeconfig path. Empty or absent follows client-go's loading rules: "
                "KUBECONFIG, then ~/.kube/config, then the pod's service account."
            ),
            "context": _string(
                "A kubeconfig context. Absent is the current context; empty is refused.",
                minLength=1,
            ),
            "inCluster": {
                "type": "boolean",
                "description": "Use the pod's service account. Refused together with "
                "kubeconfig or context.",
                "default": False,
            },
        },
        default={},
        **_IN_CLUSTER_EXCLUSIVE,
    )


def _kueue() -> Schema:
    return _object(
        "Present selects Kueue mode; absent is plain mode.",
        {
            "localQueue": _queue_name(
                "The LocalQueue, set as kueue.x-k8s.io/queue-name: an object name that is "
                "also a label value (at most 63 characters)."
            ),
            "priorityClass": _queue_name(
                "Set as kueue.x-k8s.io/priority-class: an object name that is also a label "
                "value (at most 63 characters)."
            ),
            "admissionCheck": _object_name(
                "The AdmissionCheck object's name. Without it the readmission gate is 'no' and "
                "the adapter is observe-only, so treat it as required."
            ),
            "admissionLease": _object(
                "The admission controller's leader-election Lease, read as its heartbeat.",
                {
                    "namespace": _dns_label("The Lease's namespace: an RFC 1123 label."),
                    "name": _object_name("The Lease's name: a Kubernetes object name."),
                },
                required=("namespace", "name"),
                default={
                    "namespace": ADMISSION_LEASE_NAMESPACE_DEFAULT,
                    "name": ADMISSION_LEASE_NAME_DEFAULT,
                },
            ),
        },
        required=("localQueue",),
    )


def _credentials() -> Schema:
    return _list(
        "Secret volumes mounted read-only (defaultMode 0400, optional) on the trainer container.",
        _object(
            "A Secret mounted by name.",
            {
                "secretName": _object_name("The Secret's name: a Kubernetes object name."),
                "mountPath": _string(
                    "A clean absolute path; not /, and not overlapping "
                    f"{PUBLISH_DIR} or another credential's path.",
                    maxLength=MOUNT_PATH_MAX,
                    pattern=MOUNT_PATH_PATTERN,
                    **{
                        "not": {
                            "anyOf": [
                                {"const": PUBLISH_DIR},
                                {"pattern": PUBLISH_DIR_INSIDE_PATTERN},
                            ]
                        }
                    },
                ),
            },
            required=("secretName", "mountPath"),
        ),
    )


_TIMEOUTS: Final = (
    ("request", "30s", "Each non-streaming apiserver request."),
    (
        "apiserverRequest",
        "60s",
        "The apiserver's --request-timeout; the declared call bound is this plus 5 seconds.",
    ),
    (
        "workload",
        "60s",
        "How long Start waits for Kueue's Workload, and how long the preflight probe's "
        "StopJob waits.",
    ),
    ("stopJob", "10m", "How long StopJob waits for everything of the job to go."),
)


def _timeouts() -> Schema:
    return _object(
        "Timeouts, each a positive Go duration.",
        {key: _duration(text, default) for key, default, text in _TIMEOUTS},
        default={key: default for key, default, _ in _TIMEOUTS},
    )


def _publish() -> Schema:
    return _object(
        f"How the publish binary reaches the trainer container, at {PUBLISH_DIR}/publish.",
        {
            "image": _shaped(
                "The publish image, pinned by digest: name@sha256: and 64 lower-case hex digits.",
                IMAGE_DIGEST_PATTERN,
                IMAGE_MAX,
            ),
            "via": {
                "type": "string",
                "description": "The route.",
                "enum": ["imageVolume", "initContainer"],
                "default": "imageVolume",
            },
            "initContainer": _dns_label(
                "The init container the runtime defines (a container name); "
                f"{PUBLISH_INIT_CONTAINER_DEFAULT} under via initContainer. Only with via "
                "initContainer."
            ),
        },
        required=("image",),
        dependentSchemas={
            "initContainer": {
                "required": ["via"],
                "properties": {"via": {"const": "initContainer"}},
            }
        },
    )


def settings_schema() -> Schema:
    """The JSON Schema of the settings object."""
    runtime_ref = {"$ref": "#/$defs/runtimeRef"}
    properties: dict[str, Schema] = {
        "namespace": _dns_label(
            "The namespace this adapter serves: an RFC 1123 label (at most 63 characters)."
        ),
        "cluster": _cluster(),
        "runtimes": _list(
            "An allow-list of runtimes; absent allows any. No duplicates.",
            runtime_ref,
            uniqueItems=True,
        ),
        "probeRuntime": {
            **runtime_ref,
            "description": "The runtime the preflight probe uses; the first of runtimes when "
            "absent. Required when runtimes is empty or absent.",
        },
        "kueue": _kueue(),
        "labels": _metadata(
            "Added to every TrainJob. Keys are qualified names outside the reserved prefixes "
            f"{_RESERVED_TEXT}; values are label values (at most 63 characters).",
            _shaped("A label value.", LABEL_VALUE_PATTERN, LABEL_MAX),
        ),
        "annotations": _metadata(
            "Added to every TrainJob. Keys are qualified names outside the reserved prefixes "
            f"{_RESERVED_TEXT}.",
            {"type": "string"},
        ),
        "gpuResource": _qualified_name(
            "The resource GPUsPerNode maps to in the TrainJob's resourcesPerNode.limits.",
            default=GPU_RESOURCE_DEFAULT,
        ),
        "credentials": _credentials(),
        "nodeLossWindow": _duration(
            "The longest a lost node can go unreported, declared to dispatch.",
            NODE_LOSS_WINDOW_DEFAULT,
        ),
        "nodeLossTaints": _list(
            "Site NoExecute taints that mean a node is lost, besides Kubernetes' own "
            "unreachable, not-ready and out-of-service. No duplicates.",
            _qualified_name("A taint key."),
            uniqueItems=True,
        ),
        "allowRankRestart": {
            "type": "boolean",
            "description": "Accept runtimes whose trainer job lets a failed rank rerun under "
            "the same identity.",
            "default": False,
        },
        "timeouts": _timeouts(),
        "publish": _publish(),
    }
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": SCHEMA_ID,
        "title": "dispatch-kubeflow settings",
        "description": "The adapter's settings object. Omit a key for its default; null is "
        "not a value.",
        "type": "object",
        "required": ["namespace"],
        "properties": properties,
        "additionalProperties": False,
        "anyOf": [
            {"required": ["probeRuntime"]},
            {"required": ["runtimes"], "properties": {"runtimes": {"minItems": 1}}},
        ],
        "$defs": _defs(),
    }


def render_json(document: Any) -> bytes:
    """Deterministic JSON: 2-space indent, keys in the order built, UTF-8, trailing newline."""
    return (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def schema_bytes() -> bytes:
    """Exactly the bytes of the committed ``schema.json``."""
    return render_json(settings_schema())


# --- The structural (CRD) form ------------------------------------------------------------------

# Cross-field rules the JSON Schema states with if/then, anyOf and dependentSchemas, as CEL on
# the object they constrain (keyed by the object's pointer under spec).
CEL_RULES: Final[Mapping[str, tuple[Schema, ...]]] = {
    "": (
        {
            "rule": "(has(self.runtimes) && size(self.runtimes) > 0) || has(self.probeRuntime)",
            "message": "probeRuntime is required when runtimes is absent or empty",
        },
    ),
    "/cluster": (
        {
            "rule": "!(has(self.inCluster) && self.inCluster == true) || "
            "(!has(self.kubeconfig) && !has(self.context))",
            "message": "inCluster: true is refused together with kubeconfig or context",
        },
    ),
    "/publish": (
        {
            "rule": "!has(self.initContainer) || (has(self.via) && self.via == 'initContainer')",
            "message": "initContainer is refused unless via is initContainer",
            "fieldPath": ".initContainer",
        },
    ),
    "/credentials/*/mountPath": (
        {"rule": "self.startsWith('/')", "message": "must be an absolute path"},
        {
            "rule": f"self != '{PUBLISH_DIR}' && !self.startsWith('{PUBLISH_DIR}/')",
            "message": f"must not be {PUBLISH_DIR} or inside it: the publish binary is mounted "
            "there",
        },
    ),
}

# What a value must be, in words, for each pattern: the CRD checks patterns with CEL rules that
# carry these messages, so kubectl shows them rather than the regular expression.
PATTERN_MESSAGES: Final[Mapping[str, str]] = {
    DNS_LABEL_PATTERN: "must be an RFC 1123 label: lower-case letters, digits and '-', "
    "beginning and ending with a letter or digit",
    DNS_SUBDOMAIN_PATTERN: "must be an RFC 1123 subdomain: lower-case letters, digits, '-' and "
    "'.', each dot-separated part beginning and ending with a letter or digit",
    QUALIFIED_NAME_PATTERN: "must be a qualified name: an optional RFC 1123 subdomain and '/', "
    "then letters, digits, '-', '_' and '.', beginning and ending with a letter or digit",
    LABEL_VALUE_PATTERN: "must be a label value: empty, or letters, digits, '-', '_' and '.', "
    "beginning and ending with a letter or digit",
    IMAGE_DIGEST_PATTERN: "must be an image reference pinned by digest: name@sha256: and 64 "
    "lower-case hex digits",
    POSITIVE_DURATION_PATTERN: "must be a positive Go duration such as 30s or 1h30m "
    "(units ns, us, ms, s, m, h)",
}

# Keywords the CRD does not carry: a structural schema cannot, or (pattern, and the newline
# guard under not) their meaning moves to CEL rules with messages, to list types, or to the
# operator's own parse (label keys, whose length no schema bounds for a CEL rule's cost).
_DROPPED: Final = frozenset(
    {
        "$schema",
        "$id",
        "$defs",
        "title",
        "default",
        "anyOf",
        "if",
        "then",
        "dependentSchemas",
        "propertyNames",
        "uniqueItems",
        "additionalProperties",
        "not",
        "pattern",
    }
)


def cel_string(text: str) -> str:
    """``text`` as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _validations(node: Schema, pointer: str) -> list[Schema]:
    """The CEL rules of one node: its pattern in words, and the rules kept for its pointer."""
    rules: list[Schema] = []
    pattern: str | None = node.get("pattern")
    if pattern is not None and pattern in PATTERN_MESSAGES:
        rules.append(
            {"rule": f"self.matches({cel_string(pattern)})", "message": PATTERN_MESSAGES[pattern]}
        )
    elif pattern is not None and pointer not in CEL_RULES:
        raise ValueError(f"the pattern at {pointer} has no message for the CRD")
    rules.extend(dict(rule) for rule in CEL_RULES.get(pointer, ()))
    return rules


def _inline_refs(node: Any, defs: Mapping[str, Schema]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = copy.deepcopy(defs[node["$ref"].removeprefix("#/$defs/")])
            rest = {k: v for k, v in node.items() if k != "$ref"}
            return _inline_refs({**target, **rest}, defs)
        return {k: _inline_refs(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline_refs(v, defs) for v in node]
    return node


def structural(node: Schema, pointer: str = "", *, optional: bool = False) -> Schema:
    """The CRD form of a (ref-free) settings schema node.

    An optional value is ``nullable`` so that a null in a manifest reaches the operator, which
    refuses it, instead of being pruned by the apiserver and read as unset. A pattern becomes a
    CEL rule with a message in words (``PATTERN_MESSAGES``).
    """
    out: Schema = {k: v for k, v in node.items() if k not in _DROPPED}
    if "default" in node:
        out["description"] = f"{node['description']} Default: {json.dumps(node['default'])}."
    if node.get("type") == "object" and "properties" in node:
        required = set(node.get("required", ()))
        out["properties"] = {
            key: structural(child, f"{pointer}/{key}", optional=key not in required)
            for key, child in node["properties"].items()
        }
    elif node.get("type") == "object" and isinstance(node.get("additionalProperties"), dict):
        values = structural(node["additionalProperties"], f"{pointer}/*", optional=True)
        values.pop("description", None)
        out["additionalProperties"] = values
    if node.get("type") == "array":
        out["items"] = structural(node["items"], f"{pointer}/*")
        if node.get("uniqueItems"):
            out.update(_list_type(node["items"]))
    validations = _validations(node, pointer)
    if validations:
        out["x-kubernetes-validations"] = validations
    if optional:
        out["nullable"] = True
    return out


def _list_type(items: Schema) -> Schema:
    if items.get("type") == "object":
        return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": items["required"]}
    return {"x-kubernetes-list-type": "set"}


def spec_schema() -> Schema:
    """The KubeflowAdapter's ``spec``: the settings schema in structural form."""
    full = settings_schema()
    return structural(_inline_refs(full, full["$defs"]))


def condition_schema(types: Sequence[str], described: str) -> Schema:
    """metav1.Condition, as a list of them keyed by type; ``described`` says what they tell."""
    return {
        "type": "array",
        "description": described,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "reason", "message", "lastTransitionTime"],
            "properties": {
                "type": {"type": "string", "description": f"One of {', '.join(types)}."},
                "status": {
                    "type": "string",
                    "description": "Whether the condition holds: True, False or Unknown.",
                    "enum": ["True", "False", "Unknown"],
                },
                "reason": {
                    "type": "string",
                    "description": "Why the condition is as it is, one CamelCase word.",
                    "maxLength": 1024,
                },
                "message": {
                    "type": "string",
                    "description": "The reason in words, for people.",
                    "maxLength": 32768,
                },
                "lastTransitionTime": {
                    "type": "string",
                    "description": "When the status last changed (not when it was last written).",
                    "format": "date-time",
                },
                "observedGeneration": {
                    "type": "integer",
                    "description": "The metadata.generation the condition was set for.",
                    "format": "int64",
                    "minimum": 0,
                },
            },
        },
    }


def kopf_status_schema() -> Schema:
    """``status.kopf``: kopf's own progress records, whose shape belongs to kopf."""
    return {
        "type": "object",
        "description": "The operator framework's (kopf's) own bookkeeping; not for users.",
        "x-kubernetes-preserve-unknown-fields": True,
    }


OBSERVED_GENERATION: Final = {
    "type": "integer",
    "description": "The metadata.generation the status was written for.",
    "format": "int64",
}


def adapter_status_schema() -> Schema:
    return {
        "type": "object",
        "description": "What the operator made of the spec: validity, connection, probe, health.",
        "properties": {
            "conditions": condition_schema(
                [c.value for c in AdapterCondition],
                "Valid (the spec parsed), Connected (the apiserver answered), Probed (the "
                "preflight probe passed), AdmissionHealthy (Kueue mode: the admission "
                "controller's Lease is fresh) and Ready (open and watching).",
            ),
            "mode": {
                "type": "string",
                "description": "plain, or kueue when the spec sets kueue (jobs queue in Kueue).",
                "enum": ["plain", "kueue"],
            },
            "readmissionGate": {
                "type": "string",
                "description": (
                    "yes when kueue.admissionCheck is set: an evicted job is readmitted only "
                    "once dispatch opens its gate; no when the adapter only observes."
                ),
                "enum": ["yes", "no"],
            },
            "declarations": {
                "type": "object",
                "description": "What this adapter promises about how it sees failures.",
                "properties": {
                    "nodeLossWindow": {
                        "type": "string",
                        "description": "A lost node is reported within this Go duration.",
                    },
                    "callBound": {
                        "type": "string",
                        "description": (
                            "Every API call ends within this Go duration "
                            "(timeouts.apiserverRequest + 5s)."
                        ),
                    },
                    "polledLoss": {
                        "type": "array",
                        "description": (
                            "Kinds of loss seen by polling rather than by a watch; empty, "
                            "because the adapter watches."
                        ),
                        "items": {"type": "string"},
                    },
                },
            },
            "observedGeneration": OBSERVED_GENERATION,
            "kopf": kopf_status_schema(),
        },
    }


def render_crd(
    *,
    kind: str,
    plural: str,
    short_names: Sequence[str],
    spec: Schema,
    status: Schema,
    printer_columns: Sequence[Mapping[str, Any]],
    description: str,
    group: str = GROUP,
    version: str = VERSION,
    scope: str = "Namespaced",
) -> Schema:
    """A CustomResourceDefinition with one served and stored version and a status subresource."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": list(short_names),
            },
            "scope": scope,
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in printer_columns],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": description,
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {
                                    "type": "string",
                                    "description": f"{group}/{version}.",
                                },
                                "kind": {"type": "string", "description": f"{kind}."},
                                # The apiserver refuses anything on metadata but its type, and
                                # describes it itself (ObjectMeta).
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


AGE_COLUMN: Final = {
    "name": "Age",
    "type": "date",
    "description": "Time since the resource was created.",
    "jsonPath": ".metadata.creationTimestamp",
}
# Columns of ``kubectl get -o wide`` only.
WIDE: Final = 1


def condition_column(kind: str, description: str, priority: int = 0) -> dict[str, Any]:
    """A printer column showing the status of condition ``kind``."""
    column: dict[str, Any] = {"name": str(kind), "type": "string", "description": description}
    if priority:
        column["priority"] = priority
    column["jsonPath"] = f'.status.conditions[?(@.type=="{kind}")].status'
    return column


def kubeflow_adapter_crd() -> Schema:
    return render_crd(
        kind=KUBEFLOW_ADAPTER_KIND,
        plural=KUBEFLOW_ADAPTERS,
        short_names=("kfa",),
        spec=spec_schema(),
        status=adapter_status_schema(),
        printer_columns=(
            {
                "name": "Mode",
                "type": "string",
                "description": "plain or kueue.",
                "jsonPath": ".status.mode",
            },
            condition_column(AdapterCondition.READY, "Open and watching the served namespace."),
            condition_column(
                AdapterCondition.ADMISSION_HEALTHY,
                "Kueue mode: the admission controller's Lease heartbeat is fresh.",
                WIDE,
            ),
            AGE_COLUMN,
        ),
        description="An adapter instance: its spec is the settings object, exactly.",
    )


def render_yaml(document: Any) -> bytes:
    """Deterministic YAML: keys in the order built, block style, UTF-8."""
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)
    return text.encode("utf-8")


def crd_files() -> dict[str, bytes]:
    """Every generated CRD, by file name under ``crds/``."""
    crd = kubeflow_adapter_crd()
    return {f"{crd['metadata']['name']}.yaml": render_yaml(crd)}


def generated_files() -> dict[str, bytes]:
    """Every generated file, by path relative to the repository root; the chart's CRDs too."""
    files = {SCHEMA_FILE: schema_bytes()}
    for directory in (CRD_DIR, CHART_CRD_DIR):
        files.update({f"{directory}/{name}": data for name, data in crd_files().items()})
    return files


def stale_files(root: Path) -> list[str]:
    """The generated files under ``root`` that are missing or differ from what is generated."""
    return [
        path
        for path, data in generated_files().items()
        if not (root / path).is_file() or (root / path).read_bytes() != data
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dispatch_kubeflow.schema",
        description="Write or check schema.json and the CRDs, generated from one source.",
    )
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="repository root")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--write", action="store_true", help="rewrite the generated files")
    action.add_argument("--check", action="store_true", help="exit 1 if a file is not current")
    args = parser.parse_args(argv)
    root: Path = args.root
    if args.write:
        for path, data in generated_files().items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)
        return 0
    stale = stale_files(root)
    for path in stale:
        print(
            f"{path} is not current: run python -m dispatch_kubeflow.schema --write",
            file=sys.stderr,
        )
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
