"""schema.json and the KubeflowAdapter CRD: current, well-formed, and saying what the seed says."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dispatch_kubeflow import schema
from dispatch_kubeflow.settings import InvalidSettings, parse_settings
from dispatch_kubeflow.settings.models import DURATION_MAX, ENTRIES_MAX
from dispatch_kubeflow.settings.names import (
    MOUNT_PATH_PATTERN,
    PUBLISH_DIR_INSIDE_PATTERN,
    RESERVED_PREFIX_PATTERN,
)
from tests.unit.growth import assert_grows_linearly

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "ab" * 32
IMAGE = f"registry.example/publish@sha256:{DIGEST}"
RUNTIME = {"kind": "ClusterTrainingRuntime", "name": "torch"}
MINIMAL: dict[str, Any] = {"namespace": "team-a", "runtimes": [RUNTIME]}
# The seed's example, kept as examples/settings.json.
EXAMPLE: dict[str, Any] = json.loads((ROOT / "examples/settings.json").read_text())


def ecma_pattern(
    validator: Any, pattern: str, instance: Any, _schema: Any
) -> Iterator[jsonschema.ValidationError]:
    """``pattern`` with ECMA-262's ``$`` (end of input only, unlike Python's before a final \\n)."""
    if isinstance(instance, str) and not re.search(re.sub(r"(?<!\\)\$", r"\\Z", pattern), instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": ecma_pattern})
VALIDATOR = Validator(json.loads((ROOT / "schema.json").read_bytes()))


def schema_accepts(document: Any) -> bool:
    return bool(VALIDATOR.is_valid(document))


def parser_accepts(document: Any) -> bool:
    try:
        parse_settings(json.dumps(document))
    except InvalidSettings:
        return False
    return True


def with_value(key: str, value: Any) -> dict[str, Any]:
    document = copy.deepcopy(MINIMAL)
    document[key] = value
    return document


def walk(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, child in node.items():
            yield from walk(child, f"{path}/{key}")
    elif isinstance(node, list):
        for index, child in enumerate(node):
            yield from walk(child, f"{path}/{index}")


class TestCommittedFiles:
    def test_schema_json_is_current(self) -> None:
        assert (ROOT / "schema.json").read_bytes() == schema.schema_bytes(), (
            "schema.json is stale: run python -m dispatch_kubeflow.schema --write"
        )

    def test_crd_is_current(self) -> None:
        assert schema.stale_files(ROOT) == []

    def test_check_reports_a_stale_file(self, tmp_path: Path) -> None:
        assert schema.main(["--root", str(tmp_path), "--write"]) == 0
        assert schema.main(["--root", str(tmp_path), "--check"]) == 0
        (tmp_path / "schema.json").write_text("{}\n")
        assert schema.main(["--root", str(tmp_path), "--check"]) == 1

    def test_rendering_is_deterministic(self) -> None:
        first = schema.schema_bytes()
        assert first == schema.schema_bytes()
        assert first.endswith(b"}\n")
        assert first.startswith(b'{\n  "$schema"')


class TestSchemaJson:
    document = json.loads((ROOT / "schema.json").read_bytes())

    def test_is_a_2020_12_schema_with_the_projects_id(self) -> None:
        jsonschema.Draft202012Validator.check_schema(self.document)
        assert self.document["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert (
            self.document["$id"]
            == "https://gitlab.com/phpboyscout/go/dispatch-kubeflow/schema.json"
        )

    def test_every_object_with_properties_refuses_others(self) -> None:
        objects = [
            (p, n)
            for p, n in walk(self.document)
            if "properties" in n and n.get("type") == "object"
        ]
        assert len(objects) >= 8
        for path, node in objects:
            assert node["additionalProperties"] is False, path

    def test_maps_constrain_their_keys_and_values(self) -> None:
        for key in ("labels", "annotations"):
            node = self.document["properties"][key]
            assert "propertyNames" in node
            assert node["additionalProperties"]["type"] == "string"

    @pytest.mark.parametrize(
        ("path", "default"),
        [
            ("/properties/gpuResource", "nvidia.com/gpu"),
            ("/properties/nodeLossWindow", "5m"),
            ("/properties/allowRankRestart", False),
            ("/properties/cluster/properties/inCluster", False),
            ("/properties/timeouts/properties/request", "30s"),
            ("/properties/timeouts/properties/apiserverRequest", "60s"),
            ("/properties/timeouts/properties/workload", "60s"),
            ("/properties/timeouts/properties/stopJob", "10m"),
            ("/properties/publish/properties/via", "imageVolume"),
            (
                "/properties/kueue/properties/admissionLease",
                {"namespace": "dispatch-system", "name": "dispatch-admission"},
            ),
        ],
    )
    def test_defaults_are_documented(self, path: str, default: Any) -> None:
        node = dict(walk(self.document))[path]
        assert node["default"] == default

    def test_documented_defaults_are_the_parsers(self) -> None:
        defaults = parse_settings(json.dumps(MINIMAL)).to_document()
        properties = self.document["properties"]
        assert properties["gpuResource"]["default"] == defaults["gpuResource"]
        for key, value in properties["timeouts"]["default"].items():
            assert (
                parse_settings(json.dumps({**MINIMAL, "timeouts": {key: value}})).to_document()[
                    "timeouts"
                ]
                == defaults["timeouts"]
            )

    def test_patterns_for_names_durations_digests_and_paths(self) -> None:
        nodes = dict(walk(self.document))
        for path in (
            "/properties/namespace",
            "/$defs/duration",
            "/$defs/qualifiedName",
            "/$defs/runtimeRef/properties/name",
            "/properties/publish/properties/image",
            "/properties/credentials/items/properties/mountPath",
        ):
            assert "pattern" in nodes[path], path

    def test_accepts_the_seeds_example(self) -> None:
        example = {
            "cluster": {"kubeconfig": "/home/u/.kube/config", "context": "train"},
            "namespace": "team-a",
            "runtimes": [RUNTIME],
            "kueue": {"localQueue": "lq", "priorityClass": "low", "admissionCheck": "c"},
            "labels": {"team": "a"},
            "annotations": {"cost-centre": "42"},
            "credentials": [{"secretName": "s3", "mountPath": "/var/run/secrets/s3"}],
            "nodeLossWindow": "5m",
            "nodeLossTaints": ["example.com/node-dead"],
            "timeouts": {"request": "30s", "apiserverRequest": "60s", "stopJob": "10m"},
            "probeRuntime": RUNTIME,
            "publish": {"image": IMAGE, "via": "imageVolume"},
        }
        assert schema_accepts(example)
        assert parser_accepts(example)


class TestWhatTheSchemaDoesNotSay:
    """Each statement of the seed's section, shown on a document: the parser is the stricter."""

    @pytest.mark.parametrize("path", ["/a/", "//a", "/a/../b", "/", "/a/./b"])
    def test_mount_paths_need_only_a_leading_slash_in_the_schema(self, path: str) -> None:
        document = with_value("credentials", [{"secretName": "s", "mountPath": path}])
        assert (schema_accepts(document), parser_accepts(document)) == (True, False)

    @pytest.mark.parametrize("path", ["/opt/dispatch", "/opt/dispatch/bin", "relative"])
    def test_both_refuse_the_publish_dir_and_relative_paths(self, path: str) -> None:
        document = with_value("credentials", [{"secretName": "s", "mountPath": path}])
        assert (schema_accepts(document), parser_accepts(document)) == (False, False)

    def test_a_path_containing_the_publish_dir_only_the_parser_refuses(self) -> None:
        document = with_value("credentials", [{"secretName": "s", "mountPath": "/opt"}])
        assert (schema_accepts(document), parser_accepts(document)) == (True, False)

    def test_overlapping_credentials_only_the_parser_refuses(self) -> None:
        credentials = [
            {"secretName": "a", "mountPath": "/a"},
            {"secretName": "b", "mountPath": "/a/b"},
        ]
        document = with_value("credentials", credentials)
        assert (schema_accepts(document), parser_accepts(document)) == (True, False)

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("runtimes", [RUNTIME, RUNTIME]),
            ("nodeLossTaints", ["a/b", "a/b"]),
        ],
    )
    def test_duplicates_both_refuse(self, key: str, value: Any) -> None:
        document = with_value(key, value)
        assert (schema_accepts(document), parser_accepts(document)) == (False, False)

    @pytest.mark.parametrize(
        "publish", [{"initContainer": "x"}, {"initContainer": "x", "via": "imageVolume"}]
    )
    def test_init_container_without_via_init_container_both_refuse(
        self, publish: dict[str, Any]
    ) -> None:
        document = with_value("publish", {"image": IMAGE, **publish})
        assert (schema_accepts(document), parser_accepts(document)) == (False, False)

    @pytest.mark.parametrize(
        "key",
        [
            "n" * 64,
            "example.com/" + "n" * 64,
            ("p" * 63 + ".") * 4 + "p/name",
        ],
    )
    @pytest.mark.parametrize("where", ["labels", "annotations", "gpuResource", "nodeLossTaints"])
    def test_qualified_name_lengths_only_the_parser_limits(self, where: str, key: str) -> None:
        value: Any = {"labels": {key: "v"}, "annotations": {key: "v"}, "gpuResource": key}.get(
            where, [key]
        )
        document = with_value(where, value)
        assert (schema_accepts(document), parser_accepts(document)) == (True, False)

    @pytest.mark.parametrize(
        "key", ["namespace", "cluster", "kueue", "labels", "publish", "timeouts"]
    )
    def test_null_both_refuse(self, key: str) -> None:
        document = with_value(key, None)
        assert (schema_accepts(document), parser_accepts(document)) == (False, False)

    @pytest.mark.parametrize(
        "document",
        [
            {"namespace": "a"},
            {"namespace": "a", "runtimes": []},
            {"runtimes": [RUNTIME]},
            {**MINIMAL, "cluster": {"inCluster": True, "kubeconfig": ""}},
            {**MINIMAL, "cluster": {"inCluster": True, "context": "c"}},
            {**MINIMAL, "cluster": {"context": ""}},
            {**MINIMAL, "nodeLossWindow": "0s"},
            {**MINIMAL, "nodeLossWindow": "-1m"},
            {**MINIMAL, "nodeLossWindow": 300},
            {**MINIMAL, "allowRankRestart": "false"},
            {**MINIMAL, "labels": {"kueue.x-k8s.io/queue-name": "q"}},
            {**MINIMAL, "publish": {"image": "registry.example/publish:v1"}},
        ],
    )
    def test_the_rest_both_refuse(self, document: dict[str, Any]) -> None:
        assert (schema_accepts(document), parser_accepts(document)) == (False, False)

    @pytest.mark.parametrize(
        "document",
        [
            {"namespace": "a", "runtimes": [], "probeRuntime": RUNTIME},
            {**MINIMAL, "cluster": {"inCluster": False, "kubeconfig": "/k", "context": "c"}},
            {**MINIMAL, "cluster": {"inCluster": True}},
            {**MINIMAL, "publish": {"image": IMAGE, "via": "initContainer", "initContainer": "x"}},
            {**MINIMAL, "nodeLossWindow": "+1h0.5m"},
        ],
    )
    def test_both_accept(self, document: dict[str, Any]) -> None:
        assert (schema_accepts(document), parser_accepts(document)) == (True, True)


