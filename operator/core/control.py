"""Glue of the control loop: from the deciders' answers to children, status and Events.

This module owns the pure translation between the spec and the three deciders (``decide_scale``
in ``core.autoscaler``, ``plan_rollout`` in ``core.rollout``, ``choose_standby`` in
``core.autoscaler_pods``) and what the shell writes:

* the deciders' inputs built from the spec (:func:`scaling_policy_of`, :func:`rollout_spec_of`)
  and from several pools' observations (:func:`combine_observations` for a split step);
* their answers turned into :class:`~tidal.operator.core.resources.Observed` (replicas per pool,
  the pool the Service selects, split) by :func:`plan_children`;
* the status the loop owns (:class:`ControlStatus`: conditions ``Scaling``, ``Prewarmed``,
  ``RolledBack``, ``MetricsStale``, the last decision with its inputs, each pool's metrics, the
  rollout state as JSON and the autoscaler's memory as JSON) and the Events of a scale
  (:func:`scale_event`);
* the autoscaler's memory to and from ``status.autoscaler`` (:func:`autoscaler_status`,
  :func:`restore_scaler_state`), so that a restarted operator resumes mid-surge.

The shell (``tidal.operator.shell.controller``) does the I/O and keeps the state between ticks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from .api import (
    ActivePool,
    AutoscalerStatus,
    ConditionStatus,
    Decision,
    InferenceService,
    InferenceServiceStatus,
    PoolName,
    RolloutStatus,
    ServiceMetrics,
    TimeToRoutable,
    duration_seconds,
    percent_value,
)
from .autoscaler import (
    REASON_HOLD_MISSING,
    REASON_HOLD_STALE,
    Capacity,
    Observation,
    ScaleDecision,
    ScalerState,
    ScalingPolicy,
    dump_state,
    estimate_capacity,
    load_state,
)
from .idle import ZeroPolicy
from .resources import Observed, content_hash, deployment_name
from .rollout import (
    ActivePool as RolloutActivePool,
)
from .rollout import (
    Pool,
    RolloutDecision,
    RolloutSpec,
    RolloutState,
    Traffic,
)
from .signals import NOTE_PROMETHEUS_UNAVAILABLE
from .slo import BreachAction, PoolSignals, SloPolicy

SCALING = "Scaling"
PREWARMED = "Prewarmed"
ROLLED_BACK = "RolledBack"
METRICS_STALE = "MetricsStale"
CONTROL_CONDITIONS = (SCALING, PREWARMED, ROLLED_BACK, METRICS_STALE)
ANNOTATION_TEMPLATE_HASH = "serving.tidal.dev/template-hash"

ConditionVerdict = tuple[str, ConditionStatus, str, str]  # type, status, reason, message


# -- inputs of the deciders ------------------------------------------------------------------


def scaling_policy_of(isvc: InferenceService, tick_seconds: float = 1.0) -> ScalingPolicy:
    """The autoscaler's policy for the pools that serve the InferenceService's traffic."""
    return ScalingPolicy.from_spec(isvc.spec.autoscaling, tick_seconds=min(tick_seconds, 1.0))


def initial_scaler_state(policy: ScalingPolicy, deployment_replicas: int | None) -> ScalerState:
    """State for a pool seen for the first time (or after an operator restart).

    The Deployment's replicas include the standby pods (all still labelled serving when new):
    seeding the serving count with them would make the first decision add the standby again.
    """
    if deployment_replicas is None:
        return ScalerState()
    serving = deployment_replicas - policy.standby_replicas
    return ScalerState(desired_serving=max(policy.min_replicas, min(policy.max_replicas, serving)))


def slo_policy_of(isvc: InferenceService) -> SloPolicy:
    """``spec.rollout.slo`` in the SLO evaluator's units (no objective: nothing can breach)."""
    rollout = isvc.spec.rollout
    slo = rollout.slo
    action = BreachAction(rollout.on_breach.value)
    if slo is None:
        return SloPolicy(on_breach=action)
    headroom = percent_value(slo.gpu_memory_headroom) if slo.gpu_memory_headroom else None
    return SloPolicy(
        p99_ms=slo.p99_ms,
        error_rate=slo.error_rate,
        cold_start_ms=slo.cold_start_ms,
        transfer_wait_ms=slo.transfer_wait_ms,
        gpu_memory_headroom=None if headroom is None else headroom / 100.0,
        for_seconds=duration_seconds(slo.for_),
        on_breach=action,
        min_requests=slo.min_requests,
    )


