"""What a ModelBuild needs done, and what its status says: pure decisions, no I/O, no clock.

* :func:`resolve_targets`: the targets of a build (its own, or by default ``cpu`` for ONNX
  Runtime and every GPU product among the nodes' labels for the GPU backends).
* :func:`builder_image`, :func:`builder_spec`, :func:`inputs_digest`, :func:`make_job`: the
  Job of one target, in the backend's image, with a GPU for a GPU target, named from a digest
  of everything it is handed (same inputs, same name: never built twice).
* :func:`read_job`: a Job and its pod, as the shell saw them, to a :class:`JobOutcome` (the
  builder's report from the pod's termination message, or the log's tail of a failure).
* :func:`plan_build`: build + nodes + Jobs + previous status + now -> Jobs to create, the new
  status and the Events its changes deserve.
* :func:`resolve_engine` / :func:`missing_targets` / :func:`resolve_build_refs`: from a
  build's status to the engine an InferenceService may serve, only when it passed its gate.
* :func:`node_target` / :func:`find_missing_engines`: the service's pods on nodes whose
  target (GPU product) the build has no published engine for (``EngineMissingForTarget``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from .api import (
    API_VERSION,
    S3_CREDENTIAL_KEYS,
    Backend,
    Condition,
    ConditionStatus,
    Engine,
    InferenceService,
    Model,
    PoolName,
    Precision,
    ServedBuild,
)
from .buildapi import (
    ANNOTATION_INPUTS,
    ARCH_TARGET_PATTERN,
    BACKENDS_WITH_IMAGES,
    BUILD_KIND,
    CPU_TARGET,
    GPU_MAJOR_LABEL,
    GPU_MINOR_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    LABEL_BUILD,
    LABEL_TARGET,
    RUNNABLE_BACKENDS,
    BuildBackend,
    BuildPhase,
    EngineArtifact,
    ModelBuild,
    ModelBuildStatus,
    TargetStatus,
)
from .events import EventSpec, timestamp

READY = "Ready"
DEGRADED = "Degraded"
# A build pod whose container cannot be created from its configuration: the kubelet's reason,
# and the Degraded reason the build reports (its credentials Secret, or a key of it, missing).
CONFIG_ERROR = "CreateContainerConfigError"
MISSING_CREDENTIALS = "MissingCredentials"
OPTIONAL_CREDENTIAL_KEY = "AWS_SESSION_TOKEN"
REPORT_SCHEMA = "tidal.dev/build-report/v1"
REPORT_DIR = "/tmp/tidal-build"
# The builder's exit status (runtime/BUILD.md) -> the reason a failed target reports.
EXIT_REASONS = {2: "InvalidInput", 3: "VersionConflict"}
LOG_TAIL_CHARS = 2048


# -- targets -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeInfo:
    """A node as the planner needs it: its name and labels."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Targets:
    targets: tuple[str, ...]
    problem: str | None = None  # why there are none (names the field to set)


def resolve_targets(build: ModelBuild, nodes: Sequence[NodeInfo] | None) -> Targets:
    """The build's targets; ``nodes`` None: the operator may not list nodes."""
    spec = build.spec
    if spec.targets:
        return Targets(tuple(spec.targets))
    if spec.backend is BuildBackend.ONNXRUNTIME:
        return Targets((CPU_TARGET,))
    if nodes is None:
        return Targets((), "spec.targets: the operator cannot list nodes; name the targets")
    products = sorted(
        {n.labels[GPU_PRODUCT_LABEL] for n in nodes if n.labels.get(GPU_PRODUCT_LABEL)}
    )
    if not products:
        return Targets(
            (), f"spec.targets: no node has the label {GPU_PRODUCT_LABEL}; name the targets"
        )
    return Targets(tuple(products))


def node_labels_for(target: str) -> dict[str, str]:
    """The node labels a target's build pod must run on (none for cpu: any node)."""
    if target == CPU_TARGET:
        return {}
    if _is_arch(target):
        digits = target[2:]
        return {GPU_MAJOR_LABEL: digits[:-1], GPU_MINOR_LABEL: digits[-1]}
    return {GPU_PRODUCT_LABEL: target}


def _is_arch(target: str) -> bool:
    return re.fullmatch(ARCH_TARGET_PATTERN, target) is not None


