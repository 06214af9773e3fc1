"""ModelBuilds on the sandbox's real API server, Job controller and scheduler, with the real
operator: invalid specs refused by the schema naming the field; one Job per target that runs
the real builder (``python -m tidal.runtime.builder``: the node agent runs pods as local
processes of this checkout, so the Job's engines land in this test's directory); verdicts in
status from the pod's termination message; a gate refusal, a failed Job with its reason and
log tail, a backend with no builder; and an InferenceService never pointed at a refused engine
(``tidal.operator.core.builds.resolve_engine`` on the stored status)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from isvc_fixtures import invalid_build_cases
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tidal.operator.core.buildapi import LABEL_BUILD, parse_model_build
from tidal.operator.core.builds import resolve_engine
from tidal.runtime import modelgen
from tidal.sandbox.operatorproc import OperatorProcess, condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = pytest.mark.sandbox

GROUP, VERSION, PLURAL = "serving.tidal.dev", "v1alpha1", "modelbuilds"
# A build Job imports onnxruntime and quantizes on a loaded 2-core machine: be generous.
BUILD_TIMEOUT = 300.0


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return modelgen.write_digits_build_inputs(tmp_path_factory.mktemp("digits"))


def manifest(name: str, digits: Path, out: Path, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "digits",
        "version": "1",
        "source": {"uri": (digits / "digits.onnx").as_uri()},
        "precisions": ["fp32", "int8"],
        "profiles": [{"input": "input", "min": [1, 64], "opt": [8, 64], "max": [64, 64]}],
        "calibration": {"uri": (digits / "calibration.npz").as_uri()},
        "validation": {"uri": (digits / "validation.npz").as_uri(), "labels": "labels"},
        "output": out.as_uri(),
    }
    body.update(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ModelBuild",
        "metadata": {"name": name},
        "spec": {k: v for k, v in body.items() if v is not None},
    }


def custom(sandbox: Any) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(sandbox.api_client())


def create(sandbox: Any, namespace: str, body: dict[str, Any]) -> None:
    custom(sandbox).create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)


def get_build(sandbox: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict(
        custom(sandbox).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    )


def wait_ready_status(
    sandbox: Any, namespace: str, name: str, reason: str, timeout: float = BUILD_TIMEOUT
) -> dict[str, Any]:
    """Wait until the build's Ready condition has ``reason``; the body then."""
    return wait_for(
        lambda: (
            (b := get_build(sandbox, namespace, name))
            and condition(b, "Ready").get("reason") == reason
            and b
        ),
        timeout=timeout,
        what=f"ModelBuild {name} Ready reason {reason}",
        describe=lambda: get_build(sandbox, namespace, name).get("status"),
    )


def events_of(sandbox: Any, namespace: str, name: str) -> list[tuple[str, str, str]]:
    items = client.CoreV1Api(sandbox.api_client()).list_namespaced_event(namespace).items
    return [
        (e.type, e.reason, e.message)
        for e in items
        if e.involved_object.kind == "ModelBuild" and e.involved_object.name == name
    ]


def jobs_of(sandbox: Any, namespace: str) -> list[Any]:
    return list(
        client.BatchV1Api(sandbox.api_client())
        .list_namespaced_job(namespace, label_selector=LABEL_BUILD)
        .items
    )


INVALID = [
    ({"precisions": ["int8"], "calibration": None}, "spec.calibration", "calibration is required"),
    ({"targets": ["sm90"]}, "spec.targets", "the onnxruntime builder builds for cpu only"),
    ({"output": "http://store/x"}, "spec.output", "should match"),
    (
        {"profiles": [{"input": "input", "min": [1], "opt": [8, 64], "max": [64, 64]}]},
        "spec.profiles[0]",
        "min, opt and max must have the same rank",
    ),
]


def test_the_schema_refuses_invalid_builds_naming_the_field(
    sandbox: Any, namespace: str, isvc_crd: None, tmp_path: Path
) -> None:
    for override, field, text in INVALID:
        body = manifest("bad", tmp_path, tmp_path / "store")
        body["spec"].update(override)
        body["spec"] = {k: v for k, v in body["spec"].items() if v is not None}
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(body))
        result = sandbox.kubectl("apply", "-n", namespace, "-f", str(path), check=False)
        assert result.returncode != 0, f"{override} was accepted"
        assert field in result.stderr and text in result.stderr, (override, result.stderr)
    # and a valid one is accepted as written
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(manifest("good", tmp_path, tmp_path / "store")))
    result = sandbox.kubectl(
        "apply", "--dry-run=server", "-n", namespace, "-f", str(good), check=False
    )
    assert result.returncode == 0, result.stderr


