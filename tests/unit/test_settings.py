"""Every rule and default of the settings object, each refusal with its exact JSON pointer."""

from __future__ import annotations

import copy
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from dispatch_kubeflow.errors import ErrInvalid
from dispatch_kubeflow.gotime import Duration
from dispatch_kubeflow.settings import (
    AdmissionLease,
    Cluster,
    InvalidSettings,
    Kueue,
    RuntimeRef,
    Settings,
    go_path_clean,
    json_pointer,
    parse_settings,
    parse_settings_object,
)
from dispatch_kubeflow.settings.refusals import MESSAGE_MAX, POINTER_SHOWN_MAX

DIGEST = "0123456789abcdef" * 4
IMAGE = f"registry.example/dispatch-publish@sha256:{DIGEST}"
RUNTIME = {"kind": "ClusterTrainingRuntime", "name": "torch-distributed"}

# The seed's example, kept as examples/settings.json.
EXAMPLE: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "examples/settings.json").read_text()
)

MINIMAL: dict[str, Any] = {"namespace": "team-a", "runtimes": [RUNTIME]}


def parse(document: Any) -> Settings:
    return parse_settings(json.dumps(document))


def with_value(path: str, value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """``base`` (the minimal document) with the value at the slash-separated ``path`` set."""
    document = copy.deepcopy(MINIMAL if base is None else base)
    *parents, last = path.strip("/").split("/")
    node: Any = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node.setdefault(part, {})
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return document


def shown_pointer(pointer: str) -> str:
    """The pointer as a message shows a printable one: whole, or cut with an ellipsis."""
    if len(pointer) <= POINTER_SHOWN_MAX:
        return pointer
    return pointer[: POINTER_SHOWN_MAX - 1] + "\u2026"


def refusal(data: str | bytes) -> InvalidSettings:
    with pytest.raises(InvalidSettings) as info:
        parse_settings(data)
    message = str(info.value)
    assert "\n" not in message
    assert len(message) <= MESSAGE_MAX
    assert isinstance(info.value, ErrInvalid)
    assert shown_pointer(info.value.pointer) in message
    return info.value


def assert_refused(document: Any, pointer: str, rule: str) -> None:
    error = refusal(json.dumps(document))
    assert (error.pointer, rule in error.rule) == (pointer, True), str(error)


class TestTheSeedsExample:
    def test_parses_to_the_values_it_states(self) -> None:
        settings = parse(EXAMPLE)
        assert settings.namespace == "team-a"
        assert settings.cluster == Cluster(kubeconfig="/home/u/.kube/config", context="train")
        assert settings.runtimes == (
            RuntimeRef(kind="ClusterTrainingRuntime", name="torch-distributed"),
        )
        assert settings.kueue == Kueue(
            local_queue="lq",
            priority_class="low",
            admission_check="dispatch-admission",
            admission_lease=AdmissionLease(namespace="dispatch-system", name="dispatch-admission"),
        )
        assert dict(settings.labels) == {"team": "a"}
        assert dict(settings.annotations) == {"cost-centre": "42"}
        assert settings.credentials[0].mount_path == "/var/run/secrets/s3"
        assert settings.node_loss_window == timedelta(minutes=5)
        assert settings.node_loss_taints == ("example.com/node-dead",)
        assert settings.timeouts.stop_job == timedelta(minutes=10)
        assert settings.publish is not None
        assert (settings.publish.via, settings.publish.init_container) == ("imageVolume", None)
        assert settings.kueue_mode
        assert settings.readmission_gate == "yes"

    def test_declarations(self) -> None:
        declarations = parse(EXAMPLE).declarations()
        assert declarations.node_loss_window == timedelta(minutes=5)
        assert declarations.call_bound == timedelta(seconds=65)
        assert declarations.polled_loss == ()
        assert declarations.model_dump(mode="json", by_alias=True) == {
            "nodeLossWindow": "5m0s",
            "callBound": "1m5s",
            "polledLoss": [],
        }

    def test_bytes_and_text_parse_alike(self) -> None:
        text = json.dumps(EXAMPLE)
        assert parse_settings(text.encode()) == parse_settings(text)


class TestDefaults:
    def test_every_default_of_a_minimal_document(self) -> None:
        settings = parse(MINIMAL)
        assert settings.cluster == Cluster(kubeconfig=None, context=None, in_cluster=False)
        assert settings.probe_runtime == settings.runtimes[0]
        assert settings.kueue is None
        assert not settings.kueue_mode
        assert settings.readmission_gate == "no"
        assert dict(settings.labels) == {}
        assert dict(settings.annotations) == {}
        assert settings.gpu_resource == "nvidia.com/gpu"
        assert settings.credentials == ()
        assert settings.node_loss_window == timedelta(minutes=5)
        assert settings.node_loss_taints == ()
        assert settings.allow_rank_restart is False
        assert settings.timeouts.request == timedelta(seconds=30)
        assert settings.timeouts.apiserver_request == timedelta(seconds=60)
        assert settings.timeouts.workload == timedelta(seconds=60)
        assert settings.timeouts.stop_job == timedelta(minutes=10)
        assert settings.publish is None
        assert settings.declarations().call_bound == timedelta(seconds=65)

    def test_probe_runtime_is_the_first_of_runtimes(self) -> None:
        second = {"kind": "TrainingRuntime", "name": "second"}
        settings = parse(with_value("/runtimes", [second, RUNTIME]))
        assert settings.probe_runtime == RuntimeRef(kind="TrainingRuntime", name="second")

    def test_probe_runtime_alone_allows_any_runtime(self) -> None:
        settings = parse({"namespace": "a", "probeRuntime": RUNTIME})
        assert settings.runtimes == ()
        assert settings.probe_runtime.name == "torch-distributed"

    def test_probe_runtime_need_not_be_one_of_runtimes(self) -> None:
        other = {"kind": "TrainingRuntime", "name": "elsewhere"}
        settings = parse(with_value("/probeRuntime", other))
        assert settings.probe_runtime.name == "elsewhere"

    def test_admission_lease_default_under_kueue(self) -> None:
        settings = parse(with_value("/kueue", {"localQueue": "lq"}))
        assert settings.kueue is not None
        assert settings.kueue.admission_lease == AdmissionLease(
            namespace="dispatch-system", name="dispatch-admission"
        )
        assert settings.kueue.priority_class is None
        assert settings.kueue.admission_check is None
        assert settings.kueue_mode
        assert settings.readmission_gate == "no"

    def test_publish_via_defaults_to_image_volume(self) -> None:
        publish = parse(with_value("/publish", {"image": IMAGE})).publish
        assert publish is not None
        assert (publish.via, publish.init_container) == ("imageVolume", None)

    def test_init_container_defaults_under_via_init_container(self) -> None:
        publish = parse(with_value("/publish", {"image": IMAGE, "via": "initContainer"})).publish
        assert publish is not None
        assert publish.init_container == "dispatch-publish"

    def test_init_container_given(self) -> None:
        document = with_value(
            "/publish", {"image": IMAGE, "via": "initContainer", "initContainer": "fill"}
        )
        publish = parse(document).publish
        assert publish is not None
        assert publish.init_container == "fill"

    def test_partial_timeouts_keep_the_other_defaults(self) -> None:
        timeouts = parse(with_value("/timeouts", {"request": "5s"})).timeouts
        assert timeouts.request == timedelta(seconds=5)
        assert timeouts.stop_job == timedelta(minutes=10)

    def test_call_bound_is_apiserver_request_plus_five_seconds(self) -> None:
        settings = parse(with_value("/timeouts/apiserverRequest", "2m"))
        assert settings.declarations().call_bound == timedelta(seconds=125)

    def test_document_output_has_every_default_and_go_durations(self) -> None:
        document = parse(MINIMAL).to_document()
        assert document == {
            "namespace": "team-a",
            "cluster": {"inCluster": False},
            "runtimes": [RUNTIME],
            "probeRuntime": RUNTIME,
            "labels": {},
            "annotations": {},
            "gpuResource": "nvidia.com/gpu",
            "credentials": [],
            "nodeLossWindow": "5m0s",
            "nodeLossTaints": [],
            "allowRankRestart": False,
            "timeouts": {
                "request": "30s",
                "apiserverRequest": "1m0s",
                "workload": "1m0s",
                "stopJob": "10m0s",
            },
        }

    def test_document_output_parses_back_to_equal_settings(self) -> None:
        settings = parse(EXAMPLE)
        assert parse(settings.to_document()) == settings


class TestTheModelIsImmutable:
    def test_fields_cannot_be_set(self) -> None:
        settings = parse(EXAMPLE)
        with pytest.raises(ValidationError):
            settings.namespace = "other"  # type: ignore[misc]

    def test_labels_cannot_be_changed(self) -> None:
        settings = parse(EXAMPLE)
        with pytest.raises(TypeError):
            settings.labels["team"] = "b"  # type: ignore[index]

    def test_settings_are_hashable(self) -> None:
        assert hash(parse(EXAMPLE)) == hash(parse(EXAMPLE))

    def test_durations_are_timedeltas(self) -> None:
        settings = parse(with_value("/nodeLossWindow", "1h30m"))
        assert isinstance(settings.node_loss_window, timedelta)
        assert settings.node_loss_window == timedelta(hours=1, minutes=30)


class TestDocumentLevelRefusals:
    def test_unknown_top_level_key(self) -> None:
        assert_refused(with_value("/namespaces", "a"), "/namespaces", "unknown key")

    @pytest.mark.parametrize(
        "path",
        [
            "/cluster/kubeConfig",
            "/kueue/admissionLease/namespaces",
            "/runtimes/0/extra",
            "/credentials/0/readOnly",
            "/timeouts/stop",
            "/publish/route",
        ],
    )
    def test_unknown_key_at_every_level(self, path: str) -> None:
        base = copy.deepcopy(EXAMPLE)
        document = with_value(path, "x", base)
        assert_refused(document, path, "unknown key")

    def test_snake_case_field_names_are_unknown_keys(self) -> None:
        assert_refused(with_value("/probe_runtime", RUNTIME), "/probe_runtime", "unknown key")

    def test_duplicate_top_level_key_names_the_later(self) -> None:
        error = refusal('{"namespace": "a", "runtimes": [], "namespace": "b"}')
        assert (error.pointer, error.rule) == ("/namespace", 'duplicate key "namespace"')

    def test_duplicate_nested_key(self) -> None:
        text = (
            '{"namespace": "a",'
            ' "probeRuntime": {"kind": "TrainingRuntime", "name": "x", "name": "y"}}'
        )
        assert refusal(text).pointer == "/probeRuntime/name"

    def test_duplicate_key_inside_an_array_item(self) -> None:
        text = (
            '{"namespace": "a", "probeRuntime": {"kind": "TrainingRuntime", "name": "x"},'
            ' "credentials": [{"secretName": "s", "secretName": "t", "mountPath": "/a"}]}'
        )
        assert refusal(text).pointer == "/credentials/0/secretName"

    def test_duplicate_label_key_is_escaped(self) -> None:
        text = (
            '{"namespace": "a", "probeRuntime": {"kind": "TrainingRuntime", "name": "x"},'
            ' "labels": {"a.b/c": "1", "a.b/c": "2"}}'
        )
        assert refusal(text).pointer == "/labels/a.b~1c"

    @pytest.mark.parametrize(
        "path",
        [
            "/namespace",
            "/cluster",
            "/cluster/kubeconfig",
            "/cluster/context",
            "/cluster/inCluster",
            "/runtimes",
            "/runtimes/0",
            "/runtimes/0/name",
            "/probeRuntime",
            "/kueue",
            "/kueue/priorityClass",
            "/kueue/admissionCheck",
            "/kueue/admissionLease",
            "/labels",
            "/labels/team",
            "/annotations/cost-centre",
            "/gpuResource",
            "/credentials/0/mountPath",
            "/nodeLossWindow",
            "/nodeLossTaints/0",
            "/allowRankRestart",
            "/timeouts",
            "/timeouts/workload",
            "/publish",
            "/publish/via",
        ],
    )
    def test_null_anywhere(self, path: str) -> None:
        document = with_value(path, None, copy.deepcopy(EXAMPLE))
        assert_refused(document, path, "null is not allowed")

    def test_null_optional_key_does_not_take_the_default(self) -> None:
        assert_refused(with_value("/kueue", None), "/kueue", "null is not allowed")

    def test_trailing_data(self) -> None:
        error = refusal(json.dumps(MINIMAL) + ' {"x": 1}')
        assert (error.pointer, "trailing data" in error.rule) == ("", True)

    def test_trailing_whitespace_is_fine(self) -> None:
        assert parse_settings(json.dumps(MINIMAL) + "\n\t ").namespace == "team-a"

    @pytest.mark.parametrize("text", ["", "{", '{"namespace": "a",}', "{'namespace': 'a'}"])
    def test_not_json(self, text: str) -> None:
        assert "not valid JSON" in refusal(text).rule

    @pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
    def test_non_json_number_constants(self, constant: str) -> None:
        assert "not valid JSON" in refusal('{"namespace": ' + constant + "}").rule

    @pytest.mark.parametrize("text", ["[]", '"settings"', "1", "true", "null"])
    def test_top_level_must_be_an_object(self, text: str) -> None:
        assert refusal(text).pointer == ""

    def test_not_utf8(self) -> None:
        assert "UTF-8" in refusal(b'{"namespace": "\xff"}').rule

    def test_byte_order_mark(self) -> None:
        assert "not valid JSON" in refusal("\ufeff" + json.dumps(MINIMAL)).rule


class TestNoCoercion:
    @pytest.mark.parametrize(
        ("path", "value", "rule"),
        [
            ("/allowRankRestart", "false", "must be a boolean, not a string"),
            ("/allowRankRestart", 0, "must be a boolean, not a number"),
            ("/cluster/inCluster", "true", "must be a boolean"),
            ("/namespace", 1, "must be a string, not a number"),
            ("/namespace", True, "must be a string, not a boolean"),
            ("/cluster/kubeconfig", 1.0, "must be a string, not a number"),
            ("/nodeLossWindow", 300, "must be a Go duration string"),
            ("/timeouts/request", 30.5, "must be a Go duration string"),
            ("/cluster", "in-cluster", "must be an object, not a string"),
            ("/cluster", [], "must be an object, not an array"),
            ("/kueue", "lq", "must be an object"),
            ("/labels", [], "must be an object"),
            ("/labels/team", 1, "must be a string, not a number"),
            ("/annotations/cost-centre", 42, "must be a string, not a number"),
            ("/runtimes", RUNTIME, "must be an array, not an object"),
            ("/credentials", {}, "must be an array"),
            ("/nodeLossTaints", "example.com/x", "must be an array"),
            ("/nodeLossTaints/0", 1, "must be a string"),
            ("/runtimes/0", "torch", "must be an object"),
            ("/timeouts", "30s", "must be an object"),
            ("/publish", IMAGE, "must be an object"),
        ],
    )
    def test_wrong_types(self, path: str, value: Any, rule: str) -> None:
        assert_refused(with_value(path, value, copy.deepcopy(EXAMPLE)), path, rule)


class TestRequired:
    def test_namespace(self) -> None:
        assert_refused({"runtimes": [RUNTIME]}, "/namespace", "is required")

    def test_runtimes_or_probe_runtime(self) -> None:
        assert_refused({"namespace": "a"}, "/probeRuntime", "required when runtimes is absent")

    def test_explicit_empty_runtimes_without_probe_runtime(self) -> None:
        assert_refused(with_value("/runtimes", []), "/probeRuntime", "required when runtimes")

    def test_empty_runtimes_with_probe_runtime_is_fine(self) -> None:
        settings = parse({"namespace": "a", "runtimes": [], "probeRuntime": RUNTIME})
        assert settings.runtimes == ()

    @pytest.mark.parametrize(
        ("document", "pointer"),
        [
            (with_value("/kueue", {"priorityClass": "low"}), "/kueue/localQueue"),
            (
                with_value("/kueue", {"localQueue": "lq", "admissionLease": {"name": "l"}}),
                "/kueue/admissionLease/namespace",
            ),
            (
                with_value("/kueue", {"localQueue": "lq", "admissionLease": {"namespace": "n"}}),
                "/kueue/admissionLease/name",
            ),
            (with_value("/credentials", [{"mountPath": "/a"}]), "/credentials/0/secretName"),
            (with_value("/credentials", [{"secretName": "s"}]), "/credentials/0/mountPath"),
            (with_value("/publish", {"via": "imageVolume"}), "/publish/image"),
            (with_value("/runtimes", [{"kind": "TrainingRuntime"}]), "/runtimes/0/name"),
            (with_value("/runtimes", [{"name": "x"}]), "/runtimes/0/kind"),
            (with_value("/probeRuntime", {"name": "x"}), "/probeRuntime/kind"),
        ],
    )
    def test_required_keys(self, document: dict[str, Any], pointer: str) -> None:
        assert_refused(document, pointer, "is required")


LONG_LABEL = "a" * 64


class TestNames:
    @pytest.mark.parametrize("value", ["team-a", "a", "0", "a" * 63, "a-0-b"])
    def test_namespace_accepts_rfc1123_labels(self, value: str) -> None:
        assert parse(with_value("/namespace", value)).namespace == value

    @pytest.mark.parametrize(
        "value", ["", "Team-a", "team_a", "-a", "a-", "a.b", LONG_LABEL, "a b", "é"]
    )
    def test_namespace_refuses_others(self, value: str) -> None:
        assert_refused(with_value("/namespace", value), "/namespace", "RFC 1123 label")

    @pytest.mark.parametrize("path", ["/runtimes/0/name", "/probeRuntime/name"])
    @pytest.mark.parametrize("value", ["", "Torch", "a_b", "a..b", "-a", "a.-b", "a" * 254])
    def test_runtime_names_are_object_names(self, path: str, value: str) -> None:
        document = with_value(path, value, with_value("/probeRuntime", dict(RUNTIME)))
        assert_refused(document, path, "Kubernetes object name")

    @pytest.mark.parametrize("value", ["a.b.c", "torch-2.1", "a" * 253, ("a" * 63 + ".") * 3 + "a"])
    def test_runtime_names_accept_subdomains(self, value: str) -> None:
        document = with_value("/runtimes/0/name", value)
        assert parse(document).runtimes[0].name == value

    def test_runtime_kind(self) -> None:
        document = with_value("/runtimes/0/kind", "JobSet")
        assert_refused(document, "/runtimes/0/kind", "must be one of")

    @pytest.mark.parametrize(
        ("path", "value", "rule"),
        [
            ("/kueue/localQueue", "", "label value"),
            ("/kueue/localQueue", "LQ", "label value"),
            ("/kueue/localQueue", "a" * 64, "label value"),
            ("/kueue/localQueue", "a_b", "label value"),
            ("/kueue/localQueue", "a-.b", "label value"),
            ("/kueue/priorityClass", "High", "label value"),
            ("/kueue/priorityClass", "a" * 64, "label value"),
            ("/kueue/admissionCheck", "Check", "Kubernetes object name"),
            ("/kueue/admissionCheck", "", "Kubernetes object name"),
            ("/kueue/admissionLease/namespace", "a.b", "RFC 1123 label"),
            ("/kueue/admissionLease/name", "Lease", "Kubernetes object name"),
            ("/credentials/0/secretName", "s3_key", "Kubernetes object name"),
        ],
    )
    def test_other_names(self, path: str, value: str, rule: str) -> None:
        assert_refused(with_value(path, value, copy.deepcopy(EXAMPLE)), path, rule)

    @pytest.mark.parametrize("value", ["lq", "a" * 63, "team-a.queue", "0"])
    def test_queue_names_accepted(self, value: str) -> None:
        document = with_value("/kueue", {"localQueue": value, "priorityClass": value})
        kueue = parse(document).kueue
        assert kueue is not None
        assert (kueue.local_queue, kueue.priority_class) == (value, value)


class TestQualifiedNames:
    @pytest.mark.parametrize(
        "value",
        [
            "team",
            "Team_A.b-c",
            "example.com/team",
            "a/" + "n" * 63,
            ("p" * 63 + ".") * 3 + "p" * 61 + "/name",  # a 253-character prefix
            "x",
            "0.0",
        ],
    )
    def test_label_keys_accepted(self, value: str) -> None:
        assert dict(parse(with_value("/labels", {value: "v"})).labels) == {value: "v"}

    @pytest.mark.parametrize(
        ("value", "rule"),
        [
            ("", "the name part must not be empty"),
            ("example.com/", "the name part must not be empty"),
            ("/name", "the prefix before '/' must not be empty"),
            ("a/b/c", "at most one '/'"),
            ("n" * 64, "more than 63"),
            ("a/" + "n" * 64, "more than 63"),
            (("p" * 63 + ".") * 3 + "p" * 62 + "/name", "more than 253"),
            ("-team", "the name part must be"),
            ("team_", "the name part must be"),
            ("te am", "the name part must be"),
            ("Example.com/team", "the prefix must be an RFC 1123 subdomain"),
            ("a_b/team", "the prefix must be an RFC 1123 subdomain"),
        ],
    )
    @pytest.mark.parametrize("where", ["labels", "annotations"])
    def test_metadata_keys_refused(self, where: str, value: str, rule: str) -> None:
        document = with_value(f"/{where}", {value: "v"})
        assert_refused(document, json_pointer(where, value), rule)

    @pytest.mark.parametrize(
        "key",
        [
            "dispatch.phpboyscout.uk/job",
            "kueue.x-k8s.io/queue-name",
            "trainer.kubeflow.org/x",
            "jobset.sigs.k8s.io/jobset-name",
        ],
    )
    @pytest.mark.parametrize("where", ["labels", "annotations"])
    def test_reserved_prefixes(self, where: str, key: str) -> None:
        document = with_value(f"/{where}", {"ok": "v", key: "v"})
        assert_refused(document, json_pointer(where, key), "reserved prefix")

    def test_lookalike_prefixes_are_not_reserved(self) -> None:
        labels = {
            "x.kueue.x-k8s.io/a": "v",
            "kueue.x-k8s.iox/a": "v",
            "dispatch.phpboyscout.uk": "v",
        }
        assert dict(parse(with_value("/labels", labels)).labels) == labels

    @pytest.mark.parametrize("value", ["nvidia.com/gpu", "amd.com/gpu", "gpu"])
    def test_gpu_resource(self, value: str) -> None:
        assert parse(with_value("/gpuResource", value)).gpu_resource == value

    @pytest.mark.parametrize("value", ["", "nvidia.com/", "a/b/c", "NVIDIA.com/gpu"])
    def test_gpu_resource_refused(self, value: str) -> None:
        assert_refused(with_value("/gpuResource", value), "/gpuResource", "qualified name")

    def test_node_loss_taints_refused(self) -> None:
        document = with_value("/nodeLossTaints", ["example.com/ok", "bad/key/x"])
        assert_refused(document, "/nodeLossTaints/1", "qualified name")

    def test_node_loss_taints_duplicates_name_the_later(self) -> None:
        document = with_value("/nodeLossTaints", ["a/x", "b/y", "a/x"])
        assert_refused(document, "/nodeLossTaints/2", "duplicates /nodeLossTaints/0")


def test_a_key_with_a_newline_still_gives_one_line() -> None:
    with pytest.raises(InvalidSettings) as info:
        parse(with_value("/labels", {"a\nb": "v"}))
    assert info.value.pointer == "/labels/a\nb"
    assert str(info.value).startswith('invalid settings at "/labels/a\\nb": ')
    assert "\n" not in str(info.value)


class TestValues:
    @pytest.mark.parametrize("value", ["", "a", "A.b_c-d", "v" * 63, "0"])
    def test_label_values_accepted(self, value: str) -> None:
        assert parse(with_value("/labels", {"k": value})).labels["k"] == value

    @pytest.mark.parametrize("value", ["v" * 64, "-a", "a-", "a b", "a/b", "é", "a\n"])
    def test_label_values_refused(self, value: str) -> None:
        assert_refused(with_value("/labels", {"k": value}), "/labels/k", "label value")

    @pytest.mark.parametrize("value", ["", "any thing / at all: é\n", "v" * 10_000])
    def test_annotation_values_are_any_string(self, value: str) -> None:
        assert parse(with_value("/annotations", {"k": value})).annotations["k"] == value


class TestDurations:
    @pytest.mark.parametrize(
        ("text", "expected"),
        [
            ("30s", timedelta(seconds=30)),
            ("1h30m", timedelta(hours=1, minutes=30)),
            ("1.5s", timedelta(seconds=1.5)),
            ("500ms", timedelta(milliseconds=500)),
            ("+5m", timedelta(minutes=5)),
            ("1us", timedelta(microseconds=1)),
            ("2µs", timedelta(microseconds=2)),
            (".5h", timedelta(minutes=30)),
        ],
    )
    def test_go_duration_strings(self, text: str, expected: timedelta) -> None:
        assert parse(with_value("/nodeLossWindow", text)).node_loss_window == expected

    @pytest.mark.parametrize(
        "path",
        [
            "/nodeLossWindow",
            "/timeouts/request",
            "/timeouts/apiserverRequest",
            "/timeouts/workload",
            "/timeouts/stopJob",
        ],
    )
    @pytest.mark.parametrize("text", ["0", "0s", "-5s", "-0", "0h0m0.0s", "0.0000000001s"])
    def test_zero_and_negative_are_refused(self, path: str, text: str) -> None:
        assert_refused(with_value(path, text), path, "must be a positive duration")

    @pytest.mark.parametrize(
        ("text", "rule"),
        [
            ("", 'invalid duration ""'),
            ("5", "missing unit"),
            ("5d", 'unknown unit "d"'),
            ("5 s", 'unknown unit " s"'),
            ("PT5M", "invalid duration"),
            ("1h-5m", 'unknown unit "h-"'),
            ("9223372036854775808ns", "invalid duration"),
            ("3000000h", "invalid duration"),
        ],
    )
    def test_not_go_durations(self, text: str, rule: str) -> None:
        assert_refused(with_value("/timeouts/stopJob", text), "/timeouts/stopJob", rule)

    def test_sub_microsecond_durations_keep_their_nanoseconds(self) -> None:
        settings = parse(with_value("/timeouts/request", "1500ns"))
        request = settings.timeouts.request
        assert isinstance(request, Duration)
        assert request.nanoseconds == 1500
        assert request > timedelta(0)
        assert settings.to_document()["timeouts"]["request"] == "1.5µs"


class TestCluster:
    @pytest.mark.parametrize(
        "cluster_object",
        [
            {},
            {"kubeconfig": ""},
            {"kubeconfig": "/k", "context": "c"},
            {"context": "c"},
            {"inCluster": True},
            {"inCluster": False, "kubeconfig": "/k", "context": "c"},
        ],
    )
    def test_accepted(self, cluster_object: dict[str, Any]) -> None:
        settings = parse(with_value("/cluster", cluster_object))
        assert settings.cluster.in_cluster is cluster_object.get("inCluster", False)

    def test_empty_context(self) -> None:
        assert_refused(
            with_value("/cluster", {"context": ""}), "/cluster/context", "must not be empty"
        )

    @pytest.mark.parametrize(
        "cluster_object",
        [
            {"inCluster": True, "kubeconfig": "/k"},
            {"inCluster": True, "kubeconfig": ""},
            {"inCluster": True, "context": "c"},
            {"kubeconfig": "/k", "context": "c", "inCluster": True},
        ],
    )
    def test_in_cluster_is_exclusive(self, cluster_object: dict[str, Any]) -> None:
        document = with_value("/cluster", cluster_object)
        assert_refused(document, "/cluster/inCluster", "refused together")


class TestCredentials:
    def creds(self, *paths: str) -> dict[str, Any]:
        return with_value(
            "/credentials", [{"secretName": f"s{i}", "mountPath": p} for i, p in enumerate(paths)]
        )

    @pytest.mark.parametrize(
        "paths",
        [
            ("/var/run/s3",),
            ("/a", "/b", "/ab"),
            ("/opt/dispatchx", "/opt/other", "/optional"),
            ("/var/run/a", "/var/run/ab"),
            ("/a b/é",),
        ],
    )
    def test_accepted(self, paths: tuple[str, ...]) -> None:
        assert [c.mount_path for c in parse(self.creds(*paths)).credentials] == list(paths)

    @pytest.mark.parametrize(
        ("path", "rule"),
        [
            ("relative/path", "must be an absolute path"),
            ("", "must be an absolute path"),
            ("/", 'must not be "/"'),
            ("/a/", 'must be a clean path ("/a", not "/a/")'),
            ("//a", 'must be a clean path ("/a", not "//a")'),
            ("/a//b", "must be a clean path"),
            ("/a/./b", "must be a clean path"),
            ("/a/../b", "must be a clean path"),
            ("/..", "must be a clean path"),
            ("/opt/dispatch", "overlaps /opt/dispatch"),
            ("/opt/dispatch/x", "overlaps /opt/dispatch"),
            ("/opt", "overlaps /opt/dispatch"),
        ],
    )
    def test_refused(self, path: str, rule: str) -> None:
        assert_refused(self.creds("/ok", path), "/credentials/1/mountPath", rule)

    @pytest.mark.parametrize(
        ("paths", "later", "earlier"),
        [
            (("/a", "/a"), 1, 0),
            (("/a", "/a/b"), 1, 0),
            (("/a/b", "/a"), 1, 0),
            (("/x", "/a/b/c", "/y", "/a/b"), 3, 1),
        ],
    )
    def test_overlaps_name_the_later(
        self, paths: tuple[str, ...], later: int, earlier: int
    ) -> None:
        assert_refused(
            self.creds(*paths),
            f"/credentials/{later}/mountPath",
            f"overlaps /credentials/{earlier}/mountPath",
        )

    @pytest.mark.parametrize(
        ("path", "clean"),
        [
            ("//a", "/a"),
            ("/a/b/", "/a/b"),
            ("/../a", "/a"),
            ("/a/../..", "/"),
            ("a/../../b", "../b"),
            ("", "."),
            ("./", "."),
        ],
    )
    def test_go_path_clean(self, path: str, clean: str) -> None:
        assert go_path_clean(path) == clean


class TestPublish:
    @pytest.mark.parametrize(
        "image",
        [
            f"x@sha256:{DIGEST}",
            f"registry.example:5000/team/dispatch-publish@sha256:{DIGEST}",
            f"localhost/a__b.c-d@sha256:{DIGEST}",
        ],
    )
    def test_digest_images(self, image: str) -> None:
        publish = parse(with_value("/publish", {"image": image})).publish
        assert publish is not None
        assert publish.image == image

    @pytest.mark.parametrize(
        "image",
        [
            "registry.example/dispatch-publish:v1",
            f"registry.example/dispatch-publish@sha256:{DIGEST[:-1]}",
            f"registry.example/dispatch-publish@sha256:{DIGEST}0",
            f"registry.example/dispatch-publish@sha256:{DIGEST.upper()}",
            f"registry.example/dispatch-publish@sha512:{DIGEST}",
            f"registry.example/dispatch-publish:v1@sha256:{DIGEST}",
            f"Registry/Publish@sha256:{DIGEST}",
            f"@sha256:{DIGEST}",
            "",
        ],
    )
    def test_undigested_images(self, image: str) -> None:
        assert_refused(
            with_value("/publish", {"image": image}), "/publish/image", "pinned by digest"
        )

    def test_via(self) -> None:
        document = with_value("/publish", {"image": IMAGE, "via": "sidecar"})
        assert_refused(document, "/publish/via", "must be one of")

    @pytest.mark.parametrize("via", [None, "imageVolume"])
    def test_init_container_only_under_via_init_container(self, via: str | None) -> None:
        publish = {"image": IMAGE, "initContainer": "fill"} | ({"via": via} if via else {})
        document = with_value("/publish", publish)
        assert_refused(document, "/publish/initContainer", 'refused unless via is "initContainer"')

    @pytest.mark.parametrize("name", ["", "Fill", "fill.er", "a" * 64])
    def test_init_container_name(self, name: str) -> None:
        document = with_value(
            "/publish", {"image": IMAGE, "via": "initContainer", "initContainer": name}
        )
        assert_refused(document, "/publish/initContainer", "container name")


class TestRuntimes:
    def test_duplicates_name_the_later(self) -> None:
        other = {"kind": "TrainingRuntime", "name": "torch-distributed"}
        document = with_value("/runtimes", [RUNTIME, other, RUNTIME])
        assert_refused(document, "/runtimes/2", "duplicates /runtimes/0")

    def test_same_name_different_kind_is_no_duplicate(self) -> None:
        other = {"kind": "TrainingRuntime", "name": "torch-distributed"}
        assert len(parse(with_value("/runtimes", [RUNTIME, other])).runtimes) == 2


class TestManifestPointers:
    def test_refusals_under_a_prefix(self) -> None:
        with pytest.raises(InvalidSettings) as info:
            parse_settings_object(
                {"namespace": "a", "runtimes": [RUNTIME], "kueue": None}, pointer="/spec"
            )
        assert info.value.pointer == "/spec/kueue"
        assert str(info.value).startswith("invalid settings at /spec/kueue: ")

    def test_a_spec_that_is_not_an_object(self) -> None:
        with pytest.raises(InvalidSettings) as info:
            parse_settings_object(["a"], pointer="/spec")
        assert info.value.pointer == "/spec"


class TestConstructedInPython:
    def test_rules_apply_to_models_built_in_code(self) -> None:
        with pytest.raises(ValidationError):
            Settings(namespace="Bad", probe_runtime=RuntimeRef(kind="TrainingRuntime", name="x"))

    def test_cross_field_rules_apply_too(self) -> None:
        with pytest.raises(InvalidSettings) as info:
            Settings(
                namespace="a",
                probe_runtime=RuntimeRef(kind="TrainingRuntime", name="x"),
                cluster=Cluster(in_cluster=True, context="c"),
            )
        assert info.value.pointer == "/cluster/inCluster"

    def test_timedelta_durations(self) -> None:
        settings = Settings(
            namespace="a",
            probe_runtime=RuntimeRef(kind="TrainingRuntime", name="x"),
            node_loss_window=timedelta(minutes=2),
        )
        assert settings.to_document()["nodeLossWindow"] == "2m0s"