def zero_policy_of(isvc: InferenceService, wake_margin_seconds: float) -> ZeroPolicy:
    """The idle timer's policy of a pool that may reach zero (``core.idle``): the spec's
    ``scaleToZeroAfterSeconds`` and ``lateRequestGpuSeconds``, and the operator's margin added
    to the wake lead."""
    return ZeroPolicy(
        after_seconds=float(isvc.spec.autoscaling.scale_to_zero_after_seconds),
        wake_margin_seconds=wake_margin_seconds,
        late_request_gpu_seconds=isvc.spec.autoscaling.late_request_gpu_seconds,
    )


def rollout_spec_of(isvc: InferenceService, primary_hash: str) -> RolloutSpec | None:
    """The planner's spec, or None for a single-pool InferenceService (no planner)."""
    rollout = isvc.spec.rollout
    if rollout.baseline is None:
        return None
    return RolloutSpec(
        slo=slo_policy_of(isvc),
        active_pool=RolloutActivePool(rollout.active_pool.value),
        primary_hash=primary_hash,
        baseline_min_replicas=rollout.baseline.min_replicas,
        control_replicas=rollout.control_replicas,
        max_replicas=isvc.spec.autoscaling.max_replicas,
        steps=tuple(rollout.steps),
        step_seconds=float(rollout.step_seconds),
        drain_seconds=float(rollout.drain_seconds),
        overflow=rollout.baseline.overflow,
    )


def primary_template_hash(objects: Sequence[Mapping[str, Any]], isvc_name: str) -> str:
    """Hash of the primary Deployment's pod template among ``desired_objects``' output."""
    name = deployment_name(isvc_name, PoolName.PRIMARY)
    for obj in objects:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == name:
            template = dict(obj["spec"]["template"])
            meta = dict(template.get("metadata") or {})
            annotations = dict(meta.get("annotations") or {})
            annotations.pop(ANNOTATION_TEMPLATE_HASH, None)
            meta["annotations"] = annotations
            template["metadata"] = meta
            return content_hash(template)
    raise ValueError(f"no primary Deployment {name} among the desired objects")


def stamp_template_hash(objects: list[dict[str, Any]], isvc_name: str) -> str:
    """Put the primary template's hash on its pods (so the shell can tell which template a
    ready pod runs); returns the hash. Idempotent."""
    digest = primary_template_hash(objects, isvc_name)
    name = deployment_name(isvc_name, PoolName.PRIMARY)
    for obj in objects:
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == name:
            meta = obj["spec"]["template"].setdefault("metadata", {})
            meta.setdefault("annotations", {})[ANNOTATION_TEMPLATE_HASH] = digest
    return digest


def combine_observations(observations: Sequence[Observation]) -> Observation:
    """One observation of the service's traffic served by several pools (a split step).

    Counts, queues and rates add up; P99 is the worst pool's; a signal missing in one pool is
    missing for the whole (the autoscaler holds rather than deciding on half the picture).
    """
    if not observations:
        raise ValueError("no observation to combine")
    if len(observations) == 1:
        return observations[0]

    def total(values: list[float | None]) -> float | None:
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)

    p99s = [o.hot_p99_ms for o in observations if o.hot_p99_ms is not None]
    warmups = [o.warmup_seconds for o in observations if o.warmup_seconds is not None]
    ages = [o.metrics_age_seconds for o in observations]
    return Observation(
        now=max(o.now for o in observations),
        ready_serving=sum(o.ready_serving for o in observations),
        warming=sum(o.warming for o in observations),
        ready_standby=sum(o.ready_standby for o in observations),
        pending_unschedulable=sum(o.pending_unschedulable for o in observations),
        queue_depth=total([o.queue_depth for o in observations]),
        hot_p99_ms=max(p99s) if p99s else None,
        arrival_rate=total([o.arrival_rate for o in observations]),
        warmup_seconds=max(warmups) if warmups else None,
        metrics_age_seconds=None if any(a is None for a in ages) else max(a or 0.0 for a in ages),
    )


