"""`python -m tests.cluster.fullstack build|up|down|status`: the full stack for people.

`up` starts the control plane (as `python -m tests.cluster up` does, with kube-controller-manager)
and the full stack on top of it in the background, then prints `export KUBECONFIG=...`; `down`
stops both. `python -m tests.cluster up --full` calls `up_full` below for the same result.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from tests.cluster import binaries
from tests.cluster.controlplane import ControlPlane
from tests.cluster.fullstack import build
from tests.cluster.fullstack.stack import FullStack, StackError, down_full, up_full

DEFAULT_RUN_DIR = binaries.CACHE_ROOT / "run"


def _build(args: argparse.Namespace) -> int:
    print(build.build(force=args.force, only=tuple(args.only)))
    return 0


def _up(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if (run_dir / "state.json").exists():
        print(f"a control plane is recorded in {run_dir}; `down` first", file=sys.stderr)
        return 1
    binaries.build()
    build.build()
    plane = ControlPlane(run_dir)
    plane.start(with_controller_manager=True)
    try:
        up_full(plane)
    except (StackError, build.BuildError) as error:
        print(f"full stack failed: {error}", file=sys.stderr)
        plane.stop()
        shutil.rmtree(run_dir)
        return 1
    print(
        f"stop it with `python -m tests.cluster.fullstack down` (logs in {run_dir / 'logs'})",
        file=sys.stderr,
    )
    print(f"export KUBECONFIG={plane.kubeconfig}")
    return 0


def _down(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if not (run_dir / "state.json").exists():
        print(f"nothing recorded in {run_dir}", file=sys.stderr)
        return 0
    plane = ControlPlane.attach(run_dir)
    down_full(plane)
    plane.stop()
    shutil.rmtree(run_dir)
    print(f"stopped the full stack and control plane in {run_dir}", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if not (run_dir / "state.json").exists():
        print("down")
        return 1
    stack = FullStack.attach(ControlPlane.attach(run_dir))
    for name, alive in stack.running().items():
        print(f"{name}: {'running' if alive else 'not running'}")
    return 0 if all(stack.running().values()) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster.fullstack", description=__doc__)
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=DEFAULT_RUN_DIR,
        help=f"where the control plane keeps its state (default {DEFAULT_RUN_DIR})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build_command = commands.add_parser(
        "build", help="build (or reuse) the binaries; print their folder"
    )
    build_command.add_argument("--force", action="store_true", help="rebuild even if cached")
    build_command.add_argument("only", nargs="*", help="build only these binaries")
    build_command.set_defaults(run=_build)
    commands.add_parser(
        "up", help="start control plane + full stack in the background"
    ).set_defaults(run=_up)
    commands.add_parser("down", help="stop them").set_defaults(run=_down)
    commands.add_parser("status", help="which full-stack processes run").set_defaults(run=_status)
    args = parser.parse_args(argv)
    result: int = args.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
