"""The ModelBuild API and its pure decisions (tidal.operator.core.builds): targets from node
labels, one Job per target on a node of that target, same inputs never built twice, a Job's
outcome (the builder's report, or the reason and the log's tail of a failure) to status and
Events, and from a build to the engine an InferenceService may serve. Time is injected."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from isvc_fixtures import invalid_build_cases, minimal
from pydantic import ValidationError

from tidal.operator import crdgen
from tidal.operator.core.api import PoolName, format_validation_error, parse_inference_service
from tidal.operator.core.buildapi import (
    ANNOTATION_INPUTS,
    GPU_MAJOR_LABEL,
    GPU_MINOR_LABEL,
    GPU_PRODUCT_LABEL,
    LABEL_TARGET,
    BuildBackend,
    BuildPhase,
    ModelBuild,
    parse_model_build,
)
from tidal.operator.core.builds import (
    JobOutcome,
    NodeInfo,
    PodPlacement,
    builder_spec,
    find_missing_engines,
    invalid_build_status,
    make_job,
    missing_targets,
    node_target,
    plan_build,
    read_job,
    resolve_build_refs,
    resolve_engine,
    resolve_targets,
)
from tidal.operator.core.status import StatusInput, compute_status
from tidal.operator.shell.builds import services_naming
from tidal.runtime.builder.spec import parse_build_spec

REPO = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 12, 6, 20, 0, 0, tzinfo=UTC)
IMAGE = "ghcr.io/tidal-serving/tidal-runtime-cpu:0.1.0"
GPU_IMAGE = "ghcr.io/tidal-serving/tidal-runtime:0.1.0"
IMAGES = {BuildBackend.ONNXRUNTIME: IMAGE, BuildBackend.TENSORRT: GPU_IMAGE}
H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"
NODES = [
    NodeInfo("cpu-1", {"kubernetes.io/os": "linux"}),
    NodeInfo("h100-1", {GPU_PRODUCT_LABEL: H100, GPU_MAJOR_LABEL: "9", GPU_MINOR_LABEL: "0"}),
    NodeInfo("h100-2", {GPU_PRODUCT_LABEL: H100, GPU_MAJOR_LABEL: "9", GPU_MINOR_LABEL: "0"}),
    NodeInfo("l4-1", {GPU_PRODUCT_LABEL: L4, GPU_MAJOR_LABEL: "8", GPU_MINOR_LABEL: "9"}),
]


def spec_data(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": "digits",
        "version": "2",
        "source": {"uri": "s3://models/digits/2/digits.onnx"},
        "precisions": ["fp32", "int8"],
        "profiles": [{"input": "input", "min": [1, 64], "opt": [8, 64], "max": [64, 64]}],
        "calibration": {"uri": "s3://models/digits/calibration.npz"},
        "validation": {"uri": "s3://models/digits/validation.npz", "labels": "labels"},
        "output": "s3://engines/team",
        "s3": {"endpoint": "http://versitygw.storage:7070", "credentialsSecret": "store-writer"},
    }
    spec.update(overrides)
    return spec


def make_build(status: dict[str, Any] | None = None, **overrides: Any) -> ModelBuild:
    body: dict[str, Any] = {
        "apiVersion": "serving.tidal.dev/v1alpha1",
        "kind": "ModelBuild",
        "metadata": {"name": "digits-2", "namespace": "team", "uid": "u-1", "generation": 1},
        "spec": spec_data(**overrides),
    }
    build = parse_model_build(body)
    if status is not None:
        build = build.model_copy(
            update={"status": build.model_validate({**body, "status": status}).status}
        )
    return build


def with_status(build: ModelBuild, status: Any) -> ModelBuild:
    return build.model_copy(update={"status": status})


# -- the API -------------------------------------------------------------------------------------


def test_the_committed_crd_is_generated_from_the_models() -> None:
    for directory in (REPO / "crds", REPO / "charts" / "tidal" / "crds"):
        path = crdgen.model_build_crd_path(directory)
        assert path.read_text() == crdgen.render_model_build(), f"{path} is stale: make crds"


INVALID = [
    ({"precisions": ["int8"], "calibration": None}, "calibration is required when precisions"),
    ({"targets": ["sm90"]}, "targets: the onnxruntime builder builds for cpu only"),
    ({"backend": "tensorrt", "targets": ["cpu"]}, "targets: tensorrt builds for GPUs, not cpu"),
    ({"precisions": ["fp32", "fp32"]}, "spec.precisions: an entry appears twice"),
    ({"precisions": ["fp64"]}, "spec.precisions[0]: Input should be"),
    ({"version": "Two"}, "spec.version: String should match pattern"),
    ({"output": "http://engines/x"}, "spec.output: String should match pattern"),
    (
        {"profiles": [{"input": "input", "min": [8, 64], "opt": [4, 64], "max": [64, 64]}]},
        "need 1 <= min <= opt <= max, got 8, 4, 64",
    ),
    ({"gate": {"minTop1Agreement": 1.5}}, "spec.gate.minTop1Agreement: Input should be less"),
    ({"s3": {"credentialsSecret": "Bad_Name"}}, "spec.s3.credentialsSecret: String should match"),
]


@pytest.mark.parametrize(("override", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_build_specs_name_the_field(override: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as info:
        make_build(**override)
    assert message in format_validation_error(info.value), format_validation_error(info.value)


def _build_rules(node: object) -> list[str]:
    """Every CEL message in a schema, nested ones too."""
    if isinstance(node, dict):
        here = [r["message"] for r in node.get("x-kubernetes-validations", [])]
        return here + [m for value in node.values() for m in _build_rules(value)]
    if isinstance(node, list):
        return [m for value in node for m in _build_rules(value)]
    return []


@pytest.mark.parametrize(
    ("path", "header", "manifest"), invalid_build_cases(), ids=lambda v: getattr(v, "stem", "")
)
def test_invalid_build_manifest_is_refused_by_the_models_naming_the_field(
    path: Path, header: dict[str, str], manifest: dict[str, Any]
) -> None:
    with pytest.raises(ValidationError) as caught:
        parse_model_build(manifest)
    text = format_validation_error(caught.value)
    leaf = header["field"].rsplit(".", 1)[-1].split("[")[0]
    assert leaf in text, f"{path.name}: the error does not name {leaf}: {text}"
    if header["rule"] == "CEL":
        assert header["expect"] in text, f"{path.name}: {text}"


def test_every_crd_rule_is_one_of_the_models_rules_and_in_the_corpus() -> None:
    """The API server refuses with the same message the operator's models give (the sandbox
    test sends the manifests; here: each CEL message is a validator's, and a manifest of
    ``invalid/build/`` breaks it)."""
    root = crdgen.build_model_build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    messages = _build_rules(root["properties"]["spec"])
    assert len(messages) >= 10, messages
    cases = invalid_build_cases()
    expected = [h["expect"] for _p, h, _m in cases if h["rule"] == "CEL"]
    uncovered = [m for m in messages if not any(e in m for e in expected)]
    assert uncovered == [], uncovered
    assert {h["rule"] for _p, h, _m in cases} > {"CEL"}, "patterns and required fields too"


def test_a_valid_build_near_the_new_rules_is_accepted() -> None:
    """Edges of the rules that must stay accepted: maxSamples equal to the batch size, the
    mean bound equal to the max bound, the default accuracy bound without labels, an s3 block
    used by the output alone, architectures and GPU products as targets."""
    make_build(calibration={"uri": "s3://c.npz", "batchSize": 8, "maxSamples": 8})
    make_build(gate={"maxAbsError": 0.2, "maxMeanAbsError": 0.2})
    make_build(validation={"uri": "s3://v.npz"}, gate={"maxAccuracyDrop": 0.01})
    make_build(
        source={"uri": "file:///m/digits.onnx"},
        calibration={"uri": "file:///m/c.npz"},
        validation={"uri": "file:///m/v.npz"},
    )
    make_build(backend="tensorrt", targets=["sm90", "sm100", "NVIDIA-H100-80GB-HBM3", "Tesla-T4"])


# -- targets and Jobs ----------------------------------------------------------------------------


def test_default_targets_are_cpu_for_onnxruntime_and_every_gpu_product_for_gpu_backends() -> None:
    assert resolve_targets(make_build(), NODES).targets == ("cpu",)
    gpu = make_build(backend="tensorrt", precisions=["fp32"], calibration=None)
    assert resolve_targets(gpu, NODES).targets == (H100, L4)
    assert resolve_targets(make_build(backend="tensorrt", targets=["sm90"]), []).targets == (
        "sm90",
    )
    none = resolve_targets(gpu, NODES[:1])
    assert none.targets == () and none.problem is not None
    assert "spec.targets: no node has the label nvidia.com/gpu.product" in none.problem
    unknown = resolve_targets(gpu, None)
    assert unknown.problem is not None and "cannot list nodes" in unknown.problem, unknown


def test_one_job_per_target_each_on_a_node_of_its_target() -> None:
    build = make_build(backend="tensorrt", precisions=["fp32"], calibration=None)
    plan = plan_build(build, NODES, [], IMAGES, T0)
    assert [j["metadata"]["labels"][LABEL_TARGET] for j in plan.create] == [H100, L4]
    affinity = [
        j["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"][0]["matchExpressions"]
        for j in plan.create
    ]
    assert affinity == [
        [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [H100]}],
        [{"key": GPU_PRODUCT_LABEL, "operator": "In", "values": [L4]}],
    ]
    # TensorRT builds run the NVIDIA runtime image, with the node's GPU
    containers = [j["spec"]["template"]["spec"]["containers"][0] for j in plan.create]
    assert {c["image"] for c in containers} == {GPU_IMAGE}
    assert [c["resources"] for c in containers] == [
        {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    ] * 2
    arch = make_job(make_build(backend="tensorrt", targets=["sm90"]), "sm90", GPU_IMAGE)
    terms = arch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    assert {(t["key"], t["values"][0]) for t in terms} == {
        (GPU_MAJOR_LABEL, "9"),
        (GPU_MINOR_LABEL, "0"),
    }
    assert [s.phase for s in plan.status.targets] == [BuildPhase.PENDING, BuildPhase.PENDING]
    assert [e.reason for e in plan.events] == ["Created", "Created"], plan.events


def test_the_job_runs_the_builder_with_a_spec_the_builder_accepts() -> None:
    build = make_build()
    job = make_job(build, "cpu", IMAGE)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["python", "-m", "tidal.runtime.builder"]
    args = container["args"]
    spec = parse_build_spec(json.loads(args[args.index("--spec-json") + 1]))
    assert (spec.model, spec.version, spec.target, spec.output) == (
        "digits",
        "2",
        "cpu",
        "s3://engines/team",
    )
    assert spec.s3.endpoint == "http://versitygw.storage:7070"
    assert args[args.index("--report") + 1] == container["terminationMessagePath"]
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["env"] == [
        {
            "name": "AWS_ACCESS_KEY_ID",
            "valueFrom": {"secretKeyRef": {"name": "store-writer", "key": "AWS_ACCESS_KEY_ID"}},
        },
        {
            "name": "AWS_SECRET_ACCESS_KEY",
            "valueFrom": {"secretKeyRef": {"name": "store-writer", "key": "AWS_SECRET_ACCESS_KEY"}},
        },
        {
            "name": "AWS_SESSION_TOKEN",
            "valueFrom": {
                "secretKeyRef": {
                    "name": "store-writer",
                    "key": "AWS_SESSION_TOKEN",
                    "optional": True,
                }
            },
        },
    ], "each credential key named, so a missing one stops the container with a reason"
    assert "affinity" not in pod, "a cpu build runs on any node"
    assert "resources" not in container, "a cpu build takes no GPU"
    assert (pod["restartPolicy"], job["spec"]["backoffLimit"]) == ("Never", 0)
    owner = job["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("ModelBuild", "digits-2", "u-1")
    assert len(job["metadata"]["name"]) <= 63
    assert builder_spec(build, "cpu") == json.loads(args[args.index("--spec-json") + 1])


def test_same_inputs_are_never_built_twice_and_new_inputs_get_a_new_job() -> None:
    build = make_build()
    first = plan_build(build, NODES, [], IMAGES, T0)
    (job,) = first.create
    name = job["metadata"]["name"]
    running = JobOutcome(
        name, "cpu", job["metadata"]["annotations"][ANNOTATION_INPUTS], BuildPhase.RUNNING
    )
    again = plan_build(with_status(build, first.status), NODES, [running], IMAGES, T0)
    assert again.create == (), "a Job of the same inputs was created again"
    built = JobOutcome(
        name,
        "cpu",
        running.inputs,
        BuildPhase.BUILT,
        artifacts=tuple(
            make_build(status=status_with_artifacts()).status.targets[0].artifacts  # type: ignore[union-attr]
        ),
    )
    done = plan_build(with_status(build, again.status), NODES, [built], IMAGES, T0)
    assert done.status.targets[0].phase is BuildPhase.BUILT
    # the Job is gone (deleted, or cleaned up): the recorded verdict of the same inputs holds
    gone = plan_build(with_status(build, done.status), NODES, [], IMAGES, T0 + timedelta(hours=1))
    assert gone.create == () and gone.status.targets == done.status.targets
    # another gate is another input: a new Job, under another name
    stricter = make_build(gate={"minTop1Agreement": 0.999}).model_copy(
        update={"status": done.status}
    )
    rebuilt = plan_build(stricter, NODES, [], IMAGES, T0)
    assert len(rebuilt.create) == 1 and rebuilt.create[0]["metadata"]["name"] != name
    # and another image too
    assert plan_build(
        with_status(build, done.status),
        NODES,
        [],
        {**IMAGES, BuildBackend.ONNXRUNTIME: IMAGE + "-2"},
        T0,
    ).create


def test_a_missing_credentials_secret_is_degraded_naming_it_not_building_for_an_hour() -> None:
    """Issue 41: a build whose credentials Secret did not exist stayed Building, Degraded
    False, no Event, until the Job's deadline (3,600 s)."""
    build = make_build()
    first = plan_build(build, NODES, [], IMAGES, T0)
    (job,) = first.create
    waiting = {
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "builder",
                    "state": {
                        "waiting": {
                            "reason": "CreateContainerConfigError",
                            "message": 'secret "store-writer" not found',
                        }
                    },
                }
            ],
        }
    }
    outcome = read_job(job, waiting)
    assert (outcome.phase, outcome.reason) == (BuildPhase.PENDING, "MissingCredentials"), outcome
    plan = plan_build(with_status(build, first.status), NODES, [outcome], IMAGES, T0)
    conditions = {c.type: c for c in plan.status.conditions}
    degraded = conditions["Degraded"]
    assert (degraded.status.value, degraded.reason) == ("True", "MissingCredentials"), degraded
    assert degraded.message.startswith("spec.s3.credentialsSecret: the build pod of Job "), (
        degraded.message
    )
    assert "Secret store-writer in namespace team is missing" in degraded.message
    assert 'secret "store-writer" not found' in degraded.message, degraded.message
    assert conditions["Ready"].reason == "MissingCredentials", conditions["Ready"]
    assert ("Warning", "MissingCredentials") in [(e.type, e.reason) for e in plan.events]
    assert plan.create == (), "the Job is not created twice"
    # the Secret was created: the container starts and the condition clears
    running = read_job(job, {"status": {"phase": "Running"}})
    later = plan_build(with_status(build, plan.status), NODES, [running], IMAGES, T0)
    assert {c.type: c for c in later.status.conditions}["Degraded"].status.value == "False"


