"""The handlers' pure parts: adapter status from each step, DispatchJob spec mapping, routing."""

from __future__ import annotations

import argparse
import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import kopf
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch_kubeflow.cli import build_parser
from dispatch_kubeflow.constants import FINALIZER, GROUP
from dispatch_kubeflow.errors import ErrInvalid, ErrUnsupported, ForbiddenError, ProbeError
from dispatch_kubeflow.events import DispatchEvent
from dispatch_kubeflow.handlers.adapters import (
    POSTERS,
    forbidden_reason,
    heartbeat_status,
    invalid_status,
    notice_spec_change,
    open_failed_status,
    opening_status,
    parse_spec,
    ready_status,
    watch_blocked_status,
)
from dispatch_kubeflow.handlers.bookkeeping import (
    DIFFBASE_KEY,
    DispatchJobDiffBase,
    ProgressStorage,
    SpecDiffBaseStorage,
)
from dispatch_kubeflow.handlers.jobs import job_spec
from dispatch_kubeflow.handlers.registry import job_events_choice
from dispatch_kubeflow.handlers.reported import event_kind, event_message
from dispatch_kubeflow.handlers.startup import apply_settings

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SPEC: dict[str, Any] = {
    "namespace": "team-a",
    "runtimes": [{"kind": "ClusterTrainingRuntime", "name": "torch"}],
}


def by_type(patch: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in patch["conditions"]}


def test_an_invalid_spec_is_refused_naming_the_pointer_under_spec() -> None:
    with pytest.raises(ErrInvalid, match="/spec/timeouts/request"):
        parse_spec({**SPEC, "timeouts": {"request": "soon"}})


@pytest.mark.parametrize(
    ("spec", "pointer"),
    [({**SPEC, "kueue": None}, "/spec/kueue"), ({**SPEC, "colour": "red"}, "/spec/colour")],
)
def test_a_null_or_unknown_key_reaching_the_operator_is_refused(
    spec: dict[str, Any], pointer: str
) -> None:
    with pytest.raises(ErrInvalid, match=pointer):
        parse_spec(spec)


def test_invalid_status_says_invalid_settings_and_is_not_ready() -> None:
    with pytest.raises(ErrInvalid) as refused:
        parse_spec({**SPEC, "nodeLossWindow": "-1s"})
    patch = invalid_status(refused.value, 4).patch(None, NOW)
    conditions = by_type(patch)
    assert conditions["Valid"] == ("False", "InvalidSettings")
    assert conditions["Ready"] == ("False", "InvalidSettings")
    assert "/spec/nodeLossWindow" in patch["conditions"][0]["message"]
    assert patch["observedGeneration"] == 4
    assert all(c["observedGeneration"] == 4 for c in patch["conditions"])


def test_opening_status_declares_mode_gate_and_durations_as_go_strings() -> None:
    patch = opening_status(parse_spec(SPEC), 1).patch(None, NOW)
    assert patch["mode"] == "plain"
    assert patch["readmissionGate"] == "no"
    assert patch["declarations"] == {
        "nodeLossWindow": "5m0s",
        "callBound": "1m5s",
        "polledLoss": [],
    }
    assert "AdmissionHealthy" not in by_type(patch)


def test_kueue_mode_with_a_check_has_a_gate_and_awaits_the_heartbeat() -> None:
    settings = parse_spec({**SPEC, "kueue": {"localQueue": "lq", "admissionCheck": "gate"}})
    patch = opening_status(settings, 1).patch(None, NOW)
    assert (patch["mode"], patch["readmissionGate"]) == ("kueue", "yes")
    assert by_type(patch)["AdmissionHealthy"] == ("Unknown", "AwaitingHeartbeat")


@pytest.mark.parametrize(
    "error",
    [
        ProbeError("Trainer v2.1 has no runtimePatches"),
        ErrUnsupported("preflight probe: Trainer v2.1 has no runtimePatches"),
    ],
    ids=["ProbeError", "ErrUnsupported-with-prefix"],
)
def test_a_failed_preflight_probe_is_connected_but_not_probed(error: Exception) -> None:
    conditions = by_type(open_failed_status(error, 1).patch(None, NOW))
    assert conditions["Connected"] == ("True", "Connected")
    assert conditions["Probed"] == ("False", "ProbeFailed")
    assert conditions["Ready"] == ("False", "ProbeFailed")