class TestKubeflowAdapterCrd:
    crd = yaml.safe_load(
        (ROOT / "crds" / "kubeflowadapters.dispatch.phpboyscout.uk.yaml").read_text()
    )
    version = crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    spec = root["properties"]["spec"]

    def test_names_and_scope(self) -> None:
        assert self.crd["apiVersion"] == "apiextensions.k8s.io/v1"
        assert self.crd["metadata"]["name"] == "kubeflowadapters.dispatch.phpboyscout.uk"
        assert self.crd["spec"]["group"] == "dispatch.phpboyscout.uk"
        assert self.crd["spec"]["names"]["kind"] == "KubeflowAdapter"
        assert self.crd["spec"]["names"]["plural"] == "kubeflowadapters"
        assert self.crd["spec"]["names"]["shortNames"] == ["kfa"]
        assert self.crd["spec"]["scope"] == "Namespaced"
        assert [v["name"] for v in self.crd["spec"]["versions"]] == ["v1alpha1"]
        assert self.version["served"] is True
        assert self.version["storage"] is True

    def test_status_subresource_and_printer_columns(self) -> None:
        assert self.version["subresources"] == {"status": {}}
        columns = [dict(column) for column in self.version["additionalPrinterColumns"]]
        assert all(column.pop("description") for column in columns)
        assert columns == [
            {"name": "Mode", "type": "string", "jsonPath": ".status.mode"},
            {
                "name": "Ready",
                "type": "string",
                "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
            },
            {
                "name": "AdmissionHealthy",
                "type": "string",
                "priority": 1,
                "jsonPath": '.status.conditions[?(@.type=="AdmissionHealthy")].status',
            },
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
        ]

    def test_spec_has_the_settings_keys_at_every_level(self) -> None:
        settings = schema.settings_schema()
        defs = settings["$defs"]

        def keys(node: dict[str, Any]) -> Any:
            if "$ref" in node:
                node = defs[node["$ref"].split("/")[-1]]
            if node.get("type") == "array":
                return ["array", keys(node["items"])]
            if "properties" in node:
                return {k: keys(v) for k, v in node["properties"].items()}
            return node.get("type")

        assert keys(self.spec) == keys(settings)

    def test_spec_is_structural(self) -> None:
        for path, node in walk(self.spec):
            assert "$ref" not in node, path
            assert node.get("additionalProperties") is not False, path
            for banned in (
                "if",
                "then",
                "anyOf",
                "dependentSchemas",
                "propertyNames",
                "uniqueItems",
                "const",
                "default",
            ):
                assert banned not in node, (path, banned)
            if path.rsplit("/", 1)[0].endswith("/properties") or path.endswith("/items"):
                assert "type" in node, path

    def test_same_patterns_as_the_schema_as_cel_rules_with_messages(self) -> None:
        properties = self.spec["properties"]
        settings = schema.settings_schema()
        for crd_node, schema_node in (
            (properties["namespace"], settings["properties"]["namespace"]),
            (properties["nodeLossWindow"], settings["$defs"]["duration"]),
            (
                properties["publish"]["properties"]["image"],
                settings["properties"]["publish"]["properties"]["image"],
            ),
        ):
            pattern = schema_node["pattern"]
            (rule,) = crd_node["x-kubernetes-validations"]
            assert rule == {
                "rule": f"self.matches({schema.cel_string(pattern)})",
                "message": schema.PATTERN_MESSAGES[pattern],
            }
            assert "pattern" not in crd_node

    def test_optional_values_are_nullable_so_nulls_reach_the_parser(self) -> None:
        properties = self.spec["properties"]
        assert "nullable" not in properties["namespace"]
        for key in (
            "cluster",
            "kueue",
            "labels",
            "nodeLossWindow",
            "timeouts",
            "publish",
            "runtimes",
        ):
            assert properties[key]["nullable"] is True, key
        assert properties["labels"]["additionalProperties"]["nullable"] is True
        kueue = properties["kueue"]["properties"]
        assert "nullable" not in kueue["localQueue"]
        assert kueue["priorityClass"]["nullable"] is True
        runtime = properties["runtimes"]["items"]["properties"]
        assert "nullable" not in runtime["kind"]
        assert "nullable" not in runtime["name"]

    def test_cross_field_rules_are_cel(self) -> None:
        rules = {
            path: [v["rule"] for v in node["x-kubernetes-validations"]]
            for path, node in walk(self.spec)
            if node.get("type") == "object" and "x-kubernetes-validations" in node
        }
        assert set(rules) == {"", "/properties/cluster", "/properties/publish"}
        assert "has(self.probeRuntime)" in rules[""][0]
        assert "self.inCluster == true" in rules["/properties/cluster"][0]
        assert "self.via == 'initContainer'" in rules["/properties/publish"][0]

    def test_uniqueness_is_a_list_type(self) -> None:
        properties = self.spec["properties"]
        assert properties["runtimes"]["x-kubernetes-list-type"] == "map"
        assert properties["runtimes"]["x-kubernetes-list-map-keys"] == ["kind", "name"]
        assert properties["nodeLossTaints"]["x-kubernetes-list-type"] == "set"

    def test_defaults_are_described_not_applied(self) -> None:
        assert 'Default: "5m".' in self.spec["properties"]["nodeLossWindow"]["description"]

    def test_status(self) -> None:
        status = self.root["properties"]["status"]["properties"]
        assert set(status) == {
            "conditions",
            "mode",
            "readmissionGate",
            "declarations",
            "observedGeneration",
            "kopf",
        }
        condition = status["conditions"]["items"]["properties"]
        assert set(condition) == {
            "type",
            "status",
            "reason",
            "message",
            "lastTransitionTime",
            "observedGeneration",
        }
        assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
        assert status["mode"]["enum"] == ["plain", "kueue"]
        assert status["readmissionGate"]["enum"] == ["yes", "no"]
        assert set(status["declarations"]["properties"]) == {
            "nodeLossWindow",
            "callBound",
            "polledLoss",
        }
        assert status["kopf"]["x-kubernetes-preserve-unknown-fields"] is True


