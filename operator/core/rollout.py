"""Which pool gets traffic: rollback to a warm baseline on SLO breach, and staged rollout.

This module owns the pure traffic state machine of an InferenceService's two pools, ``primary``
(the new or memory-saving configuration) and ``baseline`` (the validated one), both behind one
Service. The shell calls :func:`plan_rollout` on every reconcile with a :class:`RolloutSpec`
(the parts of ``spec.rollout`` and ``spec.autoscaling`` it needs, plus the primary's template
hash), a :class:`RolloutObservation` (ready replicas and Prometheus signals of both pools, and
the autoscaler's desired replicas) and the :class:`RolloutState` it stored last time. It gets
back a :class:`RolloutDecision` (desired replicas per pool, the pools the Service selects,
whether to hold the primary's new pod template, Events, both pools' SLO verdicts for status)
and the next state. The function is level-triggered and idempotent: it never reads a clock,
every call recomputes the whole desired state, and Events come only from state transitions,
so calling it again with the state it returned emits nothing new.

Traffic (what the Service selects) is ``primary``, ``baseline`` or ``split`` (both pools; the
share is the proportion of ready replicas). Rules:

1. **Never switch to a cold pool.** Before the Service stops selecting a pool, the pool that is
   to take all traffic is scaled to the current load, ``max(autoscaler's desired, ready
   replicas serving now, 1)`` (capped at ``maxReplicas``; for the baseline at least its
   ``minReplicas``) -- action ``prepare-<pool>`` -- and the switch (``flip-to-<pool>``) happens
   only once that many of its replicas are ready. There is no timeout that flips anyway: a
   ``PrepareStalled`` Warning is emitted after ``prepareTimeoutSeconds``.
2. **Rollback.** With ``activePool: auto`` and ``onBreach: rollback``, a primary breach
   sustained for ``slo.for`` (see :mod:`tidal.operator.core.slo`) marks the primary's running
   template hash as rolled back (latched: a recovery while the baseline is being scaled up does
   not cancel it -- the breach was real for a whole window and cancelling invites flapping).
   Traffic then moves to the baseline by rule 1, a ``RolledBack`` Warning carries the breached
   signals and values, and the primary keeps ``controlReplicas`` pods as the control group (its
   signals are still evaluated and reported; note it gets no user traffic behind the Service,
   so its latency signals only exist if something probes it).
3. **No flapping.** Traffic returns to the primary only when the primary's template hash
   changes (a staged rollout of the new spec) or ``activePool`` says so; the control group
   recovering does not move traffic.
4. **Manual wins.** ``activePool: primary|baseline`` overrides the SLO logic (breaches are
   still evaluated and reported as ``SloBreach`` Warnings); the switch still obeys rule 1.
   Pinning the primary accepts its current template (and clears a rollback once it serves);
   back on ``auto``, a still-breached primary rolls back again.
5. **Alert only.** ``onBreach: alert`` reports breaches (``SloBreach``) and never moves
   traffic because of them; a staged rollout then holds at its step while the primary breaches
   instead of aborting.
6. **Staged rollout.** When the primary's template hash differs from the promoted one (and
   ``activePool`` is ``auto``): (a) if primary pods serve traffic, the decision holds the new
   template (``holdPrimaryTemplate``: the shell patches only replicas of the primary
   Deployment) and moves traffic to the baseline by rule 1; (b) ``drainSeconds`` after the
   switch the template is released and the new primary warms up beside the baseline with no
   traffic until it has the first step's replicas ready; (c) traffic moves in ``steps`` (default
   25, 50, 100 percent). Granularity: the share is by **ready replica proportion** behind one
   Service, so with ``N`` = the autoscaler's desired replicas a step of ``p`` percent runs
   ``max(1, round(N*p/100))`` primary and ``max(1, N - that)`` baseline replicas; the real
   share is ``primary / (primary + baseline)`` and is reported (``N = 1`` gives 50 % for every
   intermediate step; kube-proxy balances per connection, so the share is approximate). The
   baseline's *serving* replicas shrink only after the primary's new replicas are ready (no
   capacity dip). A step's
   clock starts when its primary replicas are ready; the next step comes after ``stepSeconds``
   with no primary signal over its objective (pending or sustained) and, unless
   ``advanceWithoutSamples``, with enough samples for p99 and errorRate. The 100 % step selects
   the primary alone (rule 1 applies) and is evaluated for ``stepSeconds`` too before
   ``Promoted``; the baseline keeps its last share until then for a fast abort. (d) A sustained
   breach at any step aborts back to the baseline by rule 2 (``RolloutAborted``). Steps only
   move forward; an abort or a newer spec starts over from the baseline.
   (e) **Rollback reserve.** While the rollout is unproven (from its first step until
   ``Promoted``) the baseline keeps enough ready replicas to carry all the traffic again: the
   ``reserve`` (what the traffic needed when it left the baseline, ``load()`` then) or the
   autoscaler's current ask, whichever is larger. Those beyond its serving share wait as standby
   (``baseline_standby``: ready, out of the Service), so the step's share is unchanged. A move
   back to the baseline (an abort) then needs only ``min(load, reserve)`` ready: it does not wait
   for replicas the autoscaler asked after the rollout began -- a breaching primary's own queue
   inflates that ask -- so the abort flips on the tick its window ends. The cost: up to
   ``reserve`` extra baseline replicas for the length of the rollout (``len(steps) *
   stepSeconds`` and the warm-ups) instead of a baseline shrunk to its share.
7. **Drain.** A pool that just stopped receiving traffic keeps its ready replicas for
   ``drainSeconds`` before it shrinks or its template changes, so connections that were routed
   to it before the endpoints update can finish (zero failed requests during a switch).
8. **Overflow** (``spec.rollout.baseline.overflow``, opt-in). While the promoted primary serves
   alone (``activePool: auto``, no rollout or rollback under way) and is short of replicas --
   the autoscaler asks more than are ready, so a surge's new capacity is still warming -- the
   Service also selects the baseline's ready replicas (traffic ``overflow``): they are warm and
   already paid for. Only while the baseline's own SLO verdict is clean (no pending or
   sustained breach) and it has a ready replica; never within ``drainSeconds`` of the last
   switch (no flapping). The overflow ends (``OverflowEnded``) as soon as the primary has the
   replicas the autoscaler asks, or the baseline breaches or has none ready; the baseline then
   drains by rule 7. The baseline is not scaled for it (new baseline replicas would be no
   warmer than the primary's); it keeps its ready replicas while it serves. The autoscaler
   goes on sizing the primary for all of the service's traffic.

Times are seconds on the shell's clock (wall time if the state is persisted in status and must
survive an operator restart).
"""