def test_an_unsupported_connection_is_not_a_probe_failure() -> None:
    error = ErrUnsupported("connect: no kubeconfig found")
    conditions = by_type(open_failed_status(error, 1).patch(None, NOW))
    assert conditions["Connected"] == ("False", "Unsupported")
    assert conditions["Probed"] == ("Unknown", "Unsupported")


def test_an_unreachable_cluster_is_not_connected() -> None:
    conditions = by_type(open_failed_status(OSError("connection refused"), 1).patch(None, NOW))
    assert conditions["Connected"] == ("False", "ConnectionFailed")
    assert conditions["Probed"][0] == "Unknown"


def forbidden(verb: str, resource: str) -> ForbiddenError:
    return ForbiddenError(f"{verb} {resource}: forbidden: no", verb=verb, resource=resource)


@pytest.mark.parametrize(
    ("verb", "resource", "reason"),
    [
        ("list", "nodes", "ForbiddenListNodes"),
        ("deletecollection", "trainjobs", "ForbiddenDeletecollectionTrainjobs"),
        ("patch", "dispatchjobs/status", "ForbiddenPatchDispatchjobsStatus"),
    ],
)
def test_a_forbidden_reason_names_the_verb_and_resource(
    verb: str, resource: str, reason: str
) -> None:
    assert forbidden_reason(forbidden(verb, resource)) == reason


def test_a_probe_refused_by_rbac_says_which_verb_and_resource() -> None:
    try:
        raise ProbeError("preflight probe: deleting TrainJobs: forbidden") from forbidden(
            "deletecollection", "trainjobs"
        )
    except ProbeError as error:
        conditions = by_type(open_failed_status(error, 1).patch(None, NOW))
    assert conditions["Connected"] == ("True", "Connected")
    assert conditions["Probed"] == ("False", "ForbiddenDeletecollectionTrainjobs")
    assert conditions["Ready"] == ("False", "ForbiddenDeletecollectionTrainjobs")


def test_a_watch_that_cannot_list_a_kind_is_not_ready_and_says_which() -> None:
    problems = [forbidden("list", "nodes"), ErrUnsupported("cannot list pods: the apiserver 500")]
    patch = watch_blocked_status(problems, 1).patch(None, NOW)
    assert by_type(patch)["Ready"] == ("False", "ForbiddenListNodes")
    message = patch["conditions"][0]["message"]
    assert "list nodes" in message
    assert "cannot list pods" in message


def test_a_watch_blocked_without_a_403_is_cannot_list() -> None:
    patch = watch_blocked_status([ErrUnsupported("cannot list pods: 500")], 1).patch(None, NOW)
    assert by_type(patch)["Ready"] == ("False", "CannotList")


def test_ready_keeps_valid_and_a_plain_adapter_drops_a_stale_admission_condition() -> None:
    opened = opening_status(parse_spec({**SPEC, "kueue": {"localQueue": "lq"}}), 1)
    before = opened.patch(None, NOW)
    after_change = opening_status(parse_spec(SPEC), 2).patch(before, NOW)
    assert "AdmissionHealthy" not in by_type(after_change)
    ready = ready_status(2).patch(after_change, NOW)
    assert by_type(ready)["Valid"] == ("True", "Parsed")
    assert by_type(ready)["Ready"] == ("True", "Watching")


def test_heartbeat_sets_admission_healthy() -> None:
    event = DispatchEvent.model_validate(
        {"type": "AdmissionHeartbeat", "time": NOW, "gate": "closed", "reason": "LeaseExpired"}
    )
    assert by_type(heartbeat_status(event, 1).patch(None, NOW)) == {
        "AdmissionHealthy": ("False", "LeaseExpired")
    }


def test_a_dispatchjob_spec_maps_onto_the_library_jobspec() -> None:
    job = job_spec(
        "train",
        {
            "adapter": "a",
            "attempt": 3,
            "runtime": {"kind": "TrainingRuntime", "name": "r"},
            "image": "img",
            "command": ["python"],
            "args": ["-c", "1"],
            "env": [{"name": "A", "value": "1"}],
            "numNodes": 4,
            "gpusPerNode": 8,
            "activeDeadlineSeconds": 60,
        },
    )
    assert (job.job_id, job.attempt, job.num_nodes, job.gpus_per_node) == ("train", 3, 4, 8)
    assert job.runtime is not None
    assert job.runtime.name == "r"
    assert job.env[0].name == "A"
    assert job.active_deadline_seconds == 60


