"""`python -m tests.cluster build|up|down|status`: the test control plane for people.

`up` starts the same etcd + kube-apiserver (+ kube-controller-manager; with `--full` also the
scheduler, KWOK nodes and the Trainer, JobSet and Kueue controllers) the test suite uses, in
the background, and prints the `export KUBECONFIG=...` line to use it; `down` stops it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from tests.cluster import binaries
from tests.cluster.controlplane import ControlPlane, ControlPlaneError, process_alive

DEFAULT_RUN_DIR = binaries.CACHE_ROOT / "run"


def _build(args: argparse.Namespace) -> int:
    print(binaries.build(force=args.force))
    return 0


def _up(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if (run_dir / "state.json").exists():
        plane = ControlPlane.attach(run_dir)
        if any(process_alive(pid) for pid in plane.pids.values()):
            print(f"a control plane already runs from {run_dir}; `down` first", file=sys.stderr)
            print(f"export KUBECONFIG={plane.kubeconfig}")
            return 1
        shutil.rmtree(run_dir)
    binaries.build()
    started = time.monotonic()
    plane = ControlPlane(run_dir)
    plane.start(with_controller_manager=args.with_controller_manager or args.full)
    if args.full:
        from tests.cluster.fullstack.stack import up_full

        try:
            up_full(plane)
        except BaseException:
            plane.stop()
            shutil.rmtree(run_dir)
            raise
    print(
        f"control plane up in {time.monotonic() - started:.1f} s at {plane.server} "
        f"(logs in {run_dir / 'logs'}); stop it with `python -m tests.cluster down`",
        file=sys.stderr,
    )
    print(f"export KUBECONFIG={plane.kubeconfig}")
    return 0


def _down(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if not (run_dir / "state.json").exists():
        print(f"no control plane recorded in {run_dir}", file=sys.stderr)
        return 0
    from tests.cluster.fullstack.stack import down_full

    plane = ControlPlane.attach(run_dir)
    down_full(plane)
    plane.stop()
    shutil.rmtree(run_dir)
    print(f"stopped the control plane in {run_dir}", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace) -> int:
    run_dir: Path = args.run_dir
    if not (run_dir / "state.json").exists():
        print("down")
        return 1
    from tests.cluster.fullstack.stack import FullStack

    plane = ControlPlane.attach(run_dir)
    pids = {**plane.pids, **FullStack.attach(plane).pids}
    for name, pid in pids.items():
        print(f"{name}: pid {pid} {'running' if process_alive(pid) else 'gone'}")
    print(f"export KUBECONFIG={plane.kubeconfig}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    parser.add_argument(
        "--run-dir",
        type=Path,
        default=DEFAULT_RUN_DIR,
        help=f"where the control plane keeps its state (default {DEFAULT_RUN_DIR})",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build (or reuse) the binaries; print their folder")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.set_defaults(run=_build)
    up = commands.add_parser("up", help="start a control plane in the background")
    up.add_argument(
        "--with-controller-manager",
        action="store_true",
        help="also run kube-controller-manager (garbage collection, Jobs, node lifecycle)",
    )
    up.add_argument(
        "--full",
        action="store_true",
        help="also kube-scheduler, KWOK nodes and the Trainer, JobSet and Kueue controllers",
    )
    up.set_defaults(run=_up)
    commands.add_parser("down", help="stop the background control plane").set_defaults(run=_down)
    commands.add_parser("status", help="show the background control plane").set_defaults(
        run=_status
    )
    args = parser.parse_args(argv)
    try:
        code: int = args.run(args)
    except (binaries.BuildError, ControlPlaneError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