def overflow_observation(primary: Observation, baseline: Observation) -> Observation:
    """The primary's observation while the baseline shares a surge (rollout rule 8).

    The autoscaler goes on sizing the primary for all of the service's traffic: the baseline's
    arrivals and queue are demand the primary must carry when the overflow ends, but its ready
    replicas are not the primary's capacity (they would hold the primary's scale-up back).
    """

    def total(a: float | None, b: float | None) -> float | None:
        return a if b is None else (b if a is None else a + b)

    return replace(
        primary,
        queue_depth=total(primary.queue_depth, baseline.queue_depth),
        arrival_rate=total(primary.arrival_rate, baseline.arrival_rate),
    )


def traffic_pools(rollout: RolloutDecision | None) -> tuple[PoolName, ...]:
    """The pools whose serving pods receive the Service's traffic."""
    if rollout is None:
        return (PoolName.PRIMARY,)
    return tuple(PoolName(p.value) for p in rollout.service_pools)


# More pods than any pool has: "every ready pod serves".
UNBOUNDED_SERVING = 1 << 30


def role_targets(
    serving: Sequence[PoolName],
    decision: ScaleDecision,
    helping: Sequence[PoolName] = (),
    rollout: RolloutDecision | None = None,
) -> dict[PoolName, tuple[int, int]]:
    """(serving, standby) pods each serving pool's ready pods are labelled for.

    The pool that alone takes the traffic gets the autoscaler's split. A split step keeps no
    autoscaler standby (``plan_children`` sizes both pools for their share): every ready pod of
    both pools serves, so a pod demoted while one pool served alone is promoted again — left
    standby, it would leave a pool of one pod with no endpoint and its share of the step with no
    traffic (and no samples for the step's verdict). The one exception is the baseline's
    rollback reserve (rollout rule 6e, ``rollout.baseline_standby``): those pods beyond its
    share wait ready out of the Service, and serving pods fill first. A ``helping`` pool (the
    baseline in an overflow) serves with every ready pod beside the pool the autoscaler sizes.
    """
    if len(serving) == 1:
        targets = {serving[0]: (decision.desired_serving, decision.desired_standby)}
    else:
        targets = {pool: (UNBOUNDED_SERVING, 0) for pool in serving}
        reserve = rollout.baseline_standby if rollout is not None else 0
        if reserve > 0 and PoolName.BASELINE in targets and rollout is not None:
            share = max(rollout.desired_replicas.baseline - reserve, 1)
            targets[PoolName.BASELINE] = (share, reserve)
    for pool in helping:
        targets.setdefault(pool, (UNBOUNDED_SERVING, 0))
    return targets


def to_wall_signals(signals: PoolSignals, mono_now: float, wall_now: float) -> PoolSignals:
    """The same signals with ``observedAt`` on the wall clock (the planner's persisted clock)."""
    if signals.observed_at is None:
        return signals
    return signals.model_copy(update={"observed_at": wall_now - (mono_now - signals.observed_at)})


# -- answers to children --------------------------------------------------------------------


