"""Start and stop a real etcd + kube-apiserver (+ kube-controller-manager) on loopback.

The flags follow controller-runtime's envtest: an own CA for serving and client certificates,
RBAC authorization, a service-account signing key, an admin client certificate in
system:masters, etcd without fsync, every process on a free 127.0.0.1 port and every byte of
state in one run folder. The pytest fixture and `python -m tests.cluster up` both use this class.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import secrets
import socket
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import binaries, crds
from tests.cluster.pki import CertificateAuthority, KeyPair, service_account_key_pem
from tests.cluster.processes import Patience, Processes, Supervised, process_alive

__all__ = ["ControlPlane", "ControlPlaneError", "free_port", "process_alive"]

READY_TIMEOUT = 60.0
POLL_INTERVAL = 0.1
PATIENCE = Patience(READY_TIMEOUT, POLL_INTERVAL, tail_lines=20)
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
CLUSTER_NAME = "dispatch-kubeflow-test"
ADMIN_USER = "admin"


class ControlPlaneError(RuntimeError):
    """A control-plane process did not start or stop as it should."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ControlPlane(Supervised):
    """One etcd, one kube-apiserver and optionally one kube-controller-manager.

    All state lives under `run_dir`: `state.json` (ports and process ids, so another process
    can stop a control plane started in the background), `pki/`, `etcd/`, `logs/`, the admin
    kubeconfig and the kubeconfigs minted for restricted identities in `users/`.
    """

    def __init__(
        self, run_dir: Path, bin_dir: Path | None = None, owner_pid: int | None = None
    ) -> None:
        self.run_dir = run_dir.resolve()
        # The process whose lifetime bounds this control plane (the pytest session), if any.
        self.owner_pid = owner_pid
        self.bin_dir = bin_dir or binaries.binary_dir()
        self.etcd_port = 0
        self.etcd_peer_port = 0
        self.apiserver_port = 0
        self.controller_manager_port = 0
        # List URLs of the installed custom resources, probed after every apiserver start.
        self.custom_resource_paths: list[str] = []
        self.processes = Processes(
            ControlPlaneError, self.run_dir, self.log_file, self.save_state, PATIENCE
        )

    # -- paths and addresses ------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.run_dir / "admin.kubeconfig"

    @property
    def _pki(self) -> Path:
        return self.run_dir / "pki"

    @property
    def _state_file(self) -> Path:
        return self.run_dir / "state.json"

    def log_file(self, name: str) -> Path:
        return self.run_dir / "logs" / f"{name}.log"

    # -- lifecycle --------------------------------------------------------------------

    def start(self, with_controller_manager: bool = False, install_crds: bool = True) -> None:
        """Start etcd and kube-apiserver, wait until ready, install the CRDs."""
        for name in binaries.PACKAGES:
            if not (self.bin_dir / name).is_file():
                raise ControlPlaneError(
                    f"{self.bin_dir / name} is missing: run `python -m tests.cluster build`"
                )
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "logs").mkdir(exist_ok=True)
        self._write_pki()
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        self.apiserver_port = free_port()
        try:
            self._start_etcd()
            self.start_apiserver()
            admin = self._certificate(ADMIN_USER, ["system:masters"])
            self._write_kubeconfig(self.kubeconfig, ADMIN_USER, admin)
            self._wait_for_default_namespace()
            if install_crds:
                self.install_crds()
            if with_controller_manager:
                self.start_controller_manager()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process this control plane started (controller-manager first)."""
        self.processes.stop_all(("kube-controller-manager", "kube-apiserver", "etcd"))

    def stop_apiserver(self) -> None:
        self.processes.stop("kube-apiserver")

    def start_apiserver(self) -> None:
        """Start kube-apiserver on its port (the same one after a stop) and wait for /readyz."""
        if self.processes.running("kube-apiserver"):
            return
        self._spawn("kube-apiserver", self._apiserver_args())
        self.processes.wait_ready(
            "kube-apiserver",
            lambda: self._https_get(f"{self.server}/readyz") == 200,
        )
        self._wait_for_custom_resources()

    def restart_apiserver(self) -> None:
        """Stop and start kube-apiserver; etcd and therefore all data stay."""
        self.stop_apiserver()
        self.start_apiserver()

    def start_controller_manager(self, extra_args: Sequence[str] = ()) -> None:
        """Start kube-controller-manager (garbage collector, Job, node lifecycle...); idempotent.

        `extra_args` (e.g. `--node-monitor-grace-period=5s`) apply only when this call starts
        it; a running controller-manager is left as it is.
        """
        if self.processes.running("kube-controller-manager"):
            return
        self.controller_manager_port = self.controller_manager_port or free_port()
        self._spawn("kube-controller-manager", [*self._controller_manager_args(), *extra_args])
        url = f"https://127.0.0.1:{self.controller_manager_port}/healthz"
        self.processes.wait_ready(
            "kube-controller-manager", lambda: self._https_get(url, verify=False) == 200
        )
        self._wait_garbage_collector()

    def _wait_garbage_collector(self) -> None:
        """Wait until the garbage collector has synced and collects: /healthz answers before.

        A dependent ConfigMap whose owner is deleted must go; until the collector's informers
        have synced it stays, and tests relying on collection would race its start-up.
        """
        suffix = secrets.token_hex(4)
        owner, dependent = f"gc-probe-owner-{suffix}", f"gc-probe-dependent-{suffix}"
        self.kubectl("create", "configmap", owner, "-n", "kube-system")
        uid = self.kubectl(
            "get", "configmap", owner, "-n", "kube-system", "-o", "jsonpath={.metadata.uid}"
        )
        reference = {"apiVersion": "v1", "kind": "ConfigMap", "name": owner, "uid": uid}
        manifest = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": dependent,
                "namespace": "kube-system",
                "ownerReferences": [reference],
            },
        }
        self.kubectl("create", "-f", "-", stdin=json.dumps(manifest))
        self.kubectl("delete", "configmap", owner, "-n", "kube-system", "--wait=false")
        self.processes.wait_ready(
            "kube-controller-manager",
            lambda: (
                not self.kubectl(
                    "get",
                    "configmap",
                    dependent,
                    "-n",
                    "kube-system",
                    "--ignore-not-found",
                    "-o",
                    "name",
                )
            ),
        )

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision; return that revision.

        Afterwards no resourceVersion older than the returned one can be watched from etcd.
        kube-apiserver serves watches from its watch cache, whose window would still cover
        recent old versions, so the apiserver is restarted as well: its caches then start at
        the compacted revision and a watch from an older resourceVersion gets 410 Gone.
        """
        revision = int(self._etcd_post("/v3/kv/range", {"key": _b64("\0")})["header"]["revision"])
        self._etcd_post("/v3/kv/compaction", {"revision": str(revision), "physical": True})
        self.restart_apiserver()
        return revision

    def kubeconfig_for(self, user: str, groups: list[str] | None = None) -> Path:
        """A kubeconfig whose client certificate authenticates as `user` in `groups`."""
        if not user or "/" in user:
            raise ValueError(f"kubeconfig_for: user name {user!r} must be non-empty without '/'")
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
        path = self.run_dir / "users" / f"{safe}.kubeconfig"
        path.parent.mkdir(exist_ok=True)
        self._write_kubeconfig(path, user, self._certificate(user, list(groups or [])))
        return path

    def kubeconfig_for_service_account(
        self, namespace: str, name: str, cluster_role: str, hours: int = 24
    ) -> Path:
        """A kubeconfig whose bearer token authenticates as the ServiceAccount `namespace/name`,
        which this makes and binds to `cluster_role` across the cluster.

        The token is a TokenRequest's, valid `hours`. This is how a cluster's controllers
        authenticate, and it costs the apiserver less than a client certificate: the apiserver
        caches a token's verification, but it verifies a certificate's chain on every request.
        """
        self.kubectl("create", "serviceaccount", name, f"--namespace={namespace}")
        self.kubectl(
            "create",
            "clusterrolebinding",
            f"{namespace}.{name}",
            f"--clusterrole={cluster_role}",
            f"--serviceaccount={namespace}:{name}",
        )
        token = self.kubectl(
            "create", "token", name, f"--namespace={namespace}", f"--duration={hours}h"
        ).strip()
        path = self.run_dir / "users" / f"{namespace}.{name}.token.kubeconfig"
        path.parent.mkdir(exist_ok=True)
        self._write_kubeconfig(path, f"{namespace}.{name}", {"token": token})
        return path

    def install_crds(self) -> list[str]:
        """Apply the upstream and project CRDs and wait until every one is Established."""
        paths = crds.write_manifests(self.run_dir / "crds")
        if not paths:
            return []
        manifests = self.run_dir / "crds"
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifests))
        names = crds.names(paths)
        self.kubectl(
            "wait",
            "--for=condition=Established",
            f"--timeout={READY_TIMEOUT:.0f}s",
            *[f"crd/{name}" for name in names],
        )
        self.custom_resource_paths = crds.list_paths(paths)
        self.save_state()
        self._wait_for_custom_resources()
        return names

    def _wait_for_custom_resources(self) -> None:
        """Established is not enough: each resource answers 429 until its watch cache is filled."""
        for path in self.custom_resource_paths:
            self.processes.wait_ready(
                "kube-apiserver",
                functools.partial(self._answers_ok, f"{self.server}{path}?limit=1"),
            )

    def _answers_ok(self, url: str) -> bool:
        return self._https_get(url) == 200

    def kubectl(
        self, *args: str, user_kubeconfig: Path | None = None, stdin: str | None = None
    ) -> str:
        """Run the kubectl built with the control plane; raise with its output on failure."""
        command = [
            str(self.bin_dir / "kubectl"),
            f"--kubeconfig={user_kubeconfig or self.kubeconfig}",
            *args,
        ]
        result = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise ControlPlaneError(
                f"`kubectl {' '.join(args)}` failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result.stdout

    # -- state shared with `python -m tests.cluster down` ------------------------------

    def save_state(self) -> None:
        state = {
            "bin_dir": str(self.bin_dir),
            "etcd_port": self.etcd_port,
            "etcd_peer_port": self.etcd_peer_port,
            "apiserver_port": self.apiserver_port,
            "controller_manager_port": self.controller_manager_port,
            "custom_resource_paths": self.custom_resource_paths,
            "owner_pid": self.owner_pid,
            "pids": self.pids,
        }
        self._state_file.write_text(json.dumps(state, indent=2))

    @classmethod
    def attach(cls, run_dir: Path) -> ControlPlane:
        """The control plane whose state is recorded in `run_dir` (started by another process)."""
        state = json.loads((run_dir / "state.json").read_text())
        plane = cls(run_dir, Path(state["bin_dir"]))
        plane.etcd_port = state["etcd_port"]
        plane.etcd_peer_port = state["etcd_peer_port"]
        plane.apiserver_port = state["apiserver_port"]
        plane.controller_manager_port = state["controller_manager_port"]
        plane.custom_resource_paths = state.get("custom_resource_paths", [])
        plane.owner_pid = state.get("owner_pid")
        plane.pids = {name: int(pid) for name, pid in state["pids"].items()}
        return plane

    @classmethod
    def stop_orphans(cls, run_dirs: Iterable[Path]) -> list[Path]:
        """Stop control planes whose owner died without tearing them down (e.g. a killed pytest)."""
        stopped = []
        for run_dir in run_dirs:
            try:
                plane = cls.attach(run_dir)
            except (OSError, ValueError, KeyError):
                continue
            owner = plane.owner_pid
            if owner is None or process_alive(owner) or not plane.pids:
                continue
            plane.stop()
            stopped.append(run_dir)
        return stopped

    # -- processes --------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> None:
        self.processes.spawn(name, [str(self.bin_dir / name), *args])

    # -- etcd -------------------------------------------------------------------------

    def _start_etcd(self) -> None:
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self._spawn(
            "etcd",
            [
                "--name=dispatch-kubeflow-test",
                f"--data-dir={self.run_dir / 'etcd'}",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=dispatch-kubeflow-test={peer}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        self.processes.wait_ready("etcd", self._etcd_healthy)

    def _etcd_healthy(self) -> bool:
        with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as response:
            return bool(json.load(response).get("health") == "true")

    def _etcd_post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.etcd_url}{path}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            result: dict[str, Any] = json.load(response)
            return result

    # -- kube-apiserver -----------------------------------------------------------------

    def _apiserver_args(self) -> list[str]:
        pki = self._pki
        return [
            f"--etcd-servers={self.etcd_url}",
            f"--secure-port={self.apiserver_port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            # The endpoint reconciler refuses a loopback advertise address; nothing in the
            # tests reaches the apiserver through the `kubernetes` Service anyway.
            "--endpoint-reconciler-type=none",
            f"--cert-dir={pki}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--authorization-mode=RBAC",
            f"--service-account-issuer=https://127.0.0.1:{self.apiserver_port}",
            f"--service-account-key-file={pki / 'sa.key'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # Without kube-controller-manager no namespace gets a default ServiceAccount.
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--profiling=false",
            # Close open watches at once on SIGTERM instead of waiting for them to end.
            "--shutdown-watch-termination-grace-period=1s",
        ]

    # -- kube-controller-manager --------------------------------------------------------

    def _controller_manager_args(self) -> list[str]:
        pki = self._pki
        return [
            f"--kubeconfig={self.kubeconfig}",
            f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}",
            f"--secure-port={self.controller_manager_port}",
            "--bind-address=127.0.0.1",
            f"--cert-dir={pki / 'kube-controller-manager'}",
            "--leader-elect=false",
            f"--cluster-name={CLUSTER_NAME}",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-account-private-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--profiling=false",
        ]

    # -- certificates and kubeconfigs ---------------------------------------------------

    def _write_pki(self) -> None:
        pki = self._pki
        if (pki / "ca.crt").exists():
            return
        pki.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority.create()
        serving = ca.serving_pair()
        files = {
            "ca.crt": ca.cert_pem,
            "ca.key": ca.key_pem,
            "apiserver.crt": serving.cert_pem,
            "apiserver.key": serving.key_pem,
            "sa.key": service_account_key_pem(),
        }
        for name, content in files.items():
            (pki / name).write_bytes(content)
            (pki / name).chmod(0o600)

    def _ca(self) -> CertificateAuthority:
        return CertificateAuthority.load(self._pki / "ca.crt", self._pki / "ca.key")

    def _certificate(self, user: str, groups: list[str]) -> dict[str, str]:
        """A kubeconfig user's client certificate and key for `user` in `groups`."""
        pair: KeyPair = self._ca().client_pair(user, groups)
        return {
            "client-certificate-data": _b64(pair.cert_pem),
            "client-key-data": _b64(pair.key_pem),
        }

    def _write_kubeconfig(self, path: Path, user: str, credentials: dict[str, str]) -> None:
        ca = self._ca()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": CLUSTER_NAME,
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(ca.cert_pem),
                    },
                }
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": user, "context": {"cluster": CLUSTER_NAME, "user": user}}],
            "current-context": user,
        }
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)

    def _ssl_context(self, verify: bool = True) -> ssl.SSLContext:
        if not verify:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        context = ssl.create_default_context(cafile=str(self._pki / "ca.crt"))
        admin = self.run_dir / "pki" / "probe"
        if not (admin / "client.crt").exists():
            admin.mkdir(exist_ok=True)
            pair = self._ca().client_pair(ADMIN_USER, ["system:masters"])
            (admin / "client.crt").write_bytes(pair.cert_pem)
            (admin / "client.key").write_bytes(pair.key_pem)
        context.load_cert_chain(str(admin / "client.crt"), str(admin / "client.key"))
        return context

    def _https_get(self, url: str, verify: bool = True) -> int:
        try:
            with urllib.request.urlopen(
                url, timeout=2, context=self._ssl_context(verify)
            ) as response:
                status: int = response.status
                return status
        except urllib.error.HTTPError as error:
            return error.code

    def _wait_for_default_namespace(self) -> None:
        self.processes.wait_ready(
            "kube-apiserver",
            lambda: self._https_get(f"{self.server}/api/v1/namespaces/default") == 200,
        )


def _b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


@contextlib.contextmanager
def given_or_temporary(kubeconfig: Path | None) -> Iterator[Path]:
    """`kubeconfig` when one is given; else a control plane of its own for the `with` block."""
    if kubeconfig is not None:
        yield kubeconfig
        return
    binaries.build()
    with tempfile.TemporaryDirectory(prefix="control-plane-") as run_dir:
        plane = ControlPlane(Path(run_dir))
        plane.start()
        try:
            yield plane.kubeconfig
        finally:
            plane.stop()