def status_with_artifacts(refused: bool = False) -> dict[str, Any]:
    int8: dict[str, Any] = (
        {"precision": "int8", "published": False, "reason": "refused: top1Agreement 0.59 < 0.99"}
        if refused
        else {
            "precision": "int8",
            "published": True,
            "uri": "s3://engines/team/digits/2/cpu/int8/digits-int8.onnx",
            "sha256": "b" * 64,
            "reason": "passed",
        }
    )
    return {
        "targets": [
            {
                "target": "cpu",
                "phase": "Refused" if refused else "Built",
                "artifacts": [
                    {
                        "precision": "fp32",
                        "published": True,
                        "uri": "s3://engines/team/digits/2/cpu/fp32/digits-fp32.onnx",
                        "sha256": "a" * 64,
                        "reason": "passed",
                    },
                    int8,
                ],
            }
        ]
    }


# -- a Job's outcome -----------------------------------------------------------------------------


def job_body(*conditions: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "digits-2-cpu-0123456789",
            "labels": {LABEL_TARGET: "cpu"},
            "annotations": {ANNOTATION_INPUTS: "d" * 64},
        },
        "status": {
            "conditions": [{"type": t, "status": "True", "reason": r} for t, r in conditions]
        },
    }


def pod_body(terminated: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    containers = [{"name": "builder", "state": {"terminated": terminated}}] if terminated else []
    return {"status": {"containerStatuses": containers, **status}}


REPORT = json.dumps(
    {
        "schema": "tidal.dev/build-report/v1",
        "engines": [
            {
                "precision": "fp32",
                "published": True,
                "uri": "s3://e/digits/2/cpu/fp32/digits-fp32.onnx",
                "sha256": "a" * 64,
                "buildKey": "k" * 64,
                "reason": "passed: top1Agreement 1 >= minTop1Agreement 0.99",
            },
            {
                "precision": "int8",
                "published": False,
                "uri": None,
                "manifest": "s3://e/digits/2/cpu/int8/manifest.json",
                "reason": "refused: top1Agreement 0.595556 < minTop1Agreement 0.99",
            },
        ],
    }
)
TAIL = "Traceback ...\nerror: calibration: engine file s3://models/x.npz does not exist\n"
OUTCOMES = [
    # (name, job conditions, pod, phase, reason, in message)
    ("not started", (), None, BuildPhase.PENDING, "", ""),
    (
        "unschedulable",
        (),
        {
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available",
                    }
                ],
            }
        },
        BuildPhase.PENDING,
        "",
        "Unschedulable: 0/3 nodes are available",
    ),
    ("running", (), {"status": {"phase": "Running"}}, BuildPhase.RUNNING, "", ""),
    (
        "gate refused one engine",
        (("Failed", "BackoffLimitExceeded"),),
        pod_body({"exitCode": 1, "reason": "Error", "message": REPORT}),
        BuildPhase.REFUSED,
        "GateRefused",
        "int8: refused: top1Agreement 0.595556 < minTop1Agreement 0.99",
    ),
    (
        "store failure: the log's tail names the field",
        (("Failed", "BackoffLimitExceeded"),),
        pod_body({"exitCode": 2, "reason": "Error", "message": TAIL}),
        BuildPhase.FAILED,
        "InvalidInput",
        "exit code 2: Traceback ...\nerror: calibration: engine file s3://models/x.npz",
    ),
    (
        "a published version built from other inputs",
        (("Failed", "BackoffLimitExceeded"),),
        pod_body({"exitCode": 3, "message": "error: changed: gate.minTop1Agreement"}),
        BuildPhase.FAILED,
        "VersionConflict",
        "changed: gate.minTop1Agreement",
    ),
    (
        "out of memory",
        (("Failed", "BackoffLimitExceeded"),),
        pod_body({"exitCode": 137, "reason": "OOMKilled", "message": "quantizing...\n"}),
        BuildPhase.FAILED,
        "OOMKilled",
        "exit code 137: quantizing...",
    ),
    (
        "past its deadline, pod gone",
        (("Failed", "DeadlineExceeded"),),
        None,
        BuildPhase.FAILED,
        "DeadlineExceeded",
        "the Job failed with no log",
    ),
    (
        "succeeded with no report",
        (("Complete", ""),),
        pod_body({"exitCode": 0, "reason": "Completed"}),
        BuildPhase.FAILED,
        "NoReport",
        "exit code 0",
    ),
]