# The API server adds this line whenever a schema error keeps it from running the CEL rules.
SKIPPED_NOTE = "some validation rules were not checked because the object was invalid"


@pytest.mark.parametrize(
    ("path", "header", "body"), invalid_build_cases(), ids=lambda v: getattr(v, "stem", "")
)
def test_the_api_server_refuses_each_invalid_build_manifest_naming_the_field(
    sandbox: Any,
    namespace: str,
    isvc_crd: None,
    path: Path,
    header: dict[str, str],
    body: dict[str, Any],
) -> None:
    result = sandbox.kubectl("apply", "-n", namespace, "-f", str(path), check=False)
    assert result.returncode != 0, f"{path.name} was accepted"
    assert header["field"] in result.stderr, (path.name, result.stderr)
    assert header["expect"] in result.stderr, (path.name, result.stderr)
    if "errors" in header:
        errors = [line for line in result.stderr.splitlines() if line.startswith("* ")]
        errors = [e for e in errors if SKIPPED_NOTE not in e] or [result.stderr]
        assert len(errors) == int(header["errors"]), (path.name, result.stderr)
    names = sandbox.kubectl("get", PLURAL, "-n", namespace, "-o", "name").stdout
    assert names.strip() == "", names


def test_a_build_whose_credentials_secret_is_missing_is_degraded_naming_it(
    sandbox: Any, namespace: str, operator: OperatorProcess, digits: Path, tmp_path: Path
) -> None:
    """Issue 41: it stayed Building, Degraded False, with no Event, for the Job's hour."""
    s3 = {"endpoint": "http://127.0.0.1:9", "credentialsSecret": "no-such-secret"}
    create(
        sandbox,
        namespace,
        manifest("secretless", digits, tmp_path / "store", output="s3://engines/team", s3=s3),
    )
    body = wait_for(
        lambda: (
            condition(b := get_build(sandbox, namespace, "secretless"), "Degraded").get("reason")
            == "MissingCredentials"
            and b
        ),
        timeout=BUILD_TIMEOUT,
        what="ModelBuild secretless Degraded=MissingCredentials",
        describe=lambda: get_build(sandbox, namespace, "secretless").get("status"),
    )
    message = condition(body, "Degraded")["message"]
    assert message.startswith("spec.s3.credentialsSecret: "), message
    assert "Secret no-such-secret" in message, message
    wait_for(
        lambda: [
            e for e in events_of(sandbox, namespace, "secretless") if e[1] == "MissingCredentials"
        ],
        timeout=60,
        what="a MissingCredentials Event",
        describe=lambda: events_of(sandbox, namespace, "secretless"),
    )


