"""examples/gitops: the Argo CD Applications point at things that exist and render, the
InferenceService they sync is valid (pydantic model and a server-side dry-run), and the Argo CD
health check reads statuses the operator really writes."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import CHART, REPO, Doc, Helm, one

from tidal.operator.core.api import GROUP, PLURAL, PoolName, parse_inference_service
from tidal.operator.core.status import DeploymentState, PodState, StatusInput, compute_status

GITOPS = REPO / "examples" / "gitops"
REPO_URL = "https://github.com/tidal-serving/tidal.git"


def load(path: Path) -> Doc:
    return dict(yaml.safe_load(path.read_text()))


def applications() -> dict[str, Doc]:
    apps = [load(p) for p in sorted(GITOPS.glob("*.yaml"))]
    return {a["metadata"]["name"]: a for a in apps if a["kind"] == "Application"}


def model_manifests() -> list[Doc]:
    return [load(p) for p in sorted((GITOPS / "models").glob("*.yaml"))]


def test_operator_application_installs_the_chart_with_valid_values(
    helm: Helm, tmp_path: Path
) -> None:
    app = applications()["tidal"]
    assert app["apiVersion"] == "argoproj.io/v1alpha1"
    source = app["spec"]["source"]
    assert (source["repoURL"], source["path"]) == (REPO_URL, "charts/tidal")
    assert (REPO / source["path"]).resolve() == CHART
    assert "ServerSideApply=true" in app["spec"]["syncPolicy"]["syncOptions"]
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(source["helm"]["valuesObject"]))
    namespace = app["spec"]["destination"]["namespace"]
    docs = helm.template(
        "--values", str(values), release=source["helm"]["releaseName"], namespace=namespace
    )
    env = {
        e["name"]: e.get("value")
        for e in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["TIDAL_PROMETHEUS_URL"] == source["helm"]["valuesObject"]["prometheus"]["url"]
    assert {d["kind"] for d in docs} >= {"Deployment", "PodMonitor"}


def test_applications_track_a_revision_that_exists() -> None:
    # A tag that does not exist makes Argo CD fail to sync ("unable to resolve"): until a release
    # is tagged, the examples track main.
    tags = subprocess.run(
        ["git", "-C", str(REPO), "tag", "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    for name, app in applications().items():
        revision = app["spec"]["source"]["targetRevision"]
        assert revision == "main" or revision in tags, (
            f"Application {name}: targetRevision {revision!r} is neither main nor a tag of "
            f"this repository (tags: {tags})"
        )


def test_models_application_syncs_after_the_operator() -> None:
    apps = applications()
    models = apps["tidal-models"]
    source = models["spec"]["source"]
    assert source["repoURL"] == REPO_URL
    assert (REPO / source["path"]).resolve() == GITOPS / "models"
    wave = "argocd.argoproj.io/sync-wave"
    assert int(models["metadata"]["annotations"][wave]) > int(
        apps["tidal"]["metadata"]["annotations"][wave]
    )
    assert "SkipDryRunOnMissingResource=true" in models["spec"]["syncPolicy"]["syncOptions"]


def test_synced_inference_services_parse() -> None:
    manifests = model_manifests()
    assert manifests
    for body in manifests:
        body = {**body, "metadata": {**body["metadata"], "namespace": "ml-serving"}}
        isvc = parse_inference_service(body)
        assert isvc.name == body["metadata"]["name"]


@pytest.mark.sandbox
def test_synced_inference_services_pass_server_side_dry_run(sandbox: Any, namespace: str) -> None:
    sandbox.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    sandbox.wait_established(f"crd/{PLURAL}.{GROUP}")
    for body in model_manifests():
        result = sandbox.kubectl(
            "apply", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(body)
        )
        assert result.stdout.strip().endswith("(server dry run)"), result.stdout


# -- the Argo CD health check ------------------------------------------------------------------

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def status(
    *, ready: bool, problems: tuple[str, ...] = (), active: PoolName = PoolName.PRIMARY
) -> Doc:
    """A status as the operator computes it: 2 desired replicas, ready or still warming."""
    deployment = DeploymentState(
        generation=1,
        observed_generation=1,
        spec_replicas=2,
        replicas=2,
        ready_replicas=2 if ready else 0,
        updated_replicas=2,
        available_replicas=2 if ready else 0,
    )
    pods = [PodState(pool=active.value, role="serving", ready=ready) for _ in range(2)]
    result = compute_status(
        StatusInput(
            generation=1,
            now=NOW,
            isvc_name="svc",
            active_pool=active,
            desired={active: 2},
            deployments={active: deployment},
            pods=pods,
            problems=problems,
        )
    )
    return result.to_wire()


@pytest.fixture(scope="module")
def health_check() -> Any:
    import lupa  # a dev dependency: Lua for Python runs Argo CD's Lua health check

    config = load(GITOPS / "argocd-health.yaml")
    script = config["data"]["resource.customizations.health.serving.tidal.dev_InferenceService"]
    lua = lupa.LuaRuntime()
    function = lua.eval(f"function(obj)\n{script}\nend")

    def run(body: Doc) -> dict[str, str]:
        result = function(lua.table_from(body, recursive=True))
        return {"status": result["status"], "message": result["message"]}

    return run


def body(status_: Doc | None, *, generation: int = 1, active_pool: str | None = None) -> Doc:
    spec: Doc = {"runtime": {"backend": "onnxruntime"}}
    if active_pool:
        spec["rollout"] = {"activePool": active_pool}
    out: Doc = {"metadata": {"name": "svc", "generation": generation}, "spec": spec}
    if status_ is not None:
        out["status"] = status_
    return out


def test_health_waits_for_the_operator(health_check: Any) -> None:
    assert health_check(body(None))["status"] == "Progressing"
    stale = health_check(body(status(ready=True), generation=2))
    assert stale["status"] == "Progressing" and "generation 2" in stale["message"]


def test_health_follows_the_operator_conditions(health_check: Any) -> None:
    assert health_check(body(status(ready=True)))["status"] == "Healthy"
    assert health_check(body(status(ready=False)))["status"] == "Progressing"
    degraded = health_check(body(status(ready=False, problems=("model m has no engine",))))
    assert degraded["status"] == "Degraded"


def test_health_flags_an_automatic_rollback_but_not_a_chosen_baseline(health_check: Any) -> None:
    rolled_back = status(ready=True, active=PoolName.BASELINE)
    assert health_check(body(rolled_back))["status"] == "Degraded"
    assert health_check(body(rolled_back, active_pool="baseline"))["status"] == "Healthy"
