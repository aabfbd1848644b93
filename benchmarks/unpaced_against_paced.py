"""Does the supervisor keep up with an unpaced writer? Paced and unpaced runs, in pairs.

    python3 benchmarks/unpaced_against_paced.py                  # the operator, two pairs
    python3 benchmarks/unpaced_against_paced.py --of library     # the library's supervisor
    python3 benchmarks/unpaced_against_paced.py --pairs 1 --jobs 200
    python3 benchmarks/unpaced_against_paced.py --runs /tmp/runs  # and keep each run's JSON
    python3 benchmarks/unpaced_against_paced.py --finish-order pods-first

Each pair runs ``operator_events.py --keep`` (or ``watch_events.py``) at ``--rate`` writes a
second and unpaced, back to back, so both see the same hour; the second pair runs them the other
way round. For each run it prints the p99 three ways: as measured, the floor's (a bare watch of
the same writes: what the machine itself did with them) and the difference between the two (what
the supervisor added). For each pair it prints the unpaced p99 over the paced p99 for each of the
three. On a machine that also runs the control plane, the unpaced writer saturates the cores and
the floor's p99 rises with it; the difference says whether the supervisor itself fell behind.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.watch_events import add_finish_order  # noqa: E402

BENCHMARKS = {
    "operator": (HERE / "operator_events.py", ["--keep"], "dispatchjob_status"),
    "library": (HERE / "watch_events.py", [], "events"),
}


def run(of: str, jobs: int, rate: float, finish_order: str, runs: Path | None) -> dict[str, Any]:
    """One run of the chosen benchmark; its progress goes to stderr, its JSON is returned (and
    kept whole under ``runs``, if given)."""
    script, extra, _ = BENCHMARKS[of]
    command = [sys.executable, str(script), "--jobs", str(jobs), *extra]
    command += ["--finish-order", finish_order]
    if rate:
        command += ["--rate", str(rate)]
    print(f"running: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True)
    if runs is not None:
        runs.mkdir(parents=True, exist_ok=True)
        name = f"{of}-{'paced' if rate else 'unpaced'}-{time.strftime('%Y%m%dT%H%M%S')}.json"
        (runs / name).write_text(done.stdout)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def summary(of: str, result: dict[str, Any]) -> dict[str, float]:
    """A run's writer rate and p99s: measured, the floor's, and their difference."""
    latency = result["latency_ms"]
    writes = result.get("transitions", 5 * result["jobs"]) + result.get("writes_without_event", 0)
    return {
        "writes_per_second": round(writes / result["transition_seconds"], 1),
        "p99_ms": latency[BENCHMARKS[of][2]]["p99"],
        "floor_p99_ms": latency["floor_bare_watch"]["p99"],
        "difference_p99_ms": latency["difference"]["p99"],
    }


def ratio(unpaced: float, paced: float) -> float | None:
    return round(unpaced / paced, 2) if paced > 0 else None


def pair(
    of: str, jobs: int, rate: float, finish_order: str, paced_first: bool, runs: Path | None
) -> dict[str, Any]:
    """A paced and an unpaced run back to back, and the unpaced p99 over the paced."""
    order = (rate, 0.0) if paced_first else (0.0, rate)
    measured = {pace: summary(of, run(of, jobs, pace, finish_order, runs)) for pace in order}
    paced, unpaced = measured[rate], measured[0.0]
    return {
        "order": "paced, unpaced" if paced_first else "unpaced, paced",
        "paced": paced,
        "unpaced": unpaced,
        "unpaced_over_paced": {
            "p99": ratio(unpaced["p99_ms"], paced["p99_ms"]),
            "floor_p99": ratio(unpaced["floor_p99_ms"], paced["floor_p99_ms"]),
            "difference_p99": ratio(unpaced["difference_p99_ms"], paced["difference_p99_ms"]),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--of", choices=sorted(BENCHMARKS), default="operator")
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=50.0, help="the paced runs' writes/s")
    add_finish_order(parser)
    parser.add_argument("--runs", type=Path, help="keep each run's whole JSON in this folder")
    args = parser.parse_args()
    if args.pairs < 1 or args.rate <= 0:
        parser.error("--pairs must be at least 1 and --rate above 0")
    pairs = [
        pair(
            args.of,
            args.jobs,
            args.rate,
            args.finish_order,
            paced_first=i % 2 == 0,
            runs=args.runs,
        )
        for i in range(args.pairs)
    ]
    result = {
        "of": args.of,
        "jobs": args.jobs,
        "rate": args.rate,
        "finish_order": args.finish_order,
        "pairs": pairs,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