def nodes_of(target: str, nodes: Sequence[NodeInfo]) -> list[str]:
    want = node_labels_for(target)
    return [n.name for n in nodes if all(n.labels.get(k) == v for k, v in want.items())]


# -- the Job of one target ---------------------------------------------------------------------


def builder_image(build: ModelBuild, images: Mapping[BuildBackend, str]) -> str | None:
    """The image a build's Jobs run: ``spec.image``, else the runtime image of its backend
    (``images``: the operator's runtime images); None for torch, which no such image carries."""
    if build.spec.image:
        return build.spec.image
    backend = build.spec.backend
    return images.get(backend) if backend in BACKENDS_WITH_IMAGES else None


def builder_spec(build: ModelBuild, target: str) -> dict[str, Any]:
    """The spec handed to ``python -m tidal.runtime.builder`` for one target (its wire shape:
    ``tidal.runtime.builder.spec.BuildSpec``)."""
    spec = build.spec
    data = spec.model_dump(
        by_alias=True,
        exclude_none=True,
        mode="json",
        include={
            "model",
            "version",
            "source",
            "backend",
            "precisions",
            "profiles",
            "calibration",
            "validation",
            "gate",
            "quantization",
            "optimization",
            "output",
        },
    )
    data["target"] = target
    if spec.s3 is not None:
        data["s3"] = spec.s3.model_dump(
            by_alias=True, exclude_none=True, mode="json", exclude={"credentials_secret"}
        )
    return data


