"""The per-InferenceService loop's remaining decisions, each a pure function of one tick value.

The shell (``tidal.operator.shell.controller``) reads one tick's world -- the pods per pool and
their signals, the Service's selector and EndpointSlices, the loop's memory -- into a frozen
value, calls the function here, and writes what it returns. Each step is so testable from one
value, without the shell:

* :func:`scale_step`: the autoscaler's decision (through ``core.idle.step_zero`` for a
  service that may reach zero) and its memory as status carries it (``ScaleTick`` in);
* :func:`control_status`: the status the loop owns (``ControlStatus``) and whether this tick's
  scale decision is a new one (``StatusTick`` in);
* :func:`choose_roles`: one pool's role labels (``choose_standby`` plus the standby pods that
  must serve again);
* :func:`host_tier_moves`: which standby pods go host-warm now (``HostTierTick`` in);
* :func:`first_decision_ready`: whether a restarted loop may decide yet;
* which pools serve and help for a rollout's traffic, and the pods-as-dicts readers they need.

The traffic move (make before break) is ``core.traffic.move_traffic``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from .api import AutoscalerStatus, Decision, PoolName, TimeToRoutable
from .autoscaler import (
    Observation,
    ScaleDecision,
    ScalerState,
    ScalingPolicy,
    decide_scale,
    estimate_capacity,
    with_gateway_held,
)
from .autoscaler_pods import PodView, StandbyAssignment, choose_standby
from .control import (
    ANNOTATION_TEMPLATE_HASH,
    ControlStatus,
    autoscaler_persist_key,
    autoscaler_status,
    metrics_condition,
    pool_metrics,
    prewarmed_condition,
    rolled_back_condition,
    rollout_status,
    scaling_condition,
    status_decision,
)
from .forecast import ForecastPolicy
from .idle import ZeroMemory, ZeroPolicy, ZeroTick, dump_zero, step_zero, zero_persist_key
from .resources import ROLE_SERVING, ROLE_STANDBY
from .rollout import (
    PoolObservation,
    RolloutDecision,
    RolloutObservation,
    RolloutState,
    Traffic,
)
from .signals import ObservedPool, pod_ready
from .slo import PoolSignals
from .traffic import pod_live

# (pod, role) label changes.
RoleChange = tuple[str, str]


def pod_annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def ready_of_template(pods: Sequence[Mapping[str, Any]], template_hash: str | None) -> int:
    """Ready pods running ``template_hash`` (None: any template; pods without the annotation,
    made by an older operator, count as running it)."""
    return sum(
        1
        for p in pods
        if pod_live(p)
        and pod_ready(p)
        and (
            template_hash is None
            or pod_annotations(p).get(ANNOTATION_TEMPLATE_HASH, template_hash) == template_hash
        )
    )


def serving_pools(state: RolloutState | None) -> tuple[PoolName, ...]:
    """The pools the autoscaler sizes (and whose signals it reads) for the traffic."""
    if state is None:
        return (PoolName.PRIMARY,)
    if state.traffic is Traffic.SPLIT:
        return (PoolName.PRIMARY, PoolName.BASELINE)
    if state.traffic is Traffic.OVERFLOW:
        return (PoolName.PRIMARY,)
    return (PoolName(state.traffic.value),)


def helping_pools(state: RolloutState | None) -> tuple[PoolName, ...]:
    """Pools that serve beside the sized one without being sized: the baseline in an overflow."""
    if state is not None and state.traffic is Traffic.OVERFLOW:
        return (PoolName.BASELINE,)
    return ()


def first_decision_ready(
    waited_seconds: float,
    timeout_seconds: float,
    deployments_ready: Mapping[PoolName, int],
    pods: Mapping[PoolName, Sequence[Mapping[str, Any]]],
) -> bool:
    """Whether a loop's first decision may be taken: the pod cache shows as many ready pods as
    the Deployments report, or the wait for it ran out.

    A restarted operator's first ticks can come before its watch has listed the pods: a pool
    would look empty, and the autoscaler would take a false idle sample mid-surge.
    """
    return waited_seconds >= timeout_seconds or all(
        ready <= ready_of_template(pods[pool], None)
        for pool, ready in deployments_ready.items()
        if pool in pods
    )


class PoolSeen(Protocol):
    """One pool's signals this tick as the status reads them (``shell.signals.PoolReading``)."""

    @property
    def observed(self) -> ObservedPool: ...

    @property
    def slo(self) -> PoolSignals: ...