@pytest.mark.parametrize(
    ("name", "conditions", "pod", "phase", "reason", "text"), OUTCOMES, ids=[o[0] for o in OUTCOMES]
)
def test_a_jobs_outcome_gives_the_verdicts_or_the_reason_and_the_logs_tail(
    name: str,
    conditions: tuple[tuple[str, str], ...],
    pod: dict[str, Any] | None,
    phase: BuildPhase,
    reason: str,
    text: str,
) -> None:
    outcome = read_job(job_body(*conditions), pod)
    assert (outcome.phase, outcome.reason) == (phase, reason), outcome
    assert text in outcome.message, outcome
    assert outcome.target == "cpu" and outcome.inputs == "d" * 64, outcome


def test_a_report_of_every_engine_published_is_built() -> None:
    report = json.loads(REPORT)
    report["engines"] = report["engines"][:1]
    outcome = read_job(
        job_body(("Complete", "")), pod_body({"exitCode": 0, "message": json.dumps(report)})
    )
    assert outcome.phase is BuildPhase.BUILT, outcome
    assert [(a.precision, a.published, a.sha256) for a in outcome.artifacts] == [
        ("fp32", True, "a" * 64)
    ]


# -- status, conditions and Events ---------------------------------------------------------------


def test_a_failed_job_is_degraded_with_its_reason_and_logs_tail_and_one_warning() -> None:
    build = make_build()
    first = plan_build(build, NODES, [], IMAGES, T0)
    ready = {c.type: c for c in first.status.conditions}
    assert (ready["Ready"].status.value, ready["Ready"].reason) == ("False", "Building")
    job = first.create[0]
    failed = read_job(
        {**job, "status": job_body(("Failed", "BackoffLimitExceeded"))["status"]},
        pod_body({"exitCode": 2, "message": TAIL}),
    )
    later = T0 + timedelta(minutes=2)
    second = plan_build(with_status(build, first.status), NODES, [failed], IMAGES, later)
    conditions = {c.type: c for c in second.status.conditions}
    degraded = conditions["Degraded"]
    assert (degraded.status.value, degraded.reason) == ("True", "BuildFailed"), degraded
    assert "target cpu: Job digits-2-cpu-" in degraded.message, degraded.message
    assert "(InvalidInput): exit code 2: Traceback" in degraded.message, degraded.message
    assert "error: calibration: engine file s3://models/x.npz does not exist" in degraded.message
    assert degraded.last_transition_time == "2026-12-06T20:02:00Z"
    assert conditions["Ready"].last_transition_time == "2026-12-06T20:00:00Z", "kept False"
    assert [(e.type, e.reason) for e in second.events] == [("Warning", "BuildFailed")]
    assert second.create == (), "a failed Job is not retried with the same inputs"
    (target,) = second.status.targets
    assert (target.phase, target.reason) == (BuildPhase.FAILED, "InvalidInput")
    # unchanged: no second Event
    third = plan_build(with_status(build, second.status), NODES, [failed], IMAGES, later)
    assert third.events == (), third.events
    # the failed Job deleted: retried
    assert len(plan_build(with_status(build, third.status), NODES, [], IMAGES, later).create) == 1


