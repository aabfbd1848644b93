"""The suite's own promises: `-m "not cluster"` builds and starts nothing, and no process the
suite started outlives it.

Both are checked by running pytest in a child process whose environment carries a token of its
own; every process that run starts inherits the token, so any of them still alive afterwards is
found (and killed) even once it has been re-parented.
"""

from __future__ import annotations

import os
import re
import secrets
import site
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from tests.cluster import processes
from tests.cluster.processes import Patience, Processes

ROOT = Path(__file__).resolve().parents[2]
RUN_TOKEN = "DISPATCH_KUBEFLOW_TEST_RUN"
# Everything a `cluster` test may reach for; on the child's PATH each is a shim that records
# the call and fails.
TOOLS = ("go", "gofmt", "helm", "podman", "buildah", "docker", "kubectl", "etcd", "kind")
SYSTEM_DIRS = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
CHILD_TIMEOUT = 540
PATIENCE = Patience(ready_timeout=5.0, poll_interval=0.1, tail_lines=5)


class Interrupted(BaseException):
    """Stands for a test's timeout or a Ctrl-C arriving while a process is being stopped."""


def run_pytest(args: list[str], env: Mapping[str, str], token: str) -> tuple[str, dict[int, str]]:
    """Run pytest in a child; return its output and the processes of that run still alive."""
    child_env = {**env, RUN_TOKEN: token}
    for name in ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", "KUBECONFIG"):
        child_env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
        check=False,
    )
    output = f"exit code {result.returncode}\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    return output, processes.with_environment(RUN_TOKEN, token)


@pytest.fixture
def token() -> Iterator[str]:
    """A token for one child run; whatever of that run is still alive afterwards is killed."""
    value = secrets.token_hex(8)
    yield value
    processes.kill(processes.with_environment(RUN_TOKEN, value))


def write_shims(folder: Path, record: Path) -> None:
    folder.mkdir()
    for tool in TOOLS:
        shim = folder / tool
        shim.write_text(
            "#!/bin/sh\n"
            f'echo "{tool} $*" >> "{record}"\n'
            f'echo "{tool} was called by a test outside the cluster marker" >&2\n'
            "exit 127\n"
        )
        shim.chmod(0o755)


def path_without_go(shims: Path) -> str:
    """The shims (ahead of any real tool), the interpreter's folder and the system folders,
    less any folder that holds `go`."""
    folders = dict.fromkeys([str(Path(sys.executable).parent), *SYSTEM_DIRS])
    kept = [folder for folder in folders if not (Path(folder) / "go").exists()]
    return os.pathsep.join([str(shims), *kept])


@pytest.mark.timeout(CHILD_TIMEOUT + 60)
def test_tests_outside_the_cluster_marker_build_and_start_nothing(
    tmp_path: Path, token: str, request: pytest.FixtureRequest
) -> None:
    record = tmp_path / "tools-called"
    write_shims(tmp_path / "shims", record)
    cache = tmp_path / "cache"
    home = tmp_path / "home"
    cache.mkdir()
    home.mkdir()
    env = {
        **os.environ,
        "PATH": path_without_go(tmp_path / "shims"),
        "HOME": str(home),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "DISPATCH_KUBEFLOW_CACHE": str(cache),
        "GOPROXY": "off",
        # HOME moved: keep packages installed for the user importable.
        "PYTHONUSERBASE": site.getuserbase(),
    }

    started = time.monotonic()
    output, left = run_pytest(
        ["-m", "not cluster", "-q", "--deselect", request.node.nodeid], env, token
    )
    seconds = time.monotonic() - started

    assert output.startswith("exit code 0\n"), output
    passed = re.search(r"(\d+) passed", output)
    assert passed is not None, output
    assert int(passed.group(1)) > 0
    assert not record.exists(), f"called: {record.read_text()}\n{output}"
    assert sorted(p.relative_to(cache) for p in cache.rglob("*")) == [], output
    assert left == {}, output
    print(f"{passed.group(1)} tests outside the cluster marker passed in {seconds:.1f} s")


def test_a_process_left_running_fails_the_session_and_is_killed(tmp_path: Path, token: str) -> None:
    leaky = tmp_path / "test_leaky.py"
    leaky.write_text(
        textwrap.dedent(
            """
            import subprocess

            from tests.cluster.processes import Patience, Processes


            def test_leaves_two_processes_running(tmp_path):
                supervised = Processes(
                    RuntimeError,
                    tmp_path,
                    lambda name: tmp_path / f"{name}.log",
                    lambda: None,
                    Patience(5.0, 0.1, 5),
                )
                supervised.spawn("supervised-sleeper", ["sleep", "300"])
                subprocess.Popen(["sleep", "301"])
            """
        )
    )

    output, left = run_pytest(
        ["-c", str(ROOT / "pyproject.toml"), "-p", "tests.conftest", str(leaky)],
        os.environ,
        token,
    )

    assert output.startswith("exit code 1\n"), output
    assert "1 passed" in output
    message = re.search(r"processes the suite started still ran at its end.*", output)
    assert message is not None, output
    assert "supervised-sleeper (pid" in message.group(0)
    assert "sleep 301 (pid" in message.group(0)
    assert left == {}


def test_stopping_every_process_goes_on_past_an_interrupted_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    supervised = Processes(
        RuntimeError, tmp_path, lambda name: tmp_path / f"{name}.log", lambda: None, PATIENCE
    )
    for name in ("controller", "apiserver", "store"):
        supervised.spawn(name, ["sleep", "300"])
    interrupted_pid = supervised.pids["apiserver"]
    stop_group = processes.stop_group

    def interrupted_for_apiserver(pid: int, error: type[Exception], timeout: float = 1.0) -> None:
        if pid == interrupted_pid:
            raise Interrupted
        stop_group(pid, error, timeout)

    monkeypatch.setattr(processes, "stop_group", interrupted_for_apiserver)
    try:
        with pytest.raises(Interrupted):
            supervised.stop_all(("controller", "apiserver", "store"))

        assert not supervised.running("controller")
        assert not supervised.running("store")
        # Not forgotten: a later stop, or the session's check, still finds it.
        assert supervised.pids == {"apiserver": interrupted_pid}
        assert processes.started_and_running().get(interrupted_pid) == "apiserver"
    finally:
        monkeypatch.undo()
        supervised.stop_all(("controller", "apiserver", "store"))
    assert interrupted_pid not in processes.started_and_running()
