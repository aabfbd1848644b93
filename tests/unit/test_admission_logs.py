"""dispatch-admission's JSON log lines carry the operator's keys and severity names."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from dispatch_kubeflow.admission.logs import JsonFormatter, configure_logging, severity


def record(level: int, message: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("dispatch_kubeflow.admission", level, __file__, 1, message, args, None)


@pytest.mark.parametrize(
    ("level", "name"),
    [
        (logging.DEBUG, "debug"),
        (logging.INFO, "info"),
        (logging.WARNING, "warn"),
        (logging.ERROR, "error"),
        (logging.CRITICAL, "fatal"),
    ],
)
def test_severity_names_are_kopfs(level: int, name: str) -> None:
    assert severity(level) == name


def test_a_record_is_one_json_line_with_the_operators_keys() -> None:
    line = JsonFormatter().format(record(logging.WARNING, "Workload %s held\nnext", "ns/w"))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "Workload ns/w held\nnext"
    assert parsed["severity"] == "warn"
    assert parsed["logger"] == "dispatch_kubeflow.admission"
    assert parsed["timestamp"].endswith("+00:00")
    assert "exc_info" not in parsed


def test_an_exception_goes_into_exc_info() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        failed = record(logging.ERROR, "deciding failed")
        failed.exc_info = sys.exc_info()
    parsed = json.loads(JsonFormatter().format(failed))
    assert "RuntimeError: boom" in parsed["exc_info"]


def test_configure_logging_refuses_an_unknown_level() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        with pytest.raises(ValueError, match="LOUD"):
            configure_logging("LOUD", "json")
    finally:
        root.handlers[:], root.level = handlers, level