def test_a_refused_engine_makes_ready_false_with_the_gates_reason() -> None:
    build = make_build()
    job = plan_build(build, NODES, [], IMAGES, T0).create[0]
    outcome = read_job(
        {**job, "status": job_body(("Failed", "BackoffLimitExceeded"))["status"]},
        pod_body({"exitCode": 1, "message": REPORT}),
    )
    plan = plan_build(build, NODES, [outcome], IMAGES, T0)
    conditions = {c.type: c for c in plan.status.conditions}
    assert (conditions["Ready"].status.value, conditions["Ready"].reason) == (
        "False",
        "GateRefused",
    )
    assert "int8: refused: top1Agreement 0.595556" in conditions["Ready"].message
    assert conditions["Degraded"].status.value == "False", "a refusal is a verdict, not a fault"
    assert plan.status.summary == "1/2 published"
    assert ("Warning", "GateRefused") in [(e.type, e.reason) for e in plan.events], plan.events


def test_backends_without_a_builder_and_targets_without_nodes_run_no_job() -> None:
    trt = make_build(backend="tensorrt", precisions=["fp32"], calibration=None)
    plan = plan_build(trt, NODES, [], IMAGES, T0, runnable=frozenset({BuildBackend.ONNXRUNTIME}))
    assert plan.create == ()
    assert {t.phase for t in plan.status.targets} == {BuildPhase.UNAVAILABLE}
    degraded = {c.type: c for c in plan.status.conditions}["Degraded"]
    assert degraded.reason == "BuilderUnavailable", degraded
    assert "spec.backend: no tensorrt builder in this release" in degraded.message
    assert ("Warning", "BuilderUnavailable") in [(e.type, e.reason) for e in plan.events]

    a100 = make_build(
        backend="tensorrt", targets=["NVIDIA-A100-SXM4-80GB"], precisions=["fp32"], calibration=None
    )
    lonely = plan_build(a100, NODES, [], IMAGES, T0)
    assert lonely.create == ()
    degraded = {c.type: c for c in lonely.status.conditions}["Degraded"]
    assert degraded.reason == "NoNodeForTarget", degraded
    assert f"no node of target NVIDIA-A100-SXM4-80GB ({GPU_PRODUCT_LABEL}=" in degraded.message


