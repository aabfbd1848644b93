"""Every reason the pinned upstream sources can write has a row in the reason table.

The sources are read from the Go module cache at the versions the test control plane and the full
stack pin (`tests/cluster/go.mod`, `tests/cluster/fullstack/*/go.mod`), downloaded with `go mod
download` when missing; so this needs Go and the module proxy and is a `cluster` test. Raising a
pin then fails here with every reason the new version added, each to be mapped or ignored (with
why) in `dispatch_kubeflow/reasons.py`.

Reasons are found where upstream keeps them: Kueue's and Trainer's API constants, JobSet's
constants, `k8s.io/api` core/v1's pod reasons, every `DisruptionTarget` condition written in
`k8s.io/kubernetes`, every reason the kubelet fails a pod with (its admission handlers, eviction,
shutdown and preemption) and every error it shows as a container's waiting reason. An
expression the reader cannot resolve to a string fails the test too, so a source that moved is
not silently skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from dispatch_kubeflow.reasons import TABLE, Where
from tests.cluster import binaries, crds
from tests.cluster.fullstack import build

pytestmark = pytest.mark.cluster

CONTROL_PLANE_GO_MOD = binaries.MODULE_DIR / "go.mod"

WORKLOAD_FIELDS = frozenset(w for w in Where if w.name.startswith("WORKLOAD_"))
POD_FIELDS = frozenset(
    {Where.POD_SCHEDULED, Where.POD_DISRUPTION, Where.POD_FAILED, Where.POD_UNREAD}
)

# Constants of Kueue's workload_types.go that are condition types, not reasons.
KUEUE_CONDITION_TYPES = frozenset(
    {
        "WorkloadAdmitted",
        "WorkloadBlockedOnPreemptionGates",
        "WorkloadQuotaReserved",
        "WorkloadFinished",
        "WorkloadPodsReady",
        "WorkloadEvicted",
        "WorkloadPreempted",
        "WorkloadRequeued",
        "WorkloadDeactivationTarget",
        "WorkloadWaitingForReplacementPods",
    }
)

_CONST_BLOCK = re.compile(r"^const \((.*?)^\)", re.DOTALL | re.MULTILINE)
_CONST_LINE = re.compile(r'^\s*(\w+)(?:\s+([\w.]+))?\s*=\s*"([^"]*)"', re.MULTILINE)
_SINGLE_CONST = re.compile(r'^(?:const|var)\s+(\w+)(?:\s+([\w.]+))?\s*=\s*"([^"]*)"', re.MULTILINE)
_ERRORS_NEW = re.compile(r'^\s*(?:var\s+)?(Err\w+)\s*=\s*errors\.New\("([A-Z]\w+)"\)', re.MULTILINE)


@dataclass(frozen=True)
class Found:
    """A reason upstream writes, where it was found, and the table fields it may belong to."""

    reason: str
    origin: str
    fields: frozenset[Where]
    prefix: bool = False


@dataclass
class Reading:
    found: list[Found] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)

    def add(self, reason: str, origin: str, fields: frozenset[Where], prefix: bool = False) -> None:
        self.found.append(Found(reason, origin, fields, prefix))


# --------------------------------------------------------------------------------------------
# Pinned versions and module folders


def _pinned(go_mod: Path, module: str) -> str:
    text = go_mod.read_text()
    replaced = re.search(rf"^replace {re.escape(module)} => \S+ (v\S+)", text, re.MULTILINE)
    if replaced:
        return replaced.group(1)
    required = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", text, re.MULTILINE)
    assert required, f"{go_mod} pins no version of {module}"
    return required.group(1)


@cache
def module(name: str) -> Path:
    versions = {
        "k8s.io/api": lambda: _pinned(CONTROL_PLANE_GO_MOD, "k8s.io/api"),
        "k8s.io/kubernetes": lambda: _pinned(CONTROL_PLANE_GO_MOD, "k8s.io/kubernetes"),
        "sigs.k8s.io/kueue": lambda: build.component("kueue").version(),
        "sigs.k8s.io/jobset": lambda: build.component("jobset-controller").version(),
        "github.com/kubeflow/trainer/v2": lambda: build.component(
            "trainer-controller-manager"
        ).version(),
    }
    return crds.module_dir(name, versions[name]())


# --------------------------------------------------------------------------------------------
# Reading Go source


def go_files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*.go")):
        if not path.name.endswith("_test.go") and "testing" not in path.parts:
            yield path


def constants(text: str) -> list[tuple[str, str | None, str]]:
    """(name, type or None, value) of every string constant or variable in Go source."""
    matches = [
        *(m for block in _CONST_BLOCK.finditer(text) for m in _CONST_LINE.finditer(block.group(1))),
        *_SINGLE_CONST.finditer(text),
    ]
    return [(m.group(1), m.group(2), m.group(3)) for m in matches]


@cache
def package_constants(folder: Path) -> dict[str, str]:
    """Every string constant of the Go package in ``folder``, by name."""
    return {
        name: value
        for path in folder.glob("*.go")
        if not path.name.endswith("_test.go")
        for name, _, value in constants(path.read_text())
    }


def literal_block(text: str, start: int) -> str:
    """The brace-balanced composite literal whose ``{`` is at or after ``start``."""
    opening = text.index("{", start)
    depth = 0
    for index in range(opening, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return text[opening : index + 1]
    return text[opening:]


def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


# --------------------------------------------------------------------------------------------
# Kueue, Trainer, JobSet


def read_kueue(reading: Reading) -> None:
    root = module("sigs.k8s.io/kueue")
    api = root / "apis/kueue/v1beta2"
    for name, type_, value in constants((api / "workload_types.go").read_text()):
        if type_ in (None, "string") and name not in KUEUE_CONDITION_TYPES:
            reading.add(value, f"kueue workload_types.go {name}", WORKLOAD_FIELDS)
    for name, type_, value in constants((api / "admissioncheck_types.go").read_text()):
        if type_ == "CheckState":
            reading.add(value, f"kueue admissioncheck_types.go {name}", WORKLOAD_FIELDS)
    kueue_constants = package_constants(api)
    # A Deactivated eviction with a DeactivationTarget is reported as Deactivated + "DueTo" + it
    # (pkg/workload/patching.ReasonWithCause).
    for path in go_files(root / "pkg"):
        for match in re.finditer(
            r"SetDeactivationTarget\(\s*\w+,\s*kueue\.(\w+)", path.read_text()
        ):
            cause = kueue_constants[match.group(1)]
            origin = f"kueue {path.relative_to(root)} SetDeactivationTarget({match.group(1)})"
            reading.add(f"DeactivatedDueTo{cause}", origin, frozenset({Where.WORKLOAD_EVICTED}))
            reading.add(cause, origin, frozenset({Where.WORKLOAD_DEACTIVATION}))


def read_trainer(reading: Reading) -> None:
    path = module("github.com/kubeflow/trainer/v2") / "pkg/apis/trainer/v1alpha1/trainjob_types.go"
    for name, _, value in constants(path.read_text()):
        if name.endswith("Reason"):
            reading.add(value, f"trainer trainjob_types.go {name}", frozenset({Where.TRAINJOB}))


def read_jobset(reading: Reading) -> None:
    path = module("sigs.k8s.io/jobset") / "pkg/constants/constants.go"
    fields = frozenset({Where.TRAINJOB, Where.JOBSET_UNREAD})
    for name, _, value in constants(path.read_text()):
        if "Reason" in name and not name.endswith("Message"):
            prefix = "%" in value
            reason = value.split("%")[0] if prefix else value
            reading.add(reason, f"jobset constants.go {name}", fields, prefix)


# --------------------------------------------------------------------------------------------
# Kubernetes: core/v1, DisruptionTarget writers, the kubelet


def read_core_v1(reading: Reading) -> None:
    path = module("k8s.io/api") / "core/v1/types.go"
    for name, _, value in constants(path.read_text()):
        if name.startswith("PodReason"):
            reading.add(value, f"k8s.io/api core/v1 {name}", POD_FIELDS)


class Resolver:
    """Resolves a Go expression in a kubelet source file to the reason strings it can hold."""

    def __init__(self, kubernetes: Path, core_v1: Path) -> None:
        self.kubernetes = kubernetes
        self.core_v1 = core_v1

    def package(self, alias: str, here: Path) -> dict[str, str]:
        if alias in ("v1", "corev1", "api"):
            return package_constants(self.core_v1)
        for candidate in (here.parent / alias, self.kubernetes / "pkg/kubelet" / alias):
            if candidate.is_dir():
                return package_constants(candidate)
        return {}

    def resolve(self, expr: str, here: Path, depth: int = 0) -> list[tuple[str, bool]] | None:
        """(reason, is prefix) pairs, [] for a pass-through of another reason, None if unknown."""
        expr = expr.strip().rstrip(",")
        if expr.startswith('"') and expr.endswith('"'):
            return [(expr[1:-1], False)]
        if expr.endswith(".Reason"):
            return []
        if expr.endswith(".Type()"):
            return self.admission_error_types()
        if expr.endswith(".PredicateName"):
            return self.predicate_names()
        sprintf = re.fullmatch(r'fmt\.Sprintf\("%s%s",\s*(\w+),.*\)', expr)
        if sprintf:
            value = package_constants(here.parent).get(sprintf.group(1))
            return [(value, True)] if value is not None else None
        qualified = re.fullmatch(r"(\w+)\.(\w+)", expr)
        if qualified:
            value = self.package(qualified.group(1), here).get(qualified.group(2))
            return [(value, False)] if value is not None else None
        if re.fullmatch(r"\w+", expr):
            value = package_constants(here.parent).get(expr)
            if value is not None:
                return [(value, False)]
            return self.assignments(expr, here, depth)
        return None

    def assignments(self, variable: str, here: Path, depth: int) -> list[tuple[str, bool]] | None:
        """The values a local variable is assigned in its file."""
        if depth > 2:
            return None
        values: list[tuple[str, bool]] = []
        text = here.read_text()
        for match in re.finditer(rf"\b{variable}\s*=\s*(.+)$", text, re.MULTILINE):
            resolved = self.resolve(match.group(1), here, depth + 1)
            if resolved is None:
                return None
            values += resolved
        return values or None

    @cache  # noqa: B019 - one resolver per test run
    def predicate_names(self) -> list[tuple[str, bool]]:
        """Names of the scheduler plugins whose failure the kubelet reports as the reason."""
        plugins = self.kubernetes / "pkg/scheduler/framework/plugins"
        names = package_constants(plugins / "names")
        sources = [
            *(self.kubernetes / "pkg/scheduler").glob("*.go"),
            self.kubernetes / "pkg/kubelet/lifecycle/predicate.go",
        ]
        found = set()
        for path in sources:
            for match in re.finditer(
                r"(?:AdmissionResult\{Name:\s*|PredicateFailureError\{)(\w+)\.Name\b",
                path.read_text(),
            ):
                plugin = plugins / match.group(1)
                if not plugin.is_dir():
                    continue  # a variable passing on another result's name
                declared = re.search(r"\bName\s*=\s*names\.(\w+)", _read_package(plugin))
                assert declared, f"scheduler plugin {plugin} declares no Name"
                found.add(names[declared.group(1)])
        return [(name, False) for name in sorted(found)]

    @cache  # noqa: B019 - one resolver per test run
    def admission_error_types(self) -> list[tuple[str, bool]]:
        """What the container manager's admission errors give as their type."""
        found = []
        for path in go_files(self.kubernetes / "pkg/kubelet/cm"):
            for match in re.finditer(r"\) Type\(\) string \{\s*return (\w+)", path.read_text()):
                value = package_constants(path.parent).get(match.group(1))
                if value is not None:
                    found.append((value, False))
        return found


def _read_package(folder: Path) -> str:
    return "\n".join(p.read_text() for p in folder.glob("*.go") if not p.name.endswith("_test.go"))


def read_disruption_targets(reading: Reading, resolver: Resolver) -> None:
    root = module("k8s.io/kubernetes")
    for path in go_files(root / "pkg"):
        text = path.read_text()
        for match in re.finditer(r"Type:\s*\w+\.DisruptionTarget\b", text):
            start = text.rfind("{", 0, match.start())
            block = literal_block(text, start)
            reason = re.search(r"\bReason:\s*([^\n]+)", block)
            if reason is None:
                continue  # the disruption controller resets the condition to False, reasonless
            origin = f"{path.relative_to(root)}:{line_of(text, match.start())}"
            resolved = resolver.resolve(reason.group(1), path)
            if resolved is None:
                reading.unresolved.append(f"{origin}: DisruptionTarget reason {reason.group(1)}")
                continue
            for value, prefix in resolved:
                reading.add(value, origin, frozenset({Where.POD_DISRUPTION}), prefix)


def read_kubelet_pod_failures(reading: Reading, resolver: Resolver) -> None:
    """Every reason the kubelet sets on a pod it refuses, evicts, shuts down or preempts."""
    root = module("k8s.io/kubernetes")
    fields = frozenset({Where.POD_FAILED, Where.POD_UNREAD})
    for path in go_files(root / "pkg/kubelet"):
        text = path.read_text()
        sites = [
            (m.start(), re.search(r"\bReason:\s*([^\n,}]+)", literal_block(text, m.start())))
            for m in re.finditer(r"\b(?:PodAdmitResult|ShouldEvictResponse)\{", text)
        ]
        sites += [
            (m.start(), m) for m in re.finditer(r"\bstatus\.Reason\s*=(?!=)\s*([^\n]+)", text)
        ]
        for start, reason in sites:
            if reason is None:
                continue
            origin = f"{path.relative_to(root)}:{line_of(text, start)}"
            resolved = resolver.resolve(reason.group(1), path)
            if resolved is None:
                reading.unresolved.append(f"{origin}: pod reason {reason.group(1)}")
                continue
            for value, prefix in resolved:
                reading.add(value, origin, fields, prefix)


def read_kubelet_waiting(reading: Reading) -> None:
    root = module("k8s.io/kubernetes")
    fields = frozenset({Where.CONTAINER_WAITING})
    for relative in (
        "pkg/kubelet/images/types.go",
        "pkg/kubelet/container/sync_result.go",
        "pkg/kubelet/kuberuntime/kuberuntime_container.go",
    ):
        for name, value in _ERRORS_NEW.findall((root / relative).read_text()):
            reading.add(value, f"{relative} {name}", fields)
    pods = root / "pkg/kubelet/kubelet_pods.go"
    for name, _, value in constants(pods.read_text()):
        if re.fullmatch(r"[A-Z][A-Za-z]+", value):  # the waiting reasons, not other strings
            reading.add(value, f"pkg/kubelet/kubelet_pods.go {name}", fields)


# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def upstream() -> Reading:
    reading = Reading()
    read_kueue(reading)
    read_trainer(reading)
    read_jobset(reading)
    read_core_v1(reading)
    resolver = Resolver(module("k8s.io/kubernetes"), module("k8s.io/api") / "core/v1")
    read_disruption_targets(reading, resolver)
    read_kubelet_pod_failures(reading, resolver)
    read_kubelet_waiting(reading)
    return reading


def _has_row(found: Found) -> bool:
    for row in TABLE:
        if row.where not in found.fields:
            continue
        for name in row.reasons:
            if name == found.reason and row.prefix == found.prefix:
                return True
            if row.prefix and not found.prefix and found.reason.startswith(name):
                return True
    return False


def test_every_upstream_reason_has_a_row(upstream: Reading) -> None:
    missing = sorted(
        {
            f"{f.reason}{'…' if f.prefix else ''} ({f.origin})"
            for f in upstream.found
            if not _has_row(f)
        }
    )
    assert not missing, (
        "upstream reasons the reason table neither maps nor ignores "
        "(add a row to dispatch_kubeflow/reasons.py):\n  " + "\n  ".join(missing)
    )


def test_every_reason_site_was_read(upstream: Reading) -> None:
    assert not upstream.unresolved, (
        "reason expressions this test cannot resolve (teach its Resolver):\n  "
        + "\n  ".join(upstream.unresolved)
    )


def test_the_reading_finds_the_reasons_the_issue_is_about(upstream: Reading) -> None:
    """A guard against a reader that silently finds nothing."""
    reasons = {f.reason for f in upstream.found}
    assert {
        "Inadmissible",
        "WaitingForQuota",
        "TopologyPlacementFailed",
        "ClusterQueueStopped",
        "NodeFailures",
        "DeactivatedDueToMaximumExecutionTimeExceeded",
        "DeletionByPodGC",
        "TerminationByKubelet",
        "EvictionByEvictionAPI",
        "UnexpectedAdmissionError",
        "OutOf",
        "DeadlineExceeded",
        "FailedJobs",
        "ErrImagePull",
    } <= reasons


def test_messages_the_table_matches_are_still_written(upstream: Reading) -> None:
    sources = {
        "kueue": module("sigs.k8s.io/kueue"),
        "kubelet": module("k8s.io/kubernetes") / "pkg/kubelet",
    }
    texts = {name: _read_tree(folder) for name, folder in sources.items()}
    missing = [
        f"{row.reasons} {row.upstream_text!r}"
        for row in TABLE
        if row.upstream_text is not None and row.upstream_text not in texts[row.source]
    ]
    assert not missing, f"messages no longer written upstream: {missing}"


@cache
def _read_tree(folder: Path) -> str:
    return "\n".join(path.read_text() for path in go_files(folder))
