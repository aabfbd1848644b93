"""The publish program of SPEC §8, run as a trainer container runs it: one file, any python3."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch_kubeflow import publish

SOURCE = Path(publish.__file__)
PYENV = Path.home() / ".pyenv" / "versions"
# Every Python 3 on the machine: the program must not depend on a recent one.
INTERPRETERS = sorted(
    {sys.executable, *(str(p / "bin" / "python3") for p in PYENV.glob("3.*") if p.is_dir())}
)


@pytest.fixture
def program(tmp_path: Path) -> Path:
    """The file alone, away from the package, as the publish image holds it."""
    copy = tmp_path / "image" / "publish"
    copy.parent.mkdir()
    shutil.copy(SOURCE, copy)
    return copy


def run(
    program: Path,
    sink: Path,
    *args: str,
    stdin: str | None = None,
    python: str = sys.executable,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-I", str(program), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={"DISPATCH_TERMINATION_LOG": str(sink)},
        check=False,
        timeout=30,
    )


@pytest.mark.parametrize("python", INTERPRETERS)
def test_runs_standalone_with_every_python3(program: Path, tmp_path: Path, python: str) -> None:
    sink = tmp_path / "termination-log"
    result = run(program, sink, '{"loss": 0.5, "uri": "s3://b/ckpt"}', python=python)
    assert result.returncode == 0, result.stderr
    assert json.loads(sink.read_text()) == {"loss": 0.5, "uri": "s3://b/ckpt"}


def test_reads_the_record_from_stdin(program: Path, tmp_path: Path) -> None:
    sink = tmp_path / "log"
    result = run(program, sink, stdin='{\n  "step": 10\n}\n')
    assert result.returncode == 0, result.stderr
    assert sink.read_bytes() == b'{"step":10}'


def test_a_later_record_replaces_the_earlier(program: Path, tmp_path: Path) -> None:
    sink = tmp_path / "log"
    run(program, sink, '{"step": 1, "padding": "' + "x" * 100 + '"}')
    run(program, sink, '{"step": 2}')
    assert sink.read_bytes() == b'{"step":2}'


def test_exactly_4_kib_is_accepted(program: Path, tmp_path: Path) -> None:
    sink = tmp_path / "log"
    record = '{"a":"' + "x" * (4096 - len('{"a":""}')) + '"}'
    assert len(record) == 4096
    assert run(program, sink, record).returncode == 0
    assert sink.read_text() == record


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ('{"a":"' + "x" * (4097 - len('{"a":""}')) + '"}', "4097 bytes, over the 4096-byte limit"),
        ("[1, 2]", "must be a JSON object, not list"),
        ('"text"', "must be a JSON object, not str"),
        ("not json", "not valid JSON"),
        ('{"a": NaN}', "NaN is not a JSON number"),
        ('{"a": 1, "a": 2}', "the key 'a' twice"),
        ('{"a": 1} trailing', "not valid JSON"),
    ],
)
def test_refuses_what_is_not_a_small_json_object(
    program: Path, tmp_path: Path, record: str, message: str
) -> None:
    sink = tmp_path / "log"
    result = run(program, sink, record)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stderr.startswith("publish: ")
    assert not sink.exists()


def test_refuses_no_record_and_extra_arguments(program: Path, tmp_path: Path) -> None:
    sink = tmp_path / "log"
    empty = run(program, sink, stdin="")
    assert empty.returncode == 2
    assert "no record given" in empty.stderr
    result = run(program, sink, "{}", "{}")
    assert result.returncode == 2
    assert "too many arguments" in result.stderr


def test_an_unwritable_termination_log_fails_with_status_1(program: Path, tmp_path: Path) -> None:
    result = run(program, tmp_path / "missing" / "log", "{}")
    assert result.returncode == 1
    assert "cannot write" in result.stderr