@dataclass(frozen=True)
class StatusTick:
    """What the loop's status is computed from: this tick's decisions and readings, and the
    memory it keeps (the last decision written, the measured times-to-routable)."""

    manual_replicas: bool
    serving: tuple[PoolName, ...]
    pools: Mapping[PoolName, PoolSeen]
    observation: Observation
    decision: ScaleDecision | None
    rollout: RolloutDecision | None
    rollout_state: RolloutState | None
    now: datetime
    autoscaler: AutoscalerStatus | None
    routable: Mapping[PoolName, TimeToRoutable]
    promote_seconds: float | None
    pod_problems: tuple[str, ...]
    last_decision: Decision | None
    last_decision_key: tuple[str, int, int] | None


@dataclass(frozen=True)
class StatusChoice:
    """The status to publish; ``decision_key`` to remember; ``new_decision``: this tick's scale
    decision differs from the last one written (the shell counts it)."""

    status: ControlStatus
    decision_key: tuple[str, int, int] | None
    new_decision: bool


def control_status(t: StatusTick) -> StatusChoice:
    """The conditions, per-pool metrics, last decision, rollout and autoscaler memory this tick
    publishes. ``lastDecision`` changes only with the decision's reason or counts."""
    notes = [n for p in t.serving for n in t.pools[p].observed.notes]
    conditions = [
        scaling_condition(t.decision, t.observation, t.manual_replicas),
        prewarmed_condition(t.decision, t.observation),
        metrics_condition(t.decision, notes),
    ]
    if t.rollout is not None:
        conditions.append(rolled_back_condition(t.rollout))
    last, key, new = t.last_decision, t.last_decision_key, False
    if t.decision is not None:
        d = t.decision
        marker = (d.reason, d.desired_serving, d.desired_standby)
        if marker != key or last is None:
            last, key, new = status_decision(d, t.serving[0], t.now), marker, True
    routable = dict(t.routable)
    routable_first = _with_promotion(routable.get(t.serving[0]), t.promote_seconds)
    if routable_first is not None:
        routable[t.serving[0]] = routable_first
    status = ControlStatus(
        conditions=tuple(conditions),
        pool_metrics={
            pool: pool_metrics(
                r.observed.observation, r.slo, r.observed.queue_source, routable.get(pool)
            )
            for pool, r in t.pools.items()
        },
        last_decision=last,
        rollout=(
            rollout_status(t.rollout, t.rollout_state) if t.rollout and t.rollout_state else None
        ),
        autoscaler=t.autoscaler,
        pod_problems=t.pod_problems,
    )
    return StatusChoice(status, key, new)


def _with_promotion(
    routable: TimeToRoutable | None, seconds: float | None
) -> TimeToRoutable | None:
    if seconds is None:
        return routable
    if routable is None:
        return TimeToRoutable(promote_seconds=seconds)
    return routable.model_copy(update={"promote_seconds": seconds})


def choose_roles(
    views: Sequence[PodView], desired_serving: int, desired_standby: int
) -> tuple[StandbyAssignment, tuple[RoleChange, ...]]:
    """One pool's role labels: ``choose_standby``'s promotions and demotions, and every standby
    pod that is neither serving nor kept as standby made to serve again (``choose_standby``
    keeps standby pods beyond the target standby out of both lists)."""
    assignment = choose_standby(views, desired_serving, desired_standby)
    changes = [(n, ROLE_SERVING) for n in assignment.promote]
    changes += [(n, ROLE_STANDBY) for n in assignment.demote]
    keep = set(assignment.serving) | set(assignment.standby)
    changes += [
        (v.name, ROLE_SERVING) for v in views if v.ready and v.standby and v.name not in keep
    ]
    return assignment, tuple(changes)


@dataclass(frozen=True)
class HostTierTick:
    """One pool's standby pods and what is known of their tiers (host-warm standby)."""

    standby: tuple[str, ...]  # the assignment's standby pods
    changes: tuple[RoleChange, ...]
    demote: frozenset[str]  # the demotions the traffic move lets be written now
    urls: Mapping[str, str]  # pod -> its tier URL
    standby_since: Mapping[str, float]  # monotonic
    on_host: frozenset[str]  # on the host tier, or moving there
    now: float  # monotonic
    after_seconds: float


def host_tier_moves(t: HostTierTick) -> tuple[dict[str, float], tuple[str, ...]]:
    """Since when each standby pod is standby, and those to move to the host tier now: once
    out of the Service, ``after_seconds`` after they became standby (endpoints and the clients
    that watch them lag the label). A demotion still waiting for endpoints is not standby yet."""
    held = {n for n, r in t.changes if r == ROLE_STANDBY and n not in t.demote}
    standby = [n for n in t.standby if n not in held]
    since = {n: t.standby_since.get(n, t.now) for n in standby}
    due = tuple(
        n
        for n in standby
        if n not in t.on_host and n in t.urls and t.now - since[n] >= t.after_seconds
    )
    return since, due