def test_a_torch_build_runs_only_in_an_image_named_for_it() -> None:
    torch = dict(backend="torch", targets=["sm90"], precisions=["fp32"], calibration=None)
    plan = plan_build(make_build(**torch), NODES, [], IMAGES, T0)
    assert plan.create == ()
    degraded = {c.type: c for c in plan.status.conditions}["Degraded"]
    assert degraded.reason == "BuilderUnavailable", degraded
    assert "spec.image: no published image carries torch; set spec.image" in degraded.message
    assert "runtime/builder/aoti.py" in degraded.message

    named = plan_build(
        make_build(**torch, image="example.com/torch-builder:1"), NODES, [], IMAGES, T0
    )
    (job,) = named.create
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "example.com/torch-builder:1"
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    args = container["args"]
    spec = parse_build_spec(json.loads(args[args.index("--spec-json") + 1]))
    assert (spec.backend, spec.target) == ("torch", "sm90")

    # a GPU product is not an architecture: AOTInductor compiles for one
    product = make_build(**{**torch, "targets": [H100, "sm90"]}, image="example.com/t:1")
    mixed = plan_build(product, NODES, [], IMAGES, T0)
    assert [j["metadata"]["labels"][LABEL_TARGET] for j in mixed.create] == ["sm90"]
    degraded = {c.type: c for c in mixed.status.conditions}["Degraded"]
    assert degraded.reason == "UnsupportedTarget", degraded
    assert f"spec.targets: {H100}: the torch builder compiles for a GPU architecture" in (
        degraded.message
    )


