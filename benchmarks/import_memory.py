"""The resident memory of importing the operator's modules, with the client whole and deferred.

    python3 benchmarks/import_memory.py

Each figure is a fresh interpreter's VmRSS after importing ``dispatch_kubeflow.cli``, the
handlers, the admission controller and kopf, and counts the kubernetes_asyncio modules loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys

PROGRAM = """
import json, re, sys
if {deferred}:
    from dispatch_kubeflow.kube.lazyclient import defer_client_imports
    defer_client_imports()
import dispatch_kubeflow.cli, dispatch_kubeflow.handlers, dispatch_kubeflow.admission.controller
import kopf
status = open("/proc/self/status").read()
rss = int(re.search(r"VmRSS:\\s+(\\d+)", status).group(1))
print(json.dumps({{
    "rss_mib": round(rss / 1024, 1),
    "client_modules": sum(m.startswith("kubernetes_asyncio.client.") for m in sys.modules),
}}))
"""


def measure(deferred: bool) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM.format(deferred=deferred)],
        capture_output=True,
        text=True,
        check=True,
    )
    measured: dict[str, float] = json.loads(done.stdout)
    return measured


def main() -> None:
    print(json.dumps({"whole": measure(False), "deferred": measure(True)}, indent=2))


if __name__ == "__main__":
    main()