from __future__ import annotations

import math
from enum import StrEnum
from itertools import pairwise
from typing import Any

from pydantic import Field, field_validator, model_validator

# The API's enums, under the names this module has always used.
from .api import ActivePool
from .api import PoolName as Pool
from .slo import (
    BreachAction,
    Frozen,
    PoolSignals,
    Signal,
    SignalReading,
    SignalStatus,
    SloPolicy,
    SloState,
    SloVerdict,
    evaluate_slo,
)

__all__ = [
    "Action",
    "ActivePool",
    "EventType",
    "Phase",
    "Pool",
    "PoolCounts",
    "PoolObservation",
    "RollbackRecord",
    "RolloutDecision",
    "RolloutEvent",
    "RolloutObservation",
    "RolloutSpec",
    "RolloutState",
    "Traffic",
    "initial_state",
    "plan_rollout",
    "step_shares",
]


class Traffic(StrEnum):
    """What the Service selects: one pool, or both (a staged rollout step)."""

    PRIMARY = "primary"
    BASELINE = "baseline"
    SPLIT = "split"
    OVERFLOW = "overflow"  # the primary, and the baseline's ready replicas while it is short


class Action(StrEnum):
    STEADY = "steady"
    PREPARE_BASELINE = "prepare-baseline"
    FLIP_TO_BASELINE = "flip-to-baseline"
    PREPARE_PRIMARY = "prepare-primary"
    FLIP_TO_PRIMARY = "flip-to-primary"
    DRAIN = "drain"  # waiting before the pool that lost traffic changes
    WARM_PRIMARY = "warm-primary"  # new primary coming up beside the baseline, no traffic
    ADVANCE_STEP = "advance-step"
    EVALUATE_STEP = "evaluate-step"
    PROMOTE = "promote"
    OVERFLOW = "overflow"  # the baseline takes part of a surge while the primary warms


class Phase(StrEnum):
    """One word for status: where the rollout stands."""

    STABLE = "Stable"  # primary serves its promoted template
    PREPARING = "Preparing"  # scaling a pool up before a switch
    ROLLED_BACK = "RolledBack"  # baseline serves because the primary breached
    PROGRESSING = "Progressing"  # staged rollout of a new primary template
    PINNED = "Pinned"  # activePool pins a pool
    OVERFLOW = "Overflow"  # the baseline's ready replicas help a primary short of capacity


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class RolloutEvent(Frozen):
    """A Kubernetes Event to emit on the InferenceService."""

    type: EventType
    reason: str
    message: str


class PoolCounts(Frozen):
    primary: int = Field(ge=0)
    baseline: int = Field(ge=0)

    def of(self, pool: Pool) -> int:
        return self.primary if pool is Pool.PRIMARY else self.baseline


