"""The publish program of SPEC §8, run as a trainer container runs it: one file, any python3."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
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


def run_bytes(
    program: Path, sink: Path, *args: bytes, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    """As ``run``, with arguments and stdin as raw bytes, which need not be UTF-8."""
    result = subprocess.run(
        [sys.executable.encode(), b"-I", bytes(program), *args],
        input=stdin,
        capture_output=True,
        env={"DISPATCH_TERMINATION_LOG": str(sink)},
        check=False,
        timeout=30,
    )
    return subprocess.CompletedProcess(
        result.args, result.returncode, result.stdout.decode(), result.stderr.decode()
    )


def one_line_refusal(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("publish: ")
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ('{"a": "\\ud800"}', "'\\ud800', a lone surrogate"),
        ('{"\\udfff": 1}', "'\\udfff', a lone surrogate"),
        ("[" * 3000 + "]" * 3000, "nested more than 64 levels deep"),
        ('{"a": ' + "[" * 65 + "]" * 65 + "}", "nested more than 64 levels deep"),
        ('{"a": 1e999}', "'1e999', beyond what a JSON number can be"),
        ('{"a": -1e999}', "'-1e999', beyond what a JSON number can be"),
        ('{"a": ' + "1" * 5000 + "}", "a number of 5000 digits"),
        ('{"a\u2028": 1, "a\u2028": 2}', "the key 'a\\u2028' twice"),
    ],
)
def test_refuses_what_json_cannot_carry(
    program: Path, tmp_path: Path, record: str, message: str
) -> None:
    sink = tmp_path / "log"
    assert message in one_line_refusal(run(program, sink, record))
    assert not sink.exists()


def test_nesting_within_the_bound_is_published(program: Path, tmp_path: Path) -> None:
    sink = tmp_path / "log"
    record = '{"a": ' + "[" * 63 + "]" * 63 + "}"
    assert run(program, sink, record).returncode == 0
    assert sink.read_text() == record.replace(" ", "")


@pytest.mark.parametrize("where", ["argv", "stdin"])
def test_refuses_text_that_is_not_utf8(program: Path, tmp_path: Path, where: str) -> None:
    sink = tmp_path / "log"
    record = b'{"a": "\xff"}'
    result = (
        run_bytes(program, sink, record)
        if where == "argv"
        else run_bytes(program, sink, stdin=record)
    )
    assert "the record is not UTF-8 text (byte 7)" in one_line_refusal(result)


def test_a_failed_write_leaves_the_earlier_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = tmp_path / "log"
    monkeypatch.setenv("DISPATCH_TERMINATION_LOG", str(sink))
    assert publish.main(['{"step": 1, "loss": 0.5}']) == 0

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkstemp", full)
    monkeypatch.setattr(os, "write", full)
    assert publish.main(['{"step": 2}']) == 1
    assert "cannot write" in capsys.readouterr().err
    assert sink.read_bytes() == b'{"step":1,"loss":0.5}'
    assert [p.name for p in tmp_path.iterdir()] == ["log"]


def test_a_path_that_cannot_be_replaced_is_written_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the kubelet's mounted termination-log file: rename fails, the write goes in place."""
    sink = tmp_path / "log"
    monkeypatch.setenv("DISPATCH_TERMINATION_LOG", str(sink))
    assert publish.main(['{"step": 1, "padding": "' + "x" * 100 + '"}']) == 0

    def busy(*_args: object) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy")

    monkeypatch.setattr(os, "replace", busy)
    assert publish.main(['{"step": 2}']) == 0
    assert sink.read_bytes() == b'{"step":2}'
    assert [p.name for p in tmp_path.iterdir()] == ["log"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_a_device_is_written_to_never_replaced(program: Path) -> None:
    result = run(program, Path("/dev/full"), "{}")
    assert result.returncode == 1
    assert result.stderr == "publish: cannot write /dev/full: No space left on device\n"
    assert Path("/dev/full").is_char_device()
