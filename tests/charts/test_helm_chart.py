"""The Helm chart without a cluster: lint, rendering with default and non-default values, the
values schema, the RBAC it grants and the contract between its env and the operator's CLI."""

from __future__ import annotations

import filecmp
from typing import Any

import pytest
import yaml
from chart_helpers import (
    CHART,
    KOPF_DISCOVERY,
    NAMESPACE_DISCOVERY,
    OPERATOR_RIGHTS,
    REPO,
    Doc,
    Helm,
    by_kind,
    env_of,
    one,
    rule_set,
)

from tidal.common import release
from tidal.operator.__main__ import parse_args
from tidal.operator.core.api import GROUP, LABEL_ISVC, LABEL_POOL, LABEL_ROLE, PLURAL

CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))


def operator_container(docs: list[Doc]) -> Doc:
    containers = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    return dict(containers[0])


def port(container: Doc, name: str) -> int:
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == name))


# -- the chart as a whole --------------------------------------------------------------------


def test_chart_crds_are_the_generated_crds() -> None:
    generated = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    in_chart = sorted(p.name for p in (CHART / "crds").glob("*.yaml"))
    assert in_chart == generated, "copy crds/*.yaml into charts/tidal/crds/"
    _, mismatch, errors = filecmp.cmpfiles(REPO / "crds", CHART / "crds", generated, shallow=False)
    assert not mismatch and not errors, f"charts/tidal/crds/ differs from crds/: {mismatch}"


def test_chart_yaml_lists_every_crd_it_ships() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    listed = {
        c["name"]: c["kind"] for c in yaml.safe_load(chart["annotations"]["artifacthub.io/crds"])
    }
    shipped = {}
    for path in (CHART / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        shipped[crd["metadata"]["name"]] = crd["spec"]["names"]["kind"]
    assert listed == shipped, f"Chart.yaml's artifacthub.io/crds {listed} != crds/ {shipped}"
    for kind in shipped.values():
        assert kind in chart["description"], f"Chart.yaml's description names no {kind}"


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "default")
def test_helm_lint_strict_passes(helm: Helm, values: Any) -> None:
    args = ["lint", "--strict", str(CHART)] + (["--values", str(values)] if values else [])
    result = helm(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_helm_is_version_4(helm: Helm) -> None:
    result = helm("version", "--short")
    assert result.returncode == 0 and result.stdout.startswith("v4."), result.stdout


# -- default values --------------------------------------------------------------------------


def test_default_render_is_a_cluster_wide_operator(helm: Helm) -> None:
    docs = helm.template()
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "Role",
        "RoleBinding",
        "ServiceAccount",
    ]
    # Leader election: only its Lease, in the release namespace.
    election = one(docs, "Role")
    assert election["metadata"]["namespace"] == "tidal-system"
    assert rule_set(election["rules"]) == {
        ("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")
    }
    assert one(docs, "RoleBinding")["roleRef"]["name"] == election["metadata"]["name"]
    operator_role = next(
        d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == "t-tidal"
    )
    assert rule_set(operator_role["rules"]) == OPERATOR_RIGHTS | KOPF_DISCOVERY
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == "t-tidal"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "t-tidal", "namespace": "tidal-system"}
    ]
    assert env_of(operator_container(docs))["TIDAL_OPERATOR_NAMESPACES"] == ""


