"""The Helm chart: linted, rendered and installed for real, its RBAC exercised by the operator.

``helm`` is built from the Go module proxy (tests/helm) the way the control plane is. The install
goes into the test control plane; no kubelet runs there, so the chart's Deployment never starts a
pod: instead the operator runs in-process with the identity of the chart's ServiceAccount
(a client certificate for ``system:serviceaccount:<ns>:<name>``), so every call it makes is
checked against exactly the ClusterRole the chart grants.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from dispatch_kubeflow.constants import GROUP, VERSION
from tests.helm import binary
from tests.images import deployment as podman_run
from tests.integration.rbac import OPERATOR_CLUSTER_ROLE, chart_rules
from tests.integration.test_operator import (
    ADAPTER,
    Scene,
    condition,
    eventually,
    running_operator,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dispatch-kubeflow"
BUILD_TIMEOUT = 3600

pytestmark = pytest.mark.timeout(BUILD_TIMEOUT)


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return binary.build()
    except binary.BuildError as error:
        pytest.fail(f"helm could not be built: {error}")


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(helm), *args], capture_output=True, text=True, check=False, timeout=300
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def render(helm: Path, *args: str) -> list[dict[str, Any]]:
    out = run_helm(
        helm, "template", "dispatch", str(CHART), "--namespace", "dispatch-system", *args
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = [doc for doc in docs if doc["kind"] == kind]
    return found


def adapter_values(namespace: str) -> list[str]:
    spec = {
        "namespace": namespace,
        "runtimes": [{"kind": "ClusterTrainingRuntime", "name": "dispatch-torch"}],
        "timeouts": {"stopJob": "20s"},
    }
    return [
        "--set",
        "adapter.create=true",
        "--set",
        f"adapter.name={ADAPTER}",
        "--set-json",
        f"adapter.spec={json.dumps(spec)}",
    ]


def admission_values() -> list[str]:
    """Values that deploy dispatch-admission for the AdmissionCheck ``dispatch-gate``."""
    return ["--set", "admission.enabled=true", "--set", "admission.admissionCheck=dispatch-gate"]


def test_the_chart_lints_clean(helm: Path) -> None:
    run_helm(helm, "lint", "--strict", str(CHART))
    run_helm(
        helm,
        "lint",
        "--strict",
        str(CHART),
        *adapter_values("team-a"),
        "--set",
        "exampleRuntime.create=true",
    )


def test_the_deployment_is_one_recreated_non_root_replica_with_a_liveness_probe(
    helm: Path,
) -> None:
    deployment = one(render(helm), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert container["ports"][0]["containerPort"] == 8080
    assert "--liveness=http://0.0.0.0:8080/healthz" in container["args"]
    assert container["args"][0] == "run"
    assert pod["serviceAccountName"] == one(render(helm), "ServiceAccount")["metadata"]["name"]
    assert "--all-namespaces" in container["args"]
    narrowed = one(render(helm, "--set-json", 'operator.namespaces=["a","b"]'), "Deployment")
    args = narrowed["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if "namespace" in a] == ["--namespace=a", "--namespace=b"]


CLUSTER_SCOPED = ("operator-cluster", "adapter-cluster")
NAMESPACED = ("operator", "adapter")


def test_the_cluster_role_is_the_rule_files_and_nothing_else(helm: Path) -> None:
    docs = render(helm)
    role = one(docs, "ClusterRole")
    assert role["rules"] == chart_rules(*OPERATOR_CLUSTER_ROLE)
    assert not [doc for doc in docs if doc["kind"] in ("Role", "RoleBinding")]
    verbs = {verb for rule in role["rules"] for verb in rule["verbs"]}
    assert "*" not in verbs
    assert not any("secrets" in rule["resources"] for rule in role["rules"])


def test_with_operator_namespaces_the_operators_rights_are_roles_in_those_namespaces(
    helm: Path,
) -> None:
    docs = render(helm, "--set-json", 'operator.namespaces=["team-a","team-b"]')
    role = one(docs, "ClusterRole")
    assert role["rules"] == chart_rules(*CLUSTER_SCOPED)
    assert {r for rule in role["rules"] for r in rule["resources"]} == {
        "customresourcedefinitions",
        "namespaces",
        "clustertrainingruntimes",
        "nodes",
    }
    roles = {doc["metadata"]["namespace"]: doc for doc in docs if doc["kind"] == "Role"}
    assert roles["team-a"]["rules"] == chart_rules(*NAMESPACED)
    assert roles["team-b"]["rules"] == chart_rules(*NAMESPACED)
    # The adapters read dispatch-admission's Lease, in the release namespace by default.
    assert roles["dispatch-system"]["rules"] == chart_rules("adapter-lease")
    account = one(docs, "ServiceAccount")["metadata"]
    bindings = [doc for doc in docs if doc["kind"] == "RoleBinding"]
    assert {b["metadata"]["namespace"] for b in bindings} == set(roles)
    for binding in bindings:
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": "dispatch-system"}
        ]
    refused = run_helm(
        helm,
        "template",
        "dispatch",
        str(CHART),
        "--set-json",
        'operator.namespaces=["team-*"]',
        check=False,
    )
    assert refused.returncode != 0


def test_optional_adapter_and_example_runtime_render_from_values(helm: Path) -> None:
    assert not [
        d for d in render(helm) if d["kind"] in ("KubeflowAdapter", "ClusterTrainingRuntime")
    ]
    docs = render(helm, *adapter_values("team-a"), "--set", "exampleRuntime.create=true")
    adapter = one(docs, "KubeflowAdapter")
    assert adapter["metadata"]["namespace"] == "dispatch-system"
    assert adapter["spec"]["namespace"] == "team-a"
    runtime = one(docs, "ClusterTrainingRuntime")
    assert runtime == yaml.safe_load((ROOT / "examples" / "runtime.yaml").read_text())


def test_values_outside_the_schema_are_refused(helm: Path) -> None:
    result = run_helm(
        helm, "template", "dispatch", str(CHART), "--set", "replicaCount=2", check=False
    )
    assert result.returncode != 0
    assert "replicaCount" in result.stderr


@contextlib.asynccontextmanager
async def installed(
    helm: Path, cluster: Any, namespace: str, kube_api: client.ApiClient, *, namespaced: bool
) -> AsyncIterator[str]:
    """The chart installed into its own short-named namespace, serving the test namespace:
    every namespace, or with ``namespaced`` only its own and the test namespace
    (``operator.namespaces``).

    Short, because the service account's user name goes into a certificate's common name
    (at most 64 characters).
    """
    name = f"dkc-{secrets.token_hex(3)}"
    core: Any = client.CoreV1Api(kube_api)  # takes a plain dict as the body
    await core.create_namespace({"metadata": {"name": name}})
    kubeconfig = ["--kubeconfig", str(cluster.kubeconfig)]
    scope = ["--set-json", f"operator.namespaces={json.dumps([name, namespace])}"]
    run_helm(
        helm,
        "install",
        name,
        str(CHART),
        "--namespace",
        name,
        *kubeconfig,
        *adapter_values(namespace),
        *(scope if namespaced else []),
    )
    try:
        yield name
    finally:
        run_helm(helm, "uninstall", name, "--namespace", name, *kubeconfig, check=False)
        await core.delete_namespace(name)


@pytest.fixture
async def release(
    helm: Path, cluster: Any, namespace: str, kube_api: client.ApiClient
) -> AsyncIterator[str]:
    """The chart installed into its own namespace, serving every namespace."""
    async with installed(helm, cluster, namespace, kube_api, namespaced=False) as name:
        yield name


async def test_installed_chart_lets_the_operator_run_jobs_as_its_service_account(
    cluster: Any, namespace: str, release: str, kube_api: client.ApiClient, tmp_path: Path
) -> None:
    await run_a_job_as_the_chart_account(cluster, namespace, release, kube_api, tmp_path, [])


async def test_with_operator_namespaces_the_installed_roles_let_the_operator_run_jobs(
    helm: Path, cluster: Any, namespace: str, kube_api: client.ApiClient, tmp_path: Path
) -> None:
    async with installed(helm, cluster, namespace, kube_api, namespaced=True) as release:
        rbac: Any = client.RbacAuthorizationV1Api(kube_api)
        role = await rbac.read_cluster_role(f"{release}-dispatch-kubeflow")
        assert "pods" not in {r for rule in role.rules for r in rule.resources}
        await run_a_job_as_the_chart_account(
            cluster, namespace, release, kube_api, tmp_path, [release, namespace]
        )


async def run_a_job_as_the_chart_account(
    cluster: Any,
    namespace: str,
    release: str,
    kube_api: client.ApiClient,
    tmp_path: Path,
    namespaces: list[str],
) -> None:
    """The operator, as the release's ServiceAccount serving ``namespaces`` (none: all), runs a
    DispatchJob in ``namespace`` to Running and stops it."""
    account = f"{release}-dispatch-kubeflow"
    found = await client.CoreV1Api(kube_api).read_namespaced_service_account(account, release)
    assert found.metadata.name == account
    identity = cluster.kubeconfig_for(
        f"system:serviceaccount:{release}:{account}",
        ["system:serviceaccounts", f"system:serviceaccounts:{release}"],
    )
    installed = Scene(kube_api, release)  # where the chart put the KubeflowAdapter
    scene = Scene(kube_api, namespace)  # the namespace it serves
    await scene.ensure_runtime()
    adapter = await installed.adapter()
    assert adapter["spec"]["namespace"] == namespace

    events = tmp_path / "events.jsonl"
    async with running_operator(identity, namespaces, events):
        await installed.ready_adapter()
        await scene.create_job("charted")
        await scene.job_in_state("charted", "Pending")
        await scene.play_running("charted-1")
        running = await scene.job_in_state("charted", "Running")
        assert condition(running, "Running")["status"] == "True"  # type: ignore[index]
        await scene.objects.delete_namespaced_custom_object(
            GROUP, VERSION, namespace, "dispatchjobs", "charted"
        )

        async def gone() -> bool:
            return await scene.job("charted") is None

        await eventually(gone, "the DispatchJob to be stopped and released")
        assert await scene.trainjob("charted-1") is None


def admission_objects(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [
        doc
        for doc in docs
        if doc["kind"] == kind and doc["metadata"]["name"] == "dispatch-dispatch-kubeflow-admission"
    ]


def test_dispatch_admission_renders_with_its_check_its_lease_and_least_privilege(
    helm: Path,
) -> None:
    docs = render(helm, *admission_values(), "--set", "admission.lease.name=gate-lease")
    (cluster_role,) = admission_objects(docs, "ClusterRole")
    assert cluster_role["rules"] == chart_rules("admission")
    assert not any("leases" in rule["resources"] for rule in cluster_role["rules"])
    (lease_role,) = admission_objects(docs, "Role")
    assert lease_role["metadata"]["namespace"] == "dispatch-system"
    assert lease_role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["gate-lease"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]
    (binding,) = admission_objects(docs, "RoleBinding")
    assert binding["roleRef"]["name"] == lease_role["metadata"]["name"]
    (deployment,) = admission_objects(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "dispatch-dispatch-kubeflow-admission"
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "dispatch_kubeflow.admission"]
    assert container["args"][:5] == [
        "--admission-check=dispatch-gate",
        "--lease-namespace=dispatch-system",
        "--lease-name=gate-lease",
        "--log-level=INFO",
        "--health-address=0.0.0.0:8081",
    ]
    check = one(docs, "AdmissionCheck")
    assert check["metadata"]["name"] == "dispatch-gate"
    assert check["spec"]["controllerName"] == "dispatch.phpboyscout.uk/admission"

    elsewhere = render(helm, *admission_values(), "--set", "admission.lease.namespace=kueue-ops")
    (moved,) = admission_objects(elsewhere, "Role")
    assert moved["metadata"]["namespace"] == "kueue-ops"
    (deployment,) = admission_objects(elsewhere, "Deployment")
    assert (
        "--lease-namespace=kueue-ops"
        in deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_dispatch_admission_is_probed_spread_over_nodes_and_kept_through_drains(
    helm: Path,
) -> None:
    docs = render(helm, *admission_values())
    (deployment,) = admission_objects(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert {"name": "health", "containerPort": 8081, "protocol": "TCP"} in container["ports"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    pods = deployment["spec"]["template"]["metadata"]["labels"]
    (spread,) = pod["topologySpreadConstraints"]
    assert (spread["topologyKey"], spread["maxSkew"]) == ("kubernetes.io/hostname", 1)
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert selects(spread["labelSelector"], pods)
    (budget,) = admission_objects(docs, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    assert selects(budget["spec"]["selector"], pods)

    strict = render(
        helm,
        *admission_values(),
        "--set",
        "admission.spreadAcrossNodes=DoNotSchedule",
        "--set",
        "admission.podDisruptionBudget.enabled=false",
    )
    (deployment,) = admission_objects(strict, "Deployment")
    (spread,) = deployment["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "DoNotSchedule"
    assert not admission_objects(strict, "PodDisruptionBudget")


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Deployment's ``matchLabels`` selector selects pods with ``labels``."""
    assert set(selector) == {"matchLabels"}, "only matchLabels selectors are expected"
    return all(labels.get(key) == value for key, value in selector["matchLabels"].items())