def test_a_build_runs_one_job_that_publishes_gated_engines_and_a_refusal_never_resolves(
    sandbox: Any, namespace: str, operator: OperatorProcess, digits: Path, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    create(sandbox, namespace, manifest("digits-1", digits, store))
    blank = {"uri": (digits / "blank.npz").as_uri()}
    create(
        sandbox,
        namespace,
        manifest("digits-2", digits, store, version="2", calibration=blank),
    )

    built = wait_ready_status(sandbox, namespace, "digits-1", "Built")
    (target,) = built["status"]["targets"]
    assert target["target"] == "cpu" and target["phase"] == "Built", target
    assert [a["precision"] for a in target["artifacts"]] == ["fp32", "int8"], target
    for artifact in target["artifacts"]:
        engine = Path(artifact["uri"].removeprefix("file://"))
        assert engine.is_file(), f"{engine} is not in the store: {target}"
        assert (engine.parent / "manifest.json").is_file(), engine
    assert built["status"]["summary"] == "2/2 published", built["status"]
    assert condition(built, "Degraded")["status"] == "False", built["status"]

    refused = wait_ready_status(sandbox, namespace, "digits-2", "GateRefused")
    message = condition(refused, "Ready")["message"]
    assert "int8: refused: top1Agreement" in message, message
    int8_dir = store / "digits" / "2" / "cpu" / "int8"
    assert sorted(p.name for p in int8_dir.iterdir()) == ["manifest.json"], "refused engine written"
    assert json.loads((int8_dir / "manifest.json").read_text())["published"] is False

    # one Job per build (one target: cpu), named from its inputs
    jobs = {j.metadata.owner_references[0].name: j for j in jobs_of(sandbox, namespace)}
    assert sorted(jobs) == ["digits-1", "digits-2"], sorted(jobs)
    assert jobs["digits-1"].metadata.name == target["job"], target

    # from the stored statuses to what a service may serve
    passed = resolve_engine(parse_model_build(built), "int8")
    assert passed.uri == target["artifacts"][1]["uri"], passed
    never = resolve_engine(parse_model_build(refused), "int8")
    assert never.uri is None and "refused by the accuracy gate" in never.reason, never
    assert resolve_engine(parse_model_build(refused), "fp32").uri is not None

    wait_for(
        lambda: any(r == "GateRefused" for _, r, _ in events_of(sandbox, namespace, "digits-2")),
        timeout=60,
        what="a GateRefused Event on digits-2",
        describe=lambda: events_of(sandbox, namespace, "digits-2"),
    )


def test_failed_jobs_and_missing_builders_are_degraded_with_what_to_fix(
    sandbox: Any, namespace: str, operator: OperatorProcess, digits: Path, tmp_path: Path
) -> None:
    api = custom(sandbox)
    missing = {"uri": (tmp_path / "nowhere.onnx").as_uri()}
    create(
        sandbox,
        namespace,
        manifest(
            "broken",
            digits,
            tmp_path / "store",
            source=missing,
            precisions=["fp32"],
            calibration=None,
        ),
    )
    create(
        sandbox,
        namespace,
        manifest(
            "gpu",
            digits,
            tmp_path / "store",
            backend="torch",
            targets=["sm90"],
            precisions=["fp32"],
            calibration=None,
        ),
    )
    create(
        sandbox,
        namespace,
        manifest(
            "trt",
            digits,
            tmp_path / "store",
            backend="tensorrt",
            targets=["NVIDIA-H100-80GB-HBM3"],
            precisions=["fp16"],
            calibration=None,
        ),
    )

    def degraded(name: str, reason: str) -> dict[str, Any]:
        return wait_for(
            lambda: (
                condition(b := get_build(sandbox, namespace, name), "Degraded").get("reason")
                == reason
                and b
            ),
            timeout=BUILD_TIMEOUT,
            what=f"ModelBuild {name} Degraded {reason}",
            describe=lambda: get_build(sandbox, namespace, name).get("status"),
        )

    # the schema takes profiles of equal rank; their order is the operator's to refuse
    unordered = [{"input": "input", "min": [8, 64], "opt": [4, 64], "max": [64, 64]}]
    create(sandbox, namespace, manifest("unordered", digits, tmp_path / "s", profiles=unordered))
    invalid = condition(degraded("unordered", "InvalidSpec"), "Degraded")["message"]
    assert "spec.profiles[0]: input 'input' axis 0: need 1 <= min <= opt <= max" in invalid

    broken = degraded("broken", "BuildFailed")
    message = condition(broken, "Degraded")["message"]
    assert "(InvalidInput): exit code 2" in message, message
    assert "error: source: " in message and "nowhere.onnx" in message, message
    (target,) = broken["status"]["targets"]
    assert (target["phase"], target["reason"]) == ("Failed", "InvalidInput"), target

    # torch: no published image carries it, so spec.image must name one
    gpu = degraded("gpu", "BuilderUnavailable")
    assert "spec.image: no published image carries torch" in condition(gpu, "Degraded")["message"]
    # tensorrt runs, on a node of its target: there is none here
    trt = degraded("trt", "NoNodeForTarget")
    assert "no node of target NVIDIA-H100-80GB-HBM3" in condition(trt, "Degraded")["message"]
    owners = [j.metadata.owner_references[0].name for j in jobs_of(sandbox, namespace)]
    assert owners == ["broken"], (
        f"a Job ran for a backend without an image, a target without a node or a bad spec: {owners}"
    )

    names = ("broken", "gpu", "trt", "unordered")
    wait_for(
        lambda: (
            {"BuildFailed", "BuilderUnavailable", "NoNodeForTarget", "InvalidSpec"}
            <= {r for n in names for _, r, _ in events_of(sandbox, namespace, n)}
        ),
        timeout=60,
        what="Warning Events naming what to fix",
        describe=lambda: [e for n in names for e in events_of(sandbox, namespace, n)],
    )

    # deleting the build takes its Job with it (owner references; the garbage collector)
    api.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "broken")
    wait_for(
        lambda: not jobs_of(sandbox, namespace),
        timeout=120,
        what="the build's Job collected",
        describe=lambda: [j.metadata.name for j in jobs_of(sandbox, namespace)],
    )
    with pytest.raises(ApiException):
        get_build(sandbox, namespace, "broken")