def test_a_bad_job_id_is_refused_as_invalid() -> None:
    with pytest.raises(ErrInvalid, match="RFC 1035"):
        job_spec("9-starts-with-a-digit", {"adapter": "a"})


@pytest.mark.parametrize(
    ("event", "kind"),
    [
        ({"type": "Running", "state": "Running"}, "Normal"),
        ({"type": "Finished", "state": "Succeeded"}, "Normal"),
        ({"type": "Finished", "state": "Failed", "cause": "ProgramError"}, "Warning"),
        ({"type": "NodeLost", "state": "Running"}, "Warning"),
    ],
)
def test_kubernetes_event_type_follows_the_outcome(event: dict[str, Any], kind: str) -> None:
    assert event_kind(event) == kind


def test_event_message_names_attempt_state_and_cause() -> None:
    message = event_message(
        {"attempt": 2, "state": "Failed", "cause": "OutOfMemory", "message": "OOMKilled"}
    )
    assert message == "attempt 2: Failed (OutOfMemory): OOMKilled"


async def test_a_new_generation_ends_the_running_session() -> None:
    changed = kopf.Memo()
    flag = asyncio.Event()
    changed.spec_changed = flag
    changed.serving_generation = 1
    # kopf's decorator types the handler as its callback protocol; called here as plain code.
    handler: Any = notice_spec_change
    await handler(body=kopf.Body(cast(kopf.RawBody, {"metadata": {"generation": 1}})), memo=changed)
    assert not flag.is_set()
    await handler(body=kopf.Body(cast(kopf.RawBody, {"metadata": {"generation": 2}})), memo=changed)
    assert flag.is_set()


def test_kopf_bookkeeping_uses_the_project_prefix_and_finalizer() -> None:
    settings = kopf.OperatorSettings()
    apply_settings(settings)
    assert settings.persistence.finalizer == FINALIZER
    progress = settings.persistence.progress_storage
    diffbase = settings.persistence.diffbase_storage
    assert isinstance(progress, kopf.AnnotationsProgressStorage)
    assert isinstance(diffbase, DispatchJobDiffBase)
    assert progress.prefix == GROUP
    assert diffbase.prefix == GROUP
    assert settings.peering.standalone is True


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
ANNOTATION_KEYS = st.sampled_from(
    [
        f"{GROUP}/{DIFFBASE_KEY}",
        f"{GROUP}/other",
        "team/a",
        "kubectl.kubernetes.io/last-applied-configuration",
    ]
)


@given(
    spec=st.dictionaries(st.sampled_from(["attempt", "readmit", "image"]), JSON_VALUES, max_size=3),
    status=st.dictionaries(st.sampled_from(["state", "events"]), JSON_VALUES, max_size=2),
    labels=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3),
    annotations=st.dictionaries(ANNOTATION_KEYS, st.text(max_size=5), max_size=4),
    extra=st.dictionaries(st.sampled_from(["data", "spec2"]), JSON_VALUES, max_size=2),
    fields=st.lists(
        st.sampled_from(
            [
                ("spec", "attempt"),
                "spec.readmit",
                ("status", "state"),
                ("metadata", "name"),
                ("metadata", "labels"),
                ("data",),
            ]
        ),
        max_size=3,
    ),
)
def test_the_lean_diffbase_builds_the_essence_kopf_builds(
    spec: Any, status: Any, labels: Any, annotations: Any, extra: Any, fields: Any
) -> None:
    body = {
        "apiVersion": "x/v1",
        "kind": "DispatchJob",
        "metadata": {
            "name": "a",
            "labels": labels,
            "annotations": annotations,
            "managedFields": [{"manager": "kopf"}],
        },
        "spec": spec,
        "status": status,
        **extra,
    }
    kopfs = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key=DIFFBASE_KEY)
    lean = SpecDiffBaseStorage(prefix=GROUP, key=DIFFBASE_KEY)
    wrapped = kopf.Body(cast(kopf.RawBody, body))
    assert lean.build(body=wrapped, extra_fields=fields) == kopfs.build(
        body=wrapped, extra_fields=fields
    )


