"""Start the full stack on top of a running control plane, and stop it.

Order matters because each webhook's failurePolicy is Fail: a controller is started, waits until
its /readyz says the webhook server listens, and only then is its webhook configuration
installed. JobSet comes first (Trainer creates JobSets), then Trainer, then Kueue (which
mutates TrainJobs), then kube-scheduler and KWOK with the simulated nodes, and last the
cluster-wide Kueue objects the scenarios share.

All state is kept under `<control plane run dir>/fullstack/` (`state.json` with ports and
process ids, configs, certificates); logs go beside the control plane's in `logs/`.
"""

from __future__ import annotations

import contextlib
import json
import os
import ssl
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from tests.cluster import crds
from tests.cluster.controlplane import ControlPlaneError, free_port
from tests.cluster.fullstack import build, webhooks
from tests.cluster.pki import CertificateAuthority
from tests.cluster.processes import Patience, Processes, Supervised

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
READY_TIMEOUT = 90.0
POLL_INTERVAL = 0.2
PATIENCE = Patience(READY_TIMEOUT, POLL_INTERVAL, tail_lines=25)

# KWOK manages (heartbeats, runs pods on) exactly the nodes carrying this label; setting it to
# anything else stops the node's heartbeats, as a kubelet that died would.
HEARTBEAT_LABEL = "sim.dispatch-kubeflow.test/heartbeat"
NODE_LABELS = {"type": "kwok", "node.kubernetes.io/instance-type": "sim-gpu-8"}
NODE_COUNT = 4
NODE_CAPACITY = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}
NODE_LEASE_SECONDS = 40

RESOURCE_FLAVOR = "sim-gpu"
PRIORITY_CLASSES = {"low": 100, "high": 1000}
ADMISSION_CHECK = "dispatch-admission"
ADMISSION_CONTROLLER = "dispatch.phpboyscout.uk/admission"
EXAMPLE_RUNTIME = REPO / "examples" / "runtime.yaml"
EXAMPLE_RUNTIME_NAME = "dispatch-torch"

# Kueue CRDs the control plane does not install but the Kueue controller watches.
EXTRA_KUEUE_CRDS = (
    "kueue.x-k8s.io_multikueueclusters.yaml",
    "kueue.x-k8s.io_multikueueconfigs.yaml",
    "kueue.x-k8s.io_provisioningrequestconfigs.yaml",
)
# KWOK's own stages used as they are (delays shortened): node start and lease heartbeat, and a
# pod's way to Running and out of existence. How a pod ends is ours (kwok-stages.yaml).
KWOK_UPSTREAM_STAGES = (
    "node/fast/node-initialize.yaml",
    "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "pod/general/pod-create.yaml",
    "pod/general/pod-init-container-running.yaml",
    "pod/general/pod-init-container-completed.yaml",
    "pod/general/pod-ready.yaml",
    "pod/general/pod-delete.yaml",
)
KWOK_STAGE_DELAY_MS = 100
SIM_NOT_REFUSED = {
    "key": '.spec.containers.[] | (.env // []).[] | select(.name == "SIM_OUTCOME") | .value',
    "operator": "NotIn",
    "values": ["refuse"],
}
# The Kueue configurations every Kueue scenario runs under: the feature gates set besides the
# stack's own. UnadmittedWorkloadsObservability (beta, off in v0.19, on by default on Kueue's main
# branch) replaces QuotaReserved=False reason Pending with granular reasons (WaitingForQuota,
# Misconfigured, Suspended...), and Inadmissible with Misconfigured or Suspended.
KUEUE_CONFIGURATIONS: dict[str, dict[str, bool]] = {
    "observability-off": {"UnadmittedWorkloadsObservability": False},
    "observability-on": {"UnadmittedWorkloadsObservability": True},
}
# Kueue v0.19 reads its metrics certificate from this fixed path whenever its internal
# certificate management is off (cmd/kueue/main.go); nothing here scrapes metrics, but the
# files must exist or Kueue exits.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")


class StackError(ControlPlaneError):
    """A full-stack process did not start or stop as it should."""


class Plane(Protocol):
    """What the stack needs of `tests.cluster.controlplane.ControlPlane`."""

    run_dir: Path

    @property
    def kubeconfig(self) -> Path: ...

    def kubectl(self, *args: str, user_kubeconfig: Path | None = None) -> str: ...

    def start_controller_manager(self) -> None: ...

    def log_file(self, name: str) -> Path: ...


