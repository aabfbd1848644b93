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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

STOP_TIMEOUT = 15.0
KILL_TIMEOUT = 5.0
STOP_POLL_INTERVAL = 0.1

# Every process `Processes` started in this interpreter and has not stopped yet, by pid: the
# test session checks at its end that none is left.
_started: dict[int, str] = {}


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


def started_and_running() -> dict[int, str]:
    """The processes started through `Processes` in this interpreter that still run, by pid."""
    return {pid: name for pid, name in _started.items() if process_alive(pid)}


def _stat(pid: str) -> tuple[str, int] | None:
    """State letter and parent pid of a process, from /proc/<pid>/stat; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1])


def command_line(pid: int) -> str:
    """A process's command line, shortened, for messages ("?" once it is gone)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    text = " ".join(
        [
            Path(argv[0].decode(errors="replace")).name,
            *(a.decode(errors="replace") for a in argv[1:]),
        ]
    )
    return text if len(text) <= 120 else text[:117] + "..."


def descendants(root: int) -> dict[int, str]:
    """The living (not zombie) descendants of process `root`, by pid, named by command line."""
    children: dict[int, list[int]] = {}
    states: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        stat = _stat(entry.name) if entry.name.isdigit() else None
        if stat is not None:
            states[int(entry.name)] = stat[0]
            children.setdefault(stat[1], []).append(int(entry.name))
    found: dict[int, str] = {}
    pending = list(children.get(root, []))
    while pending:
        pid = pending.pop()
        pending.extend(children.get(pid, []))
        if states[pid] != "Z":
            found[pid] = command_line(pid)
    return found


def with_environment(name: str, value: str) -> dict[int, str]:
    """The living processes whose environment has `name=value`, by pid, named by command line.

    A variable set for a child is inherited by everything it starts, so this finds a run's
    processes even after their parent has exited and they were re-parented.
    """
    wanted = f"{name}={value}".encode()
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environment = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in environment and process_alive(int(entry.name)):
            found[int(entry.name)] = command_line(int(entry.name))
    return found


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each process (its whole group if it leads one) and reap it if it is our child."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + KILL_TIMEOUT
        while process_alive(pid) and time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(STOP_POLL_INTERVAL)
        _started.pop(pid, None)


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
        _started[process.pid] = name
        self.save_state()

    def running(self, name: str) -> bool:
        pid = self.pids.get(name)
        return pid is not None and process_alive(pid)

    def stop(self, name: str) -> None:
        pid = self.pids.get(name)
        if pid is None:
            return
        stop_group(pid, self.error)
        # Forgotten only once it is gone: a stop that fails or is interrupted (a test's
        # timeout, Ctrl-C) leaves the pid recorded for a later stop and the session's check.
        del self.pids[name]
        _started.pop(pid, None)
        child = self._children.pop(name, None)
        if child is not None:
            child.wait()
        if self.cwd.exists():
            self.save_state()

    def stop_all(self, names: Iterable[str]) -> None:
        """Stop each named process in turn; one that fails or is interrupted stops not the rest.

        The first interruption (a test's timeout, Ctrl-C) is raised once all were stopped,
        else one error naming every process that would not stop.
        """
        errors: list[str] = []
        interruption: BaseException | None = None
        for name in names:
            try:
                self.stop(name)
            except Exception as error:
                errors.append(str(error))
            except BaseException as error:
                interruption = interruption or error
        if interruption is not None:
            raise interruption
        if errors:
            raise self.error("; ".join(errors))

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