def plan_children(
    isvc: InferenceService,
    scale: ScaleDecision | None,
    rollout: RolloutDecision | None,
    current: Mapping[PoolName, int],
) -> Observed:
    """Replicas per pool and routing for ``desired_objects``.

    Without a decision (manual ``spec.replicas``, or no tick yet) the current replicas stay.
    With a planner the pools get its sizes; the standby pods belong to the pool that alone
    serves the traffic (a split step keeps none: both pools are sized by the planner).
    """
    replicas: dict[PoolName, int] = dict(current)
    if rollout is None:
        if scale is not None and isvc.spec.replicas is None:
            replicas[PoolName.PRIMARY] = scale.desired_total
        return Observed(replicas=replicas, active_pool=PoolName.PRIMARY, split=False)
    replicas[PoolName.PRIMARY] = rollout.desired_replicas.primary
    replicas[PoolName.BASELINE] = rollout.desired_replicas.baseline
    pools = traffic_pools(rollout)
    overflow = rollout.traffic is Traffic.OVERFLOW
    if (len(pools) == 1 or overflow) and scale is not None:
        # The standby belongs to the pool the autoscaler sizes (the primary in an overflow).
        replicas[pools[0]] += scale.desired_standby
    if isvc.spec.replicas is not None:
        replicas.pop(PoolName.PRIMARY, None)  # the manual count wins (desired_replicas)
    return Observed(
        replicas=replicas,
        active_pool=pools[0] if len(pools) == 1 else PoolName.PRIMARY,
        split=rollout.traffic is Traffic.SPLIT or overflow,
    )


def follow_planner(isvc: InferenceService) -> InferenceService:
    """The InferenceService with ``activePool: auto`` for ``desired_objects``: the planner
    already obeys a manual pin, and only after the pinned pool is warm (rule 1 of rollout)."""
    if isvc.spec.rollout.active_pool is ActivePool.AUTO:
        return isvc
    rollout = isvc.spec.rollout.model_copy(update={"active_pool": ActivePool.AUTO})
    spec = isvc.spec.model_copy(update={"rollout": rollout})
    return isvc.model_copy(update={"spec": spec})


# -- status -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ControlStatus:
    """The status fields the control loop owns (merged into the status by ``compute_status``)."""

    conditions: tuple[ConditionVerdict, ...] = ()
    pool_metrics: Mapping[PoolName, ServiceMetrics] = field(default_factory=dict)
    last_decision: Decision | None = None
    rollout: RolloutStatus | None = None
    autoscaler: AutoscalerStatus | None = None
    # Pods that run but cannot turn Ready, with the runtime's reason (core.podfaults).
    pod_problems: tuple[str, ...] = ()


def rfc3339_ms(now: datetime) -> str:
    """RFC 3339 in UTC with milliseconds: decisions a second apart must stay apart."""
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{now.microsecond // 1000:03d}Z"


def _round(value: float | None, digits: int) -> float | None:
    if value is None or math.isnan(value) or math.isinf(value):
        return None
    return round(value, digits)


def pool_metrics(
    observation: Observation,
    signals: PoolSignals,
    queue_source: str,
    routable: TimeToRoutable | None = None,
) -> ServiceMetrics:
    """One pool's signals for status, rounded so noise does not rewrite the status."""
    return ServiceMetrics(
        time_to_routable=routable,
        queue_depth=_round(observation.queue_depth, 1),
        arrival_rate=_round(observation.arrival_rate, 1),
        p99_hot_ms=_round(signals.p99_hot_ms, 1),
        p99_cold_ms=_round(signals.cold_start_ms, 1),
        error_rate=_round(signals.error_rate, 4),
        requests=signals.requests,
        queue_source=queue_source,
    )


def decision_inputs(decision: ScaleDecision) -> dict[str, float]:
    """The numbers of a decision that are known (None inputs are left out)."""
    out: dict[str, float] = {}
    for name, value in vars_of(decision.inputs).items():
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float) and math.isfinite(value):
            out[_camel(name)] = round(float(value), 3)
    return out


def vars_of(obj: Any) -> dict[str, Any]:
    slots = getattr(obj, "__slots__", None)
    if slots:
        return {name: getattr(obj, name) for name in slots}
    return dict(vars(obj))


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def status_decision(decision: ScaleDecision, pool: PoolName, now: datetime) -> Decision:
    return Decision(
        reason=decision.reason,
        at=rfc3339_ms(now),
        pool=pool.value,
        desired_replicas=decision.desired_serving,
        standby_replicas=decision.desired_standby,
        inputs=decision_inputs(decision),
    )


