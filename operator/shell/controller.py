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

``Controller.tick`` reads as these steps: ``_read_signals`` (1), ``_route`` and
``_decide_scale`` (2), ``_decide_rollout`` (3), ``_decide_roles``, ``_plan_children`` and
``_apply_pods`` (4), ``_publish_view``, ``_settle`` (quiet or not) and ``_post_events`` (5).

Pod patches are JSON merge patches of metadata only (field manager ``tidal-operator-pods``); the
ReplicaSet selects on isvc and pool, never on the role label, so it never fights them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
from pydantic import ValidationError

from ..core.api import (
    LABEL_POOL,
    LABEL_ROLE,
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
    decide_scale,
    estimate_capacity,
    with_gateway_held,
)
from ..core.autoscaler_pods import (
    ANNOTATION_POD_DELETION_COST,
    StandbyAssignment,
    choose_standby,
    pod_deletion_cost,
)
from ..core.builds import raw_build_refs
from ..core.control import (
    ANNOTATION_TEMPLATE_HASH,
    ControlStatus,
    ControlView,
    autoscaler_persist_key,
    autoscaler_status,
    combine_observations,
    initial_scaler_state,
    metrics_condition,
    overflow_observation,
    plan_children,
    pool_metrics,
    prewarmed_condition,
    primary_template_hash,
    provisional_view,
    restore_rollout_state,
    restore_scaler_state,
    role_targets,
    rolled_back_condition,
    rollout_spec_of,
    rollout_status,
    scale_event,
    scaling_condition,
    scaling_policy_of,
    status_decision,
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
    ZeroTick,
    dump_zero,
    is_quiet,
    load_zero,
    quiet_period,
    step_zero,
    zero_persist_key,
)
from ..core.podfaults import PodFaults, due, not_ready_pods, unstartable_pods
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
    PoolObservation,
    RolloutDecision,
    RolloutObservation,
    RolloutSpec,
    RolloutState,
    Traffic,
    initial_state,
    plan_rollout,
)
from ..core.signals import (
    PodScrape,
    PoolKey,
    pod_address,
    pod_labels,
    pod_ready,
    pod_views,
    scrape_targets,
    time_to_routable,
)
from ..core.status import has_served
from ..core.traffic import (
    RoutePod,
    TrafficPolicy,
    TrafficStep,
    TrafficWant,
    plan_traffic,
)
from . import metrics
from .activity import ActivityWatch
from .kube import Kube, KubeError
from .podmetrics import new_scrape_session, probe_ready
from .reconciler import Children, Key, Store
from .signals import PoolReading, SignalCollector

log = logging.getLogger("tidal.operator.controller")

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
    patched: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    pod_faults: PodFaults = field(default_factory=PodFaults)
    probing: asyncio.Task[None] | None = None  # the readiness probes under way, if any
    routable: dict[PoolName, TimeToRoutable] = field(default_factory=dict)
    first_ready: dict[str, PodScrape] = field(default_factory=dict)
    # Host-warm standby: pods known to be on the host tier, tier changes under way, and how
    # long the last promotion took.
    host_tier: set[str] = field(default_factory=set)
    tier_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    standby_since: dict[str, float] = field(default_factory=dict)
    promote_seconds: float | None = None
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
    # A traffic move waiting for endpoints (``core.traffic``): since when (monotonic), why,
    # and whether its wait ran out (its Warning posted).
    traffic_since: float | None = None
    traffic_reason: str = "unchanged"
    traffic_overdue: bool = False


