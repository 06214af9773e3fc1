"""The operator against the sandbox: a real API server, controllers, node agent and pods.

Each test gets a fresh namespace and its own ``tidal-operator`` process watching only that
namespace (see conftest.py). Assertions are about the state of the world (objects, status,
answers from the pods), never about which requests the operator made.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from isvc_fixtures import (
    EXAMPLE_MODEL_PREFIX,
    INVALID,
    example_paths,
    invalid_cases,
    minimal,
)

from tidal.operator.core import api
from tidal.operator.core.resources import ANNOTATION_APPLIED_HASH, Observed, desired_objects
from tidal.runtime.modelgen import write_mlp
from tidal.sandbox.endpoints import ready_endpoints
from tidal.sandbox.operatorproc import OperatorProcess, condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = pytest.mark.sandbox

FAKE_NODE_PLACEMENT = {
    "nodeSelector": {"tidal.dev/sandbox-fake": "true"},
    "tolerations": [
        {
            "key": "tidal.dev/sandbox-fake",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        }
    ],
}


# -- helpers --------------------------------------------------------------------------------


def is_ready(sandbox: Any, namespace: str, name: str) -> dict[str, Any] | None:
    body = get_isvc(sandbox, namespace, name)
    status = body.get("status") or {}
    if (
        condition(body, "Ready").get("status") == "True"
        and status.get("observedGeneration") == body["metadata"]["generation"]
    ):
        return body
    return None


def wait_ready(sandbox: Any, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    """The service once Ready for its generation; on timeout the error holds its status."""
    return wait_for(
        lambda: is_ready(sandbox, namespace, name),
        timeout=timeout,
        what=f"{name} Ready",
        describe=lambda: get_isvc(sandbox, namespace, name).get("status"),
    )


def apply(sandbox: Any, namespace: str, manifest: dict[str, Any] | str) -> None:
    text = manifest if isinstance(manifest, str) else yaml.safe_dump(manifest)
    sandbox.kubectl("apply", "-n", namespace, "-f", "-", input=text)


def children(sandbox: Any, namespace: str, name: str) -> dict[str, set[str]]:
    """Names of every object labelled as this InferenceService's, by kind."""
    out = sandbox.kubectl(
        "get",
        "deployments,replicasets,services,configmaps,pods",
        "-n",
        namespace,
        "-l",
        f"{api.LABEL_ISVC}={name}",
        "-o",
        "json",
    )
    found: dict[str, set[str]] = {}
    for item in json.loads(out.stdout)["items"]:
        if item["metadata"].get("deletionTimestamp"):
            continue
        found.setdefault(item["kind"], set()).add(item["metadata"]["name"])
    return found


def materialize(path: Path, model_dir: Path) -> dict[str, Any]:
    """An example with its model URIs pointing at freshly generated ONNX files (and no S3
    store: the files are local)."""
    text = path.read_text()
    for index, uri in enumerate(
        sorted(set(re.findall(re.escape(EXAMPLE_MODEL_PREFIX) + r"\S+", text)))
    ):
        local = model_dir / uri.removeprefix(EXAMPLE_MODEL_PREFIX)
        write_mlp(local, seed=index)
        text = text.replace(uri, local.resolve().as_uri())
    body = dict(yaml.safe_load(text))
    body["spec"]["runtime"].pop("storage", None)
    return body