def test_the_operator_and_admission_deployments_select_only_their_own_pods(
    helm: Path,
) -> None:
    docs = render(helm, *admission_values(), "--set-json", 'podLabels={"team": "a"}')
    deployments = {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == "Deployment"}
    operator = deployments["dispatch-dispatch-kubeflow"]["spec"]
    admission = deployments["dispatch-dispatch-kubeflow-admission"]["spec"]
    operator_pods = operator["template"]["metadata"]["labels"]
    admission_pods = admission["template"]["metadata"]["labels"]

    assert selects(operator["selector"], operator_pods)
    assert selects(admission["selector"], admission_pods)
    assert not selects(operator["selector"], admission_pods)
    assert not selects(admission["selector"], operator_pods)


def test_the_deployment_runs_the_built_image_by_digest_as_the_image_test_runs_it(
    helm: Path,
) -> None:
    digest = "sha256:" + "ab" * 32
    deployment = one(
        render(
            helm,
            "--set",
            "image.repository=localhost/dispatch-kubeflow",
            "--set",
            f"image.digest={digest}",
        ),
        "Deployment",
    )
    arguments = podman_run.run_arguments(deployment, "operator")
    container = podman_run.container(deployment, "operator")

    assert container["image"] == f"localhost/dispatch-kubeflow@{digest}"
    assert container["command"] == ["dispatch-kubeflow"]
    assert arguments[-len(container["args"]) - 1 :] == [container["image"], *container["args"]]
    assert '--entrypoint=["dispatch-kubeflow"]' in arguments
    assert "--user=65532:65532" in arguments
    assert {"--read-only", "--read-only-tmpfs=false", "--cap-drop=ALL"} <= set(arguments)
    assert "--security-opt=no-new-privileges" in arguments
    assert [a for a in arguments if a.startswith("--tmpfs")] == ["--tmpfs=/tmp:rw,mode=1777"]
    assert podman_run.liveness_port(container) == 8080


