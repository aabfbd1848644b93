"""The preflight probe's objects belong to no job (issue 12, item 16)."""

from __future__ import annotations

from typing import Any

from dispatch_kubeflow.constants import (
    KIND_TRAINJOB,
    LABEL_ADAPTER,
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_PROBE,
)
from dispatch_kubeflow.index import JobIndex, job_key
from dispatch_kubeflow.kube.informer import Change

LABELS = {LABEL_ADAPTER: "a", LABEL_JOB: "dispatch-probe-0a1b2c3d", LABEL_ATTEMPT: "1"}


def trainjob(labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "dispatch-probe-0a1b2c3d-1", "uid": "u1", "labels": labels}}


def test_item16_the_probes_objects_have_no_job_key() -> None:
    assert job_key(trainjob(LABELS)) == ("dispatch-probe-0a1b2c3d", 1)
    assert job_key(trainjob({**LABELS, LABEL_PROBE: "true"})) is None


def test_item16_the_index_keeps_no_job_for_the_probe() -> None:
    index = JobIndex()
    change = Change(KIND_TRAINJOB, "ADDED", trainjob({**LABELS, LABEL_PROBE: "true"}))
    assert index.apply(change) == set()
    assert index.job_keys() == set()