def test_render_crd_serves_other_kinds() -> None:
    crd = schema.render_crd(
        kind="Example",
        plural="examples",
        short_names=["ex"],
        spec={"type": "object"},
        status={"type": "object"},
        printer_columns=[schema.AGE_COLUMN],
        description="An example.",
    )
    assert crd["metadata"]["name"] == "examples.dispatch.phpboyscout.uk"
    assert crd["spec"]["names"]["listKind"] == "ExampleList"
    assert crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"] == {
        "type": "object"
    }


def schema_patterns(node: Any) -> set[str]:
    return {n["pattern"] for _, n in walk(node) if isinstance(n.get("pattern"), str)}


class TestHostileValues:
    """Every common validator agrees with the parser, and none takes long on any value."""

    stock = jsonschema.Draft202012Validator(json.loads((ROOT / "schema.json").read_bytes()))

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("namespace", "team-a\n"),
            ("nodeLossWindow", "5m\n"),
            ("gpuResource", "nvidia.com/gpu\n"),
            ("labels", {"team": "a\n"}),
            ("labels", {"team\n": "a"}),
            ("nodeLossTaints", ["example.com/x\n"]),
            ("probeRuntime", {"kind": "TrainingRuntime", "name": "x\n"}),
            ("publish", {"image": IMAGE + "\n"}),
            ("kueue", {"localQueue": "lq\n"}),
            ("credentials", [{"secretName": "s", "mountPath": "/opt/dispatch\n"}]),
            ("credentials", [{"secretName": "s", "mountPath": "/a\nb"}]),
        ],
    )
    def test_a_trailing_newline_is_judged_alike_by_python_ecma_and_the_parser(
        self, key: str, value: Any
    ) -> None:
        document = with_value(key, value)
        parser = parser_accepts(document)
        assert (bool(self.stock.is_valid(document)), schema_accepts(document)) == (parser, parser)

    @pytest.mark.parametrize(
        "unit", ["1", "0", "1s", "0s", "1.", "1m", "a", "a-", "a.", "a-a.", "A", "a_", "a/", "/a"]
    )
    def test_every_pattern_matches_in_linear_time(self, unit: str) -> None:
        patterns = [re.compile(p) for p in sorted(schema_patterns(schema.settings_schema()))]

        def match_all(text: str) -> None:
            for pattern in patterns:
                pattern.search(text)

        assert_grows_linearly(lambda n: unit * n + "!", match_all, 4_000)

    def test_lists_maps_and_durations_are_bounded(self) -> None:
        properties = schema.settings_schema()["properties"]
        for key in ("runtimes", "credentials", "nodeLossTaints"):
            assert properties[key]["maxItems"] == ENTRIES_MAX, key
        for key in ("labels", "annotations"):
            assert properties[key]["maxProperties"] == ENTRIES_MAX, key
        defs = schema.settings_schema()["$defs"]
        assert defs["duration"]["maxLength"] == DURATION_MAX
        assert defs["qualifiedName"]["maxLength"] == 317
        assert properties["publish"]["properties"]["image"]["maxLength"] == 327

    def test_the_bounds_accept_the_seeds_example(self) -> None:
        assert bool(self.stock.is_valid(EXAMPLE))
        assert parser_accepts(EXAMPLE)