def build_ref(build: str, precision: str) -> dict[str, Any]:
    """A model named digits served from a ModelBuild."""
    return {"name": "digits", "build": {"name": build, "precision": precision}}


def create_service(
    sandbox: Any, namespace: str, name: str, model: dict[str, Any], **spec: Any
) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "runtime": {"backend": "onnxruntime"},
            "models": [model],
            "autoscaling": {"minReplicas": 1, "maxReplicas": 1},
            **spec,
        },
    }
    custom(sandbox).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "inferenceservices", body
    )


def wait_isvc(
    sandbox: Any,
    namespace: str,
    name: str,
    holds: Any,
    what: str,
    timeout: float = BUILD_TIMEOUT,
) -> dict[str, Any]:
    """Wait until ``holds(body)`` of the InferenceService; the body then."""
    return wait_for(
        lambda: (b := get_isvc(sandbox, namespace, name)) and holds(b) and b,
        timeout=timeout,
        what=what,
        describe=lambda: get_isvc(sandbox, namespace, name).get("status"),
    )


def is_ready(body: dict[str, Any]) -> bool:
    return condition(body, "Ready").get("status") == "True"


def phase(body: dict[str, Any]) -> str:
    return str(((body.get("status") or {}).get("rollout") or {}).get("phase", ""))


def is_stable(body: dict[str, Any]) -> bool:
    return is_ready(body) and phase(body) == "Stable"


def rolling_out(body: dict[str, Any]) -> bool:
    return phase(body) in ("Preparing", "Progressing")


def not_servable(body: dict[str, Any]) -> bool:
    return condition(body, "Degraded").get("reason") == "BuildNotServable"


def point_at(sandbox: Any, namespace: str, name: str, model: dict[str, Any]) -> None:
    """Make the service's one model that ``model``."""
    custom(sandbox).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "inferenceservices", name, {"spec": {"models": [model]}}
    )


def config_text(sandbox: Any, namespace: str, name: str) -> str:
    """The primary pool's runtime configuration ("" while it has none)."""
    core = client.CoreV1Api(sandbox.api_client())
    try:
        cm = core.read_namespaced_config_map(f"{name}-primary-config", namespace)
    except ApiException as exc:
        if exc.status == 404:
            return ""
        raise
    return json.dumps(cm.data or {})


