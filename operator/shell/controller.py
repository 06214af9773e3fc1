"""The per-InferenceService control loop: observe every tick, decide, hand the result over.

This module owns the loop that runs beside the level-triggered reconciler, one asyncio task per
InferenceService (started by the watch handlers, stopped when the object is deleted or gone
from the store). Each tick (``tick_seconds``, at most 1 s):

1. observe each pool from the pods the watch keeps (``SignalCollector.observe_pool``: direct pod
   scrapes for the queue, the shared Prometheus round for latencies and errors);
2. ``decide_scale`` for the pool(s) the Service routes to (state in memory per traffic set,
   written to ``status.autoscaler`` every status write and restored from it by a restarted
   operator, so it resumes mid-surge with its learned capacity and windows);
3. ``plan_rollout`` when a baseline is configured, on wall-clock seconds, its state restored
   from ``status.rollout.state`` so a restarted operator resumes;
4. relabel pods ``serving``/``standby`` (``choose_standby``; a surge promotes standby pods at
   once, before any new pod is asked for) and, before a scale-down, set each pod's
   ``controller.kubernetes.io/pod-deletion-cost`` so the ReplicaSet removes the cheapest;
   every traffic move is make-before-break (``core.traffic.plan_traffic``): what it adds is
   written at once, what it takes away (a pool the Service stops selecting, demotions, a routed
   pool's scale-down) waits until the Service's EndpointSlices list the pods that stay;
5. publish a :class:`~tidal.operator.core.control.ControlView` (replicas per pool, the pool the
   Service selects, the status fields this loop owns) for the reconciler, and enqueue a
   reconcile when the children must change (at once) or the status did (at most once per
   ``status_interval``); post an Event for each scale and each traffic switch.

``Controller.tick`` reads as these steps, each taking the loop's memory (``ServiceState``) and
one value, each decision a ``core`` function over one frozen tick value (``core.loop``,
``core.traffic.move_traffic``): ``_read_signals`` (1) gives a ``TickReading``; ``_decide`` (2, 3:
``core.loop.scale_step``, ``plan_rollout``) a ``Decided``; ``_plan`` (4: ``core.loop.choose_roles``,
``move_traffic``) a ``Plan``, which ``_apply_pods`` (the pod writes of ``shell.pods``),
``_publish_view`` (5: ``core.loop.control_status``), ``_settle`` and ``_post_events`` write.

Pod patches are JSON merge patches of metadata only (field manager ``tidal-operator-pods``); the
ReplicaSet selects on isvc and pool, never on the role label, so it never fights them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ...common.clock import CLOCK, Clock
from ..core.api import (
    LABEL_POOL,
    AutoscalerStatus,
    InferenceService,
    InferenceServiceStatus,
    PoolName,
    StandbyTier,
    TimeToRoutable,
)
from ..core.autoscaler import (
    Observation,
    ScaleDecision,
    ScalerState,
    ScalingPolicy,
)
from ..core.builds import raw_build_refs
from ..core.control import (
    ControlView,
    combine_observations,
    initial_scaler_state,
    overflow_observation,
    plan_children,
    primary_template_hash,
    provisional_view,
    restore_rollout_state,
    restore_scaler_state,
    role_targets,
    rollout_spec_of,
    scale_event,
    scaling_policy_of,
    stored_zero_memory,
    to_wall_signals,
    urgent_change,
    zero_policy_of,
)
from ..core.events import EventSpec
from ..core.forecast import ForecastPolicy
from ..core.idle import (
    ZeroMemory,
    ZeroPolicy,
    is_quiet,
    load_zero,
    quiet_period,
)
from ..core.loop import (
    ScaleTick,
    StatusTick,
    ZeroInputs,
    control_status,
    first_decision_ready,
    helping_pools,
    rollout_observation,
    scale_step,
    serving_pools,
)
from ..core.podfaults import unstartable_pods
from ..core.resources import (
    LABEL_COMPONENT,
    ROLE_SERVING,
    ROLE_STANDBY,
    Observed,
    desired_objects,
    find_spec_problems,
    may_scale_to_zero,
    pools_of,
    secret_fields,
)
from ..core.rollout import (
    RolloutDecision,
    RolloutSpec,
    RolloutState,
    Traffic,
    initial_state,
    plan_rollout,
)
from ..core.signals import (
    PodScrape,
    PoolKey,
    pod_labels,
    scrape_targets,
    time_to_routable,
)
from ..core.status import has_served
from ..core.traffic import (
    TrafficMemory,
    TrafficPolicy,
    TrafficTick,
    move_traffic,
    pod_live,
    route_pods,
)
from . import metrics
from .activity import ActivityWatch, ActivityWatches
from .kube import Kube
from .pods import PodMemory, PodWriter, RoleChanges
from .reconciler import Children, Key, Store
from .signals import PoolReading, SignalCollector

log = logging.getLogger("tidal.operator.controller")

# The pools whose Deployments the loop sizes.
_ROUTED = (PoolName.PRIMARY.value, PoolName.BASELINE.value)

Enqueue = Callable[[Key], Awaitable[None]]


# The per-service demand forecast of a scale-to-zero service: by default the fleet's (a daily
# profile of 96 x 15 min buckets, sampled every 5 s).
ZERO_FORECAST_PERIOD = ForecastPolicy().period_seconds
ZERO_FORECAST_MIN_PERIOD = 60.0


def zero_forecast_policy(period_seconds: float) -> ForecastPolicy:
    """The forecast of a scale-to-zero service over a cycle of ``period_seconds``: the daily
    default's 96 buckets, fewer for a short (compressed) cycle so that every bucket gets a
    sample each period (a bucket no shorter than the 5 s sample interval)."""
    base = ForecastPolicy()
    slots = max(1, min(base.slots, int(period_seconds // base.sample_interval_seconds)))
    return ForecastPolicy(period_seconds=period_seconds, slots=slots)


@dataclass(frozen=True)
class ControllerSettings:
    """How often the loop ticks and how eagerly it writes."""

    tick_seconds: float = 1.0
    # Status changes that are only new metric values are written at most this often.
    status_interval: float = 1.0
    # A label patch the watch has not confirmed yet is not sent again within this time.
    patch_grace_seconds: float = 3.0
    # A loop's first decision waits at most this long for the pod cache to show the ready
    # pods the Deployments report (see Controller.tick).
    sync_timeout_seconds: float = 10.0
    # A quiet service (``core.idle.is_quiet``: no request, nothing pending, nothing changing)
    # is ticked this often, and at once on a watch event of it or its children (``poke``);
    # busy ones every ``tick_seconds``. <= tick_seconds: every service every tick.
    quiet_tick_seconds: float = 5.0
    # A quiet service whose every pod has the activity long-poll parked (its first request
    # wakes the loop at once: ``shell.activity``) and with no idle timer towards zero to keep
    # (minReplicas >= 1) has nothing that can change unseen: ticked this often.
    watched_quiet_tick_seconds: float = 60.0
    # The cycle a scale-to-zero service's demand forecast learns (`zero_forecast_policy`): a
    # day; a shorter one compresses it (a demo, a test of the wake before the rise).
    forecast_period_seconds: float = ZERO_FORECAST_PERIOD
    # Added to the measured time-to-routable: how early a forecast wake comes.
    wake_margin_seconds: float = ZeroPolicy().wake_margin_seconds
    # How long a traffic move waits for the EndpointSlices before it says so (core.traffic).
    traffic: TrafficPolicy = field(default_factory=TrafficPolicy)


# A verdict due at the end of a breach window is taken this long after it (clock skew between
# the loop's monotonic sleep and the wall clock the planner judges on).
VERDICT_SLACK = 0.02


@dataclass
class ServiceState:
    """What the loop remembers of one InferenceService between ticks (memory only, except the
    rollout state and the autoscaler's state of the serving pools, which go to status)."""

    scalers: dict[tuple[PoolName, ...], ScalerState] = field(default_factory=dict)
    # The autoscaler's status as found at the first tick (restored from once; kept while the
    # replicas are manual so the memory is not lost).
    scaler_loaded: bool = False
    stored_autoscaler: AutoscalerStatus | None = None
    # The pod cache has once shown the ready pods the Deployments report (or the wait for it
    # timed out): from then on every tick decides.
    synced: bool = False
    first_tick_at: float | None = None
    last_total: dict[tuple[PoolName, ...], int] = field(default_factory=dict)
    rollout: RolloutState | None = None
    rollout_loaded: bool = False
    # When a pending SLO breach of the primary will have lasted `for` (monotonic): the loop
    # ticks once more at that moment instead of at the next period (rollout rule 6e's flip).
    verdict_due: float | None = None
    last_decision_key: tuple[str, int, int] | None = None
    view: ControlView | None = None
    enqueued_at: float = -1e9
    # Label patches sent, readiness faults, host-warm standby (``shell.pods``).
    pods: PodMemory = field(default_factory=PodMemory)
    routable: dict[PoolName, TimeToRoutable] = field(default_factory=dict)
    first_ready: dict[str, PodScrape] = field(default_factory=dict)
    # The spec as last parsed and checked, the key it was parsed for, its primary hash.
    spec_key: tuple[Any, ...] | None = None
    isvc: InferenceService | None = None
    primary_hash: str | None = None
    # When status.autoscaler was last refreshed, and for which desired count.
    autoscaler_key: tuple[Any, ...] | None = None
    # minReplicas 0: the idle timer and the service's demand forecast (``core.idle``).
    zero: ZeroMemory = field(default_factory=ZeroMemory)
    # The last tick found nothing going on: the loop waits for `wake` or the slow timer.
    quiet: bool = False
    # While quiet: the long-polls that wake the loop at the first request to reach a pod.
    activity: ActivityWatch | None = None
    # No idle timer or forecast to keep (minReplicas >= 1): a watched quiet loop may sleep long.
    timerless: bool = False
    # A view change not handed to the reconciler yet (status writes are rate-limited).
    unsent: bool = False
    # At zero with a forecast wake due before the next slow tick: ticked every tick until it,
    # so the wake keeps its lead instead of coming up to a quiet period late.
    wake_soon: bool = False
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # A traffic move waiting for endpoints (``core.traffic.move_traffic``).
    traffic: TrafficMemory = field(default_factory=TrafficMemory)


class Controller:
    """Runs one control loop per InferenceService key."""

    def __init__(
        self,
        kube: Kube,
        store: Store,
        enqueue: Enqueue,
        collector: SignalCollector,
        settings: ControllerSettings | None = None,
        *,
        clock: Clock = CLOCK,
    ) -> None:
        self.kube, self.store, self.enqueue = kube, store, enqueue
        self.collector = collector
        self.settings = settings or ControllerSettings()
        self.zero_forecast = zero_forecast_policy(self.settings.forecast_period_seconds)
        self.clock = clock
        self.states: dict[Key, ServiceState] = {}
        self.tasks: dict[Key, asyncio.Task[None]] = {}
        # Requests held now at the service's gateway (the activator's count, pushed by the
        # gateway loop's long-poll, which pokes the service when it changes).
        self.held: Callable[[Key], int] = lambda key: 0
        # Each gateway pod's cumulative arrival count and when it was read (the same
        # long-poll; None: not reported).
        self.arrivals: Callable[[Key], tuple[Mapping[str, int], float] | None] = lambda key: None
        self.pod_writer = PodWriter(kube, clock, self.settings.patch_grace_seconds)
        self.watches = ActivityWatches()

    # -- lifecycle ---------------------------------------------------------------------------

    def view(self, key: Key) -> ControlView | None:
        """The loop's latest view, or before its first decision `provisional_view` (hold the
        pools where the previous operator left them)."""
        state = self.states.get(key)
        if state is not None and state.view is not None:
            return state.view
        body = self.store.services.get(key)
        if body is None:
            return None
        return provisional_view(_stored_status(body), _spec_replicas(self.store.children.get(key)))

    def poke(self, key: Key) -> None:
        """Something about the service changed (its spec, a child): a quiet loop ticks now."""
        state = self.states.get(key)
        if state is not None:
            state.wake.set()

    def ensure(self, key: Key) -> None:
        """Start the key's loop unless it runs."""
        task = self.tasks.get(key)
        if task is None or task.done():
            self.tasks[key] = asyncio.create_task(self._run(key), name=f"control {key[0]}/{key[1]}")

    async def stop(self, key: Key) -> None:
        """Stop the key's loop and forget its state (the object was deleted)."""
        task = self.tasks.pop(key, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._forget(key)
        metrics.forget_service(*key)
        for pool in PoolName:
            self.collector.forget(PoolKey(key[0], key[1], pool.value))

    async def close(self) -> None:
        for key in list(self.tasks):
            await self.stop(key)
        await self.collector.close()
        await self.pod_writer.close()
        await self.watches.close()

    async def _tick_once(self, key: Key) -> None:
        started = self.clock.monotonic()
        try:
            await self.tick(key)
        except asyncio.CancelledError:
            raise
        except Exception:  # one bad tick must not end the loop; the next one retries
            log.exception("control tick of %s/%s failed", *key)
        metrics.TICK_DURATION.observe(self.clock.monotonic() - started)

    async def _run(self, key: Key) -> None:
        period = self.settings.tick_seconds
        next_at = self.clock.monotonic()
        loop = "busy"
        while key in self.store.services:
            metrics.TICK_LAG.observe(max(self.clock.monotonic() - next_at, 0.0))
            metrics.TICKS.labels(loop).inc()
            await self._tick_once(key)
            st = self.states.get(key)
            if (
                st is not None
                and st.quiet
                and st.verdict_due is None
                and self.settings.quiet_tick_seconds > period
            ):
                # Nothing going on: the next tick on an event or the slow timer.
                loop = "quiet"
                await _wait_for_poke(st.wake, self._quiet_period(st))
                next_at = self.clock.monotonic()
                continue
            loop = "busy"
            next_at += period
            now = self.clock.monotonic()
            if next_at < now:  # a slow tick: skip the missed ticks rather than bunching up
                # The late tick runs now; the ones due after it, up to now, are skipped.
                if skipped := int((now - next_at) // period):
                    metrics.TICKS_SKIPPED.inc(skipped)
                next_at = now
            # A breach whose window ends before the next tick is judged when it ends: the
            # rollback then flips within a tick's duration of the window, not up to a period.
            st = self.states.get(key)
            due = None if st is None or st.verdict_due is None else st.verdict_due + VERDICT_SLACK
            if due is not None and now < due < next_at:
                await asyncio.sleep(due - now)
                if key not in self.store.services:
                    break
                await self._tick_once(key)
                now = self.clock.monotonic()
            await asyncio.sleep(max(next_at - now, 0.0))
        self._forget(key)
        self.tasks.pop(key, None)

    def _forget(self, key: Key) -> None:
        st = self.states.pop(key, None)
        if st is not None and st.activity is not None:
            st.activity.cancel()

    # -- one tick ----------------------------------------------------------------------------

    async def tick(self, key: Key) -> None:
        """One control step, read → decide → apply → publish: each line a step below (the
        module docstring's 1-5), each taking the loop's memory and one value, each decision a
        ``core`` function."""
        self._begin_tick(key)
        parsed = self._parsed_spec(key)
        if parsed is None:
            return
        st, isvc, body = parsed
        seen = await self._read_signals(key, body, st, isvc)
        if seen is None:
            return
        plan = await self._plan(st, self._decide(st, seen))
        await self._apply_pods(st, plan)
        await self._publish_view(st, plan)
        self._settle(st, plan)
        await self._post_events(plan)

    def _begin_tick(self, key: Key) -> None:
        """Events from here on wake the next wait; those before are seen by this tick."""
        known = self.states.get(key)
        if known is not None:
            known.wake.clear()
            known.quiet = known.wake_soon = False

    def _parsed_spec(
        self, key: Key
    ) -> tuple[ServiceState, InferenceService, Mapping[str, Any]] | None:
        """The service's state, parsed spec and object; None while it is being deleted or its
        spec is invalid (the reconciler reports that as Degraded).

        The parsed spec, its checks and the primary's template hash change only with the
        object's spec, labels or annotations: computed once per change, not every tick (at
        1,000 services they were most of the operator's CPU)."""
        body = self.store.services.get(key)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        spec_key = _spec_key(self.store, key, body)
        st = self.states.get(key)
        if st is not None and st.spec_key == spec_key and st.isvc is not None:
            return st, st.isvc, body
        try:
            isvc = self.store.parse(body)
        except ValidationError:
            return None
        if find_spec_problems(isvc):
            return None
        if st is None:
            st = self.states[key] = ServiceState()
            metrics.start_service(*key)
        st.spec_key, st.isvc, st.primary_hash = spec_key, isvc, None
        return st, isvc, body

    async def _read_signals(
        self, key: Key, body: Mapping[str, Any], st: ServiceState, isvc: InferenceService
    ) -> TickReading | None:
        """The pods per pool and their signals (``SignalCollector.observe_pool``), read at one
        instant; None until the pod cache has synced (`_cache_synced`)."""
        kids = self.store.children.get(key)
        bodies = list(kids.pod_bodies.values()) if kids is not None else []
        pools = tuple(p.name for p in pools_of(isvc))
        pods = _pods_by_pool(bodies, pools)
        if not st.synced and not self._cache_synced(st, kids, pods):
            return None
        every_pod = [b for pool in pools for b in pods[pool]]
        st.pods.faults.unstartable = unstartable_pods(every_pod, secret_fields(isvc))
        self.pod_writer.start_probes(st.pods, every_pod)
        observe = self.collector.observe_pool
        read = await asyncio.gather(*(observe(PoolKey(*key, p.value), pods[p]) for p in pools))
        readings = dict(zip(pools, read, strict=True))
        mono, wall = self.clock.monotonic(), self.clock.wall()
        _measure_startup(st, bodies, pods, readings, wall)
        current = _spec_replicas(kids)
        return TickReading(key, body, isvc, kids, pools, pods, readings, current, mono, wall)

    def _route(self, st: ServiceState, seen: TickReading) -> Routing:
        """Which pools the autoscaler sizes this tick (the rollout's traffic, its state
        restored once from status) and the observation it sizes them on."""
        isvc = seen.isvc
        if st.primary_hash is None:
            st.primary_hash = primary_template_hash(desired_objects(isvc, Observed()), isvc.name)
        spec = rollout_spec_of(isvc, st.primary_hash)
        if spec is not None and not st.rollout_loaded:
            st.rollout = _restore((seen.body.get("status") or {}).get("rollout"))
            st.rollout_loaded = True
        traffic_state = st.rollout or (initial_state(spec) if spec else None)
        serving = serving_pools(traffic_state)
        # An overflow (rollout rule 8): the baseline helps, the autoscaler sizes the primary.
        helping = helping_pools(traffic_state)
        observation = combine_observations([seen.readings[p].observed.observation for p in serving])
        if helping:
            observation = overflow_observation(
                observation, seen.readings[PoolName.BASELINE].observed.observation
            )
        policy = scaling_policy_of(isvc, self.settings.tick_seconds)
        return Routing(spec, st.primary_hash, serving, helping, policy, observation)

    def _decide_scale(self, st: ServiceState, seen: TickReading, route: Routing) -> Scaling:
        """The autoscaler's decision for the serving pools (None with manual replicas) and its
        memory as status carries it (``core.loop.scale_step``); the memory is restored once
        from status."""
        if not st.scaler_loaded:
            self._restore_scaler(st, seen, route.serving)
        isvc, serving, policy = seen.isvc, route.serving, route.policy
        if isvc.spec.replicas is not None:
            return Scaling(None, st.stored_autoscaler, isvc.spec.replicas)
        scaler = st.scalers.get(serving)
        if scaler is None:
            have = [seen.current[p] for p in serving if p in seen.current]
            scaler = initial_scaler_state(policy, sum(have) if have else None)
        step = scale_step(
            ScaleTick(
                policy, serving, route.observation, self.held(seen.key), scaler, seen.mono,
                seen.wall, st.view.status.autoscaler if st.view is not None else None,
                st.autoscaler_key,
                self._zero_inputs(st, seen, serving) if policy.min_replicas == 0 else None,
            )
        )  # fmt: skip
        st.scalers[serving], st.autoscaler_key = step.scaler, step.autoscaler_key
        if step.zero is not None:
            st.zero, st.wake_soon = step.zero, step.wake_soon
        return Scaling(step.decision, step.autoscaler, step.decision.desired_serving)

    def _restore_scaler(
        self, st: ServiceState, seen: TickReading, serving: tuple[PoolName, ...]
    ) -> None:
        """A restarted operator resumes from ``status.autoscaler`` (mid-surge, with its learned
        capacity and windows) and the zero memory it carries."""
        st.stored_autoscaler = _stored_autoscaler(seen.body)
        st.scaler_loaded = True
        stored = stored_zero_memory(st.stored_autoscaler)
        st.zero = load_zero(self.zero_forecast, stored, seen.wall - seen.mono)
        restored = restore_scaler_state(st.stored_autoscaler, serving, seen.mono, seen.wall)
        if restored is not None:
            st.scalers[serving] = restored
            asked = restored.desired_serving
            log.info("%s/%s: autoscaler state restored (%s serving asked)", *seen.key, asked)

    def _decide(self, st: ServiceState, seen: TickReading) -> Decided:
        """Who serves, the autoscaler's and the rollout's verdicts, and their Events."""
        route = self._route(st, seen)
        scaling = self._decide_scale(st, seen, route)
        rollout, events = self._decide_rollout(st, seen, route, scaling)
        decision = scaling.decision
        if decision is not None:
            event = scale_event(route.serving[0], st.last_total.get(route.serving), decision)
            if event is not None:
                events += (EventSpec(*event),)  # type: ignore[arg-type]
            st.last_total[route.serving] = decision.desired_total
        return Decided(seen, route, scaling, rollout, events)

    def _decide_rollout(
        self, st: ServiceState, seen: TickReading, route: Routing, scaling: Scaling
    ) -> tuple[RolloutDecision | None, tuple[EventSpec, ...]]:
        """``plan_rollout`` when a baseline is configured (None otherwise), on wall-clock
        seconds; a verdict due before the next tick is kept for the loop (`verdict_due`)."""
        spec = route.spec
        if spec is None:
            return None, ()
        mono, wall = seen.mono, seen.wall
        applied = st.rollout.applied_hash if st.rollout is not None else route.primary_hash
        slo = {p: to_wall_signals(r.slo, mono, wall) for p, r in seen.readings.items()}
        obs = rollout_observation(seen.pods, slo, applied, scaling.desired_serving or 0)
        rollout, st.rollout = plan_rollout(spec, obs, st.rollout, wall)
        due = rollout.verdict_due_at
        st.verdict_due = None if due is None else mono + (due - wall)
        metrics.count_rollout_events(
            seen.isvc.namespace, seen.isvc.name, (e.reason for e in rollout.events)
        )
        return rollout, tuple(EventSpec(e.type.value, e.reason, e.message) for e in rollout.events)

    async def _choose_roles(self, st: ServiceState, d: Decided) -> tuple[RoleChanges, ...]:
        """Per pool, the role labels its pods are to get (none with manual replicas)."""
        decision, seen = d.scaling.decision, d.seen
        if decision is None:
            return ()
        split = d.rollout is not None and d.rollout.traffic is Traffic.SPLIT
        # The baseline's rollback reserve stays on the device: an abort is instant.
        tier = StandbyTier.DEVICE if split else seen.isvc.spec.autoscaling.standby_tier
        targets = role_targets(d.route.serving, decision, d.route.helping, d.rollout)
        return tuple(
            [
                await self.pod_writer.choose_roles(
                    seen.key, st.pods, seen.pods[pool], seen.readings[pool], wanted, tier
                )
                for pool, wanted in targets.items()
            ]
        )

    async def _plan(self, st: ServiceState, d: Decided) -> Plan:
        """The role labels (`_choose_roles`), the replicas and routing to publish
        (``plan_children``) moved make-before-break (``core.traffic.move_traffic``), and the
        demotions that may be written now."""
        seen = d.seen
        roles = await self._choose_roles(st, d)
        changes = [c for r in roles for c in r.changes]
        selector = seen.kids.service_selector if seen.kids is not None else None
        move = move_traffic(
            TrafficTick(
                service=seen.isvc.name,
                routes_itself=seen.isvc.spec.fleet is not None
                or (selector is not None and LABEL_COMPONENT in selector),
                has_baseline=seen.isvc.spec.rollout.baseline is not None,
                selector=selector,
                endpoints=seen.kids.ready_endpoints() if seen.kids is not None else None,
                pods=route_pods(seen.pods),
                observed=plan_children(seen.isvc, d.scaling.decision, d.rollout, seen.current),
                current=seen.current,
                promote=frozenset(n for n, role in changes if role == ROLE_SERVING),
                demote=frozenset(n for n, role in changes if role == ROLE_STANDBY),
                memory=st.traffic,
                now=seen.mono,
                policy=self.settings.traffic,
            )
        )
        step = move.step
        if move.announce and step is not None:
            missing = f", not listed ready yet: {', '.join(step.missing)}" if step.missing else ""
            pools = "+".join(sorted(p.value for p in step.pools))
            log.info("%s/%s traffic %s: select %s%s", *seen.key, step.reason, pools, missing)
        st.traffic = move.memory
        events = d.events + ((move.event,) if move.event is not None else ())
        return Plan(d, move.observed, roles, move.demote, events)

    async def _apply_pods(self, st: ServiceState, plan: Plan) -> None:
        """Write the role labels the traffic move lets go, and before a scale-down each pod's
        deletion cost (the ReplicaSet removes the cheapest)."""
        seen, writer = plan.decided.seen, self.pod_writer
        for role_changes in plan.roles:
            await writer.write_roles(seen.key, st.pods, role_changes, plan.demote)
        if plan.decided.scaling.decision is None:
            return
        for pool in plan.decided.route.serving:
            pods = seen.pods[pool]
            if plan.observed.replicas.get(pool, 0) < sum(1 for p in pods if pod_live(p)):
                await writer.set_deletion_costs(seen.key, st.pods, pods, seen.readings[pool])

    async def _publish_view(self, st: ServiceState, plan: Plan) -> None:
        """Hand the tick's view (replicas, routing, status: ``core.loop.control_status``) to
        the reconciler."""
        d = plan.decided
        seen, route, decision, rollout = d.seen, d.route, d.scaling.decision, d.rollout
        choice = control_status(
            StatusTick(
                manual_replicas=seen.isvc.spec.replicas is not None,
                serving=route.serving,
                pools=seen.readings,
                observation=route.observation,
                decision=decision,
                rollout=rollout,
                rollout_state=st.rollout,
                now=seen.now,
                autoscaler=d.scaling.autoscaler,
                routable=st.routable,
                promote_seconds=st.pods.promote_seconds,
                pod_problems=st.pods.faults.problems(),
                last_decision=st.view.status.last_decision if st.view is not None else None,
                last_decision_key=st.last_decision_key,
            )
        )
        st.last_decision_key = choice.decision_key
        if choice.new_decision and decision is not None:
            metrics.count_decision(*seen.key, route.serving[0].value, decision.reason)
        view = ControlView(
            observed=plan.observed,
            status=choice.status,
            hold_primary_template=rollout.hold_primary_template if rollout else False,
        )
        await self._publish(seen.key, st, view, seen.mono)

    def _settle(self, st: ServiceState, plan: Plan) -> None:
        """Whether the loop may go quiet until an event or the slow timer, and while quiet
        the long-polls that wake it."""
        d = plan.decided
        decision, route, seen = d.scaling.decision, d.route, d.seen
        st.quiet = (
            decision is not None
            and route.spec is None
            and not route.helping
            and not plan.events
            and not st.unsent
            and not st.wake_soon
            and st.traffic.since is None
            and not st.pods.busy()
            and is_quiet(decision, route.observation, route.policy.max_metrics_age_seconds)
        )
        st.timerless = not may_scale_to_zero(seen.isvc)
        self._watch_activity(seen.key, st, [b for pool in seen.pools for b in seen.pods[pool]])

    async def _post_events(self, plan: Plan) -> None:
        seen = plan.decided.seen
        for e in plan.events:
            log.info("%s/%s %s: %s", seen.key[0], seen.key[1], e.reason, e.message)
        await asyncio.gather(*(self.kube.post_event(seen.body, e, seen.now) for e in plan.events))

    def _watch_activity(
        self, key: Key, st: ServiceState, pods: Sequence[Mapping[str, Any]]
    ) -> None:
        """While the loop is quiet, keep a long-poll parked on each of its pods
        (`ActivityWatch`): the first request to arrive pokes the loop."""
        slow = self.settings.quiet_tick_seconds > self.settings.tick_seconds
        urls = frozenset(f"http://{t.address}" for t in scrape_targets(pods))
        urls = urls if st.quiet and slow else frozenset()
        poke = functools.partial(self.poke, key)
        st.activity = self.watches.keep(f"{key[0]}/{key[1]}", st.activity, urls, poke)

    def _quiet_period(self, st: ServiceState) -> float:
        """How long a quiet loop sleeps unless poked: long when every pod's long-poll is parked
        and no idle timer runs, else the slow timer."""
        watch = st.activity
        return quiet_period(
            self.settings.quiet_tick_seconds,
            self.settings.watched_quiet_tick_seconds,
            st.timerless,
            watch is not None and watch.parked,
        )

    def _cache_synced(
        self, st: ServiceState, kids: Children | None, pods: Mapping[PoolName, Sequence[Any]]
    ) -> bool:
        """Whether the loop may decide yet (``core.loop.first_decision_ready``; once true,
        stays true): the reconciler holds to the provisional view meanwhile. Later ticks never
        wait (a per-tick check flaps as pods turn ready, and the gaps it leaves between scrapes
        average the arrival rate over seconds)."""
        now = self.clock.monotonic()
        if st.first_tick_at is None:
            st.first_tick_at = now
        deployments = kids.deployments if kids is not None else {}
        ready = {PoolName(p): d.ready_replicas for p, d in deployments.items() if p in _ROUTED}
        waited = now - st.first_tick_at
        st.synced = first_decision_ready(waited, self.settings.sync_timeout_seconds, ready, pods)
        return st.synced

    async def _publish(self, key: Key, st: ServiceState, view: ControlView, mono: float) -> None:
        before = st.view
        st.view = view
        if before is not None and before == view:
            return
        urgent = urgent_change(before, view)
        if urgent or mono - st.enqueued_at >= self.settings.status_interval:
            st.enqueued_at = mono
            st.unsent = False
            await self.enqueue(key)
        else:
            st.unsent = True  # written with a later change, or once the loop is not quiet

    # -- pods ----------------------------------------------------------------------------------

    def _zero_inputs(
        self, st: ServiceState, seen: TickReading, serving: tuple[PoolName, ...]
    ) -> ZeroInputs:
        """What a pool that may reach zero decides on: the arrivals its gateway counted, the
        measured time-to-routable, whether it has served (not to zero before a first replica
        was Ready, as the status has recorded) and how long the loop has run."""
        routable = st.routable.get(serving[0])
        first = st.first_tick_at if st.first_tick_at is not None else seen.mono
        return ZeroInputs(
            zero_policy_of(seen.isvc, self.settings.wake_margin_seconds),
            self.zero_forecast,
            st.zero,
            self.arrivals(seen.key),
            routable.total_seconds if routable is not None else None,
            self.settings.quiet_tick_seconds,
            has_served(_stored_status(seen.body)),
            seen.mono - first,
        )


def _spec_key(store: Store, key: Key, body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the parsed spec depends on: the object's spec, labels and annotations."""
    meta = body["metadata"]
    return (
        meta.get("uid"),
        meta.get("generation"),
        json.dumps(meta.get("labels") or {}, sort_keys=True),
        json.dumps(meta.get("annotations") or {}, sort_keys=True),
        # models[].build resolve against their ModelBuilds: a build that passes its gate
        # changes the primary's template (a staged rollout) with no change of the spec.
        *(
            (store.builds.get((key[0], name)) or {}).get("metadata", {}).get("resourceVersion")
            for name in raw_build_refs(body.get("spec") or {})
        ),
    )


async def _wait_for_poke(wake: asyncio.Event, seconds: float) -> None:
    """A quiet loop's wait: until it is poked, or the slow timer."""
    metrics.QUIET_LOOPS.inc()
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), seconds)
    finally:
        metrics.QUIET_LOOPS.dec()


def _pods_by_pool(
    bodies: Sequence[Mapping[str, Any]], pools: Sequence[PoolName]
) -> dict[PoolName, list[Mapping[str, Any]]]:
    return {p: [b for b in bodies if pod_labels(b).get(LABEL_POOL) == p.value] for p in pools}


def _spec_replicas(kids: Children | None) -> dict[PoolName, int]:
    """The replicas the pools' Deployments ask for (primary, baseline)."""
    deployments = kids.deployments if kids is not None else {}
    return {PoolName(p): d.spec_replicas for p, d in deployments.items() if p in _ROUTED}


def _stored_status(body: Mapping[str, Any]) -> InferenceServiceStatus | None:
    raw = body.get("status")
    if not isinstance(raw, dict) or not raw:
        return None
    try:
        return InferenceServiceStatus.model_validate(raw)
    except ValidationError:
        return None


def _stored_autoscaler(body: Mapping[str, Any]) -> AutoscalerStatus | None:
    raw = (body.get("status") or {}).get("autoscaler")
    if not isinstance(raw, dict):
        return None
    try:
        return AutoscalerStatus.model_validate(raw)
    except ValidationError:
        return None


def _restore(raw: Any) -> RolloutState | None:
    from ..core.api import RolloutStatus

    if not isinstance(raw, dict):
        return None
    try:
        return restore_rollout_state(RolloutStatus.model_validate(raw))
    except ValidationError:
        return None


def _measure_startup(
    st: ServiceState,
    bodies: Sequence[Mapping[str, Any]],
    pods: Mapping[PoolName, Sequence[Mapping[str, Any]]],
    readings: Mapping[PoolName, PoolReading],
    wall: float,
) -> None:
    """Each pod's first scrape after it turned Ready: its startup, not later on-demand loads
    (which would rewrite the status on every load); the pools' time-to-routable from it."""
    present = {(b.get("metadata") or {}).get("name") for b in bodies}
    st.first_ready = {k: v for k, v in st.first_ready.items() if k in present}
    for pool in pods:
        for name, scrape in readings[pool].pod_scrapes.items():
            if scrape.startup_seconds is not None:
                st.first_ready.setdefault(name, scrape)
        routable = time_to_routable(pods[pool], st.first_ready, wall)
        if routable is not None:  # kept while no replica is recent enough to measure
            st.routable[pool] = routable


@dataclass(frozen=True)
class TickReading:
    """What one tick read (`Controller._read_signals`): the service's object and parsed spec,
    its children, its pods per pool and their signals, at one instant (`mono`, `wall`)."""

    key: Key
    body: Mapping[str, Any]
    isvc: InferenceService
    kids: Children | None
    pools: tuple[PoolName, ...]
    pods: Mapping[PoolName, Sequence[Mapping[str, Any]]]
    readings: Mapping[PoolName, PoolReading]
    current: Mapping[PoolName, int]  # the Deployments' replicas (primary, baseline)
    mono: float
    wall: float

    @property
    def now(self) -> datetime:
        return datetime.fromtimestamp(self.wall, UTC)


@dataclass(frozen=True)
class Routing:
    """Who serves this tick (`Controller._route`): the rollout's spec (None: one pool), the
    pools the autoscaler sizes and those that help them, its policy and the observation it
    sizes them on."""

    spec: RolloutSpec | None
    primary_hash: str
    serving: tuple[PoolName, ...]
    helping: tuple[PoolName, ...]
    policy: ScalingPolicy
    observation: Observation


@dataclass(frozen=True)
class Scaling:
    """The autoscaler's verdict this tick (`Controller._decide_scale`): its decision (None
    with manual replicas), the serving replicas asked, and its memory as status carries it."""

    decision: ScaleDecision | None
    autoscaler: AutoscalerStatus | None
    desired_serving: int | None


@dataclass(frozen=True)
class Decided:
    """The tick's decisions (`Controller._decide`): who serves, the autoscaler's verdict, the
    rollout's (None: no baseline), and the Events they call for."""

    seen: TickReading
    route: Routing
    scaling: Scaling
    rollout: RolloutDecision | None
    events: tuple[EventSpec, ...]


@dataclass(frozen=True)
class Plan:
    """What the tick writes (`Controller._plan`): the replicas and routing to publish, each
    pool's role labels, the demotions the traffic move lets go now, and every Event."""

    decided: Decided
    observed: Observed
    roles: tuple[RoleChanges, ...]
    demote: frozenset[str]
    events: tuple[EventSpec, ...]