_labels, _ready = pod_labels, pod_ready


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def _live(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return meta.get("deletionTimestamp") is None and phase not in ("Succeeded", "Failed")


def ready_of_template(pods: Sequence[Mapping[str, Any]], template_hash: str | None) -> int:
    """Ready pods running ``template_hash`` (None: any template; pods without the annotation,
    made by an older operator, count as running it)."""
    return sum(
        1
        for p in pods
        if _live(p)
        and _ready(p)
        and (
            template_hash is None
            or _annotations(p).get(ANNOTATION_TEMPLATE_HASH, template_hash) == template_hash
        )
    )


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
        mono: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.kube, self.store, self.enqueue = kube, store, enqueue
        self.collector = collector
        self.settings = settings or ControllerSettings()
        self.zero_forecast = zero_forecast_policy(self.settings.forecast_period_seconds)
        self.mono, self.wall = mono, wall
        self.states: dict[Key, ServiceState] = {}
        self.tasks: dict[Key, asyncio.Task[None]] = {}
        # Requests held now at the service's gateway (the activator's count, pushed by the
        # gateway loop's long-poll, which pokes the service when it changes).
        self.held: Callable[[Key], int] = lambda key: 0
        # Each gateway pod's cumulative arrival count and when it was read (the same
        # long-poll; None: not reported).
        self.arrivals: Callable[[Key], tuple[Mapping[str, int], float] | None] = lambda key: None
        self._probe_session: aiohttp.ClientSession | None = None
        self._long_polls: aiohttp.ClientSession | None = None

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
        kids = self.store.children.get(key)
        deployments = {
            PoolName(p): d.spec_replicas
            for p, d in (kids.deployments.items() if kids is not None else ())
            if p in (PoolName.PRIMARY.value, PoolName.BASELINE.value)
        }
        return provisional_view(_stored_status(body), deployments)

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
        if self._probe_session is not None:
            await self._probe_session.close()
            self._probe_session = None
        if self._long_polls is not None:
            await self._long_polls.close()
            self._long_polls = None

    def _start_probes(self, st: ServiceState, pods: Sequence[Mapping[str, Any]]) -> None:
        """Ask the not-Ready pods why, in the background: a runtime busy loading may take up to
        ``PROBE_TIMEOUT`` to answer, and the tick must not wait for it. The answers reach the
        status from the next tick on."""
        if st.probing is not None and not st.probing.done():
            return
        st.probing = asyncio.create_task(self._probe_quietly(st, pods))

    async def _probe_quietly(self, st: ServiceState, pods: Sequence[Mapping[str, Any]]) -> None:
        try:
            await self._probe_not_ready(st, pods)
        except Exception:  # the next tick asks again
            log.exception("readiness probes failed")

    async def _probe_not_ready(self, st: ServiceState, pods: Sequence[Mapping[str, Any]]) -> None:
        """Ask the pods that run but stay not Ready why (``core.podfaults``)."""
        targets = not_ready_pods(pods, self.wall())
        st.pod_faults.keep_only(t.pod for t in targets)
        asked = due(targets, st.pod_faults, self.mono())
        if not asked:
            return
        if self._probe_session is None:
            self._probe_session = new_scrape_session(connections=16)
        answers = await asyncio.gather(*(probe_ready(self._probe_session, t.url) for t in asked))
        now = self.mono()
        for target, message in zip(asked, answers, strict=True):
            st.pod_faults.record(target, message, now)

    async def _tick_once(self, key: Key) -> None:
        started = self.mono()
        try:
            await self.tick(key)
        except asyncio.CancelledError:
            raise
        except Exception:  # one bad tick must not end the loop; the next one retries
            log.exception("control tick of %s/%s failed", *key)
        metrics.TICK_DURATION.observe(self.mono() - started)

    async def _run(self, key: Key) -> None:
        period = self.settings.tick_seconds
        next_at = self.mono()
        loop = "busy"
        while key in self.store.services:
            metrics.TICK_LAG.observe(max(self.mono() - next_at, 0.0))
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
                metrics.QUIET_LOOPS.inc()
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(st.wake.wait(), self._quiet_period(st))
                finally:
                    metrics.QUIET_LOOPS.dec()
                next_at = self.mono()
                continue
            loop = "busy"
            next_at += period
            now = self.mono()
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
                now = self.mono()
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
        module docstring's 1-5), each decision a ``core`` function."""
        self._begin_tick(key)
        parsed = self._parsed_spec(key)
        if parsed is None:
            return
        st, isvc, body = parsed
        seen = await self._read_signals(key, body, st, isvc)
        if seen is None:
            return
        route = self._route(st, seen)
        scaling = self._decide_scale(st, seen, route)
        events: list[EventSpec] = []
        rollout = self._decide_rollout(st, seen, route, scaling, events)
        roles = await self._decide_roles(st, seen, route, scaling.decision, rollout, events)
        observed, demote = self._plan_children(st, seen, scaling, rollout, roles, events)
        await self._apply_pods(st, seen, route, scaling.decision, observed, roles, demote)
        await self._publish_view(st, seen, route, scaling, rollout, observed)
        self._settle(st, seen, route, scaling.decision, events)
        await self._post_events(seen, events)

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
        spec_key = self._spec_key(key, body)
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

    def _spec_key(self, key: Key, body: Mapping[str, Any]) -> tuple[Any, ...]:
        meta = body["metadata"]
        return (
            meta.get("uid"),
            meta.get("generation"),
            json.dumps(meta.get("labels") or {}, sort_keys=True),
            json.dumps(meta.get("annotations") or {}, sort_keys=True),
            # models[].build resolve against their ModelBuilds: a build that passes its gate
            # changes the primary's template (a staged rollout) with no change of the spec.
            *(
                (self.store.builds.get((key[0], name)) or {})
                .get("metadata", {})
                .get("resourceVersion")
                for name in raw_build_refs(body.get("spec") or {})
            ),
        )

    async def _read_signals(
        self, key: Key, body: Mapping[str, Any], st: ServiceState, isvc: InferenceService
    ) -> TickReading | None:
        """The pods per pool and their signals (``SignalCollector.observe_pool``), read at one
        instant; None until the pod cache has synced (`_cache_synced`)."""
        kids = self.store.children.get(key)
        bodies = list(kids.pod_bodies.values()) if kids is not None else []
        pools = tuple(p.name for p in pools_of(isvc))
        pods = {
            pool: [b for b in bodies if _labels(b).get(LABEL_POOL) == pool.value] for pool in pools
        }
        if not st.synced and not self._cache_synced(st, kids, pods):
            return None
        every_pod = [b for pool in pools for b in pods[pool]]
        st.pod_faults.unstartable = unstartable_pods(every_pod, secret_fields(isvc))
        self._start_probes(st, every_pod)
        readings_list = await asyncio.gather(
            *(
                self.collector.observe_pool(PoolKey(key[0], key[1], pool.value), pods[pool])
                for pool in pools
            )
        )
        readings = dict(zip(pools, readings_list, strict=True))
        mono, wall = self.mono(), self.wall()
        self._measure_startup(st, bodies, pods, readings, wall)
        deployments = kids.deployments if kids is not None else {}
        current = {
            PoolName(p): d.spec_replicas
            for p, d in deployments.items()
            if p in (PoolName.PRIMARY.value, PoolName.BASELINE.value)
        }
        return TickReading(key, body, isvc, kids, pools, pods, readings, current, mono, wall)

    @staticmethod
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
        serving = _serving_pools(traffic_state)
        # An overflow (rollout rule 8): the baseline helps, the autoscaler sizes the primary.
        helping = _helping_pools(traffic_state)
        observation = combine_observations([seen.readings[p].observed.observation for p in serving])
        if helping:
            observation = overflow_observation(
                observation, seen.readings[PoolName.BASELINE].observed.observation
            )
        policy = scaling_policy_of(isvc, self.settings.tick_seconds)
        return Routing(spec, st.primary_hash, serving, helping, policy, observation)

    def _decide_scale(self, st: ServiceState, seen: TickReading, route: Routing) -> Scaling:
        """The autoscaler's decision for the serving pools (None with manual replicas) and its
        memory as status carries it; the memory is restored once from status."""
        if not st.scaler_loaded:
            self._restore_scaler(st, seen, route.serving)
        isvc, serving, policy = seen.isvc, route.serving, route.policy
        if isvc.spec.replicas is not None:
            return Scaling(None, st.stored_autoscaler, isvc.spec.replicas)
        scaler = st.scalers.get(serving)
        if scaler is None:
            have = [seen.current[p] for p in serving if p in seen.current]
            scaler = initial_scaler_state(policy, sum(have) if have else None)
        if policy.min_replicas == 0:
            # Not to zero before a first replica was Ready (as the status has recorded).
            first = st.first_tick_at if st.first_tick_at is not None else seen.mono
            decision, scaler = self._decide_zero(
                st, isvc, policy, route.observation, scaler, serving, seen.mono, seen.wall,
                self.held(seen.key),
                served=has_served(_stored_status(seen.body)), waited_seconds=seen.mono - first,
            )  # fmt: skip
        else:  # what the burst buffer holds waits for these replicas: queued demand
            observation = with_gateway_held(route.observation, self.held(seen.key))
            decision, scaler = decide_scale(policy, observation, scaler)
        st.scalers[serving] = scaler
        autoscaler = self._persisted(st, policy, serving, scaler, seen.mono, seen.wall)
        return Scaling(decision, autoscaler, decision.desired_serving)

    def _restore_scaler(
        self, st: ServiceState, seen: TickReading, serving: tuple[PoolName, ...]
    ) -> None:
        """A restarted operator resumes from ``status.autoscaler`` (mid-surge, with its learned
        capacity and windows) and the zero memory it carries."""
        st.stored_autoscaler = _stored_autoscaler(seen.body)
        st.scaler_loaded = True
        st.zero = load_zero(
            self.zero_forecast, stored_zero_memory(st.stored_autoscaler), seen.wall - seen.mono
        )
        restored = restore_scaler_state(st.stored_autoscaler, serving, seen.mono, seen.wall)
        if restored is not None:
            st.scalers[serving] = restored
            log.info(
                "%s/%s: autoscaler state restored (%s serving asked)",
                seen.key[0],
                seen.key[1],
                restored.desired_serving,
            )

    def _decide_rollout(
        self,
        st: ServiceState,
        seen: TickReading,
        route: Routing,
        scaling: Scaling,
        events: list[EventSpec],
    ) -> RolloutDecision | None:
        """``plan_rollout`` when a baseline is configured (None otherwise), on wall-clock
        seconds; a verdict due before the next tick is kept for the loop (`verdict_due`)."""
        spec = route.spec
        if spec is None:
            return None
        mono, wall, pods, readings = seen.mono, seen.wall, seen.pods, seen.readings
        applied = st.rollout.applied_hash if st.rollout is not None else route.primary_hash
        obs = RolloutObservation(
            primary=PoolObservation(
                ready_replicas=ready_of_template(pods[PoolName.PRIMARY], applied),
                signals=to_wall_signals(readings[PoolName.PRIMARY].slo, mono, wall),
            ),
            baseline=PoolObservation(
                ready_replicas=ready_of_template(pods[PoolName.BASELINE], None),
                signals=to_wall_signals(readings[PoolName.BASELINE].slo, mono, wall),
            ),
            autoscaler_desired=max(scaling.desired_serving or 0, 0),
        )
        rollout, st.rollout = plan_rollout(spec, obs, st.rollout, wall)
        due = rollout.verdict_due_at
        st.verdict_due = None if due is None else mono + (due - wall)
        events += [EventSpec(e.type.value, e.reason, e.message) for e in rollout.events]
        metrics.count_rollout_events(
            seen.isvc.namespace, seen.isvc.name, (e.reason for e in rollout.events)
        )
        return rollout

    async def _decide_roles(
        self,
        st: ServiceState,
        seen: TickReading,
        route: Routing,
        decision: ScaleDecision | None,
        rollout: RolloutDecision | None,
        events: list[EventSpec],
    ) -> list[RoleChanges]:
        """The scale Event and, per pool, the role labels its pods are to get (none with manual
        replicas)."""
        if decision is None:
            return []
        serving = route.serving
        event = scale_event(serving[0], st.last_total.get(serving), decision)
        if event is not None:
            events.append(EventSpec(*event))  # type: ignore[arg-type]
        st.last_total[serving] = decision.desired_total
        split = rollout is not None and rollout.traffic is Traffic.SPLIT
        # The baseline's rollback reserve stays on the device: an abort is instant.
        tier = StandbyTier.DEVICE if split else seen.isvc.spec.autoscaling.standby_tier
        targets = role_targets(serving, decision, route.helping, rollout)
        return [
            await self._choose_roles(
                seen.key, st, seen.pods[pool], seen.readings[pool], want_serving, want_standby, tier
            )
            for pool, (want_serving, want_standby) in targets.items()
        ]

    def _plan_children(
        self,
        st: ServiceState,
        seen: TickReading,
        scaling: Scaling,
        rollout: RolloutDecision | None,
        roles: Sequence[RoleChanges],
        events: list[EventSpec],
    ) -> tuple[Observed, frozenset[str]]:
        """The replicas and routing to publish (``plan_children``), moved make-before-break
        (`_move_traffic`), and the demotions that may be written now."""
        observed = plan_children(seen.isvc, scaling.decision, rollout, seen.current)
        return self._move_traffic(
            seen.key,
            st,
            seen.isvc,
            seen.kids,
            seen.pods,
            observed,
            seen.current,
            roles,
            seen.mono,
            events,
        )

    async def _apply_pods(
        self,
        st: ServiceState,
        seen: TickReading,
        route: Routing,
        decision: ScaleDecision | None,
        observed: Observed,
        roles: Sequence[RoleChanges],
        demote: frozenset[str],
    ) -> None:
        """Write the role labels the traffic move lets go, and before a scale-down each pod's
        deletion cost (the ReplicaSet removes the cheapest)."""
        for role_changes in roles:
            await self._write_roles(seen.key, st, role_changes, demote)
        if decision is None:
            return
        for pool in route.serving:
            if observed.replicas.get(pool, 0) < sum(1 for p in seen.pods[pool] if _live(p)):
                await self._set_deletion_costs(seen.key, st, seen.pods[pool], seen.readings[pool])

    async def _publish_view(
        self,
        st: ServiceState,
        seen: TickReading,
        route: Routing,
        scaling: Scaling,
        rollout: RolloutDecision | None,
        observed: Observed,
    ) -> None:
        """Hand the tick's view (replicas, routing, status) to the reconciler."""
        status = self._status(
            st,
            seen.isvc,
            route.serving,
            seen.readings,
            route.observation,
            scaling.decision,
            rollout,
            seen.now,
            scaling.autoscaler,
        )
        view = ControlView(
            observed=observed,
            status=status,
            hold_primary_template=rollout.hold_primary_template if rollout else False,
        )
        await self._publish(seen.key, st, view, seen.mono)

    def _settle(
        self,
        st: ServiceState,
        seen: TickReading,
        route: Routing,
        decision: ScaleDecision | None,
        events: Sequence[EventSpec],
    ) -> None:
        """Whether the loop may go quiet until an event or the slow timer, and while quiet
        the long-polls that wake it."""
        st.quiet = (
            decision is not None
            and route.spec is None
            and not route.helping
            and not events
            and not st.unsent
            and not st.wake_soon
            and st.traffic_since is None
            and not self._busy_in_background(st)
            and is_quiet(decision, route.observation, route.policy.max_metrics_age_seconds)
        )
        st.timerless = not may_scale_to_zero(seen.isvc)
        self._watch_activity(seen.key, st, [b for pool in seen.pools for b in seen.pods[pool]])

    async def _post_events(self, seen: TickReading, events: Sequence[EventSpec]) -> None:
        for e in events:
            log.info("%s/%s %s: %s", seen.key[0], seen.key[1], e.reason, e.message)
        await asyncio.gather(*(self.kube.post_event(seen.body, e, seen.now) for e in events))

    def _watch_activity(
        self, key: Key, st: ServiceState, pods: Sequence[Mapping[str, Any]]
    ) -> None:
        """While the loop is quiet, keep a long-poll parked on each of its pods
        (`ActivityWatch`): the first request to arrive pokes the loop."""
        slow = self.settings.quiet_tick_seconds > self.settings.tick_seconds
        urls = (
            frozenset(f"http://{t.address}" for t in scrape_targets(pods))
            if st.quiet and slow
            else frozenset()
        )
        watch = st.activity
        if watch is not None and (watch.urls != urls or watch.done or watch.woke):
            watch.cancel()
            st.activity = watch = None
        if urls and watch is None:
            st.activity = ActivityWatch(
                f"{key[0]}/{key[1]}", urls, lambda: self.poke(key), self._activity_session
            )

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

    def _activity_session(self) -> aiohttp.ClientSession:
        # Apart from the scrapes' session: parked long-polls must not take its connections.
        if self._long_polls is None or self._long_polls.closed:
            self._long_polls = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._long_polls

    def _cache_synced(
        self,
        st: ServiceState,
        kids: Any,
        pods: Mapping[PoolName, Sequence[Mapping[str, Any]]],
    ) -> bool:
        """Whether the loop may decide yet (once true, stays true).

        A restarted operator's first ticks can come before its watch has listed the pods: a
        pool would look empty, and the autoscaler would take a false idle sample mid-surge.
        So the first decision waits, once, until the pod cache shows as many ready pods as the
        Deployments report, or `sync_timeout_seconds`; the reconciler holds to the provisional
        view meanwhile. Later ticks never wait (a per-tick check flaps as pods turn ready, and
        the gaps it leaves between scrapes average the arrival rate over seconds).
        """
        now = self.mono()
        if st.first_tick_at is None:
            st.first_tick_at = now
        deployments = kids.deployments if kids is not None else {}
        st.synced = now - st.first_tick_at >= self.settings.sync_timeout_seconds or all(
            d.ready_replicas <= ready_of_template(pods[PoolName(p)], None)
            for p, d in deployments.items()
            if p in (PoolName.PRIMARY.value, PoolName.BASELINE.value) and PoolName(p) in pods
        )
        return st.synced

    def _status(
        self,
        st: ServiceState,
        isvc: InferenceService,
        serving: tuple[PoolName, ...],
        readings: Mapping[PoolName, PoolReading],
        observation: Observation,
        decision: ScaleDecision | None,
        rollout: RolloutDecision | None,
        now: datetime,
        autoscaler: AutoscalerStatus | None,
    ) -> ControlStatus:
        notes = [n for p in serving for n in readings[p].observed.notes]
        conditions = [
            scaling_condition(decision, observation, isvc.spec.replicas is not None),
            prewarmed_condition(decision, observation),
            metrics_condition(decision, notes),
        ]
        if rollout is not None:
            conditions.append(rolled_back_condition(rollout))
        last = st.view.status.last_decision if st.view is not None else None
        if decision is not None:
            marker = (decision.reason, decision.desired_serving, decision.desired_standby)
            if marker != st.last_decision_key or last is None:
                last = status_decision(decision, serving[0], now)
                st.last_decision_key = marker
                metrics.SCALE_DECISIONS.labels(
                    namespace=isvc.namespace,
                    isvc=isvc.name,
                    pool=serving[0].value,
                    reason=decision.reason,
                ).inc()
        return ControlStatus(
            conditions=tuple(conditions),
            pool_metrics={
                pool: pool_metrics(
                    r.observed.observation,
                    r.slo,
                    r.observed.queue_source,
                    _with_promotion(st.routable.get(pool), st.promote_seconds)
                    if pool == serving[0]
                    else st.routable.get(pool),
                )
                for pool, r in readings.items()
            },
            last_decision=last,
            rollout=rollout_status(rollout, st.rollout) if rollout and st.rollout else None,
            autoscaler=autoscaler,
            pod_problems=st.pod_faults.problems(),
        )

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

    async def _patch_pod(
        self, key: Key, st: ServiceState, pod: str, what: str, value: str, patch: dict[str, Any]
    ) -> None:
        sent = st.patched.get((pod, what))
        if (
            sent is not None
            and sent[0] == value
            and self.mono() - sent[1] < self.settings.patch_grace_seconds
        ):
            return
        st.patched[(pod, what)] = (value, self.mono())
        try:
            await self.kube.patch_pod(key[0], pod, patch)
        except KubeError as exc:
            log.warning("patch pod %s/%s: %s", key[0], pod, exc)

    async def _choose_roles(
        self,
        key: Key,
        st: ServiceState,
        pods: Sequence[Mapping[str, Any]],
        reading: PoolReading,
        desired_serving: int,
        desired_standby: int,
        tier: StandbyTier = StandbyTier.DEVICE,
    ) -> RoleChanges:
        """The role labels one pool's pods are to get (``choose_standby``); a host-warm pod to
        promote is moved back onto the device first (and stays standby if that failed)."""
        views = pod_views(pods, reading.pod_scrapes, self.wall())
        assignment = choose_standby(views, desired_serving, desired_standby)
        changes = [(n, ROLE_SERVING) for n in assignment.promote]
        changes += [(n, ROLE_STANDBY) for n in assignment.demote]
        # Pods demoted earlier but counted among the serving now (choose_standby keeps standby
        # pods beyond the target standby out of both lists): make every standby pod that is
        # neither serving nor kept as standby serve again.
        keep = set(assignment.serving) | set(assignment.standby)
        for v in views:
            if v.ready and v.standby and v.name not in keep:
                changes.append((v.name, ROLE_SERVING))
        started = self.mono()
        urls = {
            str((p.get("metadata") or {}).get("name")): url
            for p in pods
            if (url := _tier_url(p)) is not None
        }
        if tier is StandbyTier.HOST:
            changes = await self._to_device_first(key, st, changes, urls)
        return RoleChanges(assignment, tuple(changes), urls, tier, started)

    async def _write_roles(
        self, key: Key, st: ServiceState, roles: RoleChanges, demote: frozenset[str]
    ) -> None:
        """Write the promotions and those demotions the traffic move lets go now (``demote``:
        a demotion waits while the EndpointSlices do not list the pods that stay)."""
        assignment = roles.assignment
        changes = [(n, r) for n, r in roles.changes if r == ROLE_SERVING or n in demote]
        if changes:
            log.info(
                "%s/%s roles (%s): %s",
                key[0],
                key[1],
                assignment.reason,
                ", ".join(f"{n}={r}" for n, r in changes),
            )
        await asyncio.gather(
            *(
                self._patch_pod(
                    key, st, name, "role", role, {"metadata": {"labels": {LABEL_ROLE: role}}}
                )
                for name, role in changes
            )
        )
        if any(role == ROLE_SERVING for _, role in changes) and assignment.promote:
            st.promote_seconds = round(self.mono() - roles.started, 3)
        if roles.tier is StandbyTier.HOST:
            # Standby pods go host-warm once out of the Service: HOST_TIER_AFTER_SECONDS after
            # they became standby (endpoints and the clients that watch them lag the label), in
            # the background (the runtime also waits until requests have stopped arriving). A
            # demotion still waiting for endpoints is not standby yet.
            now = self.mono()
            held = {n for n, r in roles.changes if r == ROLE_STANDBY and n not in demote}
            standby = set(assignment.standby) - held
            for name in list(st.standby_since):
                if name not in standby:
                    del st.standby_since[name]
            for name in assignment.standby:
                if name in held:
                    continue
                since = st.standby_since.setdefault(name, now)
                if name in st.host_tier or name in st.tier_tasks or name not in roles.urls:
                    continue
                if now - since < HOST_TIER_AFTER_SECONDS:
                    continue
                st.tier_tasks[name] = asyncio.create_task(
                    self._to_host(st, name, roles.urls[name]), name=f"host-tier {name}"
                )

    def _move_traffic(
        self,
        key: Key,
        st: ServiceState,
        isvc: InferenceService,
        kids: Children | None,
        pods: Mapping[PoolName, Sequence[Mapping[str, Any]]],
        observed: Observed,
        current: Mapping[PoolName, int],
        roles: Sequence[RoleChanges],
        mono: float,
        events: list[EventSpec],
    ) -> tuple[Observed, frozenset[str]]:
        """Make before break (``core.traffic``): the routing and replicas to publish this tick,
        and the demotions that may be written. What a move adds goes at once; what it takes
        away (a pool the Service stops selecting, pods demoted to standby, replicas of a pool
        that gets traffic) waits until the Service's EndpointSlices list the pods that stay."""
        demote = frozenset(n for r in roles for n, role in r.changes if role == ROLE_STANDBY)
        selector = kids.service_selector if kids is not None else None
        if isvc.spec.fleet is not None or (selector is not None and LABEL_COMPONENT in selector):
            return observed, demote  # the Service selects the gateway, which routes itself
        has_baseline = isvc.spec.rollout.baseline is not None
        both = frozenset(PoolName) if has_baseline else frozenset({PoolName.PRIMARY})
        active = observed.active_pool if has_baseline else PoolName.PRIMARY
        want_pools = both if observed.split and has_baseline else frozenset({active})
        selected = _selected_pools(selector, both, want_pools)
        route_pods = [
            RoutePod(
                str((b.get("metadata") or {}).get("name")),
                pool,
                _labels(b).get(LABEL_ROLE) == ROLE_SERVING,
                _ready(b),
            )
            for pool, bodies in pods.items()
            for b in bodies
            if _live(b)
        ]
        shrink = any(
            observed.replicas.get(pool, current[pool]) < current[pool]
            for pool in selected | want_pools
            if pool in current
        )
        want = TrafficWant(
            pools=want_pools,
            promote=frozenset(n for r in roles for n, role in r.changes if role == ROLE_SERVING),
            demote=demote,
            shrink=shrink,
        )
        endpoints = kids.ready_endpoints() if kids is not None else None
        step = plan_traffic(
            want, route_pods, selected, endpoints, st.traffic_since, mono, self.settings.traffic
        )
        if step.reason != st.traffic_reason and step.reason != "unchanged":
            log.info(
                "%s/%s traffic %s: select %s%s",
                key[0],
                key[1],
                step.reason,
                "+".join(sorted(p.value for p in step.pools)),
                f", not listed ready yet: {', '.join(step.missing)}" if step.missing else "",
            )
        st.traffic_reason = step.reason
        if step.overdue and not st.traffic_overdue:
            events.append(traffic_event(isvc.name, step, self.settings.traffic))
        st.traffic_overdue = step.overdue
        st.traffic_since = step.waiting_since
        replicas = dict(observed.replicas)
        if not step.shrink:
            for pool in step.pools:
                if pool in replicas and pool in current:
                    replicas[pool] = max(replicas[pool], current[pool])
        moved = replace(observed, replicas=replicas, split=len(step.pools) > 1)
        return moved, step.demote

    @staticmethod
    def _busy_in_background(st: ServiceState) -> bool:
        """Readiness probes or tier moves under way, or standby pods waiting for their move to
        the host tier (a timer of its own): the loop must come back to them."""
        if st.probing is not None and not st.probing.done():
            return True
        if any(not t.done() for t in st.tier_tasks.values()):
            return True
        return any(name not in st.host_tier for name in st.standby_since)

    def _decide_zero(
        self,
        st: ServiceState,
        isvc: InferenceService,
        policy: ScalingPolicy,
        observation: Observation,
        scaler: ScalerState,
        serving: tuple[PoolName, ...],
        mono: float,
        wall: float,
        held: int,
        *,
        served: bool = True,
        waited_seconds: float = math.inf,
    ) -> tuple[ScaleDecision, ScalerState]:
        """decide_scale for a pool that may reach zero: gathers what ``core.idle.step_zero``
        decides on (``held``: requests its gateway holds now; the arrivals the gateway
        counted; the measured time-to-routable; whether it has served) and keeps its memory."""
        routable = st.routable.get(serving[0])
        counted = self.arrivals((isvc.namespace, isvc.name))
        tick = ZeroTick(
            mono,
            wall,
            observation,
            held=held,
            arrivals=counted[0] if counted is not None else None,
            arrivals_at=counted[1] if counted is not None else None,
            routable_seconds=routable.total_seconds if routable is not None else None,
            quiet_tick_seconds=self.settings.quiet_tick_seconds,
            served=served,
            waited_seconds=waited_seconds,
        )
        zero = zero_policy_of(isvc, self.settings.wake_margin_seconds)
        step = step_zero(policy, zero, self.zero_forecast, st.zero, scaler, tick)
        st.zero, st.wake_soon = step.memory, step.wake_soon
        return step.decision, step.scaler

    def _persisted(
        self,
        st: ServiceState,
        policy: ScalingPolicy,
        serving: tuple[PoolName, ...],
        state: ScalerState,
        mono: float,
        wall: float,
    ) -> AutoscalerStatus:
        """The autoscaler's memory as status carries it, rebuilt (its JSON) and rewritten only
        when something a restarted operator would decide from has changed
        (`autoscaler_persist_key`): its times move every tick, and writing them would patch
        every service's status every second in a quiet cluster."""
        previous = st.view.status.autoscaler if st.view is not None else None
        key = autoscaler_persist_key(state, estimate_capacity(policy, state.capacity))
        if policy.min_replicas == 0:
            key = (*key, zero_persist_key(st.zero))
        if previous is None or key != st.autoscaler_key:
            st.autoscaler_key = key
            zero = None
            if policy.min_replicas == 0:
                zero = dump_zero(self.zero_forecast, st.zero, wall - mono)
            return autoscaler_status(policy, serving, state, mono, wall, zero)
        return previous

    async def _put_tier(self, url: str, tier: str) -> bool:
        """Ask a runtime to move its engines to ``tier``; True when it did (or predates tiers:
        its engines are on the device anyway)."""
        if self._probe_session is None:
            self._probe_session = new_scrape_session(connections=16)
        try:
            async with (
                asyncio.timeout(TIER_TIMEOUT_SECONDS),
                self._probe_session.put(url, json={"tier": tier}) as response,
            ):
                if response.status == 404 and tier == "device":
                    return True
                if response.status == 409:
                    log.info("tier %s at %s: %s", tier, url, await response.text())
                elif response.status != 200:
                    log.warning("tier %s at %s: HTTP %s", tier, url, response.status)
                return response.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.warning("tier %s at %s failed: %s", tier, url, exc)
            return False

    async def _to_device_first(
        self,
        key: Key,
        st: ServiceState,
        changes: list[tuple[str, str]],
        urls: Mapping[str, str],
    ) -> list[tuple[str, str]]:
        """Host-warm standby: a pod about to serve loads its engines back onto the device and
        warms them up first; only those that did get the serving label now."""
        promote = [n for n, role in changes if role == ROLE_SERVING and n in urls]
        done = await asyncio.gather(*(self._put_tier(urls[n], "device") for n in promote))
        failed = {n for n, ok in zip(promote, done, strict=True) if not ok}
        for name in promote:
            st.host_tier.discard(name)
            task = st.tier_tasks.pop(name, None)
            if task is not None:
                task.cancel()
        if failed:
            log.warning("%s/%s: not promoted (device tier failed): %s", *key, sorted(failed))
        return [(n, r) for n, r in changes if not (r == ROLE_SERVING and n in failed)]

    async def _to_host(self, st: ServiceState, name: str, url: str) -> None:
        try:
            if await self._put_tier(url, "host"):
                st.host_tier.add(name)
        finally:
            st.tier_tasks.pop(name, None)

    async def _set_deletion_costs(
        self,
        key: Key,
        st: ServiceState,
        pods: Sequence[Mapping[str, Any]],
        reading: PoolReading,
    ) -> None:
        by_name = {str((p.get("metadata") or {}).get("name")): p for p in pods}
        patches = []
        for view in pod_views(pods, reading.pod_scrapes, self.wall()):
            cost = str(pod_deletion_cost(view))
            if _annotations(by_name.get(view.name, {})).get(ANNOTATION_POD_DELETION_COST) == cost:
                continue
            patch = {"metadata": {"annotations": {ANNOTATION_POD_DELETION_COST: cost}}}
            patches.append(self._patch_pod(key, st, view.name, "cost", cost, patch))
        await asyncio.gather(*patches)


TIER_TIMEOUT_SECONDS = 30.0
HOST_TIER_AFTER_SECONDS = 2.0


def _with_promotion(
    routable: TimeToRoutable | None, seconds: float | None
) -> TimeToRoutable | None:
    if seconds is None:
        return routable
    if routable is None:
        return TimeToRoutable(promote_seconds=seconds)
    return routable.model_copy(update={"promote_seconds": seconds})


def _tier_url(pod: Mapping[str, Any]) -> str | None:
    address = pod_address(pod)
    return None if address is None else f"http://{address}/v2/tidal/tier"


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


def _serving_pools(state: RolloutState | None) -> tuple[PoolName, ...]:
    """The pools the autoscaler sizes (and whose signals it reads) for the traffic."""
    if state is None:
        return (PoolName.PRIMARY,)
    if state.traffic is Traffic.SPLIT:
        return (PoolName.PRIMARY, PoolName.BASELINE)
    if state.traffic is Traffic.OVERFLOW:
        return (PoolName.PRIMARY,)
    return (PoolName(state.traffic.value),)


def _helping_pools(state: RolloutState | None) -> tuple[PoolName, ...]:
    """Pools that serve beside the sized one without being sized: the baseline in an overflow."""
    if state is not None and state.traffic is Traffic.OVERFLOW:
        return (PoolName.BASELINE,)
    return ()


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
class RoleChanges:
    """One pool's role labels to write (``Controller._choose_roles``)."""

    assignment: StandbyAssignment
    changes: tuple[tuple[str, str], ...]  # (pod, role)
    urls: Mapping[str, str]  # pod -> its tier URL (host-warm standby)
    tier: StandbyTier
    started: float  # monotonic, for the promotion's duration


def _selected_pools(
    selector: Mapping[str, str] | None, both: frozenset[PoolName], want: frozenset[PoolName]
) -> frozenset[PoolName]:
    """The pools the live Service selects (its selector names one, or none: all); before the
    Service exists, the ones wanted."""
    if selector is None:
        return want
    pool = selector.get(LABEL_POOL)
    if pool is None:
        return both
    try:
        return frozenset({PoolName(pool)})
    except ValueError:
        return want


def traffic_event(service: str, step: TrafficStep, policy: TrafficPolicy) -> EventSpec:
    """The Warning of a traffic move whose wait for endpoints ran out."""
    wait = f"{policy.wait_seconds:g}s"
    missing = ", ".join(step.missing) or "none"
    pools = "+".join(sorted(p.value for p in step.pools))
    if step.reason == "endpoints-unseen":
        return EventSpec(
            "Warning",
            "EndpointSlicesUnseen",
            f"no EndpointSlice of Service {service} seen in {wait}: traffic moved to {pools} "
            "without waiting for its endpoints (may the operator list and watch "
            "endpointslices.discovery.k8s.io?)",
        )
    if step.complete:
        return EventSpec(
            "Warning",
            "EndpointsSlow",
            f"traffic moved to {pools} after waiting {wait} for the EndpointSlices of Service "
            f"{service}: Ready pods not listed ready yet: {missing}",
        )
    return EventSpec(
        "Warning",
        "EndpointsNotReady",
        f"traffic move waits: after {wait} the EndpointSlices of Service {service} list none of "
        f"the pods that are to take the traffic as ready (Ready pods not listed: {missing}); "
        f"the Service keeps selecting {pools}, so the pods serving now keep answering",
    )