def test_a_service_naming_a_build_serves_only_engines_that_passed_their_gate(
    sandbox: Any, namespace: str, operator: OperatorProcess, digits: Path, tmp_path: Path
) -> None:
    """From a build to a serving pod: a service naming a refused version stays Degraded with
    the gate's reason and no child; naming a version that passed, its pods serve that engine
    and turn Ready; naming the refused one again, the service is Degraded
    (BuildNotServable), stays Ready, and its pods keep the engine that passed (status.builds):
    the refused one never reaches a pod."""
    store = tmp_path / "store"
    create(sandbox, namespace, manifest("digits-1", digits, store))
    blank = {"uri": (digits / "blank.npz").as_uri()}
    create(sandbox, namespace, manifest("digits-2", digits, store, version="2", calibration=blank))
    wait_ready_status(sandbox, namespace, "digits-2", "GateRefused")

    create_service(sandbox, namespace, "digits", build_ref("digits-2", "int8"))

    def degraded_by_gate() -> dict[str, Any]:
        body = get_isvc(sandbox, namespace, "digits")
        message = condition(body, "Degraded").get("message", "")
        return body if "refused by the accuracy gate" in message else {}

    body = wait_for(
        degraded_by_gate,
        timeout=120,
        what="the service Degraded by the refused build",
        describe=lambda: get_isvc(sandbox, namespace, "digits").get("status"),
    )
    message = condition(body, "Degraded")["message"]
    assert "spec.models[digits].build: ModelBuild digits-2: digits/2 cpu int8" in message, message
    assert config_text(sandbox, namespace, "digits") == "", "a child was made for a refused build"

    built = wait_ready_status(sandbox, namespace, "digits-1", "Built")
    passed_uri = built["status"]["targets"][0]["artifacts"][1]["uri"]
    point_at(sandbox, namespace, "digits", build_ref("digits-1", "int8"))
    body = wait_isvc(sandbox, namespace, "digits", is_ready, "Ready on the version that passed")
    served = config_text(sandbox, namespace, "digits")
    assert passed_uri in served, served
    assert condition(body, "Degraded")["status"] == "False", body["status"]

    # back to the refused version: Degraded, and the pods keep the engine that passed
    point_at(sandbox, namespace, "digits", build_ref("digits-2", "int8"))
    body = wait_for(
        degraded_by_gate,
        timeout=120,
        what="the service Degraded by the refused build again",
        describe=lambda: get_isvc(sandbox, namespace, "digits").get("status"),
    )
    degraded = condition(body, "Degraded")
    assert degraded["reason"] == "BuildNotServable", degraded
    assert f"serving {passed_uri} (digits-1) meanwhile" in degraded["message"], degraded
    assert condition(body, "Ready")["status"] == "True", "serving stopped"
    assert [(b["model"], b["build"], b["uri"]) for b in body["status"]["builds"]] == [
        ("digits", "digits-1", passed_uri)
    ], body["status"]
    assert config_text(sandbox, namespace, "digits") == served, "the refused engine was applied"
    assert "/digits/2/" not in served


def test_a_version_that_passes_its_gate_later_starts_the_staged_rollout(
    sandbox: Any, namespace: str, operator: OperatorProcess, digits: Path, tmp_path: Path
) -> None:
    """A service with a baseline serves digits-1; its primary then names digits-3, which does
    not exist yet: Degraded (BuildNotServable), still Ready, pods unchanged. Once digits-3
    is built and passes its gate, nothing in the service's spec changes, but its primary's
    template does: the staged rollout against the baseline starts."""
    store = tmp_path / "store"
    create(sandbox, namespace, manifest("digits-1", digits, store))
    wait_ready_status(sandbox, namespace, "digits-1", "Built")
    rollout = {
        # the validated version, pinned: the baseline does not follow the primary
        "baseline": {"minReplicas": 1, "models": [build_ref("digits-1", "fp32")]},
        "steps": [50, 100],
        "stepSeconds": 600,
    }
    create_service(sandbox, namespace, "staged", build_ref("digits-1", "fp32"), rollout=rollout)

    wait_isvc(sandbox, namespace, "staged", is_stable, "Ready and Stable on digits-1")
    before = config_text(sandbox, namespace, "staged")
    assert "/digits/1/cpu/fp32/" in before, before

    point_at(sandbox, namespace, "staged", build_ref("digits-3", "int8"))
    body = wait_isvc(sandbox, namespace, "staged", not_servable, "BuildNotServable", 120)
    assert (
        "ModelBuild digits-3: the ModelBuild does not exist"
        in condition(body, "Degraded")["message"]
    )
    assert condition(body, "Ready")["status"] == "True", body["status"]
    assert config_text(sandbox, namespace, "staged") == before, "the primary changed"

    create(sandbox, namespace, manifest("digits-3", digits, store, version="3"))
    wait_ready_status(sandbox, namespace, "digits-3", "Built")
    body = wait_isvc(sandbox, namespace, "staged", rolling_out, "the staged rollout of digits-3")
    assert condition(body, "Degraded")["status"] == "False", body["status"]
    served = {(b["pool"], b["build"]) for b in body["status"]["builds"]}
    assert served == {("primary", "digits-3"), ("baseline", "digits-1")}, body["status"]
