"""The project's rules for names, paths and image references: one place, one spelling.

Each shape is a pattern shared with the JSON Schema and the CRD (``schema.py`` imports them) and
a ``check_*`` function the settings models use. The patterns use only what both ECMA-262 (JSON
Schema) and RE2 (the apiserver) understand, and groups that capture nothing, which backtracking
engines match at less cost. A closing ``$`` is the end of the text in both; Python's ``re`` also
lets it match before a final newline, so the parser compiles each to end in ``\\Z`` and the
JSON Schema adds a guard against newlines (see ``schema.py``). Each check measures a value's
length before it runs a pattern on it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from dispatch_kubeflow.constants import PUBLISH_DIR, RESERVED_PREFIXES
from dispatch_kubeflow.settings.refusals import refuse, shown

DNS_LABEL_PATTERN: Final = r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN: Final = (
    r"^[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*$"
)
_NAME_PART: Final = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_PREFIX_PART: Final = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
QUALIFIED_NAME_PATTERN: Final = rf"^(?:{_PREFIX_PART}/)?{_NAME_PART}$"
LABEL_VALUE_PATTERN: Final = rf"^(?:{_NAME_PART})?$"
# A job id: the TrainJob named after it must be an RFC 1035 label (a CEL rule of Trainer's CRD).
RFC1035_LABEL_PATTERN: Final = r"^[a-z](?:[-a-z0-9]*[a-z0-9])?$"


def _literal(text: str) -> str:
    """``text`` as a pattern; only '.' needs escaping in the names used here."""
    return text.replace(".", r"\.")


RESERVED_PREFIX_PATTERN: Final = (
    "^(?:" + "|".join(_literal(p.rstrip("/")) for p in RESERVED_PREFIXES) + ")/"
)
_DOMAIN_COMPONENT: Final = r"(?:[A-Za-z0-9]|[A-Za-z0-9][-A-Za-z0-9]*[A-Za-z0-9])"
_PATH_COMPONENT: Final = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_DIGEST_PATTERN: Final = (
    rf"^(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*(?::[0-9]+)?/)?"
    rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*@sha256:[0-9a-f]{{64}}$"
)
MOUNT_PATH_PATTERN: Final = "^/"
# Inside the publish directory; the directory itself is matched as a constant, with no '$'.
PUBLISH_DIR_INSIDE_PATTERN: Final = "^" + _literal(PUBLISH_DIR) + "/"

LABEL_MAX: Final = 63
SUBDOMAIN_MAX: Final = 253
QUALIFIED_NAME_MAX: Final = SUBDOMAIN_MAX + 1 + LABEL_MAX
# A reference name is at most 255 characters (the distribution reference's limit).
IMAGE_NAME_MAX: Final = 255
IMAGE_MAX: Final = IMAGE_NAME_MAX + len("@sha256:") + 64
# Linux's PATH_MAX: no longer path can be mounted.
MOUNT_PATH_MAX: Final = 4096

_DNS_LABEL = re.compile(DNS_LABEL_PATTERN.rstrip("$") + r"\Z")
_DNS_SUBDOMAIN = re.compile(DNS_SUBDOMAIN_PATTERN.rstrip("$") + r"\Z")
_NAME = re.compile(_NAME_PART + r"\Z")
_QUALIFIED_NAME = re.compile(QUALIFIED_NAME_PATTERN.rstrip("$") + r"\Z")
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN.rstrip("$") + r"\Z")
_RFC1035_LABEL = re.compile(RFC1035_LABEL_PATTERN.rstrip("$") + r"\Z")
_IMAGE = re.compile(IMAGE_DIGEST_PATTERN.rstrip("$") + r"\Z")


def is_rfc1035_label(value: str, limit: int = LABEL_MAX) -> bool:
    """At most ``limit`` characters of a-z, 0-9 and '-', beginning with a letter, ending with a
    letter or digit."""
    return len(value) <= limit and _RFC1035_LABEL.match(value) is not None


def is_object_name(value: str) -> bool:
    """A Kubernetes object name: an RFC 1123 subdomain of at most 253 characters."""
    return len(value) <= SUBDOMAIN_MAX and _DNS_SUBDOMAIN.match(value) is not None


def is_label_value(value: str) -> bool:
    """A label value: empty, or at most 63 characters of A-Z, a-z, 0-9, '-', '_' and '.',
    beginning and ending with a letter or digit."""
    return len(value) <= LABEL_MAX and _LABEL_VALUE.match(value) is not None


def check_dns_label(value: str, what: str = "an RFC 1123 label") -> str:
    if len(value) > LABEL_MAX or not _DNS_LABEL.match(value):
        refuse(
            f"must be {what} (at most 63 characters of a-z, 0-9 and '-', beginning and ending "
            f"with a letter or digit), got {shown(value)}"
        )
    return value


def check_container_name(value: str) -> str:
    return check_dns_label(value, "a container name")


def _check_subdomain(value: str, limit: int, what: str) -> str:
    if len(value) > limit or not _DNS_SUBDOMAIN.match(value):
        refuse(
            f"must be {what} (at most {limit} characters of a-z, 0-9, '-' and '.', each "
            f"dot-separated part beginning and ending with a letter or digit), got {shown(value)}"
        )
    return value


def check_object_name(value: str) -> str:
    return _check_subdomain(value, SUBDOMAIN_MAX, "a Kubernetes object name, an RFC 1123 subdomain")


def check_queue_name(value: str) -> str:
    return _check_subdomain(value, LABEL_MAX, "an object name that is also a label value")


def qualified_name_problem(value: str) -> str | None:
    """Why ``value`` is not a Kubernetes qualified name (``[prefix/]name``), or None."""
    prefix, slash, name = value.rpartition("/")
    if slash and not prefix:
        return "the prefix before '/' must not be empty"
    if slash and "/" in prefix:
        return "at most one '/' is allowed"
    if not name:
        return "the name part must not be empty"
    if len(name) > LABEL_MAX:
        return f"the name part is {len(name)} characters, more than 63"
    if not _NAME.match(name):
        return (
            "the name part must be A-Z, a-z, 0-9, '-', '_' and '.', beginning and ending with "
            "a letter or digit"
        )
    if slash and len(prefix) > SUBDOMAIN_MAX:
        return f"the prefix is {len(prefix)} characters, more than 253"
    if slash and not _DNS_SUBDOMAIN.match(prefix):
        return "the prefix must be an RFC 1123 subdomain (a-z, 0-9, '-' and '.')"
    return None


def _is_qualified_name(value: str) -> bool:
    if not _QUALIFIED_NAME.match(value):
        return False
    prefix, _, name = value.rpartition("/")
    return len(name) <= LABEL_MAX and len(prefix) <= SUBDOMAIN_MAX


def check_qualified_name(value: str) -> str:
    if len(value) > QUALIFIED_NAME_MAX or not _is_qualified_name(value):
        problem = qualified_name_problem(value)
        refuse(f"must be a qualified name ([prefix/]name): {problem}, got {shown(value)}")
    return value


def check_metadata_key(value: str) -> str:
    check_qualified_name(value)
    if value.startswith(RESERVED_PREFIXES):
        prefix = next(p for p in RESERVED_PREFIXES if value.startswith(p))
        refuse(
            f"key {shown(value)} uses the reserved prefix {shown(prefix)}, which dispatch, "
            "Kueue, Trainer and JobSet read"
        )
    return value


def check_label_value(value: str) -> str:
    if len(value) > LABEL_MAX or not _LABEL_VALUE.match(value):
        refuse(
            "must be a label value (empty, or at most 63 characters of A-Z, a-z, 0-9, '-', '_' "
            f"and '.', beginning and ending with a letter or digit), got {shown(value)}"
        )
    return value


def check_not_empty(value: str) -> str:
    if not value:
        refuse("must not be empty: omit the key for the current context")
    return value


def go_path_clean(path: str) -> str:
    """Go's ``path.Clean``: the shortest path equivalent to ``path`` by purely lexical rules."""
    if not path:
        return "."
    rooted = path.startswith("/")
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts and parts[-1] != "..":
                parts.pop()
            elif not rooted:
                parts.append("..")
            continue
        parts.append(part)
    joined = "/".join(parts)
    if rooted:
        return "/" + joined
    return joined or "."