def camel_reason(reason: str) -> str:
    """``surge:queue`` -> ``SurgeQueue`` (condition reasons are CamelCase)."""
    parts = [p for chunk in reason.replace("-", ":").split(":") for p in [chunk] if p]
    return "".join(p[:1].upper() + p[1:] for p in parts) or "Unknown"


def scaling_condition(
    decision: ScaleDecision | None, observation: Observation | None, manual: bool
) -> ConditionVerdict:
    """``Scaling``: True while the pool is on its way to a new size, with the decision's reason."""
    if manual:
        return (SCALING, ConditionStatus.FALSE, "Manual", "spec.replicas is set: no autoscaling")
    if decision is None or observation is None:
        return (SCALING, ConditionStatus.UNKNOWN, "NoDecision", "no decision yet")
    have = observation.ready_serving
    want = decision.desired_serving
    moving = have != want or observation.warming > 0
    message = (
        f"{decision.reason}: {want} serving + {decision.desired_standby} standby asked, "
        f"{have} serving, {observation.ready_standby} standby ready, "
        f"{observation.warming} warming"
    )
    if decision.notes:
        message += "; " + "; ".join(decision.notes)
    status = ConditionStatus.TRUE if moving else ConditionStatus.FALSE
    pending = observation.pending_unschedulable
    if pending and f"{pending} pod(s) pending unschedulable" not in message:
        message += f"; {pending} pod(s) pending unschedulable"
    if pending:
        # Whatever the last decision's reason, the pool is short for lack of room: say so for
        # as long as it lasts (the decision itself stops asking for more, see decide_scale).
        return (SCALING, ConditionStatus.TRUE, "Unschedulable", message)
    return (SCALING, status, camel_reason(decision.reason), message)


def prewarmed_condition(
    decision: ScaleDecision | None, observation: Observation | None
) -> ConditionVerdict:
    """``Prewarmed``: the warm standby asked for is ready (True when none is asked for)."""
    if decision is None or observation is None:
        return (PREWARMED, ConditionStatus.UNKNOWN, "NoDecision", "no decision yet")
    want, have = decision.desired_standby, observation.ready_standby
    if want == 0:
        return (PREWARMED, ConditionStatus.TRUE, "NoStandby", "no standby replicas asked for")
    if have >= want:
        return (PREWARMED, ConditionStatus.TRUE, "StandbyReady", f"{have}/{want} standby warm")
    return (
        PREWARMED,
        ConditionStatus.FALSE,
        "StandbyWarming",
        f"{have}/{want} standby warm, {observation.warming} pods warming",
    )


def metrics_condition(decision: ScaleDecision | None, notes: Sequence[str]) -> ConditionVerdict:
    """``MetricsStale``: True while the autoscaler holds the pool for lack of fresh metrics."""
    detail = "; ".join(notes) if notes else "all signals fresh"
    if decision is not None and decision.reason in (REASON_HOLD_MISSING, REASON_HOLD_STALE):
        reason = "MetricsMissing" if decision.reason == REASON_HOLD_MISSING else "MetricsStale"
        return (METRICS_STALE, ConditionStatus.TRUE, reason, f"holding the pool size: {detail}")
    if any(n.startswith(NOTE_PROMETHEUS_UNAVAILABLE) for n in notes):
        return (
            METRICS_STALE,
            ConditionStatus.TRUE,
            "PrometheusUnavailable",
            "scaling up on the pods' own signals; no scale-down and no SLO verdict until "
            f"Prometheus answers: {detail}",
        )
    return (METRICS_STALE, ConditionStatus.FALSE, "Fresh", detail)


def rolled_back_condition(rollout: RolloutDecision) -> ConditionVerdict:
    """``RolledBack``: True while the baseline serves because the primary breached."""
    record = rollout.rollback
    if record is None:
        return (ROLLED_BACK, ConditionStatus.FALSE, rollout.phase.value, rollout.reason)
    breaches = ", ".join(r.describe() for r in record.breaches) or record.reason
    return (
        ROLLED_BACK,
        ConditionStatus.TRUE,
        "SloBreach",
        f"primary {record.primary_hash}: {breaches}",
    )


