"""The adapter's settings object: parsed strictly, typed, immutable, every default applied.

``names`` holds the rules for names, paths and images (and the patterns the JSON Schema shares);
``models`` the frozen pydantic models and the rules across fields; ``documents`` the strict
reading of JSON text and decoded objects into ``Settings``, with a JSON pointer on every refusal.
"""

from dispatch_kubeflow.constants import PUBLISH_INIT_CONTAINER_DEFAULT
from dispatch_kubeflow.settings.documents import parse_settings, parse_settings_object
from dispatch_kubeflow.settings.models import (
    NODE_LOSS_WINDOW_DEFAULT,
    POSITIVE_DURATION_PATTERN,
    AdmissionLease,
    Cluster,
    Credential,
    Declarations,
    FrozenMap,
    Kueue,
    Publish,
    RuntimeRef,
    Settings,
    Timeouts,
)
from dispatch_kubeflow.settings.names import (
    DNS_LABEL_PATTERN,
    DNS_SUBDOMAIN_PATTERN,
    IMAGE_DIGEST_PATTERN,
    LABEL_MAX,
    LABEL_VALUE_PATTERN,
    MOUNT_PATH_PATTERN,
    PUBLISH_DIR_INSIDE_PATTERN,
    QUALIFIED_NAME_PATTERN,
    RESERVED_PREFIX_PATTERN,
    SUBDOMAIN_MAX,
    go_path_clean,
    paths_overlap,
)
from dispatch_kubeflow.settings.refusals import InvalidSettings, json_pointer

__all__ = [
    "DNS_LABEL_PATTERN",
    "DNS_SUBDOMAIN_PATTERN",
    "IMAGE_DIGEST_PATTERN",
    "LABEL_MAX",
    "LABEL_VALUE_PATTERN",
    "MOUNT_PATH_PATTERN",
    "NODE_LOSS_WINDOW_DEFAULT",
    "POSITIVE_DURATION_PATTERN",
    "PUBLISH_DIR_INSIDE_PATTERN",
    "PUBLISH_INIT_CONTAINER_DEFAULT",
    "QUALIFIED_NAME_PATTERN",
    "RESERVED_PREFIX_PATTERN",
    "SUBDOMAIN_MAX",
    "AdmissionLease",
    "Cluster",
    "Credential",
    "Declarations",
    "FrozenMap",
    "InvalidSettings",
    "Kueue",
    "Publish",
    "RuntimeRef",
    "Settings",
    "Timeouts",
    "go_path_clean",
    "json_pointer",
    "parse_settings",
    "parse_settings_object",
    "paths_overlap",
]