class TestCrdMessages:
    spec = TestKubeflowAdapterCrd.spec

    def test_no_pattern_is_left_for_kubectl_to_show(self) -> None:
        assert schema_patterns(self.spec) == set()

    def test_every_rule_has_a_message_in_words(self) -> None:
        rules = [
            rule for _, node in walk(self.spec) for rule in node.get("x-kubernetes-validations", ())
        ]
        assert len(rules) >= 15
        for rule in rules:
            assert rule["message"].startswith(
                ("must", "probeRuntime", "inCluster", "initContainer")
            )
            assert not set("^$[]*+?\\") & set(rule["message"]), rule

    def test_every_schema_pattern_has_a_rule(self) -> None:
        crd_rules = {
            rule["rule"]
            for _, node in walk(self.spec)
            for rule in node.get("x-kubernetes-validations", ())
        }
        # The newline guard needs no rule (RE2's '$' is the end of the text), mount paths have
        # rules of their own, and label keys are the operator's to check.
        for pattern in schema_patterns(schema.settings_schema()) - {
            schema.NEWLINE_PATTERN,
            MOUNT_PATH_PATTERN,
            PUBLISH_DIR_INSIDE_PATTERN,
            RESERVED_PREFIX_PATTERN,
        }:
            assert f"self.matches({schema.cel_string(pattern)})" in crd_rules, pattern

    def test_durations_say_what_they_must_be(self) -> None:
        (rule,) = self.spec["properties"]["timeouts"]["properties"]["request"][
            "x-kubernetes-validations"
        ]
        assert rule["message"].startswith("must be a positive Go duration such as 30s or 1h30m")

    def test_lists_and_maps_are_bounded(self) -> None:
        properties = self.spec["properties"]
        for key in ("runtimes", "credentials", "nodeLossTaints"):
            assert properties[key]["maxItems"] == ENTRIES_MAX, key
        for key in ("labels", "annotations"):
            assert properties[key]["maxProperties"] == ENTRIES_MAX, key
        assert properties["nodeLossWindow"]["maxLength"] == DURATION_MAX

    def test_the_chart_holds_the_same_crd(self) -> None:
        name = "kubeflowadapters.dispatch.phpboyscout.uk.yaml"
        assert (ROOT / "charts/dispatch-kubeflow/crds" / name).read_bytes() == (
            ROOT / "crds" / name
        ).read_bytes()
