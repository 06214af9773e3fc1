"""The chart against the sandbox's real API server: the rendered manifests pass a server-side
dry-run, and the RBAC it grants is enough for the real operator and no more.

The Prometheus Operator's CRDs (PodMonitor, ServiceMonitor) are not installed in the sandbox,
so those two kinds are left out of the dry-run; test_helm_chart.py checks them offline.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import (
    CHART,
    KOPF_DISCOVERY,
    NAMESPACE_DISCOVERY,
    OPERATOR_RIGHTS,
    Doc,
    Helm,
    by_kind,
    env_of,
    one,
)
from kubernetes import client

from tidal.operator.core.api import GROUP, LABEL_ISVC, PLURAL
from tidal.sandbox.nodeagent import FAKE_LABEL
from tidal.sandbox.operatorproc import http_forbidden
from tidal.sandbox.procs import free_port
from tidal.sandbox.wait import wait_for

pytestmark = pytest.mark.sandbox

PROMETHEUS_OPERATOR_KINDS = {"PodMonitor", "ServiceMonitor"}
# Runtime pods go to the sandbox's fake node: scheduled, never run (no process, no CPU).
FAKE_NODE_PLACEMENT = {
    "nodeSelector": {FAKE_LABEL: "true"},
    "tolerations": [{"key": FAKE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
}


@pytest.fixture(scope="module")
def chart_crds(sandbox: Any) -> None:
    """The chart's CRDs, applied for real (helm installs crds/ before the templates)."""
    sandbox.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    sandbox.wait_established(f"crd/{PLURAL}.{GROUP}")


def dump(docs: list[Doc]) -> str:
    return yaml.safe_dump_all(docs, sort_keys=False)