def test_every_backends_job_hands_the_builder_a_spec_it_accepts() -> None:
    builds = [
        (make_build(), "cpu"),
        (make_build(backend="tensorrt", precisions=["fp16", "int8"]), H100),
        (
            make_build(backend="tensorrt", targets=["sm90"], precisions=["bf16"], calibration=None),
            "sm90",
        ),
        (make_build(backend="torch", image="t:1", precisions=["fp16"], calibration=None), "sm90"),
    ]
    for build, target in builds:
        args = make_job(build, target, "any:1")["spec"]["template"]["spec"]["containers"][0]["args"]
        spec = parse_build_spec(json.loads(args[args.index("--spec-json") + 1]))
        assert (spec.backend, spec.target) == (build.spec.backend.value, target)


def test_an_invalid_spec_is_degraded_naming_the_field() -> None:
    plan = invalid_build_status("spec.calibration: required", 3, None, T0)
    degraded = {c.type: c for c in plan.status.conditions}["Degraded"]
    assert (degraded.reason, degraded.message) == ("InvalidSpec", "spec.calibration: required")
    assert [(e.type, e.reason) for e in plan.events] == [("Warning", "InvalidSpec")]
    assert plan.status.observed_generation == 3


# -- from a build to an InferenceService ---------------------------------------------------------


def test_only_an_engine_that_passed_its_gate_resolves() -> None:
    passed = make_build(status=status_with_artifacts())
    choice = resolve_engine(passed, "int8")
    assert choice.uri == "s3://engines/team/digits/2/cpu/int8/digits-int8.onnx", choice
    assert choice.sha256 == "b" * 64
    refused = resolve_engine(make_build(status=status_with_artifacts(refused=True)), "int8")
    assert refused.uri is None and "refused by the accuracy gate: refused: top1" in refused.reason
    fp32 = resolve_engine(make_build(status=status_with_artifacts(refused=True)), "fp32")
    assert fp32.uri is not None, "the other precision of a partly refused build still serves"
    pending = resolve_engine(
        make_build(status={"targets": [{"target": "cpu", "phase": "Running"}]}), "fp32"
    )
    assert pending.uri is None and "not built yet (Running)" in pending.reason
    assert "does not exist" in resolve_engine(None, "fp32").reason
    assert "does not make this precision" in resolve_engine(passed, "fp16").reason
    assert "no build for target sm90" in resolve_engine(passed, "fp32", "sm90").reason


def test_a_node_whose_gpu_product_has_no_engine_is_named() -> None:
    build = make_build(status=status_with_artifacts())
    assert missing_targets(build, "fp32", ["cpu"]) == []
    assert missing_targets(build, "fp32", ["cpu", H100, L4, H100]) == [H100, L4]


def per_gpu_build(built: Sequence[str]) -> ModelBuild:
    """A torch build for cpu, H100 and L4 with an fp32 engine published for ``built``."""
    artifact = {"precision": "fp32", "published": True, "sha256": "a" * 64, "reason": "passed"}
    return make_build(
        backend="torch",
        targets=["cpu", H100, L4],
        precisions=["fp32"],
        calibration=None,
        status={
            "targets": [
                {
                    "target": t,
                    "phase": "Built",
                    "artifacts": [{**artifact, "uri": f"s3://engines/digits/2/{t}/fp32.pt2"}],
                }
                for t in built
            ]
        },
    )


def test_a_node_needs_its_gpu_products_engine_only_from_a_build_per_gpu() -> None:
    on_h100 = {GPU_PRODUCT_LABEL: H100}
    assert node_target(per_gpu_build(["cpu"]), on_h100) == H100
    assert node_target(per_gpu_build(["cpu"]), {}) == "cpu", "a node with no GPU runs cpu"
    cpu_only = make_build(status=status_with_artifacts())
    assert node_target(cpu_only, on_h100) == "cpu", "a cpu engine runs on any node"


def test_pods_on_a_node_whose_gpu_product_has_no_engine_name_model_node_and_target() -> None:
    isvc = serving(
        {"name": "digits-2", "precision": "fp32"}, {"name": "digits-1", "precision": "fp32"}
    )
    pods = [
        PodPlacement("p-1", "primary", "gpu-a", {GPU_PRODUCT_LABEL: H100}),
        PodPlacement("p-2", "primary", "gpu-b", {GPU_PRODUCT_LABEL: L4}),
        PodPlacement("p-3", "primary", "gpu-b", {GPU_PRODUCT_LABEL: L4}),
        PodPlacement("p-4", "primary", "cpu-a", {}),
        # the baseline's build (digits-1) is not among the builds found: not this check's
        PodPlacement("b-1", "baseline", "gpu-b", {GPU_PRODUCT_LABEL: L4}),
    ]
    builds = {"digits-2": per_gpu_build(["cpu", H100])}
    assert find_missing_engines(isvc, builds, pods) == [
        f"spec.models[digits].build: model digits has pods on node gpu-b (target {L4}) but "
        f"ModelBuild digits-2 has no engine for target {L4}: digits/2 {L4} fp32: no build for "
        f"target {L4} (pods: p-2, p-3)"
    ]
    # it clears when the pods move to a node with an engine, or when the engine exists
    moved = [p if p.node != "gpu-b" else PodPlacement(p.pod, p.pool, "gpu-a", {}) for p in pods]
    assert find_missing_engines(isvc, builds, moved) == []
    built = {"digits-2": per_gpu_build(["cpu", H100, L4])}
    assert find_missing_engines(isvc, built, pods) == []
    assert find_missing_engines(isvc, {}, pods) == [], "a missing build is reported elsewhere"


