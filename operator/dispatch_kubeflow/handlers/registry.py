"""What the operator shares between handlers of different objects.

A DispatchJob's handlers need the open adapter that serves its namespace, and the dispatch events
leave the process as JSON lines on a stream the user chose. Both live in kopf's operator-wide memo
(kopf gives every object a shallow copy of it, so these objects are shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

EVENTS_TO_ENV: Final = "DISPATCH_KUBEFLOW_EVENTS_TO"
JOB_EVENTS_ENV: Final = "DISPATCH_KUBEFLOW_JOB_EVENTS"
# Which dispatch events are also posted as Kubernetes Events on their DispatchJob.
JOB_EVENTS: Final = ("all", "warnings", "none")


def job_events_choice(value: str | None) -> str:
    """``--job-events`` (or its environment variable); ``ValueError`` names the choices."""
    chosen = value or "all"
    if chosen not in JOB_EVENTS:
        raise ValueError(f"{JOB_EVENTS_ENV}={chosen!r} is not one of {', '.join(JOB_EVENTS)}")
    return chosen


@dataclass
class AdapterRegistry:
    """Open adapters by (served namespace, KubeflowAdapter name)."""

    adapters: dict[tuple[str, str], Any] = field(default_factory=dict)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def publish(self, namespace: str, name: str, adapter: Any) -> None:
        async with self.changed:
            self.adapters[(namespace, name)] = adapter
            self.changed.notify_all()

    async def withdraw(self, namespace: str, name: str, adapter: Any) -> None:
        async with self.changed:
            if self.adapters.get((namespace, name)) is adapter:
                del self.adapters[(namespace, name)]
            self.changed.notify_all()

    def get(self, namespace: str, name: str) -> Any | None:
        return self.adapters.get((namespace, name))

    async def wait_for(self, namespace: str, name: str, within: float) -> Any | None:
        """The open adapter, waiting up to ``within`` seconds for it to be published."""
        async with self.changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await self.changed.wait_for(lambda: (namespace, name) in self.adapters)
            return self.adapters.get((namespace, name))


class EventLines:
    """Writes each dispatch event as one JSON line to stdout, stderr or a file (or nowhere)."""

    def __init__(self, target: str | None) -> None:
        self.target = target or "none"
        self._stream: IO[str] | None = None
        if self.target == "stdout":
            self._stream = sys.stdout
        elif self.target == "stderr":
            self._stream = sys.stderr
        elif self.target != "none":
            self._stream = Path(self.target).open("a", encoding="utf-8", buffering=1)  # noqa: SIM115

    def write(self, event: dict[str, Any]) -> None:
        if self._stream is None:
            return
        self._stream.write(json.dumps(event, separators=(",", ":"), sort_keys=False) + "\n")
        self._stream.flush()

    def close(self) -> None:
        if self._stream is not None and self._stream not in (sys.stdout, sys.stderr):
            self._stream.close()
        self._stream = None