def rollout_status(decision: RolloutDecision, state: RolloutState) -> RolloutStatus:
    return RolloutStatus(
        phase=decision.phase.value,
        traffic=decision.traffic.value,
        primary_traffic_percent=round(decision.primary_traffic_percent, 1),
        step=decision.step,
        reason=decision.reason[:2048],
        state=json.dumps(state.model_dump(mode="json", by_alias=True), sort_keys=True),
    )


def restore_rollout_state(raw: RolloutStatus | None) -> RolloutState | None:
    """The planner's state as an earlier operator stored it (None: absent or unreadable)."""
    if raw is None or not raw.state:
        return None
    try:
        return RolloutState.model_validate(json.loads(raw.state))
    except ValueError:
        return None


def autoscaler_status(
    policy: ScalingPolicy,
    pools: Sequence[PoolName],
    state: ScalerState,
    mono_now: float,
    wall_now: float,
    zero: Mapping[str, Any] | None = None,
) -> AutoscalerStatus:
    """The autoscaler's memory for status: learned capacity, and the state as JSON for the
    traffic set `pools` (times on the wall clock, so another process can read them); `zero`:
    a scale-to-zero pool's memory (``core.idle.dump_zero``), kept beside it."""
    capacity = estimate_capacity(policy, state.capacity)
    doc: dict[str, Any] = {
        "pools": [p.value for p in pools],
        "scaler": dump_state(state, wall_now - mono_now),
    }
    if zero is not None:
        doc["zero"] = dict(zero)
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return AutoscalerStatus(
        capacity_per_replica=None if capacity is None else _round(capacity.per_replica_rate, 2),
        knee_concurrency=None if capacity is None else _round(capacity.knee_concurrency, 2),
        state=text,
    )


def _bucket(value: float | None) -> int | None:
    """5 % buckets: a learned number that moves less than that is not worth a write."""
    if value is None or value <= 0 or not math.isfinite(value):
        return None
    return round(math.log(value) / math.log(1.05))


def autoscaler_persist_key(state: ScalerState, capacity: Capacity | None) -> tuple[Any, ...]:
    """What a restarted operator would decide differently from: the persisted state needs
    writing only when this changes, so a quiet cluster costs no status writes.

    The times of a steady state move every tick and need not be written: the scale-down
    window's head while it is the only entry (a steady recommendation) restarts as well from the
    current tick, the trend keeps only its last rate. What does matter: the serving count
    asked, a pending scale-down's head (its time decides when the delay is over), whether
    the delay is running, and the learned capacity, per-request time and surge (5 % steps).
    """
    window = state.down_window
    head: tuple[float | None, int] | None = None
    if window:
        head = window[0] if len(window) > 1 else (None, window[0][1])
    surge = state.surge[0] if state.surge is not None else None
    return (
        state.desired_serving,
        head,
        state.agreed_since is None,
        _bucket(capacity.per_replica_rate if capacity is not None else None),
        _bucket(state.seconds_per_request),
        _bucket(surge),
    )


def stored_zero_memory(raw: AutoscalerStatus | None) -> Any:
    """The scale-to-zero memory an earlier operator stored (``core.idle.load_zero`` reads it);
    None when absent or unreadable."""
    if raw is None or not raw.state:
        return None
    try:
        return json.loads(raw.state).get("zero")
    except (ValueError, AttributeError):
        return None


def restore_scaler_state(
    raw: AutoscalerStatus | None,
    pools: Sequence[PoolName],
    mono_now: float,
    wall_now: float,
) -> ScalerState | None:
    """The state an earlier operator stored for the traffic set `pools` (None: absent,
    unreadable, or stored for other pools)."""
    if raw is None or not raw.state:
        return None
    try:
        data = json.loads(raw.state)
        if data.get("pools") != [p.value for p in pools]:
            return None
        return load_state(data["scaler"], wall_now - mono_now)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


# -- Events -----------------------------------------------------------------------------------


