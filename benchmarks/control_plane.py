"""How long the test control plane takes to build and to start.

    python3 benchmarks/control_plane.py                # warm start, 3 rounds
    python3 benchmarks/control_plane.py --rounds 5
    python3 benchmarks/control_plane.py --cold-build   # full rebuild with an empty Go build cache

A warm start is: etcd + kube-apiserver from cached binaries, /readyz, the `default` namespace,
and every CRD installed and Established — what the `cluster` fixture costs once per session.
The cold build compiles all four binaries with a fresh GOCACHE into a scratch folder (the
module cache is kept: it only holds downloads), which is what a CI machine without caches pays;
it reports wall time, CPU time (user + system of the Go toolchain) and seconds per binary.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster import binaries
from tests.cluster.controlplane import ControlPlane

CACHE_ROOT = binaries.CACHE_ROOT


def cold_build() -> dict[str, float]:
    """Build everything with an empty Go build cache into a scratch cache folder."""
    with (
        tempfile.TemporaryDirectory(prefix="gocache-") as gocache,
        tempfile.TemporaryDirectory(prefix="k8s-cache-") as cache_root,
    ):
        os.environ["GOCACHE"] = gocache
        binaries.CACHE_ROOT = Path(cache_root)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        target = binaries.build(force=True)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        steps = json.loads((target / "build-seconds.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), **steps}


def warm_start(rounds: int, with_controller_manager: bool) -> dict[str, float]:
    binaries.build()
    starts, crds, stops = [], [], []
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="control-plane-") as run_dir:
            plane = ControlPlane(Path(run_dir))
            started = time.monotonic()
            plane.start(with_controller_manager=with_controller_manager, install_crds=False)
            ready = time.monotonic()
            plane.install_crds()
            installed = time.monotonic()
            plane.stop()
            stops.append(time.monotonic() - installed)
            starts.append(ready - started)
            crds.append(installed - ready)
    return {
        "ready_s_median": round(statistics.median(starts), 2),
        "crds_s_median": round(statistics.median(crds), 2),
        "start_total_s_median": round(
            statistics.median(a + b for a, b in zip(starts, crds, strict=True)), 2
        ),
        "stop_s_median": round(statistics.median(stops), 2),
        "rounds": rounds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--with-controller-manager", action="store_true")
    parser.add_argument("--cold-build", action="store_true")
    args = parser.parse_args()
    result: dict[str, object] = {"kubernetes": binaries.kubernetes_version()}
    if args.cold_build:
        result["cold_build"] = cold_build()
        binaries.CACHE_ROOT = CACHE_ROOT
    result["warm_start"] = warm_start(args.rounds, args.with_controller_manager)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