@dataclass(frozen=True)
class ZeroInputs:
    """What the way to and from zero decides on besides the autoscaler's inputs (minReplicas 0:
    ``core.idle.step_zero``): its policy and forecast, its memory, the arrivals the gateway
    counted (per gateway pod, and when read), the measured time-to-routable, whether the
    service has served, and how long the loop has run."""

    policy: ZeroPolicy
    forecast: ForecastPolicy
    memory: ZeroMemory
    arrivals: tuple[Mapping[str, int], float] | None = None
    routable_seconds: float | None = None
    quiet_tick_seconds: float = 5.0
    served: bool = True
    waited_seconds: float = math.inf


@dataclass(frozen=True)
class ScaleTick:
    """One tick's autoscaler inputs as one value (:func:`scale_step`): the policy, the serving
    pools' observation and the requests their gateway holds, the autoscaler's memory, the
    status memory last published (and its key), and the zero inputs (None: minReplicas >= 1)."""

    policy: ScalingPolicy
    serving: tuple[PoolName, ...]
    observation: Observation
    held: int
    scaler: ScalerState
    mono: float
    wall: float
    published: AutoscalerStatus | None = None
    published_key: tuple[Any, ...] | None = None
    zero: ZeroInputs | None = None


@dataclass(frozen=True)
class ScaleStep:
    """The decision, the autoscaler's and the zero memory to keep, whether a forecast wake is
    due before the next slow tick, and the autoscaler's memory as status carries it (and its
    key)."""

    decision: ScaleDecision
    scaler: ScalerState
    zero: ZeroMemory | None
    wake_soon: bool
    autoscaler: AutoscalerStatus
    autoscaler_key: tuple[Any, ...]


def scale_step(t: ScaleTick) -> ScaleStep:
    """``decide_scale`` for the serving pools -- through ``core.idle.step_zero`` where the pool
    may reach zero -- and its memory as status carries it.

    What the gateway holds waits for these replicas (queued demand). The status memory is
    rebuilt (its JSON) only when something a restarted operator would decide from has changed
    (`autoscaler_persist_key`): its times move every tick, and writing them would patch every
    service's status every second in a quiet cluster."""
    policy, z = t.policy, t.zero
    zero, wake_soon = None, False
    if z is None:
        observation = with_gateway_held(t.observation, t.held)
        decision, scaler = decide_scale(policy, observation, t.scaler)
    else:
        counted = z.arrivals
        tick = ZeroTick(
            t.mono,
            t.wall,
            t.observation,
            held=t.held,
            arrivals=counted[0] if counted is not None else None,
            arrivals_at=counted[1] if counted is not None else None,
            routable_seconds=z.routable_seconds,
            quiet_tick_seconds=z.quiet_tick_seconds,
            served=z.served,
            waited_seconds=z.waited_seconds,
        )
        step = step_zero(policy, z.policy, z.forecast, z.memory, t.scaler, tick)
        decision, scaler, zero, wake_soon = step.decision, step.scaler, step.memory, step.wake_soon
    key = autoscaler_persist_key(scaler, estimate_capacity(policy, scaler.capacity))
    if zero is not None:
        key = (*key, zero_persist_key(zero))
    autoscaler = t.published
    if autoscaler is None or key != t.published_key:
        dumped = None if z is None or zero is None else dump_zero(z.forecast, zero, t.wall - t.mono)
        autoscaler = autoscaler_status(policy, t.serving, scaler, t.mono, t.wall, dumped)
    return ScaleStep(decision, scaler, zero, wake_soon, autoscaler, key)


def rollout_observation(
    pods: Mapping[PoolName, Sequence[Mapping[str, Any]]],
    slo: Mapping[PoolName, PoolSignals],
    applied_hash: str,
    autoscaler_desired: int,
) -> RolloutObservation:
    """What ``plan_rollout`` judges: each pool's ready replicas (the primary's of the template
    applied) and SLO signals (wall-clock), and the serving replicas the autoscaler asks."""
    return RolloutObservation(
        primary=PoolObservation(
            ready_replicas=ready_of_template(pods[PoolName.PRIMARY], applied_hash),
            signals=slo[PoolName.PRIMARY],
        ),
        baseline=PoolObservation(
            ready_replicas=ready_of_template(pods[PoolName.BASELINE], None),
            signals=slo[PoolName.BASELINE],
        ),
        autoscaler_desired=max(autoscaler_desired, 0),
    )