def scale_event(
    pool: PoolName, before: int | None, decision: ScaleDecision
) -> tuple[str, str, str] | None:
    """(type, reason, message) of the Event for a change of a pool's size, None for no change."""
    after = decision.desired_total
    if before is None or before == after:
        return None
    inputs = decision.inputs
    parts = [f"queue {inputs.queue_depth:.1f}" if inputs.queue_depth is not None else "queue ?"]
    if inputs.arrival_rate is not None:
        parts.append(f"rate {inputs.arrival_rate:.1f}/s")
    if inputs.hot_p99_ms is not None:
        parts.append(f"p99 {inputs.hot_p99_ms:.0f}ms")
    parts.append(f"warm-up {inputs.warmup_seconds:.1f}s")
    kind = "ScaledUp" if after > before else "ScaledDown"
    if after == 0:
        kind = "ScaledToZero"  # minReplicas 0: not an error, the GPUs are released
    elif before == 0:
        kind = "ScaledFromZero"
    type_ = "Warning" if decision.unschedulable else "Normal"
    message = (
        f"pool {pool.value}: {before} -> {after} replicas ({decision.desired_serving} serving, "
        f"{decision.desired_standby} standby, promote {decision.promote_standby}): "
        f"{decision.reason}; {', '.join(parts)}"
    )
    return type_, kind, message


def rollout_pool(pool: PoolName) -> Pool:
    return Pool(pool.value)


@dataclass(frozen=True)
class ControlView:
    """What the reconciler takes from the control loop for one InferenceService.

    ``hold_primary_template``: the primary's new pod template must wait (a staged rollout moves
    traffic off the primary first); the reconciler then changes only its replicas.
    """

    observed: Observed
    status: ControlStatus
    hold_primary_template: bool = False


def urgent_change(before: ControlView | None, view: ControlView) -> bool:
    """Whether the reconciler must write ``view`` now rather than with the next periodic status
    write (metrics alone wait for that): a change of the children, the template hold, the
    conditions, the decision, the rollout's traffic, or the pods' problems (Degraded follows
    them: a pod that cannot start or load is news, and a loop that is quiet because nothing of
    such a pod keeps it busy would otherwise hold it)."""
    return (
        before is None
        or before.observed != view.observed
        or before.hold_primary_template != view.hold_primary_template
        or before.status.conditions != view.status.conditions
        or before.status.last_decision != view.status.last_decision
        or before.status.pod_problems != view.status.pod_problems
        or (before.status.rollout is None) != (view.status.rollout is None)
        or (
            before.status.rollout is not None
            and view.status.rollout is not None
            and before.status.rollout.traffic != view.status.rollout.traffic
        )
    )


def provisional_view(
    previous: InferenceServiceStatus | None, deployment_replicas: Mapping[PoolName, int]
) -> ControlView | None:
    """What the reconciler should hold to before the control loop's first decision.

    A restarted operator reconciles before its watches have listed the Deployments: without a
    view it would apply each pool at its minimum, and a pool mid-surge would lose the replicas
    warming up. Until the first tick the pools keep what the Deployments ask for, or else what
    the previous operator asked for (``status.pools[*].desired``), the routing it recorded, and
    its rollout and autoscaler status (so the first status write does not erase the memory the
    loop restores from). None for an object that never had a status (nothing to hold to).
    """
    if previous is None or not previous.pools:
        return None
    replicas: dict[PoolName, int] = {}
    for name, pool in previous.pools.items():
        try:
            key = PoolName(name)
        except ValueError:
            continue
        replicas[key] = deployment_replicas.get(key, pool.desired)
    rollout = previous.rollout
    observed = Observed(
        replicas=replicas,
        active_pool=previous.active_pool,
        split=rollout is not None
        and rollout.traffic in (Traffic.SPLIT.value, Traffic.OVERFLOW.value),
    )
    status = ControlStatus(
        last_decision=previous.last_decision, rollout=rollout, autoscaler=previous.autoscaler
    )
    return ControlView(observed=observed, status=status)