def paths_overlap(a: str, b: str) -> bool:
    """Whether one clean absolute path is, is inside, or contains the other."""
    if a == b:
        return True
    inner, outer = (a, b) if len(a) > len(b) else (b, a)
    return inner.startswith(outer.rstrip("/") + "/")


def check_mount_path(value: str) -> str:
    if len(value) > MOUNT_PATH_MAX:
        refuse(f"must be at most {MOUNT_PATH_MAX} characters, got {len(value)}")
    if not value.startswith("/"):
        refuse(f"must be an absolute path, got {shown(value)}")
    clean = go_path_clean(value)
    if clean != value:
        refuse(f"must be a clean path ({shown(clean)}, not {shown(value)})")
    if value == "/":
        refuse('must not be "/"')
    if paths_overlap(value, PUBLISH_DIR):
        refuse(f"{shown(value)} overlaps {PUBLISH_DIR}, where the publish binary is mounted")
    return value


def first_overlap(paths: Sequence[str]) -> tuple[int, int] | None:
    """The first ``(later, earlier)`` indices of two overlapping clean absolute paths, or None.

    ``later`` is the smallest index whose path is, is inside, or contains an earlier one, and
    ``earlier`` the smallest such earlier index: what comparing every pair in order would find,
    found in one pass over the paths' components through a tree of the directories seen.
    """
    nodes: dict[tuple[int, str], int] = {}
    mounted: dict[int, int] = {}  # directory node -> first index mounted exactly there
    below: dict[int, int] = {}  # directory node -> first index mounted strictly inside it
    for later, path in enumerate(paths):
        chain = []
        node = 0
        for part in path.split("/")[1:]:
            node = nodes.setdefault((node, part), len(nodes) + 1)
            chain.append(node)
        earlier = [mounted[n] for n in chain if n in mounted]
        if node in below:
            earlier.append(below[node])
        if earlier:
            return later, min(earlier)
        mounted[node] = later
        for parent in chain[:-1]:
            below.setdefault(parent, later)
    return None


def check_image(value: str) -> str:
    if len(value) > IMAGE_MAX:
        refuse(
            f"must be an image reference of at most {IMAGE_MAX} characters (a name of at most "
            f"{IMAGE_NAME_MAX}, @sha256: and 64 hex digits), got {len(value)}"
        )
    if not _IMAGE.match(value):
        refuse(
            "must be an image reference pinned by digest (name@sha256: and 64 lower-case hex "
            f"digits), got {shown(value)}"
        )
    return value
