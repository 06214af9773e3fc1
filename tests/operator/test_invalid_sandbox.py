"""The invalid-manifest corpus against the sandbox's real API server and a real operator.

``test_operator_sandbox.py`` checks that the API server rejects every ``invalid/*.yaml`` naming
its field. Here: the manifests whose header says ``errors: 1`` get that one error and no second,
misleading one (CEL rules guard on the fields they read); and every ``invalid/degraded/*.yaml``,
which the schema accepts, turns the service Degraded with the field in the condition and in an
Event, without any child being created; every ``invalid/ineffective/*.yaml`` (a working spec
with a setting that can never act, or two that contradict each other) is built all the same and
turns Degraded (``IneffectiveSetting`` or ``ConflictingSettings``) naming the field, with an
Event.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from isvc_fixtures import (
    accepted_paths,
    degraded_cases,
    ineffective_cases,
    invalid_cases,
    minimal,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from tidal.operator.core import api
from tidal.sandbox.operatorproc import OperatorProcess, condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = pytest.mark.sandbox

# The API server adds this line whenever a schema error keeps it from running the CEL rules;
# it names no field and is no second error of the user's.
SKIPPED_NOTE = "some validation rules were not checked because the object was invalid"


def _errors(stderr: str) -> list[str]:
    lines = [line[2:] for line in stderr.splitlines() if line.startswith("* ")]
    if not lines:  # a single error is printed on the "is invalid:" line itself
        lines = [line for line in stderr.splitlines() if " is invalid: " in line]
    return [line for line in lines if SKIPPED_NOTE not in line]


SINGLE = [case for case in invalid_cases() if "errors" in case[1]]


def test_single_error_cases_exist() -> None:
    assert len(SINGLE) >= 10


@pytest.mark.parametrize(
    ("path", "header", "manifest"), SINGLE, ids=lambda v: getattr(v, "stem", "")
)
def test_api_server_reports_only_the_true_error(
    sandbox: Any,
    namespace: str,
    isvc_crd: None,
    path: Any,
    header: dict[str, str],
    manifest: dict[str, Any],
) -> None:
    result = sandbox.kubectl("apply", "-n", namespace, "-f", str(path), check=False)
    assert result.returncode != 0, f"{path.name} was accepted"
    errors = _errors(result.stderr)
    assert len(errors) == int(header["errors"]), result.stderr
    assert header["field"] in errors[0] and header["expect"] in errors[0], result.stderr


def test_api_server_accepts_the_edge_values(sandbox: Any, namespace: str, isvc_crd: None) -> None:
    assert accepted_paths()
    for path in accepted_paths():
        sandbox.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))


def test_schema_valid_spec_that_cannot_work_is_degraded_naming_the_field(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    cases = degraded_cases()
    for _path, _header, manifest in cases:
        sandbox.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))

    def all_degraded() -> dict[str, dict[str, Any]] | None:
        found = {}
        for _path, _header, manifest in cases:
            name = manifest["metadata"]["name"]
            cond = condition(get_isvc(sandbox, namespace, name), "Degraded")
            if cond.get("status") != "True":
                return None
            found[name] = cond
        return found

    conditions = wait_for(all_degraded, timeout=90, what="every degraded case Degraded")
    events = json.loads(
        sandbox.kubectl(
            "get", "events", "-n", namespace, "--field-selector", "reason=InvalidSpec", "-o", "json"
        ).stdout
    )["items"]
    for path, header, manifest in cases:
        name = manifest["metadata"]["name"]
        cond = conditions[name]
        assert cond["reason"] == "InvalidSpec", (path.name, cond)
        assert header["field"] in cond["message"], (path.name, cond["message"])
        assert header["expect"] in cond["message"], (path.name, cond["message"])
        messages = [e["message"] for e in events if e["involvedObject"]["name"] == name]
        assert any(header["field"] in m for m in messages), (path.name, messages)
    deployments = sandbox.kubectl(
        "get", "deployments", "-n", namespace, "-l", api.LABEL_ISVC, "-o", "name"
    ).stdout
    assert deployments.strip() == ""


def test_ineffective_setting_is_built_and_degraded_naming_the_field(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    cases = ineffective_cases()
    # IneffectiveSetting or ConflictingSettings, as each manifest's header says.
    reasons = {m["metadata"]["name"]: h["reason"] for _p, h, m in cases}
    for _path, _header, manifest in cases:
        # The pods stay Pending (no node has this label): a runtime that started would fail
        # to load the corpus's made-up engine, and EngineLoadFailed outranks the warning.
        body = copy.deepcopy(manifest)
        body["spec"]["runtime"]["nodeSelector"] = {"tidal.dev/no-such-node": "none"}
        sandbox.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))

    def all_degraded() -> dict[str, dict[str, Any]] | None:
        found = {}
        for _path, _header, manifest in cases:
            name = manifest["metadata"]["name"]
            cond = condition(get_isvc(sandbox, namespace, name), "Degraded")
            if cond.get("reason") != reasons[name]:
                return None
            found[name] = cond
        return found

    conditions = wait_for(all_degraded, timeout=90, what="every ineffective case Degraded")

    def warnings_by_name() -> dict[str, list[str]] | None:
        items = json.loads(
            sandbox.kubectl(
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector",
                "type=Warning",
                "-o",
                "json",
            ).stdout
        )["items"]
        found: dict[str, list[str]] = {}
        for e in items:
            name = e["involvedObject"]["name"]
            if e["reason"] == reasons.get(name):
                found.setdefault(name, []).append(e["message"])
        names = {m["metadata"]["name"] for _p, _h, m in cases}
        return found if names <= found.keys() else None

    events = wait_for(warnings_by_name, timeout=60, what="a Warning Event for every case")
    deployments = sandbox.kubectl(
        "get", "deployments", "-n", namespace, "-l", api.LABEL_ISVC, "-o", "name"
    ).stdout.split()
    for path, header, manifest in cases:
        name = manifest["metadata"]["name"]
        cond = conditions[name]
        assert cond["status"] == "True", (path.name, cond)
        assert header["field"] in cond["message"], (path.name, cond["message"])
        assert header["expect"] in cond["message"], (path.name, cond["message"])
        assert any(header["field"] in m for m in events[name]), (path.name, events[name])
        # Serving goes on: the children are built despite the warning.
        assert f"deployment.apps/{name}-primary" in deployments, (path.name, deployments)


# Quantities at the edges of the byte rules: both layers must give the same verdict.
QUANTITIES = [
    "0",
    "1",
    "1k",
    "1.5Gi",
    "1.1Gi",
    "1.5G",
    "0.5",
    "500m",
    "1000m",
    "1.0001k",
    "1.25Ki",
    "2.5Mi",
    "7Ei",
    "9Ei",
    "1e3",
    "-1Gi",
    "1 Gi",
    "1gi",
    "01Gi",
    "1.Gi",
    ".5Gi",
    "20Gi",
]


def _server_accepts(api_client: Any, namespace: str, body: dict[str, Any]) -> bool:
    objects = client.CustomObjectsApi(api_client)
    try:
        objects.create_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, body, dry_run="All"
        )
    except ApiException as exc:
        assert exc.status == 422, exc.body
        return False
    return True


def _models_accept(body: dict[str, Any]) -> bool:
    try:
        api.parse_inference_service(body)
    except ValidationError:
        return False
    return True


def test_api_server_and_models_agree_on_byte_quantities(
    sandbox: Any, namespace: str, isvc_crd: None
) -> None:
    api_client = sandbox.api_client()
    disagree = []
    for value in QUANTITIES:
        for spec in (
            {"memory": {"engineCacheBudget": value}},
            {"memory": {"engineCacheBudget": "64Gi", "reserve": value}},
            {"models": [{"name": "m", "memory": value, "engines": [{"uri": "file:///m.onnx"}]}]},
            {"runtime": {"backend": "onnxruntime", "resources": {"limits": {"memory": value}}}},
        ):
            body = minimal(name="q", namespace=namespace, **spec)
            body["metadata"] = {"name": "q"}
            server, models = _server_accepts(api_client, namespace, body), _models_accept(body)
            if server != models:
                disagree.append((spec, "server" if server else "models"))
    assert disagree == [], disagree


def test_a_hostpath_forbidden_by_pod_security_is_degraded_naming_the_field(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    """Issue 31: a namespace whose Pod Security level forbids hostPath volumes refuses the
    pods; the user is told spec.runtime.engineCache.hostPath, not the volume's name."""
    sandbox.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    body = minimal(
        name="cache",
        namespace=namespace,
        runtime={"backend": "onnxruntime", "engineCache": {"hostPath": "/var/cache/tidal-x"}},
    )
    body["metadata"] = {"name": "cache"}
    sandbox.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(body))

    def degraded() -> dict[str, Any] | None:
        cond = condition(get_isvc(sandbox, namespace, "cache"), "Degraded")
        return cond if cond.get("reason") == "DeploymentFailed" else None

    cond = wait_for(degraded, timeout=120, what="Degraded=DeploymentFailed")
    assert cond["status"] == "True", cond
    assert cond["message"].startswith("pool primary: spec.runtime.engineCache.hostPath "), cond
    assert "Pod Security level forbids hostPath" in cond["message"], cond

    def warning() -> list[str] | None:
        items = json.loads(
            sandbox.kubectl(
                "get", "events", "-n", namespace, "--field-selector",
                "reason=DeploymentFailed,type=Warning", "-o", "json",
            ).stdout
        )["items"]  # fmt: skip
        found = [e["message"] for e in items if e["involvedObject"]["name"] == "cache"]
        return found or None

    messages = wait_for(warning, timeout=60, what="a DeploymentFailed Warning Event")
    assert any("spec.runtime.engineCache.hostPath" in m for m in messages), messages