@pytest.mark.parametrize(
    "values",
    [None, "namespaced-values.yaml", "monitoring-values.yaml"],
    ids=["default", "namespaced", "monitoring"],
)
def test_rendered_manifests_pass_server_side_dry_run(
    sandbox: Any, namespace: str, chart_crds: None, helm: Helm, values: str | None
) -> None:
    args = ["--values", str(CHART / "ci" / values)] if values else []
    if values == "namespaced-values.yaml":
        args += ["--set", f"watchNamespaces={{{namespace}}}"]  # Roles need an existing namespace
    docs = helm.template(*args, release="dry", namespace=namespace)
    applied = [d for d in docs if d["kind"] not in PROMETHEUS_OPERATOR_KINDS]
    assert len(applied) >= 6
    result = sandbox.kubectl(
        "apply", "--dry-run=server", "-f", "-", input=dump(applied), check=False
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == len(applied), result.stdout
    assert all(line.endswith("(server dry run)") for line in lines), result.stdout


# -- RBAC: the operator runs with nothing but what the chart grants ---------------------------


def service_account_kubeconfig(sandbox: Any, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount (a TokenRequest token)."""
    token = sandbox.kubectl(
        "create", "token", account, "-n", namespace, "--duration=10m"
    ).stdout.strip()
    admin = yaml.safe_load(Path(sandbox.kubeconfig).read_text())
    cluster = admin["clusters"][0]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [cluster],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": cluster["name"], "user": account}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


@pytest.fixture
def installed_rbac(sandbox: Any, namespace: str, helm: Helm) -> Iterator[list[Doc]]:
    """The chart's ServiceAccount and RBAC for an operator watching ``namespace``, applied for
    real (the Deployment is left out: the operator runs as a local process instead)."""
    release = f"op{namespace[-5:]}"
    docs = helm.template(
        "--set",
        f"watchNamespaces={{{namespace}}}",
        "--set",
        f"operator.healthPort={free_port()}",
        "--set",
        f"operator.metricsPort={free_port()}",
        "--set",
        "rbac.aggregateToDefaultRoles=false",
        release=release,
        namespace=namespace,
    )
    rbac = [d for d in docs if d["kind"] != "Deployment"]
    sandbox.kubectl("apply", "-f", "-", input=dump(rbac))
    yield docs
    cluster_scoped = [d for d in rbac if d["kind"].startswith("Cluster")]
    sandbox.kubectl("delete", "--ignore-not-found", "-f", "-", input=dump(cluster_scoped))


def test_operator_reconciles_with_only_the_chart_rbac(
    sandbox: Any, namespace: str, chart_crds: None, installed_rbac: list[Doc], tmp_path: Path
) -> None:
    docs = installed_rbac
    account = one(docs, "ServiceAccount")["metadata"]["name"]
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    kubeconfig = service_account_kubeconfig(sandbox, namespace, account, tmp_path / "sa.kubeconfig")
    # The Deployment's own environment; only the bind address is narrowed to this machine.
    env = {
        **os.environ,
        **env_of(container),
        "KUBECONFIG": str(kubeconfig),
        "TIDAL_OPERATOR_BIND_ADDRESS": "127.0.0.1",
        "TIDAL_OPERATOR_LOG_FORMAT": "full",
        "POD_NAMESPACE": namespace,  # the downward API's value: the release namespace
    }
    assert env["TIDAL_OPERATOR_LEADER_ELECT"] == "true"
    env.pop("TIDAL_PROMETHEUS_URL", None)
    health_port = next(p["containerPort"] for p in container["ports"] if p["name"] == "health")
    probe_path = container["livenessProbe"]["httpGet"]["path"]
    log_path = tmp_path / "operator.log"
    with log_path.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidal.operator"], env=env, stdout=sink, stderr=subprocess.STDOUT
        )
    try:
        # The probe the chart configures answers.
        wait_for(
            lambda: (
                urllib.request.urlopen(
                    f"http://127.0.0.1:{health_port}{probe_path}", timeout=2
                ).status
                == 200
            ),
            timeout=30,
            what="the operator's liveness endpoint",
        )
        isvc = {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "rbac-check", "namespace": namespace},
            "spec": {
                "runtime": {"backend": "onnxruntime", **FAKE_NODE_PLACEMENT},
                "models": [{"name": "m", "engines": [{"uri": "file:///nonexistent/m.onnx"}]}],
            },
        }
        sandbox.kubectl("apply", "-f", "-", input=json.dumps(isvc))

        def reconciled() -> dict[str, Any] | None:
            out = sandbox.kubectl("get", PLURAL, "rbac-check", "-n", namespace, "-o", "json")
            body = json.loads(out.stdout)
            status = body.get("status") or {}
            return (
                body if status.get("observedGeneration") == body["metadata"]["generation"] else None
            )

        wait_for(reconciled, timeout=30, what="status written by the operator")
        # It leads through its Lease, with only the chart's rights.
        lease = json.loads(sandbox.kubectl("get", "leases", "-n", namespace, "-o", "json").stdout)[
            "items"
        ]
        assert [item["spec"].get("holderIdentity") is not None for item in lease] == [True]
        out = sandbox.kubectl(
            "get",
            "deployments,services,configmaps",
            "-n",
            namespace,
            "-l",
            f"{LABEL_ISVC}=rbac-check",
            "-o",
            "json",
        )
        kinds = {item["kind"] for item in json.loads(out.stdout)["items"]}
        assert kinds == {"Deployment", "Service", "ConfigMap"}, log_path.read_text()[-3000:]
        events = json.loads(
            sandbox.kubectl(
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector",
                "involvedObject.name=rbac-check",
                "-o",
                "json",
            ).stdout
        )["items"]
        assert any(e.get("reportingComponent") == "tidal-operator" for e in events)
        sandbox.kubectl("delete", PLURAL, "rbac-check", "-n", namespace, "--wait=false")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
    log = log_path.read_text(errors="replace")
    # An HTTP 403 anywhere in the log, in the forms the clients print it (not any "403").
    assert http_forbidden(log) is None, log[-4000:]


def access(
    api: Any, user: str, namespace: str | None, group: str, resource: str, verb: str
) -> bool:
    """A SubjectAccessReview (``api``: an AuthorizationV1Api): may ``user`` do this?"""
    sa_namespace = user.split(":")[2]
    resource, _, subresource = resource.partition("/")
    body: Any = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": user,
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{sa_namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "group": group,
                "resource": resource,
                "subresource": subresource,
                "verb": verb,
                **({"namespace": namespace} if namespace else {}),
            },
        },
    }
    review = api.create_subject_access_review(body)
    return review.status is not None and bool(review.status.allowed)


def test_cluster_wide_rbac_allows_exactly_the_operator_rights(
    sandbox: Any, namespace: str, helm: Helm
) -> None:
    docs = helm.template(release=f"cw{namespace[-5:]}", namespace=namespace)
    rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    sandbox.kubectl("apply", "-f", "-", input=dump(rbac))
    api = client.AuthorizationV1Api(sandbox.api_client())
    try:
        account = one(docs, "ServiceAccount")["metadata"]["name"]
        user = f"system:serviceaccount:{namespace}:{account}"
        elsewhere = "default"  # cluster-wide: rights in any namespace
        for group, resource, verb in sorted(OPERATOR_RIGHTS):
            assert access(api, user, elsewhere, group, resource, verb), (group, resource, verb)
        for group, resource, verb in sorted(KOPF_DISCOVERY):
            assert access(api, user, None, group, resource, verb), (group, resource, verb)
        denied = [
            ("", "secrets", "get"),
            ("", "secrets", "list"),
            ("apps", "deployments", "delete"),
            ("", "pods", "delete"),
            ("", "pods", "create"),
            (GROUP, PLURAL, "update"),
            (GROUP, PLURAL, "patch"),
            (GROUP, PLURAL, "delete"),
            ("rbac.authorization.k8s.io", "clusterroles", "escalate"),
            *NAMESPACE_DISCOVERY,  # only needed when watching named namespaces
        ]
        for group, resource, verb in denied:
            assert not access(api, user, elsewhere, group, resource, verb), (
                group,
                resource,
                verb,
            )
    finally:
        cluster_scoped = [d for d in rbac if d["kind"].startswith("Cluster")]
        sandbox.kubectl("delete", "--ignore-not-found", "-f", "-", input=dump(cluster_scoped))


def test_namespaced_rbac_grants_nothing_outside_the_watched_namespaces(
    sandbox: Any, namespace: str, installed_rbac: list[Doc]
) -> None:
    api = client.AuthorizationV1Api(sandbox.api_client())
    account = one(installed_rbac, "ServiceAccount")["metadata"]["name"]
    user = f"system:serviceaccount:{namespace}:{account}"
    for group, resource, verb in sorted(OPERATOR_RIGHTS):
        assert access(api, user, namespace, group, resource, verb), (group, resource, verb)
        assert not access(api, user, "default", group, resource, verb), (group, resource, verb)
    for group, resource, verb in sorted(KOPF_DISCOVERY | NAMESPACE_DISCOVERY):
        assert access(api, user, None, group, resource, verb), (group, resource, verb)
    assert by_kind(installed_rbac, "Role")[0]["metadata"]["namespace"] == namespace
