"""The InferenceService's status and the Events it deserves, computed without I/O.

This module owns the meaning of the conditions (``Ready``, ``Progressing``, ``Degraded``), the
replica counts, and which changes are worth an Event. It takes what the shell observed (the
Deployments and pods of each pool), the spec problems found by
:func:`tidal.operator.core.resources.find_spec_problems` (and the settings that cannot act,
from ``find_spec_warnings``), the previous status and the current
time, and returns the new status and Events. Conditions keep their ``lastTransitionTime`` while
their status does not change, so writing the result again is a no-op (idempotence).

The control loop's part (``tidal.operator.core.control.ControlStatus``: conditions ``Scaling``,
``Prewarmed``, ``RolledBack``, ``MetricsStale``, per-pool metrics, ``lastDecision``, ``rollout``)
is merged in when given, with the same transition-time rules; without it those fields are
carried over from the previous status unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .api import (
    LABEL_ISVC,
    LABEL_POOL,
    Condition,
    ConditionStatus,
    FleetStatus,
    InferenceServiceStatus,
    PoolName,
    PoolStatus,
    ServedBuild,
)
from .control import ControlStatus
from .events import EventSpec, timestamp

READY = "Ready"
PROGRESSING = "Progressing"
DEGRADED = "Degraded"
OWNED_CONDITIONS = (READY, PROGRESSING, DEGRADED)
# Degraded's reasons for a working spec with settings that can never act as written, or that
# contradict each other (tidal.operator.core.rules).
INEFFECTIVE_SETTING = "IneffectiveSetting"
CONFLICTING_SETTINGS = "ConflictingSettings"
# Degraded's reason when a models[].build names a version that cannot be served (yet).
BUILD_NOT_SERVABLE = "BuildNotServable"
# Degraded's reason when a pod runs on a node whose target (GPU product) the build has no
# published engine for (tidal.operator.core.builds.find_missing_engines).
ENGINE_MISSING_FOR_TARGET = "EngineMissingForTarget"
# Ready's and Progressing's reason while a models[].build only waits for its build to finish
# (a real build takes minutes: not a fault, so Degraded stays as it is).
BUILD_PENDING = "BuildPending"
# Ready's reason for a pool at zero that has never had a Ready replica (see has_served).
NOT_YET_SERVED = "NotYetServed"


@dataclass(frozen=True)
class DeploymentState:
    """The parts of a Deployment's status that matter here."""

    generation: int = 0
    observed_generation: int = 0
    spec_replicas: int = 0
    replicas: int = 0
    ready_replicas: int = 0
    updated_replicas: int = 0
    available_replicas: int = 0
    failure: str | None = None  # message of ReplicaFailure / ProgressDeadlineExceeded


@dataclass(frozen=True)
class PodState:
    """One pod of an InferenceService as the status needs it."""

    pool: str
    role: str
    ready: bool
    terminating: bool = False


@dataclass(frozen=True)
class StatusInput:
    """Everything :func:`compute_status` needs; ``now`` is the wall time for timestamps."""

    generation: int
    now: datetime
    isvc_name: str
    active_pool: PoolName
    desired: Mapping[PoolName, int]
    deployments: Mapping[PoolName, DeploymentState] = field(default_factory=dict)
    pods: Sequence[PodState] = ()
    problems: Sequence[str] = ()
    error: str | None = None
    previous: InferenceServiceStatus | None = None
    control: ControlStatus | None = None
    # With spec.fleet: the fleet loop's summary (None: not computed yet, keep the previous)
    # and the models no replica can hold (reported as Degraded, serving goes on).
    fleet_enabled: bool = False
    fleet: FleetStatus | None = None
    fleet_problems: Sequence[str] = ()
    # Settings that can never act as written, and settings that contradict each other
    # (core.rules): Degraded, serving goes on; a conflict outranks an ineffective setting.
    warnings: Sequence[str] = ()
    conflicts: Sequence[str] = ()
    # models[].build: what could not be served (Degraded, serving goes on with the engines
    # kept in ``builds``), and the engines served from builds (None: keep the previous).
    build_problems: Sequence[str] = ()
    builds: Sequence[ServedBuild] | None = None
    # models[].build whose build is still pending or running: Progressing (BuildPending); with
    # nothing served yet, Ready=False (BuildPending) and no child is made until it is built.
    build_pending: Sequence[str] = ()
    # Pods on nodes whose target has no engine from the build they serve (Degraded, serving
    # goes on elsewhere): each names the model, the node and the missing target.
    target_problems: Sequence[str] = ()


@dataclass(frozen=True)
class StatusResult:
    status: InferenceServiceStatus
    events: tuple[EventSpec, ...]

    def to_wire(self) -> dict[str, Any]:
        return self.status.to_wire()