@dataclass
class Ports:
    webhook: int = 0
    health: int = 0
    metrics: int = 0

    @classmethod
    def allocate(cls) -> Ports:
        return cls(free_port(), free_port(), free_port())


def _http_status(url: str) -> int:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            status: int = response.status
            return status
    except urllib.error.HTTPError as error:
        return error.code


class FullStack(Supervised):
    """kube-scheduler, KWOK and the Trainer, JobSet and Kueue controllers beside a control plane."""

    PROCESSES = (
        "jobset-controller",
        "trainer-controller-manager",
        "kueue",
        "kube-scheduler",
        "kwok",
    )

    def __init__(self, plane: Plane, bin_dir: Path | None = None) -> None:
        self.plane = plane
        self.bin_dir = bin_dir or build.binary_dir()
        self.dir = plane.run_dir / "fullstack"
        self.ports: dict[str, Ports] = {}
        self.nodes: list[str] = [f"sim-gpu-{index}" for index in range(NODE_COUNT)]
        # Kueue feature gates beyond the stack's own (see KUEUE_CONFIGURATIONS).
        self.kueue_gates: dict[str, bool] = dict(KUEUE_CONFIGURATIONS["observability-off"])
        self.processes = Processes(StackError, self.dir, plane.log_file, self.save_state, PATIENCE)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        missing = [name for name in build.versions() if not (self.bin_dir / name).is_file()]
        if missing:
            raise StackError(
                f"{', '.join(missing)} missing in {self.bin_dir}: "
                "run `python -m tests.cluster.fullstack build`"
            )
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            self.plane.start_controller_manager()
            self._install_extra_crds()
            self._apply(
                [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}}],
                "namespaces",
            )
            self._write_certs()
            self._ensure_kueue_metrics_certs()
            for name in ("jobset-controller", "trainer-controller-manager", "kueue"):
                self._start_controller(name)
            self._start_scheduler()
            self._start_kwok()
            self._create_nodes()
            self._create_shared_objects()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop every process of the stack (the control plane is left running)."""
        if not self.pids:
            return
        errors = []
        try:
            self.processes.stop_all(reversed(self.PROCESSES))
        except StackError as error:
            errors.append(str(error))
        # Webhooks whose server is gone would refuse every write they cover.
        with contextlib.suppress(Exception):
            self.plane.kubectl(
                "delete",
                "--ignore-not-found",
                "--wait=false",
                *[f"mutatingwebhookconfiguration/{name}-mutating" for name in webhooks.SOURCES],
                *[f"validatingwebhookconfiguration/{name}-validating" for name in webhooks.SOURCES],
            )
        if errors:
            raise StackError("; ".join(errors))

    def running(self) -> dict[str, bool]:
        return {name: self.processes.running(name) for name in self.PROCESSES}

    def restart(self, name: str) -> None:
        """Stop and start one process on the same ports (its configuration is kept)."""
        self.processes.stop(name)
        if name == "kube-scheduler":
            self._start_scheduler()
        elif name == "kwok":
            self._start_kwok()
        else:
            self._start_controller(name)

    def configure_kueue(self, gates: Mapping[str, bool]) -> None:
        """Run Kueue with these feature gates, restarting it if they differ from the current."""
        if dict(gates) == self.kueue_gates:
            return
        self.kueue_gates = dict(gates)
        if self.processes.running("kueue"):
            self.restart("kueue")

    # -- nodes ----------------------------------------------------------------------------

    def stop_heartbeats(self, node: str) -> None:
        """KWOK lets go of the node: no more Lease renewals, its pods freeze where they are."""
        self._label_node(node, "off")

    def resume_heartbeats(self, node: str) -> None:
        self._label_node(node, "on")

    def _label_node(self, node: str, value: str) -> None:
        self.plane.kubectl("label", "--overwrite", f"node/{node}", f"{HEARTBEAT_LABEL}={value}")

    def delete_node(self, node: str) -> None:
        """Delete the Node object, as a cloud provider does with a machine that is gone."""
        self.plane.kubectl("delete", "--wait=true", f"node/{node}")

    def restore_node(self, node: str) -> None:
        """Create a deleted simulated node again and wait until it is Ready."""
        self._create_nodes([node])

    # -- per-test Kueue objects -----------------------------------------------------------

    def create_queues(
        self,
        namespace: str,
        gpus: int,
        admission_check: bool = False,
        local_queue: str = "lq",
        shared_with: Sequence[str] = (),
    ) -> str:
        """A ClusterQueue named after `namespace` with `gpus` GPUs of quota and LowerPriority
        preemption, and a LocalQueue `local_queue` pointing at it in `namespace` and in each of
        `shared_with` (the ClusterQueue serves them all). Returns the ClusterQueue's name
        (delete it after the test)."""
        served = [namespace, *shared_with]
        cluster_queue: dict[str, Any] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": namespace},
            "spec": {
                "namespaceSelector": {
                    "matchExpressions": [
                        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": served}
                    ]
                },
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": RESOURCE_FLAVOR,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "1000"},
                                    {"name": "memory", "nominalQuota": "4Ti"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": str(gpus)},
                                ],
                            }
                        ],
                    }
                ],
            },
        }
        if admission_check:
            cluster_queue["spec"]["admissionChecksStrategy"] = {
                "admissionChecks": [{"name": ADMISSION_CHECK}]
            }
        locals_ = [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": local_queue, "namespace": where},
                "spec": {"clusterQueue": namespace},
            }
            for where in served
        ]
        self._apply([cluster_queue, *locals_], f"queues-{namespace}")
        return namespace

    def stop_cluster_queue(self, name: str, policy: str = "HoldAndDrain") -> None:
        """Stop a ClusterQueue as an administrator does (``spec.stopPolicy``)."""
        patch = json.dumps({"spec": {"stopPolicy": policy}})
        self.plane.kubectl("patch", f"clusterqueue/{name}", "--type=merge", "-p", patch)

    def delete_queues(self, namespace: str) -> None:
        self.plane.kubectl(
            "delete", "--ignore-not-found", "--wait=false", f"clusterqueue/{namespace}"
        )

    # -- state shared with `python -m tests.cluster down` ---------------------------------

    def save_state(self) -> None:
        state = {
            "bin_dir": str(self.bin_dir),
            "pids": self.pids,
            "ports": {name: vars(ports) for name, ports in self.ports.items()},
        }
        (self.dir / "state.json").write_text(json.dumps(state, indent=2))

    @classmethod
    def attach(cls, plane: Plane) -> FullStack:
        stack = cls(plane)
        state_file = stack.dir / "state.json"
        if state_file.exists():
            state = json.loads(state_file.read_text())
            stack.bin_dir = Path(state["bin_dir"])
            stack.pids = {name: int(pid) for name, pid in state["pids"].items()}
            stack.ports = {name: Ports(**ports) for name, ports in state["ports"].items()}
        return stack

    # -- processes --------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.processes.spawn(
            name,
            [str(self.bin_dir / name), *args],
            env={**os.environ, "KUBECONFIG": str(self.plane.kubeconfig), **(env or {})},
        )

    # -- objects ----------------------------------------------------------------------------

    def _apply(self, documents: list[dict[str, Any]], label: str) -> None:
        path = self.dir / "manifests" / f"{label}.yaml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump_all(documents, sort_keys=False))
        self.plane.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=dispatch-kubeflow-tests",
            "-f",
            str(path),
        )

    def _install_extra_crds(self) -> None:
        folder = crds.module_dir("sigs.k8s.io/kueue", build.component("kueue").version())
        documents = [
            crds.serve_storage_version_only(
                yaml.safe_load((folder / "config/components/crd/bases" / name).read_text())
            )
            for name in EXTRA_KUEUE_CRDS
        ]
        self._apply(documents, "kueue-extra-crds")
        self.plane.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *[f"crd/{d['metadata']['name']}" for d in documents],
        )

    def _write_certs(self) -> None:
        certs = self.dir / "certs"
        if (certs / "tls.crt").exists():
            return
        certs.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority.create()
        serving = ca.serving_pair()
        for name, content in (
            ("ca.crt", ca.cert_pem),
            ("tls.crt", serving.cert_pem),
            ("tls.key", serving.key_pem),
        ):
            (certs / name).write_bytes(content)
            (certs / name).chmod(0o600)

    def _ensure_kueue_metrics_certs(self) -> None:
        """Give Kueue the metrics certificate files it insists on (any valid pair will do)."""
        if all((KUEUE_METRICS_CERTS / name).is_file() for name in ("tls.crt", "tls.key")):
            return
        try:
            KUEUE_METRICS_CERTS.mkdir(parents=True, exist_ok=True)
            for name in ("tls.crt", "tls.key"):
                (KUEUE_METRICS_CERTS / name).write_bytes((self.dir / "certs" / name).read_bytes())
        except OSError as error:
            raise StackError(
                f"Kueue needs a certificate in {KUEUE_METRICS_CERTS} (fixed in its source when "
                f"internal certificate management is off) and it cannot be written: {error}"
            ) from error

    # -- the three controllers -------------------------------------------------------------

    def _controller_config(self, name: str, ports: Ports) -> dict[str, Any]:
        certs = str(self.dir / "certs")
        health = f"127.0.0.1:{ports.health}"
        metrics = f"127.0.0.1:{ports.metrics}"
        if name == "jobset-controller":
            return {
                "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
                "kind": "Configuration",
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
                "webhook": {"port": ports.webhook, "host": "127.0.0.1", "certDir": certs},
                "metrics": {"bindAddress": metrics},
                "health": {"healthProbeBindAddress": health},
                "clientConnection": {"qps": 500, "burst": 500},
            }
        if name == "trainer-controller-manager":
            return {
                "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
                "kind": "Configuration",
                "leaderElection": {"leaderElect": False},
                "certManagement": {"enable": False},
                "webhook": {"port": ports.webhook, "host": "127.0.0.1"},
                "metrics": {"bindAddress": metrics, "secureServing": False},
                "health": {"healthProbeBindAddress": health},
                "statusServer": {"port": free_port()},
                "clientConnection": {"qps": 200, "burst": 300},
            }
        if name == "kueue":
            return {
                "apiVersion": "config.kueue.x-k8s.io/v1beta2",
                "kind": "Configuration",
                "leaderElection": {"leaderElect": False},
                "internalCertManagement": {"enable": False},
                "webhook": {"port": ports.webhook, "host": "127.0.0.1", "certDir": certs},
                "metrics": {"bindAddress": metrics},
                "health": {"healthProbeBindAddress": health},
                "clientConnection": {"qps": 300, "burst": 500},
                "manageJobsWithoutQueueName": False,
                "integrations": {"frameworks": ["trainer.kubeflow.org/trainjob"]},
                # The on-demand visibility API is an aggregated apiserver nothing here uses.
                "featureGates": {"VisibilityOnDemand": False, **self.kueue_gates},
            }
        raise KeyError(name)

    def _start_controller(self, name: str) -> None:
        ports = self.ports.get(name) or Ports.allocate()
        self.ports[name] = ports
        folder = self.dir / name
        folder.mkdir(exist_ok=True)
        config = folder / "config.yaml"
        config.write_text(yaml.safe_dump(self._controller_config(name, ports), sort_keys=False))
        # Trainer reads its serving certificate from $TMPDIR/k8s-webhook-server/serving-certs.
        tmp = folder / "tmp"
        serving = tmp / "k8s-webhook-server" / "serving-certs"
        serving.mkdir(parents=True, exist_ok=True)
        for file in ("tls.crt", "tls.key"):
            (serving / file).write_bytes((self.dir / "certs" / file).read_bytes())
        args = [
            f"--config={config}",
            f"--kubeconfig={self.plane.kubeconfig}",
            "--zap-log-level=info",
        ]
        self._spawn(name, args, env={"TMPDIR": str(tmp)})
        self.processes.wait_ready(
            name, lambda: _http_status(f"http://127.0.0.1:{ports.health}/readyz") == 200
        )
        version = build.component(name).version()
        ca = (self.dir / "certs" / "ca.crt").read_bytes()
        self._apply(
            webhooks.loopback_configurations(name, version, ports.webhook, ca), f"{name}-webhooks"
        )

    # -- kube-scheduler and KWOK -----------------------------------------------------------

    def _start_scheduler(self) -> None:
        ports = self.ports.get("kube-scheduler") or Ports(health=free_port())
        self.ports["kube-scheduler"] = ports
        kubeconfig = str(self.plane.kubeconfig)
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--leader-elect=false",
                f"--secure-port={ports.health}",
                "--bind-address=127.0.0.1",
                f"--cert-dir={self.dir / 'kube-scheduler'}",
                "--profiling=false",
            ],
        )
        self.processes.wait_ready(
            "kube-scheduler",
            lambda: _http_status(f"https://127.0.0.1:{ports.health}/healthz") == 200,
        )

    def _kwok_stages(self) -> list[dict[str, Any]]:
        folder = (
            crds.module_dir("sigs.k8s.io/kwok", build.component("kwok").version())
            / "kustomize/stage"
        )
        stages = []
        for name in KWOK_UPSTREAM_STAGES:
            stage = yaml.safe_load((folder / name).read_text())
            delay = stage["spec"].get("delay")
            # Heartbeat delays stay: they pace status refreshes, the Lease is the heartbeat.
            if delay is not None and stage["spec"]["resourceRef"]["kind"] == "Pod":
                delay["durationMilliseconds"] = KWOK_STAGE_DELAY_MS
                delay.pop("jitterDurationMilliseconds", None)
                delay.pop("jitterDurationFrom", None)
            if stage["metadata"]["name"] == "pod-create":
                # A pod the kubelet refuses (kwok-stages.yaml) never starts.
                stage["spec"]["selector"]["matchExpressions"].append(SIM_NOT_REFUSED)
            stages.append(stage)
        stages += [d for d in yaml.safe_load_all((HERE / "kwok-stages.yaml").read_text()) if d]
        return stages

    def _start_kwok(self) -> None:
        ports = self.ports.get("kwok") or Ports(health=free_port())
        self.ports["kwok"] = ports
        config = self.dir / "kwok.yaml"
        config.write_text(yaml.safe_dump_all(self._kwok_stages(), sort_keys=False))
        self._spawn(
            "kwok",
            [
                f"--config={config}",
                f"--kubeconfig={self.plane.kubeconfig}",
                f"--manage-nodes-with-label-selector={HEARTBEAT_LABEL}=on",
                f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
                f"--server-address=127.0.0.1:{ports.health}",
                # KWOK hands out pod IPs from this range; its default /24 runs out under load.
                "--cidr=10.64.0.0/16",
            ],
        )
        self.processes.wait_ready(
            "kwok", lambda: _http_status(f"http://127.0.0.1:{ports.health}/healthz") == 200
        )

    def _create_nodes(self, names: list[str] | None = None) -> None:
        nodes = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        **NODE_LABELS,
                        "kubernetes.io/hostname": name,
                        HEARTBEAT_LABEL: "on",
                    },
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                },
                "status": {"capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY},
            }
            for name in names or self.nodes
        ]
        self._apply(nodes, "nodes")
        self.plane.kubectl(
            "wait",
            "--for=condition=Ready",
            "--timeout=60s",
            *[f"node/{name}" for name in names or self.nodes],
        )

    def _create_shared_objects(self) -> None:
        documents: list[dict[str, Any]] = [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": RESOURCE_FLAVOR},
                "spec": {
                    "nodeLabels": {
                        "node.kubernetes.io/instance-type": NODE_LABELS[
                            "node.kubernetes.io/instance-type"
                        ]
                    }
                },
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "AdmissionCheck",
                "metadata": {"name": ADMISSION_CHECK},
                "spec": {"controllerName": ADMISSION_CONTROLLER},
            },
        ]
        documents += [
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
                "description": f"{name} priority for the full-stack scenarios",
            }
            for name, value in PRIORITY_CLASSES.items()
        ]
        documents += [d for d in yaml.safe_load_all(EXAMPLE_RUNTIME.read_text()) if d]
        self._apply(documents, "shared")


def up_full(plane: Plane) -> FullStack:
    """Build (or reuse) the full-stack binaries and start the stack beside a running `plane`."""
    build.build()
    started = time.monotonic()
    stack = FullStack(plane)
    stack.start()
    print(
        f"full stack up in {time.monotonic() - started:.1f} s: "
        f"{', '.join(f'{name} {version}' for name, version in build.versions().items())}; "
        f"nodes {', '.join(stack.nodes)}",
        file=sys.stderr,
    )
    return stack


def down_full(plane: Plane) -> None:
    """Stop the full stack recorded beside `plane` (a no-op when there is none)."""
    FullStack.attach(plane).stop()
