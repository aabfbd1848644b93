"""Settings parse throughput: documents per second for the seed's example and for the largest.

The largest holds as many runtimes, credentials, taints, labels and annotations as the bounds
allow (64 each).

Run from the repository root: ``python3 benchmarks/parse_settings.py [--seconds N]``.
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path

from dispatch_kubeflow.settings import parse_settings
from dispatch_kubeflow.settings.models import ENTRIES_MAX

# The seed's example, kept as examples/settings.json.
EXAMPLE = json.loads((Path(__file__).resolve().parents[1] / "examples/settings.json").read_text())
LARGEST = {
    **EXAMPLE,
    "runtimes": [{"kind": "TrainingRuntime", "name": f"runtime-{i}"} for i in range(ENTRIES_MAX)],
    "credentials": [
        {"secretName": f"secret-{i}", "mountPath": f"/var/run/secrets/s{i}"}
        for i in range(ENTRIES_MAX)
    ],
    "nodeLossTaints": [f"example.com/taint-{i}" for i in range(ENTRIES_MAX)],
    "labels": {f"example.com/label-{i:02d}": f"value-{i}" for i in range(ENTRIES_MAX)},
    "annotations": {f"example.com/note-{i:02d}": f"value-{i}" for i in range(ENTRIES_MAX)},
}


def documents_per_second(parse: Callable[[], object], seconds: float) -> float:
    parse()  # warm up
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        parse()
        count += 1
        now = time.perf_counter()
        if now >= deadline:
            return count / (now - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0, help="time per document")
    args = parser.parse_args()
    for name, document in (("seed example", EXAMPLE), ("largest", LARGEST)):
        text = json.dumps(document)
        rate = documents_per_second(functools.partial(parse_settings, text), args.seconds)
        print(f"{name:>12}: {rate:12,.0f} documents/s  ({len(text):,} bytes)")


if __name__ == "__main__":
    main()
