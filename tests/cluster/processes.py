"""Supervise the background processes of the control plane and the full stack.

Both start binaries in their own session with output appended to a log file, record their
process ids in a state file (so another process can stop them), wait for a readiness probe
while watching that the process has not died, and stop whole process groups. That logic lives
here once; each user supplies its error class, working folder, log locations and state writer.
"""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

STOP_TIMEOUT = 15.0
KILL_TIMEOUT = 5.0
STOP_POLL_INTERVAL = 0.1


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); treat it as gone.
    with contextlib.suppress(OSError):
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return status != "Z"
    return True


def stop_group(pid: int, error: type[Exception], timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM a process group, then SIGKILL it if it has not gone after `timeout` seconds."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, KILL_TIMEOUT)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not process_alive(pid):
                return
            time.sleep(STOP_POLL_INTERVAL)
    raise error(f"process group {pid} survived SIGKILL")


def log_tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass(frozen=True)
class Patience:
    """How long to wait for a process to be ready, how often to probe, how much log to show."""

    ready_timeout: float
    poll_interval: float
    tail_lines: int


class Processes:
    """Named child processes, each in its own process group with its own log file.

    `cwd` is the working folder and holds the state `save_state` writes after every change;
    errors are raised as `error` so each user keeps its own exception type.
    """

    def __init__(
        self,
        error: type[Exception],
        cwd: Path,
        log_file: Callable[[str], Path],
        save_state: Callable[[], None],
        patience: Patience,
    ) -> None:
        self.error = error
        self.cwd = cwd
        self.log_file = log_file
        self.save_state = save_state
        self.patience = patience
        self.pids: dict[str, int] = {}
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(self, name: str, command: list[str], env: Mapping[str, str] | None = None) -> None:
        log = self.log_file(name).open("ab")
        # Own session: the whole process group can be signalled, and a Ctrl-C in the
        # terminal that runs pytest reaches pytest (which tears down) rather than the children.
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=self.cwd,
            env=None if env is None else dict(env),
        )
        log.close()
        self._children[name] = process
        self.pids[name] = process.pid
        self.save_state()

    def running(self, name: str) -> bool:
        pid = self.pids.get(name)
        return pid is not None and process_alive(pid)

    def stop(self, name: str) -> None:
        pid = self.pids.pop(name, None)
        if pid is None:
            return
        stop_group(pid, self.error)
        child = self._children.pop(name, None)
        if child is not None:
            child.wait()
        if self.cwd.exists():
            self.save_state()

    def wait_ready(self, name: str, probe: Callable[[], bool]) -> None:
        """Poll `probe` until it holds; raise with the log tail if `name` dies or times out."""
        deadline = time.monotonic() + self.patience.ready_timeout
        while time.monotonic() < deadline:
            if not self.running(name):
                raise self.error(self._failure(name, "exited during start-up"))
            with contextlib.suppress(OSError, ssl.SSLError):
                if probe():
                    return
            time.sleep(self.patience.poll_interval)
        timeout = self.patience.ready_timeout
        raise self.error(self._failure(name, f"not ready after {timeout:.0f} s"))

    def _failure(self, name: str, what: str) -> str:
        log = self.log_file(name)
        return f"{name} {what}; last lines of {log}:\n" + log_tail(log, self.patience.tail_lines)


class Supervised:
    """Gives a class that supervises through `self.processes` its `pids` (saved and restored)."""

    processes: Processes

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running processes by binary name."""
        return self.processes.pids

    @pids.setter
    def pids(self, pids: dict[str, int]) -> None:
        self.processes.pids = pids