def test_operator_pod_is_locked_down(helm: Helm) -> None:
    docs = helm.template()
    deployment = one(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = operator_container(docs)
    assert deployment["spec"]["replicas"] == 1
    # Leader election on: an upgrade is a rolling update whose new pod waits for the Lease.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["image"] == release.image("operator")


def test_rendered_env_configures_the_operator_cli(helm: Helm) -> None:
    """The env the chart sets is read by the operator's own argument parser as intended."""
    for values, expected_namespaces in [
        (None, []),
        (CHART / "ci" / "namespaced-values.yaml", ["team-a", "team-b"]),
    ]:
        docs = helm.template(*(["--values", str(values)] if values else []))
        container = operator_container(docs)
        env = env_of(container)
        args = parse_args([], env)
        assert args.namespaces == expected_namespaces
        assert args.health_port == port(container, "health")
        assert args.metrics_port == port(container, "metrics")
        assert args.bind_address == "0.0.0.0"  # reachable by the kubelet's probes
    # the non-default values reach the operator
    assert (args.workers, args.resync_seconds, args.log_format, args.debug) == (
        8,
        120.0,
        "plain",
        True,
    )
    assert env["TIDAL_PROMETHEUS_URL"] == "http://prometheus-operated.monitoring.svc:9090"
    assert env["TZ"] == "UTC"


# -- non-default values ----------------------------------------------------------------------


def test_watch_namespaces_grant_rights_only_there(helm: Helm) -> None:
    docs = helm.template("--values", str(CHART / "ci" / "namespaced-values.yaml"))
    roles = [r for r in by_kind(docs, "Role") if "leader-election" not in r["metadata"]["name"]]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert rule_set(role["rules"]) == OPERATOR_RIGHTS
    bindings = [
        b for b in by_kind(docs, "RoleBinding") if "leader-election" not in b["metadata"]["name"]
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"][0]["namespace"] == "tidal-system"
    # Cluster-wide, only kopf's read-only discovery; no aggregated user roles (turned off).
    (cluster_role,) = by_kind(docs, "ClusterRole")
    assert rule_set(cluster_role["rules"]) == KOPF_DISCOVERY | NAMESPACE_DISCOVERY
    container = operator_container(docs)
    assert container["image"].startswith("registry.example.com/tidal/operator@sha256:")
    assert container["imagePullPolicy"] == "Always"
    assert one(docs, "Deployment")["metadata"]["name"] == "tidal-operator"
    service = one(docs, "Service")
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert service["spec"]["selector"].items() <= (
        one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    )


def test_no_rule_grants_more_than_the_operator_uses(helm: Helm) -> None:
    for args in ([], ["--values", str(CHART / "ci" / "namespaced-values.yaml")]):
        docs = helm.template(*args)
        for doc in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
            if "inferenceservice-" in doc["metadata"]["name"]:
                continue  # the aggregated roles for people, checked below
            for group, resource, verb in rule_set(doc["rules"]):
                assert "*" not in (group, resource, verb)
                assert resource != "secrets"
                assert verb not in ("delete", "deletecollection", "escalate", "bind", "impersonate")


def test_user_roles_aggregate_into_the_builtin_roles(helm: Helm) -> None:
    docs = helm.template()
    roles = {d["metadata"]["name"]: d for d in by_kind(docs, "ClusterRole")}
    editor = roles["t-tidal-inferenceservice-editor"]
    viewer = roles["t-tidal-inferenceservice-viewer"]
    assert editor["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert viewer["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert (GROUP, PLURAL, "create") in rule_set(editor["rules"])
    assert {verb for _, _, verb in rule_set(viewer["rules"])} == {"get", "list", "watch"}


def test_monitors_select_the_operator_and_runtime_pods(helm: Helm) -> None:
    docs = helm.template("--values", str(CHART / "ci" / "monitoring-values.yaml"))
    deployment = one(docs, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    monitors = {d["metadata"]["name"]: d for d in by_kind(docs, "PodMonitor")}
    operator_monitor = monitors["t-tidal"]
    assert operator_monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert operator_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert operator_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"

    service_monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert (
        service_monitor["spec"]["selector"]["matchLabels"].items()
        <= service["metadata"]["labels"].items()
    )
    assert service_monitor["spec"]["endpoints"][0] == {
        "port": "metrics",
        "path": "/metrics",
        "interval": "15s",
        "honorLabels": True,
    }
    # tidal_inferenceservice_* name the InferenceService's namespace, not the operator's.
    assert operator_monitor["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True

    runtime = monitors["t-tidal-runtime"]["spec"]
    assert runtime["selector"]["matchExpressions"] == [{"key": LABEL_ISVC, "operator": "Exists"}]
    assert runtime["namespaceSelector"] == {"any": True}
    endpoint = runtime["podMetricsEndpoints"][0]
    assert (endpoint["port"], endpoint["interval"]) == ("http", "2s")  # the runtime's port name
    targets = {r["targetLabel"]: r["sourceLabels"][0] for r in endpoint["relabelings"]}

    def meta_label(label: str) -> str:
        return "__meta_kubernetes_pod_label_" + "".join(c if c.isalnum() else "_" for c in label)

    assert targets["isvc"] == meta_label(LABEL_ISVC)
    assert targets["pool"] == meta_label(LABEL_POOL)
    assert targets["role"] == meta_label(LABEL_ROLE)


def test_runtime_pod_monitor_follows_watched_namespaces(helm: Helm) -> None:
    docs = helm.template(
        "--set", "runtimeMetrics.podMonitor.enabled=true", "--set", "watchNamespaces={a,b}"
    )
    (monitor,) = by_kind(docs, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["a", "b"]}


PODMONITOR_API = "monitoring.coreos.com/v1/PodMonitor"


@pytest.mark.parametrize(
    ("enabled", "cluster_serves_podmonitor", "installed"),
    [
        (None, True, True),  # the default, auto, where the Prometheus Operator runs
        (None, False, False),  # the default on a cluster without its CRDs: the install works
        ("false", True, False),
        ("true", False, True),
    ],
)
def test_runtime_pod_monitor_is_on_by_default_where_the_cluster_serves_it(
    helm: Helm, enabled: str | None, cluster_serves_podmonitor: bool, installed: bool
) -> None:
    # Without it Prometheus never sees the runtime's P99, errors or cold starts: no SLO breaches.
    args = ["--set", f"runtimeMetrics.podMonitor.enabled={enabled}"] if enabled else []
    if cluster_serves_podmonitor:
        args += ["--api-versions", PODMONITOR_API]
    docs = helm.template(*args)
    names = [d["metadata"]["name"] for d in by_kind(docs, "PodMonitor")]
    assert names == (["t-tidal-runtime"] if installed else []), f"{args}: PodMonitors {names}"


def install_notes(helm: Helm, *sets: str) -> str:
    """NOTES.txt as `helm install --dry-run=client` prints it, with these --set values."""
    args = [arg for value in sets for arg in ("--set", value)]
    result = helm("install", "t", str(CHART), "--dry-run=client", "-n", "tidal-system", *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[-1]


def test_notes_say_what_needs_prometheus_and_the_runtime_monitor(helm: Helm) -> None:
    notes = install_notes(helm)
    assert "queue depth" in notes and "needs no Prometheus" in notes, notes
    assert "prometheus.url is empty" in notes and "No runtime PodMonitor" in notes, notes
    assert "ModelBuild" in notes, notes
    on = "runtimeMetrics.podMonitor.enabled=true"
    notes = install_notes(helm, on, "prometheus.url=http://prometheus:9090")
    assert "prometheus.url is empty" not in notes and "No runtime PodMonitor" not in notes, notes
    assert "runtimeMetrics.podMonitor.labels.release" in notes, notes  # installed, no labels
    notes = install_notes(helm, on, "runtimeMetrics.podMonitor.labels.release=kps")
    assert "without labels" not in notes, notes


def test_existing_service_account_is_used_when_not_created(helm: Helm) -> None:
    docs = helm.template("--set", "serviceAccount.create=false", "--set", "serviceAccount.name=ops")
    assert not by_kind(docs, "ServiceAccount")
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"
    assert one(docs, "ClusterRoleBinding")["subjects"][0]["name"] == "ops"
    result = helm("template", "t", str(CHART), "--set", "serviceAccount.create=false")
    assert result.returncode != 0 and "serviceAccount.name is required" in result.stderr


def test_rbac_can_be_left_to_the_cluster_admin(helm: Helm) -> None:
    docs = helm.template("--set", "rbac.create=false")
    assert not [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io")]


# -- the values schema -----------------------------------------------------------------------

BAD_VALUES = [
    (["--set", "unknownKey=1"], "additional properties 'unknownKey' not allowed"),
    (["--set", "operator.workers=0"], "/operator/workers"),
    (["--set", "operator.resyncSeconds=-5"], "/operator/resyncSeconds"),
    (["--set", "operator.wakeMarginSeconds=-1"], "/operator/wakeMarginSeconds"),
    (["--set", "operator.logFormat=xml"], "/operator/logFormat"),
    (["--set", "operator.logLevel=trace"], "/operator/logLevel"),
    (["--set", "operator.metricsPort=70000"], "/operator/metricsPort"),
    (["--set", "operator.healthPort=0"], "/operator/healthPort"),
    (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["--set", "image.digest=latest"], "/image/digest"),
    (["--set", "image.repository="], "/image/repository"),
    (["--set", "watchNamespaces={Team_A}"], "/watchNamespaces/0"),
    (["--set", "prometheus.url=prometheus:9090"], "/prometheus/url"),
    (["--set", "resources.requests.cpu=lots"], "/resources/requests/cpu"),
    (["--set", "metrics.serviceMonitor.interval=30 seconds"], "/metrics/serviceMonitor/interval"),
    (["--set-string", "rbac.create=yes"], "/rbac/create"),
    (["--set", "operator.extraEnv[0].value=x"], "/operator/extraEnv/0"),
    (["--set", "livenessProbe.periodSeconds=0"], "/livenessProbe/periodSeconds"),
    (["--set", "runtimeMetrics.podMonitor.enabled=yes"], "/runtimeMetrics/podMonitor/enabled"),
]


@pytest.mark.parametrize(("args", "message"), BAD_VALUES, ids=[a[1] for a, _ in BAD_VALUES])
def test_schema_rejects_bad_values(helm: Helm, args: list[str], message: str) -> None:
    result = helm("template", "t", str(CHART), *args)
    assert result.returncode != 0, f"helm accepted {args}"
    assert "don't meet the specifications of the schema" in result.stderr
    assert message in result.stderr, result.stderr


def test_same_metrics_and_health_port_is_refused(helm: Helm) -> None:
    result = helm("template", "t", str(CHART), "--set", "operator.healthPort=8081")
    assert result.returncode != 0
    assert "metricsPort and operator.healthPort must differ" in result.stderr


def test_every_default_value_is_described_in_the_schema() -> None:
    """values.yaml and values.schema.json name the same keys (the schema forbids the others)."""
    import json

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def missing(value: Any, node: Doc, path: str) -> list[str]:
        if not isinstance(value, dict) or "properties" not in node:
            return []
        out = []
        for key, child in value.items():
            if key not in node["properties"]:
                out.append(f"{path}.{key}")
            else:
                out += missing(child, node["properties"][key], f"{path}.{key}")
        return out

    assert missing(values, schema, "") == []


def test_leader_election_reaches_the_operator_and_guards_replicas(helm: Helm) -> None:
    docs = helm.template(
        "--set", "operator.replicas=2", "--set", "operator.leaderElection.leaseSeconds=20"
    )
    container = operator_container(docs)
    env = env_of(container)
    assert env["TIDAL_OPERATOR_LEASE_SECONDS"] == "20"
    pod_namespace = next(e for e in container["env"] if e["name"] == "POD_NAMESPACE")
    assert pod_namespace["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    args = parse_args([], {**env, "POD_NAMESPACE": "tidal-system"})
    assert args.leader_elect and args.lease_seconds == 20
    assert args.lease_namespace == "tidal-system" and args.lease_name == "tidal-operator"
    assert one(docs, "Deployment")["spec"]["replicas"] == 2
    # Off: one operator, Recreate, no Lease rights, and more replicas are refused.
    off = helm.template("--set", "operator.leaderElection.enabled=false")
    assert one(off, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    assert by_kind(off, "Role") == []
    assert not parse_args([], env_of(operator_container(off))).leader_elect
    result = helm(
        "template",
        "t",
        str(CHART),
        "--set",
        "operator.leaderElection.enabled=false",
        "--set",
        "operator.replicas=2",
    )
    assert result.returncode != 0 and "needs operator.leaderElection.enabled" in result.stderr