def inputs_digest(spec: Mapping[str, Any], image: str) -> str:
    """sha256 of what a Job is handed: same digest, same Job, no rebuild."""
    canonical = json.dumps({"spec": spec, "image": image}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def job_name(build_name: str, target: str, digest: str) -> str:
    """``<build>-<target>-<digest>``, shortened to a label value (63) and DNS-safe."""
    slug = "".join(c if c.isalnum() else "-" for c in target.lower()).strip("-")
    head = f"{build_name}-{slug}"[:52].rstrip("-.")
    return f"{head}-{digest[:10]}"


def label_value(name: str) -> str:
    """A build name as a label value (at most 63 characters; longer names get a digest)."""
    if len(name) <= 63:
        return name
    return f"{name[:52].rstrip('-.')}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def _credentials_env(secret: str) -> list[dict[str, Any]]:
    """The builder's S3 credentials from ``secret``, each key named (not envFrom): a Secret
    that is missing, or lacks a key, keeps the container from starting with a reason read_job
    reports (MissingCredentials), where envFrom would start the builder without credentials
    and the S3 client would fail on instance metadata, naming neither the Secret nor spec.s3."""
    return [
        {
            "name": key,
            "valueFrom": {
                "secretKeyRef": {"name": secret, "key": key}
                | ({"optional": True} if key == OPTIONAL_CREDENTIAL_KEY else {})
            },
        }
        for key in S3_CREDENTIAL_KEYS
    ]


def _node_affinity(labels: Mapping[str, str]) -> dict[str, Any]:
    """Only nodes with every one of ``labels``."""
    match = [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(labels.items())]
    term = {"nodeSelectorTerms": [{"matchExpressions": match}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term}}


def make_job(build: ModelBuild, target: str, image: str) -> dict[str, Any]:
    """The Job that builds one target, on a node of that target."""
    spec = builder_spec(build, target)
    digest = inputs_digest(spec, image)
    name = job_name(build.name, target, digest)
    labels = {LABEL_BUILD: label_value(build.name), LABEL_TARGET: label_value(target)}
    report = f"{REPORT_DIR}/{name}.json"
    container: dict[str, Any] = {
        "name": "builder",
        "image": image,
        "command": ["python", "-m", "tidal.runtime.builder"],
        "args": ["--spec-json", json.dumps(spec, sort_keys=True), "--report", report],
        # The builder writes its verdicts here; a failure without one leaves the log's tail.
        "terminationMessagePath": report,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if target != CPU_TARGET:
        # The builder compiles for, and measures on, the GPU of the node it runs on.
        container["resources"] = {"limits": {GPU_RESOURCE: "1"}, "requests": {GPU_RESOURCE: "1"}}
    if build.spec.s3 is not None and build.spec.s3.credentials_secret:
        container["env"] = _credentials_env(build.spec.s3.credentials_secret)
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    want = node_labels_for(target)
    if want:
        pod["affinity"] = _node_affinity(want)
    if build.spec.tolerations:
        pod["tolerations"] = [t.to_wire() for t in build.spec.tolerations]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": build.namespace,
            "labels": labels,
            "annotations": {ANNOTATION_INPUTS: digest},
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": BUILD_KIND,
                    "name": build.name,
                    "uid": build.uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": build.spec.active_deadline_seconds,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


# -- what a Job did ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobOutcome:
    """One Job as the planner needs it."""

    name: str
    target: str
    inputs: str
    phase: BuildPhase  # PENDING, RUNNING, BUILT, REFUSED or FAILED
    reason: str = ""
    message: str = ""
    artifacts: tuple[EngineArtifact, ...] = ()


def parse_report(text: str) -> tuple[EngineArtifact, ...] | None:
    """The builder's report (``--report``) as artifacts; None when ``text`` is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
        return None
    try:
        return tuple(
            EngineArtifact(
                precision=e["precision"],
                published=bool(e["published"]),
                uri=e.get("uri"),
                sha256=e.get("sha256"),
                manifest=e.get("manifest"),
                build_key=e.get("buildKey"),
                top1_agreement=e.get("top1Agreement"),
                reason=str(e.get("reason", ""))[:1024],
            )
            for e in data.get("engines", [])
        )
    except (KeyError, TypeError, ValidationError):
        return None


def _terminated(pod: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    for c in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        state = c.get("state") or {}
        if "terminated" in state:
            return dict(state["terminated"])
    return None


def _waiting(pod: Mapping[str, Any] | None) -> str:
    status = (pod or {}).get("status") or {}
    for c in status.get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', '')}: {waiting.get('message', '')}".strip(": ")
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
    return ""


def _job_condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def _config_error(pod: Mapping[str, Any] | None) -> str:
    """The kubelet's message when the container cannot be created from its configuration
    (a Secret or a key of it missing); '' otherwise."""
    for c in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") == CONFIG_ERROR:
            return str(waiting.get("message") or CONFIG_ERROR)
    return ""


def read_job(job: Mapping[str, Any], pod: Mapping[str, Any] | None) -> JobOutcome:
    """A build Job and its (latest) pod to an outcome. The builder's report in the pod's
    termination message gives each engine's verdict (exit 0 or 1); a failure without one gives
    the reason (the exit status's meaning, the container's or the Job's) and the log's tail."""
    meta = job.get("metadata") or {}
    name = str(meta.get("name", ""))
    target = str((meta.get("labels") or {}).get(LABEL_TARGET, ""))
    inputs = str((meta.get("annotations") or {}).get(ANNOTATION_INPUTS, ""))
    done = _job_condition(job, "Complete") or _job_condition(job, "SuccessCriteriaMet")
    failed = _job_condition(job, "Failed") or _job_condition(job, "FailureTarget")
    terminated = _terminated(pod)
    if done is None and failed is None and terminated is None:
        running = ((pod or {}).get("status") or {}).get("phase") == "Running"
        phase = BuildPhase.RUNNING if running else BuildPhase.PENDING
        config = _config_error(pod)
        if config:
            return JobOutcome(name, target, inputs, phase, MISSING_CREDENTIALS, config)
        return JobOutcome(name, target, inputs, phase, message=_waiting(pod))
    # Below, the pod may have ended before the Job controller said so: the pod is read first.
    message = str((terminated or {}).get("message", ""))
    artifacts = parse_report(message) if message else None
    if artifacts is not None and artifacts:
        refused = [a for a in artifacts if not a.published]
        if not refused:
            return JobOutcome(name, target, inputs, BuildPhase.BUILT, artifacts=artifacts)
        why = "; ".join(f"{a.precision}: {a.reason}" for a in refused)
        return JobOutcome(
            name, target, inputs, BuildPhase.REFUSED, "GateRefused", why, artifacts=artifacts
        )
    if terminated is None and done is None and failed is None:
        return JobOutcome(name, target, inputs, BuildPhase.PENDING)
    code = (terminated or {}).get("exitCode")
    said = str((terminated or {}).get("reason") or "")
    reason = EXIT_REASONS.get(code, "") if isinstance(code, int) else ""
    if not reason:
        reason = said if said not in ("", "Error", "Completed") else ""
    if not reason:
        reason = str((failed or {}).get("reason") or "")
    if not reason:
        reason = "NoReport" if code == 0 else "BuildFailed"
    tail = message[-LOG_TAIL_CHARS:].strip()
    detail = f"exit code {code}" if code is not None else str((failed or {}).get("message", ""))
    text = f"{detail}: {tail}" if tail else (detail or "the Job failed with no log")
    return JobOutcome(name, target, inputs, BuildPhase.FAILED, reason, text)


# -- the plan ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildPlan:
    create: tuple[dict[str, Any], ...]
    status: ModelBuildStatus
    events: tuple[EventSpec, ...]

    def to_wire(self) -> dict[str, Any]:
        return self.status.to_wire()


def _condition(
    previous: Mapping[str, Condition],
    kind: str,
    verdict: tuple[ConditionStatus, str, str],
    generation: int,
    now: datetime,
) -> Condition:
    status, reason, message = verdict
    before = previous.get(kind)
    kept = before is not None and before.status == status
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message[:32768],
        last_transition_time=before.last_transition_time if kept and before else timestamp(now),
        observed_generation=generation,
    )


def _event(before: Condition | None, after: Condition) -> EventSpec | None:
    if before is not None and before.status == after.status and before.reason == after.reason:
        return None
    if after.type == DEGRADED:
        if after.status is ConditionStatus.TRUE:
            return EventSpec("Warning", after.reason, after.message[:1024])
        return None if before is None else EventSpec("Normal", "Recovered", "Degraded=False")
    if after.status is ConditionStatus.TRUE:
        return EventSpec("Normal", "Built", after.message[:1024])
    return None  # a refusal's Event is per target (plan_build), not per condition change


def invalid_build_status(
    problem: str, generation: int, previous: ModelBuildStatus | None, now: datetime
) -> BuildPlan:
    """The status of a build whose spec the operator cannot use (the message names the field)."""
    return _finish((), [], previous, generation, now, (("InvalidSpec", problem),), "")


def plan_build(
    build: ModelBuild,
    nodes: Sequence[NodeInfo] | None,
    jobs: Sequence[JobOutcome],
    images: Mapping[BuildBackend, str],
    now: datetime,
    runnable: frozenset[BuildBackend] = RUNNABLE_BACKENDS,
) -> BuildPlan:
    """Which Jobs to create and the build's new status.

    A target whose inputs (``inputs_digest``) match a finished verdict in the previous status
    (Built or Refused) is not built again, even when its Job is gone; a Job of the same name is
    never created twice; a target whose Job failed is retried only when its inputs change or
    its Job is deleted. ``images``: the runtime image of each backend (:func:`builder_image`).
    Backends with no builder or no image to run it in, targets the builder cannot build for,
    and targets no node has run no Job: ``Degraded`` says what to change.
    """
    image = builder_image(build, images)
    previous = build.status
    generation = build.generation
    before = {t.target: t for t in (previous.targets if previous else [])}
    by_name = {j.name: j for j in jobs}
    targets = resolve_targets(build, nodes)
    problems: list[tuple[str, str]] = []
    if targets.problem:
        problems.append(("NoTargets", targets.problem))
    unavailable = _builder_unavailable(build, image, runnable)
    if unavailable:
        problems.append(("BuilderUnavailable", unavailable))
    create: list[dict[str, Any]] = []
    statuses: list[TargetStatus] = []
    for target in targets.targets:
        known = before.get(target)
        status, job, found = _plan_target(build, target, image, known, by_name, nodes, unavailable)
        statuses.append(status)
        problems += found
        if job is not None:
            create.append(job)
    events = [
        EventSpec("Normal", "Created", f"Created Job {j['metadata']['name']}") for j in create
    ]
    refused_before = {t for t, s in before.items() if s.phase is BuildPhase.REFUSED}
    for s in statuses:
        if s.phase is BuildPhase.REFUSED and s.target not in refused_before:
            events.append(EventSpec("Warning", "GateRefused", f"target {s.target}: {s.message}"))
    summary = _summary(build, statuses)
    return _finish(create, statuses, previous, generation, now, tuple(problems), summary, events)


def _plan_target(
    build: ModelBuild,
    target: str,
    image: str | None,
    known: TargetStatus | None,
    jobs: Mapping[str, JobOutcome],
    nodes: Sequence[NodeInfo] | None,
    unavailable: str | None,
) -> tuple[TargetStatus, dict[str, Any] | None, list[tuple[str, str]]]:
    """One target's status, the Job to create for it (None: none) and the problems it shows
    (``known``: its status before; ``jobs``: the outcomes of the Jobs that exist, by name)."""
    job = make_job(build, target, image or "")
    name = job["metadata"]["name"]
    digest = job["metadata"]["annotations"][ANNOTATION_INPUTS]
    if unavailable:
        return _unavailable(target, digest, "BuilderUnavailable", ""), None, []
    if build.spec.backend is BuildBackend.TORCH and not (target == CPU_TARGET or _is_arch(target)):
        message = (
            f"spec.targets: {target}: the torch builder compiles for a GPU architecture "
            "(sm90) or cpu; name architectures in spec.targets"
        )
        unsupported = _unavailable(target, digest, "UnsupportedTarget", message)
        return unsupported, None, [("UnsupportedTarget", message)]
    finished = (BuildPhase.BUILT, BuildPhase.REFUSED)
    if known is not None and known.inputs == digest and known.phase in finished:
        return known, None, []
    outcome = jobs.get(name)
    if outcome is None and nodes is not None and not nodes_of(target, nodes):
        want = ", ".join(f"{k}={v}" for k, v in node_labels_for(target).items()) or "any"
        message = f"spec.targets: no node of target {target} ({want})"
        return (
            _unavailable(target, digest, "NoNodeForTarget", message),
            None,
            [("NoNodeForTarget", message)],
        )
    if outcome is None:
        pending = TargetStatus(target=target, phase=BuildPhase.PENDING, job=name, inputs=digest)
        return pending, job, []
    status = TargetStatus(
        target=target,
        phase=outcome.phase,
        job=name,
        inputs=digest,
        reason=outcome.reason,
        message=outcome.message[-4096:],
        artifacts=list(outcome.artifacts),
    )
    problems = []
    if outcome.reason == MISSING_CREDENTIALS:
        problems.append((MISSING_CREDENTIALS, _missing_credentials(build, name, outcome)))
    if outcome.phase is BuildPhase.FAILED:
        tail = outcome.message[-LOG_TAIL_CHARS:]
        failed = f"target {target}: Job {name} failed ({outcome.reason}): {tail}"
        problems.append(("BuildFailed", failed))
    return status, None, problems


def _missing_credentials(build: ModelBuild, job: str, outcome: JobOutcome) -> str:
    secret = build.spec.s3.credentials_secret if build.spec.s3 is not None else None
    return (
        f"spec.s3.credentialsSecret: the build pod of Job {job} cannot start: Secret {secret} "
        f"in namespace {build.namespace} is missing, or lacks AWS_ACCESS_KEY_ID or "
        f"AWS_SECRET_ACCESS_KEY ({outcome.message}); create it with those keys (the Job "
        "starts once it exists), or name another in spec.s3.credentialsSecret"
    )


def _builder_unavailable(
    build: ModelBuild, image: str | None, runnable: frozenset[BuildBackend]
) -> str:
    """Why no Job can build this backend ('' when one can)."""
    backend = build.spec.backend
    if backend not in runnable:
        return (
            f"spec.backend: no {backend.value} builder in this release (runtime/BUILD.md); "
            "use onnxruntime"
        )
    if image is None and backend is BuildBackend.TORCH:
        return (
            "spec.image: no published image carries torch; set spec.image to an image with "
            "torch (and CUDA for GPU targets) and this project installed: the builder is "
            "runtime/builder/aoti.py (python -m tidal.runtime.builder)"
        )
    if image is None:
        return f"spec.image: the operator has no runtime image for {backend.value}; set one"
    return ""


def _unavailable(target: str, digest: str, reason: str, message: str) -> TargetStatus:
    return TargetStatus(
        target=target,
        phase=BuildPhase.UNAVAILABLE,
        inputs=digest,
        reason=reason,
        message=message,
    )


def _summary(build: ModelBuild, statuses: Sequence[TargetStatus]) -> str:
    wanted = len(build.spec.precisions) * len(statuses)
    published = sum(1 for s in statuses for a in s.artifacts if a.published)
    return f"{published}/{wanted} published"


def _finish(
    create: Sequence[dict[str, Any]],
    statuses: Sequence[TargetStatus],
    previous: ModelBuildStatus | None,
    generation: int,
    now: datetime,
    problems: tuple[tuple[str, str], ...],
    summary: str,
    events: Sequence[EventSpec] = (),
) -> BuildPlan:
    phases = {s.phase for s in statuses}
    if problems:
        ready = (ConditionStatus.FALSE, problems[0][0], problems[0][1])
    elif phases & {BuildPhase.PENDING, BuildPhase.RUNNING}:
        waiting = [s.message for s in statuses if s.message and s.phase is BuildPhase.PENDING]
        ready = (
            ConditionStatus.FALSE,
            "Building",
            "; ".join(["Jobs pending or running", *waiting]),
        )
    elif BuildPhase.REFUSED in phases:
        refused = [f"target {s.target}: {s.message}" for s in statuses if s.message]
        ready = (ConditionStatus.FALSE, "GateRefused", "; ".join(refused))
    else:
        ready = (ConditionStatus.TRUE, "Built", f"every engine published ({summary})")
    degraded = (
        (ConditionStatus.TRUE, problems[0][0], "; ".join(m for _, m in problems))
        if problems
        else (ConditionStatus.FALSE, "AsExpected", "")
    )
    old = {c.type: c for c in (previous.conditions if previous else [])}
    conditions = [
        _condition(old, READY, ready, generation, now),
        _condition(old, DEGRADED, degraded, generation, now),
    ]
    all_events = list(events)
    for cond in conditions:
        event = _event(old.get(cond.type), cond)
        if event is not None:
            all_events.append(event)
    status = ModelBuildStatus(
        observed_generation=generation,
        conditions=conditions,
        targets=list(statuses),
        summary=summary,
    )
    return BuildPlan(tuple(create), status, tuple(all_events))


# -- from a build to an InferenceService ------------------------------------------------------


@dataclass(frozen=True)
class EngineChoice:
    """The engine of one (build, target, precision), or why there is none to serve."""

    uri: str | None
    sha256: str | None = None
    reason: str = ""
    # No engine yet, but none is wrong either: the build has not planned or finished this
    # target (a real build takes minutes). The service waits (Progressing), not Degraded.
    pending: bool = False


def _build_degraded(build: ModelBuild) -> bool:
    conditions = build.status.conditions if build.status else []
    return any(c.type == DEGRADED and c.status is ConditionStatus.TRUE for c in conditions)


def resolve_engine(
    build: ModelBuild | None, precision: str, target: str = CPU_TARGET
) -> EngineChoice:
    """The engine an InferenceService may serve from a build: only one that passed its gate
    and was published. A refused engine is never returned (no pod is ever pointed at it)."""
    if build is None:
        return EngineChoice(None, reason="the ModelBuild does not exist")
    label = f"{build.spec.model}/{build.spec.version} {target} {precision}"
    if precision not in {p.value for p in build.spec.precisions}:
        return EngineChoice(None, reason=f"{label}: the build does not make this precision")
    status = build.status
    found = next((t for t in (status.targets if status else []) if t.target == target), None)
    if found is None and (status is None or not status.targets) and not _build_degraded(build):
        return EngineChoice(None, reason=f"{label}: waiting for the build to start", pending=True)
    if found is None:
        return EngineChoice(None, reason=f"{label}: no build for target {target}")
    artifact = next((a for a in found.artifacts if a.precision == precision), None)
    if artifact is None:
        waiting = found.phase in (BuildPhase.PENDING, BuildPhase.RUNNING) and not (
            _build_degraded(build)
        )
        return EngineChoice(
            None, reason=f"{label}: not built yet ({found.phase.value})", pending=waiting
        )
    if not artifact.published or not artifact.uri:
        return EngineChoice(
            None, reason=f"{label}: refused by the accuracy gate: {artifact.reason}"
        )
    return EngineChoice(artifact.uri, artifact.sha256, f"{label}: passed its gate")


def missing_targets(build: ModelBuild, precision: str, node_targets: Sequence[str]) -> list[str]:
    """Targets of nodes (GPU products, or ``cpu``) a service's pods run on that have no
    published engine of ``precision`` in ``build``: what ``Degraded`` names."""
    return sorted({t for t in node_targets if resolve_engine(build, precision, t).uri is None})


def builds_per_gpu(build: ModelBuild) -> bool:
    """Whether the build makes engines per GPU (its targets, named or built, are not only
    ``cpu``; a GPU backend with no targets named builds for the nodes' GPU products)."""
    named = [
        *build.spec.targets,
        *(t.target for t in (build.status.targets if build.status else [])),
    ]
    if named:
        return any(t != CPU_TARGET for t in named)
    return build.spec.backend is not BuildBackend.ONNXRUNTIME


def node_target(build: ModelBuild, labels: Mapping[str, str]) -> str:
    """The target a node needs from ``build``: its GPU product when the build makes engines
    per GPU and the node has one, else ``cpu`` (a cpu engine runs on any node)."""
    product = labels.get(GPU_PRODUCT_LABEL)
    return product if product and builds_per_gpu(build) else CPU_TARGET


@dataclass(frozen=True)
class PodPlacement:
    """A pod of the service, the pool it belongs to and the labels of the node it is
    scheduled on."""

    pod: str
    pool: str
    node: str
    node_labels: Mapping[str, str] = field(default_factory=dict)


def find_missing_engines(
    isvc: InferenceService, builds: Mapping[str, ModelBuild], placements: Sequence[PodPlacement]
) -> list[str]:
    """Each (model, node) where a pod of the model's pool runs on a node whose target has no
    published engine of the model's build (:func:`missing_targets`): a line naming the
    field, the model, the node, the missing target and its pods. A build that does not exist
    is :func:`resolve_build_refs`'s to report, not this."""
    spec = isvc.spec
    baseline = spec.rollout.baseline
    pools = [(PoolName.PRIMARY.value, "spec.models", spec.models)]
    if baseline is not None and baseline.models:
        pools.append((PoolName.BASELINE.value, "spec.rollout.baseline.models", baseline.models))
    problems = []
    for pool, at, models in pools:
        for model in models:
            ref = model.build
            build = builds.get(ref.name) if ref is not None else None
            if ref is None or build is None:
                continue
            on_nodes: dict[tuple[str, str], list[str]] = {}
            for placed in placements:
                if placed.pool == pool:
                    key = (placed.node, node_target(build, placed.node_labels))
                    on_nodes.setdefault(key, []).append(placed.pod)
            for (node, target), pods in sorted(on_nodes.items()):
                if missing_targets(build, ref.precision.value, [target]):
                    reason = resolve_engine(build, ref.precision.value, target).reason
                    problems.append(
                        f"{at}[{model.name}].build: model {model.name} has pods on node {node} "
                        f"(target {target}) but ModelBuild {ref.name} has no engine for "
                        f"target {target}: {reason} (pods: {', '.join(sorted(pods))})"
                    )
    return problems


def raw_build_refs(spec: Mapping[str, Any]) -> list[str]:
    """The ModelBuilds an InferenceService's raw ``spec`` names (primary and baseline
    models), in order, without parsing it (for watch handlers and caches)."""
    baseline = (spec.get("rollout") or {}).get("baseline") or {}
    models = [*(spec.get("models") or []), *(baseline.get("models") or [])]
    names = [
        str((m.get("build") or {}).get("name"))
        for m in models
        if isinstance(m, Mapping) and isinstance(m.get("build"), Mapping)
    ]
    return list(dict.fromkeys(names))


def build_refs(isvc: InferenceService) -> set[str]:
    """The ModelBuilds an InferenceService's models name (primary and baseline)."""
    spec = isvc.spec
    baseline = spec.rollout.baseline
    models = [*spec.models, *((baseline.models or []) if baseline is not None else [])]
    return {m.build.name for m in models if m.build is not None}


@dataclass(frozen=True)
class BuildResolution:
    """An InferenceService with its ``models[].build`` resolved to engines.

    ``problems``: each named version that cannot be served, naming the field and why.
    ``pending``: each named version that only waits for its build to finish (not in
    ``problems``: not a fault).
    ``served``: the engine each such model's pods are given (the new one when it passed its
    gate; else the one served before, from ``status.builds``). ``blocked``: a model with
    neither (a first deploy of a version not servable yet): nothing of its pool can be made.
    """

    isvc: InferenceService
    problems: tuple[str, ...] = ()
    served: tuple[ServedBuild, ...] = ()
    blocked: bool = False
    pending: tuple[str, ...] = ()
    # The builds found, by name (what :func:`find_missing_engines` reads).
    builds: Mapping[str, ModelBuild] = field(default_factory=dict)


def resolve_build_refs(
    isvc: InferenceService,
    builds: Mapping[str, ModelBuild],
    served: Sequence[ServedBuild] = (),
) -> BuildResolution:
    """The service with each ``models[].build`` turned into the engine its build published
    for the pool's target, and only one that passed its gate: a version not built yet, or
    refused, is reported (Degraded, serving goes on) while the pods keep the engine they were
    given before (``served``, from ``status.builds``), so a refused engine never reaches a pod
    and autoscaling and the rollback switch keep working. A version that passes changes the
    pool's template like any edit: with a baseline, the staged rollout takes it from there.
    """
    spec = isvc.spec
    if not build_refs(isvc):
        return BuildResolution(isvc)
    found = _Resolving(builds, {(s.pool, s.model): s for s in served})
    resolve = found.models
    models = resolve(spec.models, spec.runtime.backend, PoolName.PRIMARY.value, "spec.models")
    update: dict[str, Any] = {"models": models}
    baseline = spec.rollout.baseline
    if baseline is not None and baseline.models:
        given = baseline.runtime.__dict__ if baseline.runtime is not None else {}
        backend = given.get("backend") or spec.runtime.backend
        resolved = resolve(
            baseline.models, backend, PoolName.BASELINE.value, "spec.rollout.baseline.models"
        )
        rollout = spec.rollout.model_copy(
            update={"baseline": baseline.model_copy(update={"models": resolved})}
        )
        update["rollout"] = rollout
    return BuildResolution(
        isvc.model_copy(update={"spec": spec.model_copy(update=update)}),
        tuple(found.problems),
        tuple(found.kept),
        found.blocked,
        tuple(found.pending),
        dict(builds),
    )


@dataclass
class _Resolving:
    """One resolution of a service's builds (``resolve_build_refs``): the builds, what each
    pool served before (by pool and model), and what was found: problems, builds pending, the
    builds served, and whether a model has no engine at all (every child held back)."""

    builds: Mapping[str, ModelBuild]
    before: Mapping[tuple[str, str], ServedBuild]
    problems: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    kept: list[ServedBuild] = field(default_factory=list)
    blocked: bool = False

    def models(self, models: Sequence[Model], backend: Backend, pool: str, at: str) -> list[Model]:
        return [self.model(m, backend, pool, at) for m in models]

    def model(self, model: Model, backend: Backend, pool: str, at: str) -> Model:
        """The model with the engine its build published (or the one it served before)."""
        ref = model.build
        if ref is None:
            return model
        build = self.builds.get(ref.name)
        choice = resolve_engine(build, ref.precision.value, CPU_TARGET)
        wrong = _wrong_build(model.name, build, backend) if build is not None else ""
        if backend is not Backend.ONNXRUNTIME:
            choice = EngineChoice(
                None,
                reason="engines from a ModelBuild are served by onnxruntime pools only in "
                f"this release (the pool's backend is {backend.value})",
            )
        elif wrong:
            choice = EngineChoice(None, reason=wrong)
        now = ServedBuild(
            pool=pool,
            model=model.name,
            build=ref.name,
            precision=ref.precision.value,
            uri=choice.uri or "",
            sha256=choice.sha256,
            version=model.version or (build.spec.version if build else None),
        )
        if choice.uri is None:
            old = self.before.get((pool, model.name))
            keeping = f"; serving {old.uri} ({old.build}) meanwhile" if old else ""
            text = f"{at}[{model.name}].build: ModelBuild {ref.name}: {choice.reason}{keeping}"
            (self.pending if choice.pending else self.problems).append(text)
            if old is None:
                self.blocked = True
                return model
            now = old
        self.kept.append(now)
        engine = Engine(
            uri=now.uri,
            sha256=now.sha256,
            backend=Backend.ONNXRUNTIME,
            precision=Precision(now.precision),
        )
        # the version kept with its engine (status.builds): the kept build may not be fetched
        return model.model_copy(update={"engines": [engine], "version": now.version})


def _wrong_build(model: str, build: ModelBuild, backend: Backend) -> str:
    """Why a pool's model may not serve this build at all, whatever it publishes ('' if it
    may): a build of another model (its engine would answer under this model's name), or of
    a backend the pool does not run (a torch package in an onnxruntime pool)."""
    if build.spec.model != model:
        return (
            f"builds model {build.spec.model}, not {model}: its engine would answer as "
            f"{model}; name a ModelBuild whose spec.model is {model}, or rename the model"
        )
    if build.spec.backend.value != backend.value:
        return (
            f"is a {build.spec.backend.value} build and the pool's backend is "
            f"{backend.value}: its engines cannot load there; name a "
            f"{backend.value} build"
        )
    return ""