def dispatch_job(
    spec: dict[str, Any],
    status: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
    uid: str = "u1",
    **metadata: Any,
) -> kopf.Body:
    body = {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "DispatchJob",
        "metadata": {"name": "a", "uid": uid, "annotations": annotations or {}, **metadata},
        "spec": {"adapter": "ad", "image": "i:1", **spec},
        "status": status or {},
    }
    return kopf.Body(cast(kopf.RawBody, body))


def handled(diffbase: DispatchJobDiffBase, body: kopf.Body) -> kopf.Patch:
    """kopf marking the current spec handled; the patch it would write."""
    patch = kopf.Patch()
    diffbase.store(body=body, patch=patch, essence=diffbase.build(body=body))
    return patch


def test_a_job_never_started_has_no_diffbase_and_its_creation_writes_none() -> None:
    diffbase = DispatchJobDiffBase(prefix=GROUP, key=DIFFBASE_KEY)
    created = dispatch_job({"attempt": 1})
    assert diffbase.fetch(body=created) is None  # kopf: a creation
    assert not handled(diffbase, created)  # nothing to write
    # Later events, before the status shows the start: nothing changed.
    assert diffbase.fetch(body=created) == diffbase.build(body=created)
    started = dispatch_job({"attempt": 1}, {"attempt": 1, "trainJob": "a-1"})
    assert diffbase.fetch(body=started) == diffbase.build(body=started)
    assert len(diffbase) == 0  # the status tells it now


def test_a_started_job_is_unchanged_after_a_restart_and_a_raised_attempt_is_an_update() -> None:
    diffbase = DispatchJobDiffBase(prefix=GROUP, key=DIFFBASE_KEY)  # a new process
    started = dispatch_job({}, {"attempt": 1})
    assert diffbase.fetch(body=started) == diffbase.build(body=started)
    raised = dispatch_job({"attempt": 2}, {"attempt": 1, "state": "Failed"})
    old = diffbase.fetch(body=raised)
    assert old is not None
    assert old["spec"]["attempt"] == 1
    assert {**old["spec"], "attempt": 2} == diffbase.build(body=raised)["spec"]
    assert not handled(diffbase, raised)
    assert diffbase.fetch(body=raised) == diffbase.build(body=raised)  # handed over
    recorded = dispatch_job({"attempt": 2}, {"attempt": 2})
    assert diffbase.fetch(body=recorded) == diffbase.build(body=recorded)
    assert len(diffbase) == 0


def test_a_job_reported_without_an_attempt_counts_as_started() -> None:
    diffbase = DispatchJobDiffBase(prefix=GROUP, key=DIFFBASE_KEY)
    reported = dispatch_job({"attempt": 3}, {"reported": {"3": "{}"}})
    assert diffbase.fetch(body=reported) == diffbase.build(body=reported)


def test_readmit_and_reject_are_updates_and_once_handled_kept_in_the_annotation() -> None:
    diffbase = DispatchJobDiffBase(prefix=GROUP, key=DIFFBASE_KEY)
    readmitted = dispatch_job({"readmit": 1}, {"attempt": 1})
    old = diffbase.fetch(body=readmitted)
    assert old is not None
    assert "readmit" not in old["spec"]
    patch = handled(diffbase, readmitted)
    written = patch["metadata"]["annotations"][f"{GROUP}/{DIFFBASE_KEY}"]
    annotated = dispatch_job(
        {"readmit": 1}, {"attempt": 1}, annotations={f"{GROUP}/{DIFFBASE_KEY}": written}
    )
    assert diffbase.fetch(body=annotated) == diffbase.build(body=annotated)
    rejected = dispatch_job(
        {"readmit": 1, "reject": "no"},
        {"attempt": 1},
        annotations={f"{GROUP}/{DIFFBASE_KEY}": written},
    )
    old = diffbase.fetch(body=rejected)
    assert old is not None
    assert "reject" not in old["spec"]
    assert handled(diffbase, rejected)  # the annotation, kept as kopf keeps it


