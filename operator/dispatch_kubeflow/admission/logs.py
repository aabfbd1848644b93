"""dispatch-admission's logs: JSON lines on stderr, in the shape of the operator's.

The operator logs through kopf's JSON formatter: one object per line with ``message``,
``timestamp`` (ISO 8601, UTC) and ``severity`` (``debug``, ``info``, ``warn``, ``error``,
``fatal``), plus ``exc_info`` with the traceback when there is one. This formatter writes the same
keys, plus ``logger``, without kopf (only the operator's handlers know kopf), so one log pipeline
reads both programs.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Final, Literal

LogFormat = Literal["json", "plain"]
PLAIN_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def severity(levelno: int) -> str:
    """kopf's severity names for a logging level."""
    if levelno <= logging.DEBUG:
        return "debug"
    if levelno <= logging.INFO:
        return "info"
    if levelno <= logging.WARNING:
        return "warn"
    if levelno <= logging.ERROR:
        return "error"
    return "fatal"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: message, timestamp, severity, logger (and exc_info)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "message": record.getMessage(),
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "severity": severity(record.levelno),
            "logger": record.name,
        }
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: LogFormat) -> None:
    """Log at ``level`` to stderr, as JSON lines or as plain text for people."""
    root = logging.getLogger()
    root.setLevel(level.upper())  # an unknown level is refused before anything changes
    handler = logging.StreamHandler(sys.stderr)
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(PLAIN_FORMAT)
    handler.setFormatter(formatter)
    root.handlers[:] = [handler]
