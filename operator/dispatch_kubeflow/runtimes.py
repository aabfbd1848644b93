"""The runtime rules (SPEC §5): which Trainer runtimes the adapter will run a dispatch job on.

A dispatch job's ranks must not be rerun under the same identity behind dispatch's back, and the
trainer container must be findable by name, so a runtime is checked before every start. Checking
is pure: it reads the runtime object the adapter fetched and raises ``ErrUnsupported`` naming
the runtime and the rule it breaks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dispatch_kubeflow.constants import TRAINER_NODE
from dispatch_kubeflow.errors import ErrUnsupported, RuntimeUnsupportedError
from dispatch_kubeflow.kube.objects import dig, mappings
from dispatch_kubeflow.settings import RuntimeRef, Settings
from dispatch_kubeflow.trainjob import publish_init_container

Refusal = Callable[[str], ErrUnsupported]

# JobSet failure-policy actions that restart even when maxRestarts is 0.
RESTARTS_IGNORING_MAX = ("RestartJobSetAndIgnoreMaxRestarts", "RestartJobAndIgnoreMaxRestarts")


def describe(ref: RuntimeRef) -> str:
    return f"{ref.kind} {ref.name!r}"


def check_runtime(runtime: Mapping[str, Any], ref: RuntimeRef, settings: Settings) -> None:
    """Raise ``ErrUnsupported`` when ``runtime`` (the object ``ref`` names) breaks a rule."""

    def refuse(rule: str) -> ErrUnsupported:
        return RuntimeUnsupportedError(f"runtime {describe(ref)} is refused: {rule}")

    jobset_spec = dig(runtime, "spec", "template", "spec")
    node_job = _named(dig(jobset_spec, "replicatedJobs"), TRAINER_NODE)
    if node_job is None:
        raise refuse(f"its JobSet template has no replicatedJob named {TRAINER_NODE!r}")
    job_spec = dig(node_job, "template", "spec")
    pod_spec = dig(job_spec, "template", "spec")
    if _named(dig(pod_spec, "containers"), TRAINER_NODE) is None:
        raise refuse(
            f"the pod template of replicatedJob {TRAINER_NODE!r} has no container named "
            f"{TRAINER_NODE!r}"
        )
    if not settings.allow_rank_restart:
        _check_no_rank_restart(job_spec, pod_spec, jobset_spec, refuse)
    if settings.publish is not None and settings.publish.via == "initContainer":
        _check_publish_init_container(pod_spec, settings, refuse)


def _check_no_rank_restart(job_spec: Any, pod_spec: Any, jobset_spec: Any, refuse: Refusal) -> None:
    suffix = " (or set allowRankRestart)"
    backoff_limit = dig(job_spec, "backoffLimit")
    if backoff_limit != 0:
        raise refuse(
            f"replicatedJob {TRAINER_NODE!r} must set backoffLimit: 0 explicitly, it has "
            f"{_shown(backoff_limit)}{suffix}"
        )
    per_index = dig(job_spec, "backoffLimitPerIndex")
    if per_index not in (None, 0):
        raise refuse(
            f"replicatedJob {TRAINER_NODE!r} sets backoffLimitPerIndex "
            f"{per_index}, which reruns a failed rank{suffix}"
        )
    for rule in mappings(dig(job_spec, "podFailurePolicy", "rules")):
        if rule.get("action") == "Ignore":
            raise refuse(
                f"replicatedJob {TRAINER_NODE!r} has a podFailurePolicy rule with action "
                f"Ignore, which reruns a failed rank{suffix}"
            )
    restart_policy = dig(pod_spec, "restartPolicy")
    if restart_policy != "Never":
        raise refuse(
            f"the pod template of replicatedJob {TRAINER_NODE!r} must set restartPolicy: Never "
            f"explicitly, it has {_shown(restart_policy)}{suffix}"
        )
    failure_policy = dig(jobset_spec, "failurePolicy")
    max_restarts = dig(failure_policy, "maxRestarts")
    if max_restarts not in (None, 0):
        raise refuse(
            f"its JobSet failurePolicy allows maxRestarts: {max_restarts}, it must be absent "
            f"or 0{suffix}"
        )
    for rule in mappings(dig(failure_policy, "rules")):
        if rule.get("action") in RESTARTS_IGNORING_MAX:
            raise refuse(
                f"its JobSet failurePolicy rule {rule.get('name', '(unnamed)')!r} has action "
                f"{rule['action']}, which restarts whatever maxRestarts says{suffix}"
            )


def _check_publish_init_container(pod_spec: Any, settings: Settings, refuse: Refusal) -> None:
    assert settings.publish is not None
    name = publish_init_container(settings)
    container = _named(dig(pod_spec, "initContainers"), name)
    if container is None:
        raise refuse(
            f"publish.via is initContainer, but the pod template of replicatedJob "
            f"{TRAINER_NODE!r} defines no init container named {name!r}"
        )
    if container.get("image") != settings.publish.image:
        raise refuse(
            f"init container {name!r} must use exactly the publish image "
            f"{settings.publish.image!r}, it uses {_shown(container.get('image'))}"
        )


def _named(items: Any, name: str) -> Mapping[str, Any] | None:
    if not isinstance(items, Sequence):
        return None
    for item in items:
        if isinstance(item, Mapping) and item.get("name") == name:
            return item
    return None


def _shown(value: Any) -> str:
    return "none" if value is None else repr(value)
