"""The CRDs: never stale in the chart, described field by field, with the printer columns."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from dispatch_kubeflow import schema
from dispatch_kubeflow.handlers import crds

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dispatch-kubeflow"


def test_committed_dispatchjob_crd_matches_the_generator() -> None:
    committed = (ROOT / "crds" / crds.FILE_NAME).read_bytes()
    assert committed == crds.render(), (
        "crds/ is stale: run python -m dispatch_kubeflow.handlers.crds crds/"
    )


def test_chart_crds_are_identical_copies_of_the_project_crds() -> None:
    project = {path.name: path.read_bytes() for path in (ROOT / "crds").glob("*.yaml")}
    chart = {path.name: path.read_bytes() for path in (CHART / "crds").glob("*.yaml")}
    assert crds.FILE_NAME in project
    assert chart == project, "copy crds/*.yaml into charts/dispatch-kubeflow/crds/"


def test_chart_example_runtime_is_the_examples_runtime() -> None:
    source = ROOT / "examples" / "runtime.yaml"
    if not source.exists():
        pytest.skip("examples/runtime.yaml is not in the tree")
    assert (CHART / "files" / "example-runtime.yaml").read_bytes() == source.read_bytes()


def columns(crd: dict[str, Any]) -> dict[str, list[str]]:
    """The printer columns of ``kubectl get`` and of ``kubectl get -o wide`` only."""
    (version,) = crd["spec"]["versions"]
    shown: dict[str, list[str]] = {"get": [], "wide": []}
    for column in version["additionalPrinterColumns"]:
        shown["wide" if column.get("priority", 0) > 0 else "get"].append(column["name"])
        assert column["description"], column["name"]
    return shown


def test_printer_columns_and_status_subresource() -> None:
    assert columns(crds.dispatchjob_crd()) == {
        "get": ["State", "Cause", "Attempt", "Age"],
        "wide": ["Reason", "TrainJob", "Admitted"],
    }
    (version,) = crds.dispatchjob_crd()["spec"]["versions"]
    assert version["subresources"] == {"status": {}}


def test_kubeflowadapter_columns_show_mode_ready_and_admission_health_in_wide() -> None:
    assert columns(schema.kubeflow_adapter_crd()) == {
        "get": ["Mode", "Ready", "Age"],
        "wide": ["AdmissionHealthy"],
    }


# The apiserver forbids a description of metadata (it gives ObjectMeta's own).
DESCRIBED_BY_THE_APISERVER = frozenset({".metadata"})


def undescribed(node: Any, path: str = "") -> Iterator[str]:
    """The path of every property, at any depth, that has no description."""
    if not isinstance(node, dict):
        return
    for name, child in (node.get("properties") or {}).items():
        if not child.get("description") and f"{path}.{name}" not in DESCRIBED_BY_THE_APISERVER:
            yield f"{path}.{name}"
        yield from undescribed(child, f"{path}.{name}")
    for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
        yield from undescribed(node.get(key), path + suffix)


@pytest.mark.parametrize(
    "crd", [crds.dispatchjob_crd(), schema.kubeflow_adapter_crd()], ids=["dj", "kfa"]
)
def test_every_field_of_the_crds_is_described_for_kubectl_explain(crd: dict[str, Any]) -> None:
    (version,) = crd["spec"]["versions"]
    root = version["schema"]["openAPIV3Schema"]
    assert root["description"]
    assert list(undescribed(root)) == []
    assert "status" in root["properties"]
    assert "conditions" in root["properties"]["status"]["properties"]


def test_undescribed_finds_a_field_without_a_description() -> None:
    node = {"properties": {"a": {"description": "x", "items": {"properties": {"b": {}}}}}}
    assert list(undescribed(node)) == [".a[].b"]


def test_every_spec_field_but_the_gate_and_recovery_ones_is_immutable() -> None:
    (version,) = crds.dispatchjob_crd()["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    mutable = {"attempt", "readmit", "reject", "recovery"}
    assert set(spec["properties"]) - mutable == set(crds.IMMUTABLE_FIELDS)

    def field_rule(name: str) -> str:
        ((rule,),) = [[r["rule"] for r in spec["properties"][name]["x-kubernetes-validations"]]]
        return str(rule)

    for field in crds.IMMUTABLE_FIELDS:
        assert field_rule(field) == "self == oldSelf"
    assert field_rule("attempt") == "self >= oldSelf"
    assert field_rule("readmit") == "self >= oldSelf"
    assert field_rule("reject") == "self == oldSelf"
    assert "x-kubernetes-validations" not in spec["properties"]["recovery"]


def test_the_spec_rules_look_up_only_fields_that_may_be_absent() -> None:
    """Each field a rule of the spec reads costs the apiserver a copy of the spec's property
    schemas on every write, so the spec's rules read only the fields that can come and go."""
    (version,) = crds.dispatchjob_crd()["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [rule["rule"] for rule in spec["x-kubernetes-validations"]]
    optional = ["runtime", "image", "command", "args", "env", "activeDeadlineSeconds"]
    assert rules == [
        *(f"has(self.{name}) == has(oldSelf.{name})" for name in optional),
        "!has(oldSelf.readmit) || has(self.readmit)",
        "!has(oldSelf.reject) || has(self.reject)",
    ]


def test_chart_values_satisfy_the_values_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**values, "replicaCount": 2}, schema)


def test_every_values_key_is_documented_in_the_chart_readme() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    readme = (CHART / "README.md").read_text()

    def keys(tree: dict[str, object], prefix: str = "") -> list[str]:
        found: list[str] = []
        for key, value in tree.items():
            path = f"{prefix}{key}"
            if (
                isinstance(value, dict)
                and value
                and not path.endswith("resources")
                and not any(path.endswith(s) for s in ("SecurityContext", "securityContext"))
            ):
                found += keys(value, f"{path}.")
            else:
                found.append(path)
        return found

    missing = [key for key in keys(values) if f"`{key}`" not in readme]
    assert not missing, f"undocumented values: {missing}"
