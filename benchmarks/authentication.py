"""What authenticating one request costs kube-apiserver: a ServiceAccount token or a certificate.

    python3 benchmarks/authentication.py                # 40 batches of 1,000 GETs each way
    python3 benchmarks/authentication.py --batches 100

kube-apiserver verifies a client certificate's chain on every request and caches a bearer token's
verification, so a ServiceAccount token (what a cluster's controllers, the operator's Deployment
among them, authenticate with) should cost it less per request than the client certificates the
test control plane gives its users. Two identities with the same authorization (each bound to
``cluster-admin`` by a ClusterRoleBinding, so neither goes round RBAC through ``system:masters``)
GET one ConfigMap in batches, ``--concurrency`` in flight, the identities in turn. It prints
kube-apiserver's CPU microseconds per request for each, the requests per second, and what the
certificate costs more: the mean difference between paired batches, plus or minus half its 95%
confidence interval.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.dispatchjob_writes import apiserver_cpu_us, ci95, print_measured
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException

from tests.cluster.controlplane import ControlPlane

NAMESPACE = "authentication"
CONFIG_MAP = "read"
CERTIFICATE_USER = "benchmark-certificate"
TOKEN_ACCOUNT = "benchmark-token"
TOKEN, CERTIFICATE = "ServiceAccount token", "client certificate"
AUTHORIZED_WITHIN = 600  # tries, 0.1 s apart: RBAC's informer sees a new binding in about 1 s


async def prepare(plane: ControlPlane) -> dict[str, Path]:
    """The namespace, the ConfigMap both read, and a kubeconfig of each identity."""
    admin = await config.new_client_from_config(config_file=str(plane.kubeconfig))
    try:
        core = client.CoreV1Api(admin)
        namespace = client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE))
        await core.create_namespace(namespace)
        await core.create_namespaced_config_map(
            NAMESPACE, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=CONFIG_MAP))
        )
    finally:
        await admin.close()
    plane.kubectl(
        "create",
        "clusterrolebinding",
        CERTIFICATE_USER,
        "--clusterrole=cluster-admin",
        f"--user={CERTIFICATE_USER}",
    )
    return {
        TOKEN: plane.kubeconfig_for_service_account(NAMESPACE, TOKEN_ACCOUNT, "cluster-admin"),
        CERTIFICATE: plane.kubeconfig_for(CERTIFICATE_USER),
    }


async def read_once_authorized(core: client.CoreV1Api) -> None:
    for _ in range(AUTHORIZED_WITHIN):
        try:
            await core.read_namespaced_config_map(CONFIG_MAP, NAMESPACE)
            return
        except ApiException as error:
            if error.status != 403:
                raise
        await asyncio.sleep(0.1)
    raise TimeoutError("the identity was not authorized within a minute")


async def measure(plane: ControlPlane, args: argparse.Namespace) -> dict[str, Any]:
    kubeconfigs = await prepare(plane)
    apis = {
        identity: await config.new_client_from_config(config_file=str(path))
        for identity, path in kubeconfigs.items()
    }
    pid = plane.processes.pids["kube-apiserver"]
    cpu_us: dict[str, list[float]] = {identity: [] for identity in apis}
    rate: dict[str, list[float]] = {identity: [] for identity in apis}
    try:
        cores = {identity: client.CoreV1Api(api) for identity, api in apis.items()}
        for core in cores.values():
            await read_once_authorized(core)
        # Batch by batch, the identities in turn: what the machine does meanwhile falls on both.
        for batch in range(args.batches):
            for identity in (TOKEN, CERTIFICATE) if batch % 2 == 0 else (CERTIFICATE, TOKEN):
                core = cores[identity]

                async def read(_: int, core: client.CoreV1Api = core) -> None:
                    await core.read_namespaced_config_map(CONFIG_MAP, NAMESPACE)

                used, per_s = await apiserver_cpu_us(pid, args.batch, args.concurrency, read)
                cpu_us[identity].append(used)
                rate[identity].append(per_s)
    finally:
        for api in apis.values():
            await api.close()
    paired = [c - t for c, t in zip(cpu_us[CERTIFICATE], cpu_us[TOKEN], strict=True)]
    return {
        "requests_per_batch": args.batch,
        "batches_per_identity": args.batches,
        "concurrency": args.concurrency,
        "apiserver_cpu_us_per_get": {
            identity: round(statistics.fmean(used), 1) for identity, used in cpu_us.items()
        },
        "gets_per_s": {identity: round(statistics.fmean(r), 1) for identity, r in rate.items()},
        "certificate_costs_more_us_per_request": {
            "mean": round(statistics.fmean(paired), 1),
            "ci95": ci95(paired),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1000, help="GETs a batch")
    parser.add_argument("--concurrency", type=int, default=8, help="GETs in flight")
    parser.add_argument("--batches", type=int, default=40, help="batches of each identity")
    return print_measured(measure, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