class RolloutSpec(Frozen):
    """What :func:`plan_rollout` needs from the spec; the shell builds it from the resource."""

    slo: SloPolicy = SloPolicy()
    active_pool: ActivePool = ActivePool.AUTO
    primary_hash: str = Field(min_length=1, description="Hash of the primary's pod template.")
    baseline_min_replicas: int = Field(
        default=1, ge=0, description="Warm baseline replicas while it serves no traffic."
    )
    control_replicas: int = Field(
        default=1, ge=0, description="Primary replicas kept as control group after rollback."
    )
    max_replicas: int | None = Field(default=None, ge=1, description="Cap on a pool's size.")
    steps: tuple[int, ...] = Field(
        default=(25, 50, 100), description="Primary's share of serving replicas, percent."
    )
    step_seconds: float = Field(default=60.0, ge=0, description="Evaluation time per step.")
    drain_seconds: float = Field(
        default=10.0, ge=0, description="A pool that lost traffic keeps its size this long."
    )
    prepare_timeout_seconds: float = Field(
        default=300.0, gt=0, description="Warn when a pool takes longer to become ready."
    )
    advance_without_samples: bool = Field(
        default=False, description="Advance steps without p99/errorRate samples."
    )
    overflow: bool = Field(
        default=False,
        description="The baseline's ready replicas share a surge while the primary is short.",
    )

    @field_validator("steps", mode="before")
    @classmethod
    def _steps_from_list(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _steps_increase_to_100(self) -> RolloutSpec:
        s = self.steps
        if not s or s[-1] != 100 or any(not 0 < p <= 100 for p in s):
            raise ValueError("steps must be percentages in (0, 100] ending with 100")
        if any(a >= b for a, b in pairwise(s)):
            raise ValueError("steps must increase strictly")
        return self


class PoolObservation(Frozen):
    """One pool as the shell sees it.

    ``ready_replicas`` counts ready pods running the pool's *current* template (for the primary:
    ``applied_primary_hash`` of the last decision); pods of an older template do not count.
    ``template_hash``, when the shell knows it, names the template those pods run; a primary
    count for another template than the applied one is read as zero ready. ``signals`` come
    from Prometheus, scoped to the pool's current pods where possible.
    """

    ready_replicas: int = Field(default=0, ge=0)
    template_hash: str | None = None
    signals: PoolSignals = PoolSignals()


class RolloutObservation(Frozen):
    primary: PoolObservation = PoolObservation()
    baseline: PoolObservation = PoolObservation()
    autoscaler_desired: int = Field(
        default=1, ge=0, description="Replicas the autoscaler wants for the service's traffic."
    )

    def pool(self, pool: Pool) -> PoolObservation:
        return self.primary if pool is Pool.PRIMARY else self.baseline


class RollbackRecord(Frozen):
    """Why the primary was rolled back: the evidence for ``RolledBack`` and its Event."""

    primary_hash: str
    reason: str
    breaches: tuple[SignalReading, ...]
    decided_at: float
    switched_at: float | None = None  # when the Service stopped selecting the primary
    during_rollout: bool = False  # an aborted staged rollout rather than a regression


class RolloutState(Frozen):
    """What :func:`plan_rollout` remembers; persist it (e.g. in status) as is."""

    traffic: Traffic
    applied_hash: str  # primary template the Deployment has been allowed to carry
    promoted_hash: str | None = None  # primary template accepted to serve alone
    step: int | None = None  # index into spec.steps while a staged rollout serves traffic
    step_ready_at: float | None = None  # when the current step's replicas were all ready
    switched_at: float | None = None  # last change of what the Service selects
    previous_traffic: Traffic | None = None
    preparing: Pool | None = None
    preparing_since: float | None = None
    prepare_warned: bool = False
    rollback: RollbackRecord | None = None
    reserve: int | None = None  # rule 6e: baseline replicas kept ready while a rollout is unproven
    primary_slo: SloState = SloState()
    baseline_slo: SloState = SloState()


class RolloutDecision(Frozen):
    """What the shell should make true now, and why."""

    action: Action
    reason: str
    phase: Phase
    traffic: Traffic
    service_pools: tuple[Pool, ...]  # pools the Service selects
    desired_replicas: PoolCounts
    serving_replicas: PoolCounts  # replicas meant to serve behind the Service, per pool
    baseline_standby: int = 0  # rule 6e: baseline replicas kept ready but out of the Service
    primary_traffic_percent: float  # expected share by replica proportion
    applied_primary_hash: str  # template the primary Deployment should carry
    hold_primary_template: bool  # True: leave the primary's pod template as it is
    step: int | None = None  # index into spec.steps
    step_percent: int | None = None
    rollback: RollbackRecord | None = None  # set while traffic is off a rolled-back primary
    primary_slo: SloVerdict
    baseline_slo: SloVerdict
    events: tuple[RolloutEvent, ...] = ()
    # When the primary's earliest pending breach will have lasted `slo.for` (same clock as
    # `now`): the shell evaluates again at that moment, so a rollback waits for no tick.
    verdict_due_at: float | None = None


def initial_state(spec: RolloutSpec) -> RolloutState:
    """State for a service seen for the first time: its first template is accepted as is.

    A staged rollout needs something validated to compare with; on creation nothing is.
    """
    pinned_baseline = spec.active_pool is ActivePool.BASELINE
    return RolloutState(
        traffic=Traffic.BASELINE if pinned_baseline else Traffic.PRIMARY,
        applied_hash=spec.primary_hash,
        promoted_hash=spec.primary_hash,
    )


def step_shares(total: int, percent: int) -> PoolCounts:
    """Serving replicas per pool for a step of ``percent`` with ``total`` desired replicas."""
    total = max(total, 1)
    if percent >= 100:
        return PoolCounts(primary=total, baseline=0)
    primary = max(1, math.floor(total * percent / 100 + 0.5))
    return PoolCounts(primary=primary, baseline=max(1, total - primary))


def _pools_of(traffic: Traffic) -> tuple[Pool, ...]:
    if traffic is Traffic.SPLIT or traffic is Traffic.OVERFLOW:
        return (Pool.PRIMARY, Pool.BASELINE)
    return (Pool(traffic.value),)


def _traffic_of(pool: Pool) -> Traffic:
    return Traffic(pool.value)


class _Plan:
    """Mutable scratchpad of one :func:`plan_rollout` call (never escapes it)."""

    def __init__(
        self, spec: RolloutSpec, obs: RolloutObservation, state: RolloutState, now: float
    ) -> None:
        self.spec, self.obs, self.now = spec, obs, now
        self.state = state
        self.events: list[RolloutEvent] = []
        self.action = Action.STEADY
        self.reason = ""
        self.preparing: Pool | None = None
        self.prepare_target = 0
        self.warm_target = 0  # replicas of a new primary warming beside the baseline
        self.released = False  # the primary's template changed in this call

    def ready(self, pool: Pool) -> int:
        seen = self.obs.pool(pool)
        # Ready pods of a template the primary no longer carries serve nothing we want.
        if pool is Pool.PRIMARY and (
            self.released or seen.template_hash not in (None, self.state.applied_hash)
        ):
            return 0
        return seen.ready_replicas

    def update(self, **changes: Any) -> None:
        self.state = self.state.model_copy(update=changes)

    def event(self, type_: EventType, reason: str, message: str) -> None:
        self.events.append(RolloutEvent(type=type_, reason=reason, message=message))

    def load(self) -> int:
        """Replicas the traffic needs now: what the autoscaler asks or what serves it now."""
        if self.state.traffic is Traffic.SPLIT:
            # Count the step's shares, not ready pods: the pool being scaled up for the next
            # switch is itself serving, and counting it would chase its own growth.
            index = min(self.state.step or 0, len(self.spec.steps) - 1)
            share = step_shares(self.obs.autoscaler_desired, self.spec.steps[index])
            serving = share.primary + share.baseline
        elif self.state.traffic is Traffic.OVERFLOW:
            # What the primary must carry alone when the overflow ends.
            serving = self.ready(Pool.PRIMARY)
        else:
            serving = self.ready(Pool(self.state.traffic.value))
        need = max(self.obs.autoscaler_desired, serving, 1)
        if self.spec.max_replicas is not None:
            need = min(need, self.spec.max_replicas)
        return need

    def required(self, pool: Pool) -> int:
        need = self.load()
        if pool is Pool.PRIMARY:
            return need
        st = self.state
        reserve = st.reserve if st.applied_hash != st.promoted_hash else None
        if reserve is not None:
            # Rule 6e: back to the baseline the rollout left, as soon as it has what carried the
            # traffic then -- not what the autoscaler asks since (a breaching primary's queue).
            need = min(need, reserve)
        return max(need, self.spec.baseline_min_replicas)

    def switch(self, to: Traffic, action: Action, reason: str) -> None:
        if to is Traffic.BASELINE:
            self.update(reserve=None)  # the baseline carries everything again
        self.update(
            previous_traffic=self.state.traffic,
            traffic=to,
            switched_at=self.now,
            preparing=None,
            preparing_since=None,
            prepare_warned=False,
        )
        self.action, self.reason = action, reason

    def move_all_to(self, pool: Pool, why: str) -> bool:
        """Rule 1: scale ``pool`` to the load, then select it alone. True once it serves alone."""
        target = _traffic_of(pool)
        if self.state.traffic is target:
            return True
        need = self.required(pool)
        ready = self.ready(pool)
        if ready >= need:
            flip = Action.FLIP_TO_PRIMARY if pool is Pool.PRIMARY else Action.FLIP_TO_BASELINE
            self.switch(target, flip, f"{flip.value}: {ready}/{need} ready; {why}")
            return False
        prepare = Action.PREPARE_PRIMARY if pool is Pool.PRIMARY else Action.PREPARE_BASELINE
        self.action = prepare
        self.reason = f"{prepare.value}: {ready}/{need} ready; {why}"
        self.preparing, self.prepare_target = pool, need
        if self.state.preparing is not pool:
            self.update(preparing=pool, preparing_since=self.now, prepare_warned=False)
            self.event(
                EventType.NORMAL,
                "Preparing",
                f"scaling {pool.value} to {need} replicas ({ready} ready) before it takes "
                f"all traffic: {why}",
            )
        since = self.state.preparing_since if self.state.preparing_since is not None else self.now
        if not self.state.prepare_warned and self.now - since >= self.spec.prepare_timeout_seconds:
            self.update(prepare_warned=True)
            self.event(
                EventType.WARNING,
                "PrepareStalled",
                f"{pool.value} has {ready}/{need} ready replicas after "
                f"{self.now - since:.0f}s; traffic stays where it is: {why}",
            )
        return False

    def draining(self) -> bool:
        at = self.state.switched_at
        return at is not None and self.now - at < self.spec.drain_seconds


def _clean(verdict: SloVerdict, spec: RolloutSpec) -> tuple[bool, str]:
    """Whether a step may advance on this verdict, and if not why."""
    if verdict.breaching:
        return False, verdict.reason
    if not spec.advance_without_samples:
        for signal in (Signal.P99, Signal.ERROR_RATE):
            reading = verdict.reading(signal)
            if reading.status not in (SignalStatus.OK, SignalStatus.DISABLED):
                return False, f"waiting for samples: {verdict.reason}"
    return True, verdict.reason


def plan_rollout(
    spec: RolloutSpec,
    observation: RolloutObservation,
    state: RolloutState | None,
    now: float,
) -> tuple[RolloutDecision, RolloutState]:
    """Decide traffic and pool sizes at ``now``; return the decision and the state to keep."""
    plan = _Plan(spec, observation, state or initial_state(spec), now)
    st = plan.state

    pv, primary_slo = evaluate_slo(spec.slo, observation.primary.signals, st.primary_slo, now)
    bv, baseline_slo = evaluate_slo(spec.slo, observation.baseline.signals, st.baseline_slo, now)
    plan.update(primary_slo=primary_slo, baseline_slo=baseline_slo)
    for pool, verdict in ((Pool.PRIMARY, pv), (Pool.BASELINE, bv)):
        if verdict.onset:
            plan.event(
                EventType.WARNING,
                "SloBreach",
                f"{pool.value} pool: {verdict.reason} (onBreach={spec.slo.on_breach.value}, "
                f"activePool={spec.active_pool.value})",
            )

    _latch_rollback(plan, pv)
    _plan_traffic(plan, pv, bv)
    if plan.preparing is None and plan.state.preparing is not None:
        plan.update(preparing=None, preparing_since=None, prepare_warned=False)

    # A switch that took traffic off a rolled-back primary is the rollback itself.
    rb = plan.state.rollback
    if (
        rb is not None
        and rb.switched_at is None
        and plan.state.traffic is Traffic.BASELINE
        and plan.action is Action.FLIP_TO_BASELINE
    ):
        rb = rb.model_copy(update={"switched_at": now})
        plan.update(rollback=rb)
        plan.event(
            EventType.WARNING,
            "RolledBack",
            f"traffic moved to the baseline; primary {rb.primary_hash}: {rb.reason}",
        )

    return _decide(plan, pv, bv), plan.state


def _latch_rollback(plan: _Plan, pv: SloVerdict) -> None:
    """Rule 2: latch the rollback of the template that breached."""
    spec, now, rollback = plan.spec, plan.now, plan.state.rollback
    if not (
        spec.active_pool is ActivePool.AUTO
        and spec.slo.on_breach is BreachAction.ROLLBACK
        and pv.breached
        and (rollback is None or rollback.primary_hash != plan.state.applied_hash)
    ):
        return
    during_rollout = plan.state.applied_hash != plan.state.promoted_hash
    # A primary that serves nothing (warming beside the baseline) is rolled back as is.
    off = plan.state.traffic is Traffic.BASELINE
    rollback = RollbackRecord(
        primary_hash=plan.state.applied_hash,
        reason=pv.reason,
        breaches=pv.breaches,
        decided_at=now,
        switched_at=now if off else None,
        during_rollout=during_rollout,
    )
    plan.update(rollback=rollback)
    plan.event(
        EventType.WARNING,
        "RolloutAborted" if during_rollout else "RollingBack",
        f"primary {plan.state.applied_hash} {pv.reason}; "
        + ("traffic stays on the baseline" if off else "moving traffic to the baseline"),
    )


def _plan_traffic(plan: _Plan, pv: SloVerdict, bv: SloVerdict) -> None:
    spec, st = plan.spec, plan.state
    rollback = st.rollback

    if spec.active_pool is ActivePool.PRIMARY:
        if st.applied_hash != spec.primary_hash:
            # The user pinned the primary: its new template rolls out directly.
            plan.update(applied_hash=spec.primary_hash, primary_slo=SloState(), step=None)
            plan.released = True
        if plan.move_all_to(Pool.PRIMARY, "activePool=primary"):
            plan.update(promoted_hash=spec.primary_hash, rollback=None, step=None, reserve=None)
            plan.action, plan.reason = Action.STEADY, f"pinned:primary; slo {pv.reason}"
        return

    # The primary's pods must not change while they serve: traffic leaves them first (rule 6a).
    if st.applied_hash != spec.primary_hash:
        if not plan.move_all_to(Pool.BASELINE, f"primary template {spec.primary_hash} pending"):
            return
        if plan.draining():
            plan.action = Action.DRAIN
            plan.reason = "drain: waiting before updating the primary template"
            return
        plan.update(applied_hash=spec.primary_hash, primary_slo=SloState(), step=None)
        plan.released = True
        if spec.active_pool is ActivePool.AUTO and spec.primary_hash != st.promoted_hash:
            plan.event(
                EventType.NORMAL,
                "RolloutStarted",
                f"primary template {spec.primary_hash}: warming beside the baseline, then "
                f"steps {', '.join(f'{p}%' for p in spec.steps)}",
            )

    if spec.active_pool is ActivePool.BASELINE:
        if plan.move_all_to(Pool.BASELINE, "activePool=baseline"):
            plan.action, plan.reason = Action.STEADY, f"pinned:baseline; slo {pv.reason}"
        return

    # auto
    rollback = plan.state.rollback
    if rollback is not None and rollback.primary_hash == spec.primary_hash:
        why = f"rollback: {rollback.reason}"
        if plan.move_all_to(Pool.BASELINE, why):
            plan.action, plan.reason = Action.STEADY, f"rolled-back: {rollback.reason}"
        return
    if spec.primary_hash == plan.state.promoted_hash:
        if _plan_overflow(plan, bv):
            return
        if plan.move_all_to(Pool.PRIMARY, "primary template is promoted (activePool=auto)"):
            plan.action, plan.reason = Action.STEADY, f"stable; slo {pv.reason}"
        return
    _plan_steps(plan, pv)


def _plan_overflow(plan: _Plan, bv: SloVerdict) -> bool:
    """Rule 8: whether the baseline shares the traffic now (True: this call decided traffic).

    Called only while the promoted primary template is the spec's and nothing pins a pool.
    """
    spec, st = plan.spec, plan.state
    if st.traffic is not Traffic.OVERFLOW and st.traffic is not Traffic.PRIMARY:
        return False
    primary, baseline = plan.ready(Pool.PRIMARY), plan.ready(Pool.BASELINE)
    need = plan.load()
    short = need - primary
    if st.traffic is Traffic.OVERFLOW:
        if not spec.overflow:
            why = "overflow disabled"
        elif bv.breaching:
            why = f"baseline {bv.reason}"
        elif baseline == 0:
            why = "no ready baseline replica"
        elif short <= 0:
            why = f"primary has {primary}/{need} ready"
        else:
            plan.action = Action.OVERFLOW
            plan.reason = (
                f"overflow: primary {primary}/{need} ready; the baseline's {baseline} ready "
                "replicas share the traffic"
            )
            return True
        plan.switch(Traffic.PRIMARY, Action.FLIP_TO_PRIMARY, f"overflow ended: {why}")
        plan.event(EventType.NORMAL, "OverflowEnded", f"the primary serves alone again: {why}")
        return True
    if not spec.overflow or short < 1 or baseline < 1 or bv.breaching or plan.draining():
        return False
    reason = (
        f"overflow: primary {primary}/{need} ready; the baseline's {baseline} ready replicas "
        "share the traffic while the primary's warm"
    )
    plan.switch(Traffic.OVERFLOW, Action.OVERFLOW, reason)
    plan.event(
        EventType.NORMAL,
        "Overflow",
        f"primary short of {short} replicas ({primary}/{need} ready): the baseline's {baseline} "
        f"ready replicas share the traffic until they are ready; baseline slo {bv.reason}",
    )
    return True


def _plan_steps(plan: _Plan, pv: SloVerdict) -> None:
    """Rule 6: the applied primary template is new; move traffic to it step by step."""
    spec, obs, now = plan.spec, plan.obs, plan.now
    steps, st = spec.steps, plan.state
    total = max(obs.autoscaler_desired, 1)
    ok, why = _clean(pv, spec)
    primary_ready = plan.ready(Pool.PRIMARY)

    if st.traffic is Traffic.BASELINE:
        _warm_first_step(plan, pv, total)
        return

    if st.traffic is Traffic.PRIMARY:
        index = len(steps) - 1
        if st.step_ready_at is None:
            plan.update(step_ready_at=now)
    else:
        # A split serves an intermediate step; clamp if the spec's steps changed meanwhile.
        index = min(st.step or 0, len(steps) - 1)
        if steps[index] == 100:
            plan.move_all_to(Pool.PRIMARY, f"rollout step {index + 1}/{len(steps)} 100%")
            if plan.state.traffic is Traffic.PRIMARY:
                plan.update(step=index, step_ready_at=now)
            return
    percent = steps[index]
    target = step_shares(total, percent)

    if st.traffic is Traffic.SPLIT and st.step_ready_at is None and primary_ready >= target.primary:
        plan.update(step_ready_at=now)
    at = plan.state.step_ready_at
    elapsed = 0.0 if at is None else max(now - at, 0.0)
    label = f"{index + 1}/{len(steps)} {percent}%"
    if at is None:
        waiting = f"waiting for {target.primary} ready primary replicas ({primary_ready} ready)"
        _evaluating(plan, index, f"evaluate-step {label}: {waiting}")
        return
    # Once the primary is being scaled for the 100 % step, a pending signal or a thin sample
    # does not shrink it again (that would flap pod counts); a sustained breach still stops it
    # (rollback: through the abort; alert: it holds here).
    committed = plan.state.preparing is Pool.PRIMARY and not pv.breached
    if elapsed < spec.step_seconds or not (ok or committed):
        held = f"{elapsed:.0f}s of {spec.step_seconds:.0f}s; {why}"
        _evaluating(plan, index, f"evaluate-step {label}: {held}")
        return

    if st.traffic is Traffic.PRIMARY:  # the 100 % step passed: promote
        plan.update(
            promoted_hash=plan.state.applied_hash,
            rollback=None,
            step=None,
            step_ready_at=None,
            reserve=None,
        )
        plan.action = Action.PROMOTE
        plan.reason = f"promote: primary {plan.state.applied_hash} passed {len(steps)} steps"
        plan.event(EventType.NORMAL, "Promoted", plan.reason)
        return
    _advance_step(plan, index + 1, total)


def _evaluating(plan: _Plan, index: int, reason: str) -> None:
    """The step ``index`` is being evaluated (its replicas, its time, its signals)."""
    plan.action = Action.EVALUATE_STEP
    plan.reason = reason
    plan.update(step=index)


def _warm_first_step(plan: _Plan, pv: SloVerdict, total: int) -> None:
    """Warming: the new primary gets the first step's replicas, no traffic yet. Without
    traffic there are no latency samples, so only a signal over its objective (GPU memory
    headroom, cold start of the warm-up) holds it back; then the first step takes traffic."""
    steps, now, primary_ready = plan.spec.steps, plan.now, plan.ready(Pool.PRIMARY)
    first = steps[0]
    need = plan.required(Pool.PRIMARY) if first == 100 else step_shares(total, first).primary
    plan.warm_target = need
    if primary_ready < need or pv.breaching:
        plan.action = Action.WARM_PRIMARY
        plan.reason = f"warm-primary: {primary_ready}/{need} ready for {first}%; slo {pv.reason}"
        return
    to = Traffic.PRIMARY if first == 100 else Traffic.SPLIT
    reserve = plan.load()  # what the baseline carries alone now (rule 6e)
    plan.switch(to, Action.ADVANCE_STEP, f"advance-step: 1/{len(steps)} {first}%")
    plan.update(step=0, step_ready_at=now, reserve=reserve)  # replicas ready: checked above
    plan.event(EventType.NORMAL, "RolloutStep", _step_message(0, steps, total))


def _advance_step(plan: _Plan, following: int, total: int) -> None:
    """A step passed: the next one (the 100 % step flips the Service to the primary)."""
    steps, now = plan.spec.steps, plan.now
    if steps[following] == 100:
        plan.move_all_to(Pool.PRIMARY, f"rollout step {following + 1}/{len(steps)} 100%")
        if plan.state.traffic is Traffic.PRIMARY:  # flipped just now
            plan.update(step=following, step_ready_at=now)
            plan.event(EventType.NORMAL, "RolloutStep", _step_message(following, steps, total))
        return
    plan.update(step=following, step_ready_at=None)
    plan.action = Action.ADVANCE_STEP
    plan.reason = f"advance-step: {following + 1}/{len(steps)} {steps[following]}%"
    plan.event(EventType.NORMAL, "RolloutStep", _step_message(following, steps, total))


def _step_message(index: int, steps: tuple[int, ...], total: int) -> str:
    shares = step_shares(total, steps[index])
    real = 100 * shares.primary / (shares.primary + shares.baseline)
    return (
        f"step {index + 1}/{len(steps)}: {steps[index]}% -> {shares.primary} primary, "
        f"{shares.baseline} baseline serving replicas ({real:.0f}% of traffic)"
    )


def _decide(plan: _Plan, pv: SloVerdict, bv: SloVerdict) -> RolloutDecision:
    spec, st = plan.spec, plan.state
    desired, serving, baseline_standby = _counts(plan)
    percent = _primary_percent(plan, serving)
    phase, rollback = _phase(plan)
    rolling = st.applied_hash != st.promoted_hash and st.traffic is not Traffic.BASELINE
    step = st.step if rolling else None
    return RolloutDecision(
        action=plan.action,
        reason=plan.reason or f"{plan.action.value}; slo {pv.reason}",
        phase=phase,
        traffic=st.traffic,
        service_pools=_pools_of(st.traffic),
        desired_replicas=desired,
        serving_replicas=serving,
        baseline_standby=min(baseline_standby, desired.baseline),
        primary_traffic_percent=percent,
        applied_primary_hash=st.applied_hash,
        hold_primary_template=st.applied_hash != spec.primary_hash,
        step=step,
        step_percent=None if step is None else spec.steps[min(step, len(spec.steps) - 1)],
        rollback=rollback,
        primary_slo=pv,
        baseline_slo=bv,
        events=tuple(plan.events),
        verdict_due_at=min(
            (
                r.breaching_since + spec.slo.for_seconds
                for r in pv.with_status(SignalStatus.PENDING)
                if r.breaching_since is not None
            ),
            default=None,
        ),
    )


def _counts(plan: _Plan) -> tuple[PoolCounts, PoolCounts, int]:
    """The replicas each pool is to have, those that serve, and the baseline's standby (the
    rest of the rollback reserve during a split step)."""
    spec, obs, st = plan.spec, plan.obs, plan.state
    n = obs.autoscaler_desired
    cap = spec.max_replicas

    def capped(value: int) -> int:
        return min(value, cap) if cap is not None else value

    unproven = st.applied_hash != st.promoted_hash and spec.active_pool is ActivePool.AUTO
    reserve = max(st.reserve or 0, n) if unproven and st.reserve is not None else 0
    baseline_standby = 0
    if st.traffic is Traffic.SPLIT:
        index = st.step if st.step is not None else 0
        share = step_shares(n, spec.steps[index])
        serving = share
        # Surge first: the baseline serves less only as the primary's new replicas are ready.
        baseline = max(share.baseline, max(n, 1) - plan.ready(Pool.PRIMARY))
        # Rule 6e: the rest of the reserve stays ready as standby, out of the Service.
        baseline_standby = max(reserve - baseline, 0)
        desired = PoolCounts(primary=share.primary, baseline=baseline + baseline_standby)
    elif st.traffic is Traffic.OVERFLOW:
        # The baseline keeps what serves now: it is not grown for a surge, nor shrunk in one.
        helping = obs.baseline.ready_replicas
        serving = PoolCounts(primary=n, baseline=helping)
        desired = PoolCounts(primary=n, baseline=max(helping, spec.baseline_min_replicas))
    elif st.traffic is Traffic.PRIMARY:
        serving = PoolCounts(primary=n, baseline=0)
        standby = spec.baseline_min_replicas
        if st.step is not None and st.promoted_hash != st.applied_hash:
            # 100 % step under evaluation: the baseline keeps its last share for a fast abort.
            last = spec.steps[-2] if len(spec.steps) > 1 else 0
            standby = max(standby, n if last == 0 else step_shares(n, last).baseline, reserve)
        desired = PoolCounts(primary=n, baseline=standby)
    else:
        serving = PoolCounts(primary=0, baseline=n)
        primary = max(spec.control_replicas, plan.warm_target)
        desired = PoolCounts(primary=primary, baseline=max(n, spec.baseline_min_replicas))

    # Rule 1: the pool being prepared grows to the load before it takes traffic.
    if plan.preparing is not None:
        desired = desired.model_copy(
            update={plan.preparing.value: max(desired.of(plan.preparing), plan.prepare_target)}
        )
    # Rule 7: the pool that just lost traffic keeps its ready replicas while it drains.
    if plan.draining() and st.previous_traffic is not None:
        for pool in set(_pools_of(st.previous_traffic)) - set(_pools_of(st.traffic)):
            keep = max(desired.of(pool), obs.pool(pool).ready_replicas)  # any template
            desired = desired.model_copy(update={pool.value: keep})
    desired = PoolCounts(primary=capped(desired.primary), baseline=capped(desired.baseline))
    return desired, serving, baseline_standby


def _primary_percent(plan: _Plan, serving: PoolCounts) -> float:
    """The primary's share of the traffic (an overflow's by the replicas that are ready)."""
    st = plan.state
    total_serving = serving.primary + serving.baseline
    percent = 100.0 * serving.primary / total_serving if total_serving else 0.0
    if st.traffic is Traffic.OVERFLOW:  # by the replicas that are ready, not those asked
        ready_p, ready_b = plan.ready(Pool.PRIMARY), plan.ready(Pool.BASELINE)
        percent = 100.0 * ready_p / (ready_p + ready_b) if ready_p + ready_b else 0.0
    if st.traffic is Traffic.PRIMARY:
        percent = 100.0
    elif st.traffic is Traffic.BASELINE:
        percent = 0.0
    return percent


def _phase(plan: _Plan) -> tuple[Phase, RollbackRecord | None]:
    """The rollout's phase, and the rollback it reports (only while rolled back)."""
    spec, st = plan.spec, plan.state
    rollback = st.rollback
    rolled_back = (
        st.traffic is Traffic.BASELINE
        and rollback is not None
        and rollback.switched_at is not None
        and rollback.primary_hash == st.applied_hash
    )
    aborting = st.rollback is not None and st.rollback.primary_hash == st.applied_hash
    rolling_out = spec.active_pool is ActivePool.AUTO and (
        st.applied_hash != st.promoted_hash or st.applied_hash != spec.primary_hash
    )
    if rolled_back:
        phase = Phase.ROLLED_BACK
    elif plan.preparing is not None and (aborting or not rolling_out):
        phase = Phase.PREPARING
    elif spec.active_pool is not ActivePool.AUTO:
        phase = Phase.PINNED
    elif st.traffic is Traffic.OVERFLOW:
        phase = Phase.OVERFLOW
    elif rolling_out:
        phase = Phase.PROGRESSING
    else:
        phase = Phase.STABLE
    if not rolled_back:
        rollback = None
    return phase, rollback
