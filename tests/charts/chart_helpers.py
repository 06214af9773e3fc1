"""Helpers of the chart and image checks: locating (or building) helm, rendering the chart.

The helm binary is built once from the Go module proxy by ``e2e/helm/build-helm.sh`` into
``$TIDAL_CACHE/helm-<version>/bin/helm`` (default ``~/.cache/tidal``), like the sandbox's
binaries; :func:`ensure_helm` runs the script when the binary is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tidal.operator.core.api import GROUP, PLURAL

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tidal"
BUILD_HELM = REPO / "e2e" / "helm" / "build-helm.sh"
HELM_VERSION = os.environ.get("TIDAL_HELM_VERSION", "v4.3.2")

Doc = dict[str, Any]


def helm_path() -> Path:
    """Where build-helm.sh puts (or has put) the helm binary."""
    cache = Path(os.environ.get("TIDAL_CACHE", Path.home() / ".cache" / "tidal"))
    return cache / f"helm-{HELM_VERSION}" / "bin" / "helm"


def ensure_helm() -> Path:
    """The helm binary, built first when missing (minutes, once; progress goes to stderr)."""
    path = helm_path()
    if not os.access(path, os.X_OK):
        bash = shutil.which("bash") or "/bin/bash"
        subprocess.run([bash, str(BUILD_HELM)], check=True, stdout=subprocess.DEVNULL)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{BUILD_HELM} ran but {path} is still missing")
    return path


@dataclass(frozen=True)
class Helm:
    """Runs one helm binary with the user's HELM_* settings left out."""

    binary: Path

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HELM_")}
        return subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )

    def template_text(self, *args: str, release: str = "t", namespace: str = "tidal-system") -> str:
        result = self("template", release, str(CHART), "--namespace", namespace, *args)
        if result.returncode != 0:
            raise AssertionError(f"helm template {' '.join(args)} failed:\n{result.stderr}")
        return result.stdout

    def template(
        self, *args: str, release: str = "t", namespace: str = "tidal-system"
    ) -> list[Doc]:
        """``helm template`` of the chart, parsed (empty documents dropped)."""
        text = self.template_text(*args, release=release, namespace=namespace)
        return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str) -> Doc:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def env_of(container: Doc) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def rule_set(rules: list[Doc]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples: the order and grouping of rules do not matter."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


# What the operator does (operator/shell) and why each right is needed; a change here must be
# a deliberate change of what the operator does.
OPERATOR_RIGHTS = {
    # kopf's watches of InferenceServices and of the labelled children
    (GROUP, PLURAL, "list"),
    (GROUP, PLURAL, "watch"),
    ("apps", "deployments", "list"),
    ("apps", "deployments", "watch"),
    ("", "services", "list"),
    ("", "services", "watch"),
    ("", "configmaps", "list"),
    ("", "configmaps", "watch"),
    ("", "pods", "list"),
    ("", "pods", "watch"),
    # the control loop: role label (serving/standby) and pod-deletion-cost annotation
    ("", "pods", "patch"),
    # make-before-break traffic moves wait for the Service's EndpointSlices (core.traffic)
    ("discovery.k8s.io", "endpointslices", "list"),
    ("discovery.k8s.io", "endpointslices", "watch"),
    # kube.py: server-side apply of the children (an apply that creates the object is
    # authorised as patch and as create: the sandbox refuses it without create)
    ("apps", "deployments", "patch"),
    ("", "services", "patch"),
    ("", "configmaps", "patch"),
    ("apps", "deployments", "create"),
    ("", "services", "create"),
    ("", "configmaps", "create"),
    # the fleet loop reads back its saved forecast (ConfigMap <isvc>-fleet-state) on start
    ("", "configmaps", "get"),
    # kube.py: status merge patch and core/v1 Events
    (GROUP, f"{PLURAL}/status", "patch"),
    ("", "events", "create"),
    # ownerReferences with blockOwnerDeletion (OwnerReferencesPermissionEnforcement)
    (GROUP, f"{PLURAL}/finalizers", "update"),
    # ModelBuilds (shell/builds.py): watched with their build Jobs (pods: above), one Job
    # created per target (owned by its build), status merge patch
    (GROUP, "modelbuilds", "list"),
    (GROUP, "modelbuilds", "watch"),
    (GROUP, "modelbuilds/status", "patch"),
    (GROUP, "modelbuilds/finalizers", "update"),
    ("batch", "jobs", "list"),
    ("batch", "jobs", "watch"),
    ("batch", "jobs", "create"),
}
KOPF_DISCOVERY = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    # cluster-wide reads beside kopf's: a ModelBuild's default targets are the GPU products
    # among the nodes' labels (kube.py list_node_labels; without it, name spec.targets)
    ("", "nodes", "list"),
}
NAMESPACE_DISCOVERY = {("", "namespaces", "list"), ("", "namespaces", "watch")}
