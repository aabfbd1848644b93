"""What an informer's cache holds of N TrainJob-sized objects, each parsed from its own JSON.

Prints the traced memory (tracemalloc) of the objects as parsed and as the informer keeps them
(every key interned), the time the interning adds per object, and what an index of one key per
value costs held as sets and as tuples. No cluster is needed.

    python3 benchmarks/informer_memory.py --objects 8000
"""

from __future__ import annotations

import argparse
import json
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from dispatch_kubeflow.kube.informer import Informer


def trainjob(n: int) -> dict[str, Any]:
    labels = {
        "dispatch.phpboyscout.uk/adapter": "default",
        "dispatch.phpboyscout.uk/job": f"job-{n}",
        "dispatch.phpboyscout.uk/attempt": "1",
    }
    return {
        "metadata": {
            "name": f"job-{n}-1",
            "namespace": "team-a",
            "uid": f"uid-{n}",
            "resourceVersion": str(n),
            "labels": labels,
            "annotations": {"dispatch.phpboyscout.uk/spec-hash": "0123456789abcdef"},
            "creationTimestamp": "2026-12-07T12:00:00Z",
        },
        "status": {
            "conditions": [
                {
                    "type": kind,
                    "status": "True",
                    "reason": kind,
                    "message": f"TrainJob job-{n}-1 is {kind}",
                    "lastTransitionTime": "2026-12-07T12:00:00Z",
                }
                for kind in ("Created", "Suspended", "Complete")
            ],
            "jobsStatus": [{"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1}],
        },
    }


def traced_mib(build: Callable[[], Any]) -> tuple[float, Any]:
    tracemalloc.start()
    built = build()
    size = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return size / 2**20, built


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=8000)
    args = parser.parse_args()
    lines = [json.dumps(trainjob(n)) for n in range(args.objects)]

    async def ignore(_change: Any) -> None:
        return None

    # The informer's own trim, as every cached object goes through it (whole objects kept here).
    keep = Informer("TrainJob", ignore, ignore)._trim

    parsed, _ = traced_mib(lambda: [json.loads(line) for line in lines])
    kept, _ = traced_mib(lambda: [keep(json.loads(line)) for line in lines])
    start = time.perf_counter()
    for line in lines:
        json.loads(line)
    plain = time.perf_counter() - start
    start = time.perf_counter()
    for line in lines:
        keep(json.loads(line))
    interned = time.perf_counter() - start

    jobs = [f"job-{n}" for n in range(args.objects)]
    keys = [f"team-a/job-{n}-1" for n in range(args.objects)]
    sets, _ = traced_mib(lambda: {j: {k} for j, k in zip(jobs, keys, strict=True)})
    tuples, _ = traced_mib(lambda: {j: (k,) for j, k in zip(jobs, keys, strict=True)})
    index = {"sets": round(sets, 2), "tuples": round(tuples, 2)}

    print(
        json.dumps(
            {
                "objects": args.objects,
                "parsed_mib": round(parsed, 1),
                "as_cached_mib": round(kept, 1),
                "interning_us_per_object": round((interned - plain) / args.objects * 1e6, 1),
                "index_of_one_key_per_value_mib": index,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
