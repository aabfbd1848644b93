"""The dispatch-kubeflow command: schema, and validate of settings documents and manifests."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from dispatch_kubeflow import cli
from dispatch_kubeflow.cli import EXIT_INTERNAL, EXIT_USAGE, MAX_INPUT_BYTES, main
from tests.unit.growth import assert_grows_linearly

ROOT = Path(__file__).resolve().parents[2]
DIGEST = "c" * 64
RUNTIME = {"kind": "ClusterTrainingRuntime", "name": "torch-distributed"}
# The seed's example, kept as examples/settings.json.
EXAMPLE: dict[str, Any] = json.loads((ROOT / "examples/settings.json").read_text())

MANIFEST = """\
apiVersion: dispatch.phpboyscout.uk/v1alpha1
kind: KubeflowAdapter
metadata:
  name: team-a
  namespace: dispatch-system
spec:
  namespace: team-a
  runtimes:
    - kind: ClusterTrainingRuntime
      name: torch-distributed
  kueue:
    localQueue: lq
    admissionCheck: dispatch-admission
  nodeLossWindow: 90s
"""


def run(
    argv: list[str], capsys: pytest.CaptureFixture[str], stdin: str | bytes = b""
) -> tuple[int, str, str]:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


class TestSchema:
    def test_prints_exactly_schema_json(self) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "dispatch_kubeflow.cli", "schema"],
            capture_output=True,
            check=True,
        )
        assert result.stdout == (ROOT / "schema.json").read_bytes()

    def test_the_console_script(self) -> None:
        script = Path(sys.executable).with_name("dispatch-kubeflow")
        if not script.exists():
            pytest.skip("the dispatch-kubeflow console script is not installed beside python")
        result = subprocess.run([str(script), "schema"], capture_output=True, check=True)
        assert result.stdout == (ROOT / "schema.json").read_bytes()


class TestValidateSettings:
    def test_the_seeds_example(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, err = run(["validate", write(tmp_path, "s.json", json.dumps(EXAMPLE))], capsys)
        assert (code, err) == (0, "")
        result = json.loads(out)
        assert result["declarations"] == {
            "nodeLossWindow": "5m0s",
            "callBound": "1m5s",
            "polledLoss": [],
        }
        settings = result["settings"]
        assert settings["timeouts"] == {
            "request": "30s",
            "apiserverRequest": "1m0s",
            "workload": "1m0s",
            "stopJob": "10m0s",
        }
        assert settings["kueue"]["admissionLease"] == {
            "namespace": "dispatch-system",
            "name": "dispatch-admission",
        }
        assert settings["cluster"] == {
            "kubeconfig": "/home/u/.kube/config",
            "context": "train",
            "inCluster": False,
        }

    def test_every_default_is_printed(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, _ = run(
            ["validate", "-"],
            capsys,
            stdin='{"namespace": "a", "probeRuntime": {"kind": "TrainingRuntime", "name": "p"}}',
        )
        assert code == 0
        settings = json.loads(out)["settings"]
        assert settings == {
            "namespace": "a",
            "cluster": {"inCluster": False},
            "runtimes": [],
            "probeRuntime": {"kind": "TrainingRuntime", "name": "p"},
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

    def test_init_container_default_is_printed(self, capsys: pytest.CaptureFixture[str]) -> None:
        document = {
            **EXAMPLE,
            "publish": {"image": EXAMPLE["publish"]["image"], "via": "initContainer"},
        }
        code, out, _ = run(["validate", "-"], capsys, stdin=json.dumps(document))
        assert code == 0
        assert json.loads(out)["settings"]["publish"]["initContainer"] == "dispatch-publish"

    def test_output_is_itself_a_valid_settings_document(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        _, first, _ = run(["validate", "-"], capsys, stdin=json.dumps(EXAMPLE))
        settings = json.dumps(json.loads(first)["settings"])
        code, second, _ = run(["validate", "-"], capsys, stdin=settings)
        assert code == 0
        assert second == first

    @pytest.mark.parametrize(
        ("document", "message"),
        [
            (
                {**EXAMPLE, "namespace": "Team-A"},
                "invalid settings at /namespace: must be an RFC 1123 label",
            ),
            ({**EXAMPLE, "kueue": None}, "invalid settings at /kueue: null is not allowed"),
            (
                {**EXAMPLE, "nodeLossWindow": 300},
                "invalid settings at /nodeLossWindow: must be a Go duration string",
            ),
            (
                {
                    **EXAMPLE,
                    "credentials": [
                        {"secretName": "a", "mountPath": "/a"},
                        {"secretName": "b", "mountPath": "/a/b"},
                    ],
                },
                "invalid settings at /credentials/1/mountPath: ",
            ),
        ],
    )
    def test_refusal_is_one_line_on_stderr(
        self, document: dict[str, Any], message: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, err = run(["validate", "-"], capsys, stdin=json.dumps(document))
        assert (code, out) == (1, "")
        assert err.startswith(message)
        assert err.count("\n") == 1

    def test_duplicate_keys_and_trailing_data(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = run(["validate", "-"], capsys, stdin='{"namespace": "a", "namespace": "b"}')
        assert (code, err) == (1, 'invalid settings at /namespace: duplicate key "namespace"\n')
        code, _, err = run(["validate", "-"], capsys, stdin='{"namespace": "a"} []')
        assert code == 1
        assert "trailing data" in err

    def test_broken_json_is_reported_as_json(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = run(["validate", "-"], capsys, stdin='{"namespace": ')
        assert code == 1
        assert "not valid JSON" in err


class TestValidateManifest:
    def test_a_manifest(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, err = run(["validate", write(tmp_path, "a.yaml", MANIFEST)], capsys)
        assert (code, err) == (0, "")
        result = json.loads(out)
        assert result["settings"]["namespace"] == "team-a"
        assert result["settings"]["nodeLossWindow"] == "1m30s"
        assert result["declarations"]["nodeLossWindow"] == "1m30s"
        assert result["settings"]["kueue"]["admissionLease"]["name"] == "dispatch-admission"

    def test_the_projects_example_manifest(self, capsys: pytest.CaptureFixture[str]) -> None:
        example = ROOT / "examples" / "adapter.yaml"
        if not example.exists():
            pytest.skip("examples/adapter.yaml is not in the tree")
        code, _, err = run(["validate", str(example)], capsys)
        assert (code, err) == (0, "")

    def test_a_manifest_as_json(self, capsys: pytest.CaptureFixture[str]) -> None:
        manifest = {
            "apiVersion": "dispatch.phpboyscout.uk/v1alpha1",
            "kind": "KubeflowAdapter",
            "metadata": {"name": "a"},
            "spec": EXAMPLE,
        }
        code, out, _ = run(["validate", "-"], capsys, stdin=json.dumps(manifest))
        assert code == 0
        assert json.loads(out)["settings"]["namespace"] == "team-a"

    @pytest.mark.parametrize(
        ("change", "message"),
        [
            (
                ("  nodeLossWindow: 90s", "  nodeLossWindow: null"),
                "invalid settings at /spec/nodeLossWindow: null is not allowed",
            ),
            (
                ("  nodeLossWindow: 90s", "  nodeLossWindow:"),
                "invalid settings at /spec/nodeLossWindow: null is not allowed",
            ),
            (
                ("  nodeLossWindow: 90s", "  nodeLossWindow: 300"),
                "invalid settings at /spec/nodeLossWindow: must be a Go duration string",
            ),
            (
                ("  nodeLossWindow: 90s", "  allowRankRestart: 'false'"),
                "invalid settings at /spec/allowRankRestart: must be a boolean, not a string",
            ),
            (
                ("    localQueue: lq", "    localQueue: lq\n    localQueue: other"),
                'invalid settings at /spec/kueue/localQueue: duplicate key "localQueue"',
            ),
            (
                ("    admissionCheck: dispatch-admission", "    admissionChecks: x"),
                "invalid settings at /spec/kueue/admissionChecks: unknown key",
            ),
            (
                ("kind: KubeflowAdapter", "kind: DispatchJob"),
                "invalid settings at /kind: must be 'KubeflowAdapter'",
            ),
            (
                ("apiVersion: dispatch.phpboyscout.uk/v1alpha1", "apiVersion: v1"),
                "invalid settings at /apiVersion: must be 'dispatch.phpboyscout.uk/v1alpha1'",
            ),
            (("metadata:", "extra: 1\nmetadata:"), "invalid settings at /extra: unknown key"),
            (
                (
                    "    - kind: ClusterTrainingRuntime",
                    "    - kind: ClusterTrainingRuntime\n      kind: TrainingRuntime",
                ),
                "invalid settings at /spec/runtimes/0/kind: duplicate key",
            ),
        ],
    )
    def test_refusals_name_pointers_under_spec(
        self,
        change: tuple[str, str],
        message: str,
        tmp_path: Path,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        assert change[0] in MANIFEST
        text = MANIFEST.replace(change[0], change[1])
        code, out, err = run(["validate", write(tmp_path, "a.yaml", text)], capsys)
        assert (code, out) == (1, "")
        assert err.startswith(message), err
        assert err.count("\n") == 1

    def test_a_yaml_key_that_is_not_a_string(self, capsys: pytest.CaptureFixture[str]) -> None:
        text = MANIFEST.replace("  nodeLossWindow: 90s", "  labels:\n    yes: a")
        code, _, err = run(["validate", "-"], capsys, stdin=text)
        assert (code, err) == (
            1,
            "invalid settings at /spec/labels: key True is not a string: quote it\n",
        )

    def test_a_manifest_without_spec(self, capsys: pytest.CaptureFixture[str]) -> None:
        text = MANIFEST[: MANIFEST.index("spec:")]
        code, _, err = run(["validate", "-"], capsys, stdin=text)
        assert (code, err) == (1, "invalid settings at /spec: is required\n")

    def test_a_null_spec(self, capsys: pytest.CaptureFixture[str]) -> None:
        text = MANIFEST[: MANIFEST.index("spec:")] + "spec: null\n"
        code, _, err = run(["validate", "-"], capsys, stdin=text)
        assert code == 1
        assert err.startswith("invalid settings at /spec: null is not allowed")

    def test_two_documents(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = run(["validate", "-"], capsys, stdin=MANIFEST + "---\n" + MANIFEST)
        assert code == 1
        assert "not valid YAML" in err

    def test_broken_yaml(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = run(["validate", "-"], capsys, stdin="spec: [\n")
        assert code == 1
        assert err.startswith("invalid settings: not valid YAML")

    def test_empty_input(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = run(["validate", "-"], capsys, stdin="")
        assert (code, err) == (1, "invalid settings: the manifest is empty\n")


class TestUsage:
    @pytest.mark.parametrize(
        "argv", [[], ["nonsense"], ["validate"], ["validate", "a", "b"], ["schema", "x"]]
    )
    def test_bad_usage_exits_2(self, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
        code, out, err = run(argv, capsys)
        assert (code, out) == (2, "")
        assert "usage:" in err

    def test_unreadable_file_exits_2(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, _, err = run(["validate", str(tmp_path / "missing.json")], capsys)
        assert code == 2
        assert "cannot read" in err


class TestAdmission:
    def test_prints_its_own_usage(self, capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exited:
            main(["admission", "--help"])
        assert exited.value.code == 0
        assert capsys.readouterr().out.startswith("usage: dispatch-kubeflow admission")

    def test_the_module_is_the_same_command(self) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "dispatch_kubeflow.admission", "--help"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.startswith("usage: dispatch-kubeflow admission")

    def test_needs_the_admission_check_it_controls(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        with pytest.raises(SystemExit) as exited:
            main(["admission"])
        assert exited.value.code == 2
        assert "--admission-check" in capsys.readouterr().err

    def test_the_lease_defaults_to_the_settings_default_lease(self) -> None:
        args = cli.build_parser().parse_args(["admission", "--admission-check", "gate"])
        cfg = cli.admission_config(args)
        assert (cfg.check, cfg.lease_namespace, cfg.lease_name) == (
            "gate",
            "dispatch-system",
            "dispatch-admission",
        )
        assert cfg.request_timeout == 30.0

    @pytest.mark.parametrize(
        ("flags", "named"),
        [
            (["--admission-check", "Not A Name"], "--admission-check"),
            (["--admission-check", "gate", "--lease-namespace", "a.b"], "--lease-namespace"),
            (["--admission-check", "gate", "--lease-name", "UPPER"], "--lease-name"),
        ],
    )
    def test_refuses_a_bad_name_in_one_line(
        self, flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        assert main(["admission", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert named in err

    def test_refuses_disordered_election_timing(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["admission", "--admission-check", "gate", "--lease-duration", "5"]) == 2
        assert "lease duration" in capsys.readouterr().err

    def test_timing_flags_are_seconds(self) -> None:
        args = cli.build_parser().parse_args(
            ["admission", "--admission-check", "gate", "--retry-period", "0.2"]
        )
        assert args.retry_period == timedelta(seconds=0.2)


def alias_bomb(levels: int) -> str:
    """A manifest whose metadata expands to 10**levels strings through YAML aliases."""
    lines = [
        "apiVersion: dispatch.phpboyscout.uk/v1alpha1",
        "kind: KubeflowAdapter",
        "metadata:",
        '  l0: &l0 ["x","x","x","x","x","x","x","x","x","x"]',
    ]
    for level in range(1, levels):
        below = f"*l{level - 1}"
        lines.append(f"  l{level}: &l{level} [{','.join([below] * 10)}]")
    return "\n".join([*lines, "spec:", "  namespace: a", ""])


def one_line(err: str) -> str:
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


class TestHostileInput:
    @pytest.mark.parametrize(
        "text",
        [
            "{" * 1000,
            '{"namespace": ' + "[" * 1000 + "]" * 1000 + "}",
            '{"apiVersion": "v", "kind": "k", "spec": ' + "[" * 1000 + "]" * 1000 + "}",
            "spec: " + "[" * 1000,
            "spec:\n  labels:\n    " + "- " * 1000 + "x\n",
        ],
    )
    def test_deep_nesting_is_refused_in_one_line(
        self, text: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, out, err = run(["validate", "-"], capsys, stdin=text)
        assert (code, out) == (1, "")
        assert "levels deep" in one_line(err)

    def test_an_alias_bomb_is_refused_at_its_first_alias(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, _, err = run(["validate", "-"], capsys, stdin=alias_bomb(7))
        assert code == 1
        assert one_line(err).startswith(
            "invalid settings: YAML aliases (*l0) are not supported: a manifest needs none"
        )

    def test_refusing_a_bomb_costs_no_more_as_it_grows(self) -> None:
        def validate(text: str) -> int:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
                patch.setattr(sys, "stderr", io.StringIO())
                return main(["validate", "-"])

        assert_grows_linearly(alias_bomb, validate, 40)

    def test_a_recursive_alias_is_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = run(["validate", "-"], capsys, stdin="spec: &a [*a]\n")
        assert code == 1
        assert "YAML aliases (*a)" in one_line(err)

    def test_anchors_without_aliases_are_fine(self, capsys: pytest.CaptureFixture[str]) -> None:
        code, _, err = run(["validate", "-"], capsys, stdin=MANIFEST.replace("spec:", "spec: &s"))
        assert (code, err) == (0, "")

    def test_a_5000_digit_integer_is_a_number_in_the_wrong_place(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        text = MANIFEST.replace("namespace: team-a", "namespace: " + "1" * 5000)
        code, _, err = run(["validate", "-"], capsys, stdin=text)
        assert code == 1
        assert one_line(err) == (
            "invalid settings at /spec/namespace: must be a string, not a number\n"
        )

    def test_a_5000_digit_integer_in_metadata_is_no_crash(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        text = MANIFEST.replace("  name: team-a", "  name: team-a\n  generation: " + "9" * 5000)
        code, _, err = run(["validate", "-"], capsys, stdin=text)
        assert (code, err) == (0, "")

    def test_a_line_separator_in_a_key_stays_escaped(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # YAML reads a raw U+2028 as a line break; the escape is the character itself.
        text = MANIFEST.replace("  nodeLossWindow: 90s", '  labels: {"a\\u2028b": "v"}')
        code, _, err = run(["validate", "-"], capsys, stdin=text)
        assert code == 1
        assert '"/spec/labels/a\\u2028b"' in one_line(err)

    def test_input_over_the_bound_is_refused_unread(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        code, _, err = run(["validate", "-"], capsys, stdin=b" " * (MAX_INPUT_BYTES + 1))
        assert code == 1
        assert one_line(err) == "invalid settings: the document is larger than 3 MiB\n"


class TestStreamsAndFaults:
    def test_a_closed_stdin(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.setattr(sys, "stdin", None)
        assert main(["validate", "-"]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert (
            one_line(err)
            == "dispatch-kubeflow validate: cannot read standard input: it is closed\n"
        )

    @pytest.mark.parametrize("command", [["schema"], ["validate", "examples/settings.json"]])
    def test_a_closed_stdout(
        self,
        command: list[str],
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        monkeypatch.chdir(ROOT)
        monkeypatch.setattr(sys, "stdout", None)
        assert main(command) == EXIT_USAGE
        err = capsys.readouterr().err
        assert "cannot write the output: standard output is closed" in one_line(err)

    @pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
    @pytest.mark.parametrize("command", [["schema"], ["validate", "examples/settings.json"]])
    def test_a_full_disk(self, command: list[str]) -> None:
        with open("/dev/full", "wb") as full:
            result = subprocess.run(
                [sys.executable, "-m", "dispatch_kubeflow.cli", *command],
                stdout=full,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                check=False,
            )
        assert result.returncode == EXIT_USAGE
        assert "cannot write the output: No space left on device" in one_line(result.stderr)

    def test_a_file_name_that_is_not_utf8(self, capsys: pytest.CaptureFixture[str]) -> None:
        name = os.fsdecode(b"/nonexistent/\xff.json")
        code, _, err = run(["validate", name], capsys)
        assert code == EXIT_USAGE
        assert "cannot read /nonexistent/\\udcff.json" in one_line(err)

    def test_an_internal_error_has_its_own_status_and_one_line(
        self, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        def broken(_data: bytes) -> None:
            raise RuntimeError("a fault\nacross lines")

        monkeypatch.setattr(cli, "load_settings_or_manifest", broken)
        code, out, err = run(["validate", "-"], capsys, stdin="{}")
        assert (code, out) == (EXIT_INTERNAL, "")
        assert one_line(err) == (
            "dispatch-kubeflow: internal error (RuntimeError: a fault\\nacross lines); "
            "please report it\n"
        )