def count_pool(
    pool: PoolName, desired: int, deployment: DeploymentState | None, pods: Sequence[PodState]
) -> PoolStatus:
    live = [p for p in pods if p.pool == pool.value and not p.terminating]
    return PoolStatus(
        desired=desired,
        replicas=len(live),
        ready=sum(1 for p in live if p.ready and p.role != "standby"),
        warming=sum(1 for p in live if not p.ready),
        standby=sum(1 for p in live if p.ready and p.role == "standby"),
        updated=deployment.updated_replicas if deployment is not None else 0,
    )


def has_served(status: InferenceServiceStatus | None) -> bool:
    """Whether the service has been Ready (serving, or at zero after serving) by ``status``.

    A pool at zero is healthy only once some replica has been Ready: a service taken to zero
    before (``spec.replicas: 0``, or a first replica that never came up) has shown nothing,
    and an engine that cannot load stays unseen while no pod runs. So ``ScaledToZero`` is
    Ready=True only after ``Serving`` was, and carries that forward."""
    if status is None:
        return False
    return any(c.type == READY and c.status is ConditionStatus.TRUE for c in status.conditions)


def _ready(inp: StatusInput, active: PoolStatus) -> tuple[ConditionStatus, str, str]:
    pool = inp.active_pool.value
    fleet = inp.fleet
    if fleet is None and inp.previous is not None:
        fleet = inp.previous.fleet
    if active.ready > 0 and inp.fleet_enabled and (fleet is None or fleet.gateways_ready == 0):
        return (
            ConditionStatus.FALSE,
            "GatewayNotReady",
            f"{active.ready} replicas of pool {pool} ready; no gateway pod is ready yet",
        )
    if active.ready > 0:
        # `desired` counts the standby too: say so, or "3 of 4 ... serving" reads as one down.
        standby = f", {active.standby} ready as standby" if active.standby else ""
        return (
            ConditionStatus.TRUE,
            "Serving",
            f"{active.ready} of {active.desired} replicas of pool {pool} ready and serving"
            f"{standby}",
        )
    if active.desired == 0 and not inp.problems and has_served(inp.previous):
        return ConditionStatus.TRUE, "ScaledToZero", f"pool {pool} is scaled to zero"
    if active.desired == 0 and not inp.problems:
        return (
            ConditionStatus.FALSE,
            NOT_YET_SERVED,
            f"pool {pool} is at zero and no replica has been Ready yet: nothing has shown that "
            "its models load and serve; the first request wakes it (and Degraded says what "
            "fails, if it does)",
        )
    if inp.problems:
        return ConditionStatus.FALSE, "InvalidSpec", "no ready replicas; see the Degraded condition"
    if inp.build_pending:
        return ConditionStatus.FALSE, BUILD_PENDING, "; ".join(inp.build_pending)
    if active.warming > 0:
        return (
            ConditionStatus.FALSE,
            "Warming",
            f"{active.warming} replicas of pool {pool} loading and warming their models",
        )
    return ConditionStatus.FALSE, "NoReadyReplicas", f"pool {pool} has no ready replicas"


def _progressing(
    inp: StatusInput, pools: Mapping[PoolName, PoolStatus]
) -> tuple[ConditionStatus, str, str]:
    if inp.problems:
        return ConditionStatus.FALSE, "InvalidSpec", "waiting for a spec that can work"
    if inp.build_pending:
        return ConditionStatus.TRUE, BUILD_PENDING, "; ".join(inp.build_pending)
    for pool, counts in pools.items():
        dep = inp.deployments.get(pool)
        if dep is None:
            return ConditionStatus.TRUE, "Creating", f"creating pool {pool.value}"
        if dep.observed_generation < dep.generation or counts.updated < counts.desired:
            return (
                ConditionStatus.TRUE,
                "RollingOut",
                f"pool {pool.value}: {counts.updated} of {counts.desired} replicas updated",
            )
        if counts.replicas > counts.desired:
            return (
                ConditionStatus.TRUE,
                "ScalingDown",
                f"pool {pool.value}: {counts.replicas} pods, {counts.desired} desired",
            )
        if counts.ready + counts.standby < counts.desired:
            return (
                ConditionStatus.TRUE,
                "ScalingUp",
                f"pool {pool.value}: {counts.ready + counts.standby} of {counts.desired} "
                "replicas ready",
            )
    return ConditionStatus.FALSE, "Complete", "every pool runs its desired replicas"


def _degraded(inp: StatusInput) -> tuple[ConditionStatus, str, str]:
    if inp.problems:
        return ConditionStatus.TRUE, "InvalidSpec", "; ".join(inp.problems)
    if inp.error is not None:
        return ConditionStatus.TRUE, "ReconcileError", inp.error
    if inp.build_problems:
        return ConditionStatus.TRUE, BUILD_NOT_SERVABLE, "; ".join(inp.build_problems)
    if inp.target_problems:
        return ConditionStatus.TRUE, ENGINE_MISSING_FOR_TARGET, "; ".join(inp.target_problems)
    failures = [
        f"pool {pool.value}: {dep.failure}" for pool, dep in inp.deployments.items() if dep.failure
    ]
    if failures:
        return ConditionStatus.TRUE, "DeploymentFailed", "; ".join(failures)
    if inp.control is not None and inp.control.pod_problems:
        return ConditionStatus.TRUE, "EngineLoadFailed", "; ".join(inp.control.pod_problems)
    if inp.fleet_problems:
        return ConditionStatus.TRUE, "ModelTooLarge", "; ".join(inp.fleet_problems)
    if inp.conflicts:
        return ConditionStatus.TRUE, CONFLICTING_SETTINGS, "; ".join(inp.conflicts)
    if inp.warnings:
        return ConditionStatus.TRUE, INEFFECTIVE_SETTING, "; ".join(inp.warnings)
    return ConditionStatus.FALSE, "AsExpected", "no problems found"