def test_metrics_are_served_behind_a_service_with_an_optional_monitor_and_dashboard(
    helm: Path,
) -> None:
    admission = admission_values()
    docs = render(helm, *admission)
    assert not [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert not [
        d for d in docs if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    ]
    deployments = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in docs
        if d["kind"] == "Deployment"
    }
    services = {
        d["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for d in docs
        if d["kind"] == "Service"
    }
    assert set(services) == {"operator", "admission"}
    for component, deployment in deployments.items():
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert "--metrics-address=0.0.0.0:9090" in container["args"]
        assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in container["ports"]
        service = services[component]["spec"]
        assert service["ports"] == [
            {"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}
        ]
        pods = deployment["spec"]["template"]["metadata"]["labels"]
        assert all(pods.get(key) == value for key, value in service["selector"].items())
        assert (
            services[component]["metadata"]["labels"]["dispatch.phpboyscout.uk/metrics"] == "true"
        )

    enabled = [
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=prom",
        "--set",
        "metrics.dashboard.enabled=true",
    ]
    run_helm(helm, "lint", "--strict", str(CHART), *admission, *enabled)
    monitored = render(helm, *admission, *enabled)
    monitor = one(monitored, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s"}
    ]
    selected = [
        d
        for d in monitored
        if d["kind"] == "Service"
        and all(
            d["metadata"]["labels"].get(k) == v
            for k, v in monitor["spec"]["selector"]["matchLabels"].items()
        )
    ]
    assert len(selected) == 2
    (dashboard,) = [
        d for d in monitored if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    ]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(dashboard["data"]["dispatch-kubeflow.json"])
    assert shipped == json.loads((CHART / "files" / "grafana-dashboard.json").read_text())

    off = render(helm, "--set", "metrics.enabled=false")
    (container,) = one(off, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert not [a for a in container["args"] if a.startswith("--metrics-address")]
    assert not [d for d in off if d["kind"] == "Service"]