def test_a_missing_engine_for_a_target_is_degraded_with_an_event() -> None:
    problem = "spec.models[digits].build: model digits has pods on node gpu-b (target L4) ..."
    inp = StatusInput(
        generation=1,
        now=T0,
        isvc_name="digits",
        active_pool=PoolName.PRIMARY,
        desired={},
        target_problems=[problem],
    )
    result = compute_status(inp)
    degraded = {c.type: c for c in result.status.conditions}["Degraded"]
    assert (degraded.status.value, degraded.reason) == ("True", "EngineMissingForTarget")
    assert degraded.message == problem
    assert ("Warning", "EngineMissingForTarget") in [(e.type, e.reason) for e in result.events]
    # the pods moved: Degraded clears
    later = compute_status(replace(inp, target_problems=(), previous=result.status))
    assert {c.type: c for c in later.status.conditions}["Degraded"].status.value == "False"


def serving(primary: dict[str, Any], baseline: dict[str, Any] | None = None) -> Any:
    spec: dict[str, Any] = {"models": [{"name": "digits", "build": primary}]}
    if baseline is not None:
        spec["rollout"] = {
            "baseline": {"models": [{"name": "digits", "build": baseline}]},
            "steps": [50, 100],
        }
    return parse_inference_service(minimal(**spec))


def test_a_service_naming_a_build_serves_only_what_passed_its_gate() -> None:
    builds = {
        "digits-1": make_build(status=status_with_artifacts()),
        "digits-2": make_build(status=status_with_artifacts(refused=True), version="3"),
    }
    first = resolve_build_refs(
        serving(
            {"name": "digits-2", "precision": "int8"}, {"name": "digits-1", "precision": "int8"}
        ),
        builds,
    )
    assert first.problems == (
        "spec.models[digits].build: ModelBuild digits-2: digits/3 cpu int8: refused by the "
        "accuracy gate: refused: top1Agreement 0.59 < 0.99",
    ), first.problems
    assert first.blocked, "nothing served before: the refused primary cannot be made"
    assert first.isvc.spec.models[0].engines == [], "a refused engine reached the primary"
    baseline = first.isvc.spec.rollout.baseline
    assert baseline is not None and baseline.models is not None
    (engine,) = baseline.models[0].engines
    assert engine.uri == "s3://engines/team/digits/2/cpu/int8/digits-int8.onnx", engine
    assert (engine.sha256, engine.precision, engine.backend) == ("b" * 64, "int8", "onnxruntime")
    assert [(s.pool, s.build, s.uri) for s in first.served] == [
        ("baseline", "digits-1", engine.uri)
    ]

    # the version that passed is served, and remembered (status.builds)
    passed = resolve_build_refs(serving({"name": "digits-1", "precision": "fp32"}), builds)
    assert passed.problems == () and not passed.blocked
    assert passed.isvc.spec.models[0].engines[0].uri.endswith("/fp32/digits-fp32.onnx")
    # the primary then names the refused version: its pods keep the engine that passed, the
    # service is Degraded naming why, and nothing blocks the children (autoscaling, rollback)
    held = resolve_build_refs(
        serving({"name": "digits-2", "precision": "int8"}), builds, passed.served
    )
    assert not held.blocked and held.served == passed.served, held
    assert held.isvc.spec.models[0].engines == passed.isvc.spec.models[0].engines
    (problem,) = held.problems
    assert "refused by the accuracy gate" in problem and "serving s3://engines/team" in problem

    missing = resolve_build_refs(serving({"name": "digits-9", "precision": "fp32"}), builds)
    assert missing.problems == (
        "spec.models[digits].build: ModelBuild digits-9: the ModelBuild does not exist",
    )
    trt = parse_inference_service(
        minimal(
            runtime={"backend": "tensorrt"},
            models=[{"name": "digits", "build": {"name": "digits-1", "precision": "fp32"}}],
        )
    )
    assert "served by onnxruntime pools only" in resolve_build_refs(trt, builds).problems[0]
    plain = parse_inference_service(minimal())
    assert resolve_build_refs(plain, builds).isvc is plain


def test_a_build_of_another_model_or_backend_is_never_served() -> None:
    """Issue 41: a service model named a build of another model (which then answered under
    the service model's name), or a torch build (which onnxruntime pods cannot load)."""
    built = make_build(status=status_with_artifacts())
    other = parse_inference_service(
        minimal(models=[{"name": "m", "build": {"name": "digits-2", "precision": "fp32"}}])
    )
    wrong = resolve_build_refs(other, {"digits-2": built})
    assert wrong.blocked and wrong.pending == (), wrong
    (problem,) = wrong.problems
    assert problem.startswith(
        "spec.models[m].build: ModelBuild digits-2: builds model digits, not m"
    ), problem
    torch = make_build(
        backend="torch", image="t:1", targets=["cpu"], precisions=["fp32"], calibration=None
    )
    torch = with_status(torch, make_build(status=status_with_artifacts()).status)
    named = serving({"name": "digits-2", "precision": "fp32"})
    (problem,) = resolve_build_refs(named, {"digits-2": torch}).problems
    assert "is a torch build and the pool's backend is onnxruntime" in problem, problem


def _service_status(generation: int = 1, **inputs: Any) -> Any:
    """An InferenceService's status from one pool of one desired replica and ``inputs``."""
    return compute_status(
        StatusInput(
            generation=generation,
            now=T0,
            isvc_name="svc",
            active_pool=PoolName.PRIMARY,
            desired={PoolName.PRIMARY: 1},
            **inputs,
        )
    )