def _condition(
    previous: Mapping[str, Condition],
    kind: str,
    verdict: tuple[ConditionStatus, str, str],
    inp: StatusInput,
) -> Condition:
    status, reason, message = verdict
    before = previous.get(kind)
    changed = before is None or before.status != status
    return Condition(
        type=kind,
        status=status,
        reason=reason,
        message=message,
        last_transition_time=timestamp(inp.now)
        if changed or before is None
        else before.last_transition_time,
        observed_generation=inp.generation,
    )


def _event_for(before: Condition | None, after: Condition) -> EventSpec | None:
    """An Event when a condition's status (or a Degraded reason) changes."""
    same_status = before is not None and before.status == after.status
    if same_status and (after.type != DEGRADED or before is None or before.reason == after.reason):
        return None
    if before is None and not (after.type == DEGRADED and after.status is ConditionStatus.TRUE):
        return None  # a new object's first status is no change (its children get Events)
    bad = (after.type == DEGRADED and after.status is ConditionStatus.TRUE) or (
        after.type == READY and after.status is ConditionStatus.FALSE and before is not None
    )
    return EventSpec(
        type="Warning" if bad else "Normal",
        reason=f"{after.type}{after.status.value}" if after.type != DEGRADED else after.reason,
        message=f"{after.type}={after.status.value} ({after.reason}): {after.message}",
    )


def _pool_statuses(inp: StatusInput, prev: InferenceServiceStatus) -> dict[PoolName, PoolStatus]:
    """Each pool's counts, with the control loop's metrics (without it: the previous ones)."""
    pools = {
        pool: count_pool(pool, desired, inp.deployments.get(pool), inp.pods)
        for pool, desired in inp.desired.items()
    }
    if inp.control is not None:
        metrics = inp.control.pool_metrics
        return {p: c.model_copy(update={"metrics": metrics.get(p)}) for p, c in pools.items()}
    before = prev.pools
    return {
        pool: counts.model_copy(
            update={"metrics": before[pool.value].metrics if pool.value in before else None}
        )
        for pool, counts in pools.items()
    }


def compute_status(inp: StatusInput) -> StatusResult:
    """The new status and the Events its changes deserve."""
    control = inp.control
    prev = inp.previous or InferenceServiceStatus()
    pools = _pool_statuses(inp, prev)
    active = pools.get(inp.active_pool, PoolStatus())
    by_type = {c.type: c for c in prev.conditions}
    ours = [
        _condition(by_type, READY, _ready(inp, active), inp),
        _condition(by_type, PROGRESSING, _progressing(inp, pools), inp),
        _condition(by_type, DEGRADED, _degraded(inp), inp),
    ]
    owned = set(OWNED_CONDITIONS)
    if control is not None:
        for verdict in control.conditions:
            ours.append(_condition(by_type, verdict[0], verdict[1:], inp))
            owned.add(verdict[0])
    others = [c for c in prev.conditions if c.type not in owned]
    # The control loop's conditions are reported by its own Events (with the decision's
    # numbers); only the three reconcile conditions get Events here.
    events = tuple(
        e
        for c in ours
        if c.type in OWNED_CONDITIONS and (e := _event_for(by_type.get(c.type), c)) is not None
    )
    status = InferenceServiceStatus(
        observed_generation=inp.generation,
        conditions=[*ours, *others],
        replicas=active.replicas,
        ready_replicas=active.ready,
        warming_replicas=active.warming,
        standby_replicas=active.standby,
        desired_replicas=active.desired,
        selector=f"{LABEL_ISVC}={inp.isvc_name},{LABEL_POOL}={inp.active_pool.value}",
        active_pool=inp.active_pool,
        pools={pool.value: counts for pool, counts in pools.items()},
        metrics=active.metrics if control is not None else prev.metrics,
        last_decision=(
            control.last_decision or prev.last_decision
            if control is not None
            else prev.last_decision
        ),
        rollout=control.rollout if control is not None else prev.rollout,
        autoscaler=(control.autoscaler or prev.autoscaler)
        if control is not None
        else prev.autoscaler,
        fleet=(inp.fleet or prev.fleet) if inp.fleet_enabled else None,
        builds=(list(inp.builds) or None) if inp.builds is not None else prev.builds,
    )
    return StatusResult(status=status, events=events)