def infer(address: str, port: int, model: str) -> dict[str, Any]:
    body = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
    request = urllib.request.Request(
        f"http://{address}:{port}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return dict(json.loads(response.read()))


def small_service(name: str, model_uri: str, **spec: Any) -> dict[str, Any]:
    body = minimal(name=name)
    body["metadata"] = {"name": name}
    body["spec"]["models"][0]["engines"][0]["uri"] = model_uri
    body["spec"].update(spec)
    return body


def fake_service(name: str, **spec: Any) -> dict[str, Any]:
    return small_service(
        name,
        "file:///nonexistent/m.onnx",
        runtime={"backend": "onnxruntime", **FAKE_NODE_PLACEMENT},
        **spec,
    )


# -- the API server rejects invalid objects ------------------------------------------------


@pytest.mark.parametrize(
    ("path", "header", "manifest"), invalid_cases(), ids=lambda v: getattr(v, "stem", "")
)
def test_api_server_rejects_invalid_manifest_naming_the_field(
    sandbox: Any,
    namespace: str,
    isvc_crd: None,
    path: Path,
    header: dict[str, str],
    manifest: dict[str, Any],
) -> None:
    result = sandbox.kubectl("apply", "-n", namespace, "-f", str(path), check=False)
    assert result.returncode != 0, f"{path.name} was accepted"
    assert header["field"] in result.stderr, result.stderr
    assert header["expect"] in result.stderr, result.stderr
    assert (
        sandbox.kubectl("get", "inferenceservices", "-n", namespace, "-o", "name").stdout.strip()
        == ""
    )


def test_invalid_corpus_is_large_enough() -> None:
    assert len(list(INVALID.glob("*.yaml"))) >= 20


def test_gpu_example_is_accepted_by_the_api_server(
    sandbox: Any, namespace: str, isvc_crd: None
) -> None:
    for path in sorted((example_paths()[0].parent / "gpu").glob("*.yaml")):
        sandbox.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", str(path))


# -- examples ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", example_paths(include_gpu=False), ids=lambda p: p.stem)
def test_example_becomes_ready_and_answers_inference(
    sandbox: Any, namespace: str, operator: OperatorProcess, tmp_path: Path, path: Path
) -> None:
    manifest = materialize(path, tmp_path / "models")
    name = manifest["metadata"]["name"]
    apply(sandbox, namespace, manifest)
    body = wait_ready(sandbox, namespace, name)
    isvc = api.parse_inference_service(body)
    want = {(o["kind"], o["metadata"]["name"]) for o in desired_objects(isvc, Observed())}
    have = children(sandbox, namespace, name)
    for kind, child in want:
        assert child in have.get(kind, set()), (kind, child, have)
    endpoints = wait_for(
        lambda: ready_endpoints(sandbox.api_client(), namespace, name),
        timeout=60,
        what=f"ready endpoints of Service {name}",
    )
    address, port = endpoints[0]
    for model in isvc.spec.models:
        answer = infer(address, port, model.name)
        assert answer["outputs"][0]["shape"] == [1, 4]


# -- rolling a spec change -------------------------------------------------------------------


def test_spec_edit_rolls_pods_while_ready_holds(
    sandbox: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    model = write_mlp(tmp_path / "m.onnx")
    apply(sandbox, namespace, small_service("roll", model.uri))
    wait_ready(sandbox, namespace, "roll")
    before = children(sandbox, namespace, "roll")["Pod"]

    edited = small_service("roll", model.uri)
    edited["spec"]["models"][0]["warmup"] = {"batchSizes": [1, 2], "iterations": 2}
    apply(sandbox, namespace, edited)

    rolling_samples = 0  # polls that saw the roll in progress, with Ready holding
    deadline = time.monotonic() + 180
    while True:
        body = get_isvc(sandbox, namespace, "roll")
        status = body.get("status") or {}
        assert condition(body, "Ready").get("status") == "True", status
        assert status.get("readyReplicas", 0) >= 1, status
        assert status.get("desiredReplicas") == 1, status
        pods = children(sandbox, namespace, "roll").get("Pod", set())
        done = (
            status.get("observedGeneration") == body["metadata"]["generation"]
            and condition(body, "Progressing").get("status") == "False"
            and pods.isdisjoint(before)
            and len(pods) == 1
        )
        if done:
            break
        rolling_samples += 1
        assert time.monotonic() < deadline, f"roll did not finish: {status}"
        time.sleep(0.2)
    # The roll was observed under way (how many polls that takes depends on the machine).
    assert rolling_samples >= 1
    after = children(sandbox, namespace, "roll")["ReplicaSet"]
    assert len(after) == 2  # old (scaled to 0, kept as history) and new


# -- crash safety ----------------------------------------------------------------------------


def test_operator_killed_mid_reconcile_leaves_exactly_the_desired_children(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    operator.stop()
    names = [f"crash-{i}" for i in range(6)]
    for name in names:
        extra = {"rollout": {"baseline": {"minReplicas": 1}}} if name.endswith(("1", "4")) else {}
        apply(sandbox, namespace, fake_service(name, **extra))
    from kubernetes import client

    core = client.CoreV1Api(sandbox.api_client())
    apps = client.AppsV1Api(sandbox.api_client())
    selector = api.LABEL_ISVC
    # One worker reconciles one service after the other; kill it as soon as the first child
    # exists, which lands in the middle of a reconcile (or between two).
    operator.start("--workers", "1")
    wait_for(
        lambda: core.list_namespaced_config_map(namespace, label_selector=selector).items,
        timeout=60,
        interval=0.005,
        what="first children",
    )
    operator.kill()
    partial = len(apps.list_namespaced_deployment(namespace, label_selector=selector).items)
    operator.start()
    for name in names:
        wait_ready(sandbox, namespace, name)
    for name in names:
        body = get_isvc(sandbox, namespace, name)
        isvc = api.parse_inference_service(body)
        want = desired_objects(isvc, Observed())
        have = children(sandbox, namespace, name)
        for kind in ("Deployment", "Service", "ConfigMap"):
            assert have.get(kind, set()) == {
                o["metadata"]["name"] for o in want if o["kind"] == kind
            }, (name, kind, have)
        assert len(have["ReplicaSet"]) == len(have["Deployment"])  # one template each
        assert len(have["Pod"]) == sum(
            o["spec"]["replicas"] for o in want if o["kind"] == "Deployment"
        )
        for obj in want:  # each child carries exactly the content the core asks for
            out = sandbox.kubectl(
                "get", obj["kind"].lower(), obj["metadata"]["name"], "-n", namespace, "-o", "json"
            )
            stored = json.loads(out.stdout)["metadata"]["annotations"][ANNOTATION_APPLIED_HASH]
            assert stored == obj["metadata"]["annotations"][ANNOTATION_APPLIED_HASH]
    assert partial < len(names) + 2  # the kill landed before every Deployment existed


# -- deletion ----------------------------------------------------------------------------------


def _all_gone(sandbox: Any, namespace: str, name: str) -> bool:
    return children(sandbox, namespace, name) == {}


def test_deleting_the_service_removes_everything_it_created(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    apply(sandbox, namespace, fake_service("gone", rollout={"baseline": {"minReplicas": 1}}))
    wait_ready(sandbox, namespace, "gone")
    assert children(sandbox, namespace, "gone")["Pod"]
    sandbox.kubectl("delete", "inferenceservice", "gone", "-n", namespace, "--wait=true")
    wait_for(lambda: _all_gone(sandbox, namespace, "gone"), timeout=120, what="children gone")


def test_deleting_while_the_operator_is_down_still_cleans_up(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    apply(sandbox, namespace, fake_service("orphan"))
    wait_ready(sandbox, namespace, "orphan")
    operator.kill()
    # No finalizer holds the object: it is gone at once, and the garbage collector follows.
    sandbox.kubectl("delete", "inferenceservice", "orphan", "-n", namespace, "--timeout=30s")
    wait_for(lambda: _all_gone(sandbox, namespace, "orphan"), timeout=120, what="children gone")


# -- level-triggered repair, degraded specs, scale subresource -----------------------------


def test_deleted_or_edited_children_are_put_back(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    apply(sandbox, namespace, fake_service("heal"))
    wait_ready(sandbox, namespace, "heal")
    uid = json.loads(
        sandbox.kubectl("get", "service", "heal", "-n", namespace, "-o", "json").stdout
    )["metadata"]["uid"]
    sandbox.kubectl("delete", "service", "heal", "-n", namespace)

    def recreated() -> bool:
        out = sandbox.kubectl("get", "service", "heal", "-n", namespace, "-o", "json", check=False)
        return out.returncode == 0 and json.loads(out.stdout)["metadata"]["uid"] != uid

    wait_for(recreated, timeout=30, what="Service recreated")
    sandbox.kubectl(
        "patch",
        "configmap",
        "heal-primary-config",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"data": {"runtime-config.json": "{}"}}),
    )

    def config_restored() -> bool:
        out = sandbox.kubectl(
            "get", "configmap", "heal-primary-config", "-n", namespace, "-o", "json"
        )
        return json.loads(out.stdout)["data"]["runtime-config.json"] != "{}"

    # The edit keeps our applied-hash annotation: the operator sees the changed data itself
    # (drift), on the edit's watch event, and a restart's forced pass would see it too
    # (the restart stays from when only a forced pass did; either way it is put back).
    operator.stop()
    operator.start()
    wait_for(config_restored, timeout=30, what="ConfigMap restored")


def test_spec_that_cannot_work_is_degraded_and_touches_nothing(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    apply(sandbox, namespace, fake_service("broken"))
    wait_ready(sandbox, namespace, "broken")
    dep = json.loads(
        sandbox.kubectl("get", "deployment", "broken-primary", "-n", namespace, "-o", "json").stdout
    )
    bad = fake_service("broken")
    bad["spec"]["runtime"]["backend"] = "tensorrt"  # the only engine is an ONNX file
    apply(sandbox, namespace, bad)

    def degraded() -> dict[str, Any] | None:
        body = get_isvc(sandbox, namespace, "broken")
        cond = condition(body, "Degraded")
        return cond if cond.get("status") == "True" else None

    cond = wait_for(degraded, timeout=30, what="Degraded")
    assert cond["reason"] == "InvalidSpec"
    assert "no engine for backend tensorrt" in cond["message"]
    assert "spec.runtime.backend" in cond["message"]
    after = json.loads(
        sandbox.kubectl("get", "deployment", "broken-primary", "-n", namespace, "-o", "json").stdout
    )
    assert after["metadata"]["generation"] == dep["metadata"]["generation"]
    events = sandbox.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        "involvedObject.name=broken,reason=InvalidSpec",
        "-o",
        "name",
    ).stdout
    assert events.strip()


def test_scale_subresource_sets_the_replica_count(
    sandbox: Any, namespace: str, operator: OperatorProcess
) -> None:
    apply(sandbox, namespace, fake_service("scaled"))
    wait_ready(sandbox, namespace, "scaled")
    sandbox.kubectl("scale", "inferenceservice", "scaled", "-n", namespace, "--replicas=3")

    def three_ready() -> bool:
        status = get_isvc(sandbox, namespace, "scaled").get("status") or {}
        return status.get("readyReplicas") == 3 and status.get("desiredReplicas") == 3

    wait_for(three_ready, timeout=60, what="3 ready replicas")
    out = sandbox.kubectl("get", "inferenceservices", "-n", namespace)
    assert re.search(r"scaled\s+True\s+3\s", out.stdout), out.stdout