def test_a_job_with_kopfs_annotation_and_other_kinds_keep_the_annotation() -> None:
    diffbase = DispatchJobDiffBase(prefix=GROUP, key=DIFFBASE_KEY)
    essence = '{"spec":{"adapter":"ad","attempt":1,"image":"i:1"}}'
    legacy = dispatch_job({"attempt": 2}, {}, annotations={f"{GROUP}/{DIFFBASE_KEY}": essence})
    old = diffbase.fetch(body=legacy)
    assert old is not None
    assert old["spec"]["attempt"] == 1
    assert handled(diffbase, legacy)
    adapter = kopf.Body(
        cast(
            kopf.RawBody,
            {
                "apiVersion": f"{GROUP}/v1alpha1",
                "kind": "KubeflowAdapter",
                "metadata": {"name": "ad", "uid": "u2"},
                "spec": {"namespace": "n"},
            },
        )
    )
    assert diffbase.fetch(body=adapter) is None
    assert handled(diffbase, adapter)


def test_handed_over_attempts_are_forgotten_once_deleted_or_beyond_the_limit() -> None:
    diffbase = DispatchJobDiffBase(prefix=GROUP, key=DIFFBASE_KEY, kept=2)
    for uid in ("u1", "u2", "u3"):
        handled(diffbase, dispatch_job({}, uid=uid))
    assert len(diffbase) == 2
    assert diffbase.fetch(body=dispatch_job({}, uid="u1")) is None  # forgotten: the oldest
    deleted = dispatch_job({}, uid="u2", deletionTimestamp="2026-01-01T00:00:00Z")
    assert diffbase.fetch(body=deleted) is not None
    assert len(diffbase) == 1


def test_kopfs_marker_is_written_with_progress_and_never_alone() -> None:
    progress = ProgressStorage(prefix=GROUP)
    body = dispatch_job({})
    done = kopf.Patch()
    progress.store(key=kopf.HandlerId("start_job"), record={"success": True}, body=body, patch=done)
    progress.purge(key=kopf.HandlerId("start_job"), body=body, patch=done)
    assert not done  # handled at once: nothing to write
    retried = kopf.Patch()
    progress.store(key=kopf.HandlerId("start_job"), record={"retries": 1}, body=body, patch=retried)
    assert retried["metadata"]["annotations"][f"{GROUP}/kopf-managed"] == "yes"
    marked = dispatch_job(
        {}, annotations={f"{GROUP}/kopf-managed": "yes", f"{GROUP}/start_job": "{}"}
    )
    purged = kopf.Patch()
    progress.purge(key=kopf.HandlerId("start_job"), body=marked, patch=purged)
    assert purged == {"metadata": {"annotations": {f"{GROUP}/start_job": None}}}


def test_run_command_parses_its_options() -> None:
    args: argparse.Namespace = build_parser().parse_args(
        ["run", "-n", "a", "-n", "b", "--events-to", "stderr", "--liveness", "http://x/healthz"]
    )
    assert args.namespaces == ["a", "b"]
    assert args.events_to == "stderr"
    assert args.liveness == "http://x/healthz"
    assert args.log_format == "json"
    assert args.job_events == "all"
    chosen = build_parser().parse_args(["run", "--job-events", "warnings"])
    assert chosen.job_events == "warnings"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--job-events", "some"])


@pytest.mark.parametrize(
    ("choice", "posted"),
    [("all", ["Normal", "Warning"]), ("warnings", ["Warning"]), ("none", [])],
)
def test_job_events_choose_which_dispatch_events_become_kubernetes_events(
    choice: str, posted: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    monkeypatch.setattr(kopf, "event", lambda *_, type, **__: seen.append(type))
    body = {"metadata": {"name": "a", "namespace": "n"}}
    for kind in ("Normal", "Warning"):
        POSTERS[choice](body, kind, "Running", "attempt 1: Running")
    assert seen == posted


def test_a_job_events_environment_value_outside_the_choices_is_refused() -> None:
    assert job_events_choice(None) == "all"
    assert job_events_choice("none") == "none"
    with pytest.raises(ValueError, match=r"DISPATCH_KUBEFLOW_JOB_EVENTS='some' is not one of all"):
        job_events_choice("some")