def test_a_build_still_running_is_waited_for_not_degraded() -> None:
    """Issue 41: a valid service whose build had not finished read Degraded=InvalidSpec 'no
    build for target' for the minutes a real build takes. Now it waits: Progressing and
    Ready False with BuildPending, Degraded False, no child made until the engine passed."""
    named = serving({"name": "digits-2", "precision": "int8"})
    fresh = make_build()  # created, no status yet
    running = make_build(
        status={"targets": [{"target": "cpu", "phase": "Running", "job": "digits-2-cpu-1"}]}
    )
    for build in (fresh, running):
        waiting = resolve_build_refs(named, {"digits-2": build})
        assert waiting.blocked and waiting.problems == (), waiting
        (line,) = waiting.pending
        assert line.startswith("spec.models[digits].build: ModelBuild digits-2: digits/2"), line
    failed = make_build(
        status={
            "conditions": [
                {
                    "type": "Degraded",
                    "status": "True",
                    "reason": "NoNodeForTarget",
                    "lastTransitionTime": "2026-12-06T20:00:00Z",
                }
            ],
            "targets": [],
        }
    )
    assert resolve_build_refs(named, {"digits-2": failed}).problems, "a fault is no wait"
    result = _service_status(
        build_pending=list(resolve_build_refs(named, {"digits-2": running}).pending)
    )
    conditions = {c.type: c for c in result.status.conditions}
    assert (conditions["Degraded"].status.value, conditions["Degraded"].reason) != (
        "True",
        "InvalidSpec",
    ), conditions
    assert conditions["Degraded"].status.value == "False", conditions
    assert conditions["Progressing"].reason == "BuildPending", conditions
    assert (conditions["Ready"].status.value, conditions["Ready"].reason) == (
        "False",
        "BuildPending",
    ), conditions
    assert "not built yet (Running)" in conditions["Ready"].message, conditions


def test_a_version_that_is_not_servable_is_degraded_while_serving_goes_on() -> None:
    from tidal.operator.core.api import ServedBuild

    kept = ServedBuild(
        pool="primary", model="digits", build="digits-1", precision="int8", uri="s3://e/x.onnx"
    )
    result = _service_status(
        generation=2,
        build_problems=["spec.models[digits].build: ModelBuild digits-2: refused"],
        builds=[kept],
    )
    degraded = {c.type: c for c in result.status.conditions}["Degraded"]
    assert (degraded.status.value, degraded.reason) == ("True", "BuildNotServable"), degraded
    assert "spec.models[digits].build" in degraded.message
    assert result.status.builds == [kept]
    assert ("Warning", "BuildNotServable") in [(e.type, e.reason) for e in result.events]


def test_engines_or_a_build_exactly_one() -> None:
    both = minimal(
        models=[
            {
                "name": "m",
                "engines": [{"uri": "file:///m.onnx"}],
                "build": {"name": "b", "precision": "fp32"},
            }
        ]
    )
    for body in (both, minimal(models=[{"name": "m"}])):
        with pytest.raises(ValidationError, match=r"set either engines \(URIs\) or build"):
            parse_inference_service(body)


def test_a_build_event_finds_the_services_that_name_it() -> None:
    services = {
        ("ns", "a"): minimal(
            "a", models=[{"name": "m", "build": {"name": "b1", "precision": "fp32"}}]
        ),
        ("ns", "b"): minimal(
            "b",
            rollout={
                "baseline": {
                    "models": [{"name": "m", "build": {"name": "b1", "precision": "fp32"}}]
                }
            },
        ),
        ("ns", "c"): minimal("c"),
        ("other", "d"): minimal(
            "d", "other", models=[{"name": "m", "build": {"name": "b1", "precision": "fp32"}}]
        ),
    }
    assert services_naming(services, ("ns", "b1")) == [("ns", "a"), ("ns", "b")]


def test_the_pods_of_a_build_answer_with_its_version_and_keep_it_while_a_refused_one_is_named() -> (
    None
):
    from tidal.operator.core.resources import pools_of, render_runtime_config

    builds = {
        "digits-1": make_build(status=status_with_artifacts(), version="1"),
        "digits-2": make_build(status=status_with_artifacts(refused=True), version="2"),
        "digits-3": make_build(status=status_with_artifacts(), version="3"),
    }

    def versions(resolution: Any) -> dict[str, list[str | None]]:
        return {
            pool.name.value: [m.get("version") for m in render_runtime_config(pool)["models"]]
            for pool in pools_of(resolution.isvc)
        }

    now = resolve_build_refs(
        serving(
            {"name": "digits-3", "precision": "int8"}, {"name": "digits-1", "precision": "fp32"}
        ),
        builds,
    )
    assert versions(now) == {"primary": ["3"], "baseline": ["1"]}, versions(now)
    # the shell fetches only the builds the spec names: digits-3's version comes from status
    named_now = {k: v for k, v in builds.items() if k != "digits-3"}
    held = resolve_build_refs(
        serving(
            {"name": "digits-2", "precision": "int8"}, {"name": "digits-1", "precision": "fp32"}
        ),
        named_now,
        now.served,
    )
    assert held.problems and versions(held) == {"primary": ["3"], "baseline": ["1"]}, (
        held.problems,
        versions(held),
    )
    named = serving({"name": "digits-3", "precision": "int8"})
    named.spec.models[0] = named.spec.models[0].model_copy(update={"version": "7"})
    assert versions(resolve_build_refs(named, builds)) == {"primary": ["7"]}, "the user's wins"
    plain = parse_inference_service(minimal())
    assert [m.get("version") for m in render_runtime_config(pools_of(plain)[0])["models"]] == [
        None
    ], "engines without a version: the runtime's default (1)"
