"""The fleet loop: where each model of an InferenceService with ``spec.fleet`` is hot.

One asyncio task per such InferenceService, beside the control loop. Every tick (1 s):

1. read each serving runtime pod's hot set (``GET /v2/tidal/models``, concurrently, with a
   short timeout; a pod that does not answer is left out of this tick);
2. tell every gateway pod which runtime pods serve (``PUT /v2/tidal/replicas``) as soon as
   that list changes, so a new replica gets traffic and a removed one loses it within a tick;
3. every ``placement.intervalSeconds``: per-model rates from the runtimes' request counters,
   the forecast (``tidal.operator.core.forecast``) updated and asked for each model's peak over
   its load-time horizon, ``place`` (``tidal.operator.core.placement``) run, and each runtime
   whose pins changed told (``PUT /v2/tidal/placement``); the gateways get the placement as
   routing hints;
4. publish ``status.fleet`` (and ``Degraded`` reasons for models no replica can hold) for the
   reconciler, and every ``forecast_save_seconds`` write the forecast state to the ConfigMap
   ``<isvc>-fleet-state``, from which a restarted operator resumes.

Pushes are level-triggered and idempotent (the whole pinned set, the whole replica list), and
repeated every ``resync_seconds`` even when nothing changed, so a restarted runtime or gateway
catches up without the operator noticing the restart.

A service without ``spec.fleet`` that may scale to zero (``autoscaling.minReplicas: 0``) is
fronted by the same gateway as an *activator*, and gets a lighter loop: step 2 only, from the
pod cache (its ready serving pods; no request to the runtimes, every replica preloads its
models), plus one long-poll per gateway pod of ``GET /v2/tidal/held``: it answers as soon as
the number of requests the gateway holds changes, and the loop then hands that number to the
control loop (``held``) and pokes the service, so a request held at zero wakes the pool within
a tick. A quiet service costs one parked request per gateway pod per ``held_wait_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import aiohttp
from pydantic import ValidationError

from ...common.backoff import Backoff, Retry
from ...common.clock import CLOCK, Clock
from ..core.api import (
    LABEL_POOL,
    LABEL_ROLE,
    InferenceService,
    PoolName,
    duration_seconds,
)
from ..core.control import ControlView
from ..core.fleet import (
    DemandState,
    FleetView,
    ReplicaReport,
    fleet_status,
    gateway_push,
    learn_demands,
    parse_replica_report,
    plan_placement,
    too_large_problems,
)
from ..core.forecast import (
    ForecastPolicy,
    ModelForecast,
    forecasts_from_json,
    forecasts_to_json,
)
from ..core.placement import Placement, PlacementPolicy
from ..core.resources import (
    COMPONENT_GATEWAY,
    GATEWAY_PORT,
    LABEL_COMPONENT,
    ROLE_SERVING,
    RUNTIME_PORT,
    common_labels,
    find_spec_problems,
    fronted_by_gateway,
    holds_requests,
    owner_reference,
    placement_headroom,
    placement_landing_share,
    resolve_active_pool,
)
from ..core.signals import pod_labels, pod_ready
from . import metrics
from .kube import Kube, KubeError
from .reconciler import Key, Store

log = logging.getLogger("tidal.operator.fleet")

Enqueue = Callable[[Key], Awaitable[None]]
FORECAST_KEY = "forecast.json"
# A gateway pod whose held count cannot be read is asked again after 0.1 s, 0.2 s, ... 5 s.
HELD_POLL_BACKOFF = Backoff(first_seconds=0.1, max_seconds=5.0)


@dataclass(frozen=True)
class FleetSettings:
    """How often the fleet loop ticks, resends and saves."""

    tick_seconds: float = 1.0
    request_timeout: float = 1.0
    # A push the other side has acknowledged is repeated this often anyway (it may restart).
    resync_seconds: float = 15.0
    # A push not acknowledged yet is repeated after this long.
    retry_seconds: float = 2.0
    forecast_save_seconds: float = 60.0
    status_interval: float = 2.0
    # How long one long-poll of a gateway's held count waits for a change.
    held_wait_seconds: float = 25.0
    # ... and how soon it answers once requests arrived (the zero forecast learns a busy
    # service's arrivals within this, one forecast sample: not at the end of the wait).
    arrivals_every_seconds: float = 5.0


@dataclass
class FleetState:
    """What the fleet loop remembers of one InferenceService between ticks."""

    demand: DemandState = field(default_factory=DemandState)  # rates and forecasts learned
    forecast_loaded: bool = False
    forecast_saved_at: float = -1e9
    placement: Placement | None = None
    placed_at: float = -1e9
    placed_wall: datetime | None = None
    pins_sent: dict[str, tuple[frozenset[str], float]] = field(default_factory=dict)
    gateway_sent: dict[str, tuple[str, float]] = field(default_factory=dict)
    loaded_bytes: int = 0
    view: FleetView | None = None
    enqueued_at: float = -1e9
    # Activator: the long-poll of each gateway pod's held count (by pod name: its URL and
    # task), and the last count each answered.
    held_polls: dict[str, tuple[str, asyncio.Task[None]]] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)
    # ... and the cumulative arrival count each last reported, with when (wall time) it was
    # read (the zero forecast learns it).
    arrivals: dict[str, tuple[int, float]] = field(default_factory=dict)
    routed: tuple[str, ...] | None = None  # the replicas last handed to the gateways


def state_config_map_name(isvc_name: str) -> str:
    return f"{isvc_name}-fleet-state"


_labels, _ready = pod_labels, pod_ready


def _usable(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    return (
        meta.get("deletionTimestamp") is None
        and status.get("phase") == "Running"
        and bool(status.get("podIP"))
    )


def fronted(body: Mapping[str, Any] | None) -> bool:
    """Whether an InferenceService's raw body asks for a gateway loop: ``spec.fleet``, or a
    service that may scale to zero (``resources.fronted_by_gateway`` on the raw spec)."""
    spec = (body or {}).get("spec") or {}
    if spec.get("fleet") is not None:
        return True
    autoscaling = spec.get("autoscaling") or {}
    return spec.get("replicas") is None and autoscaling.get("minReplicas") == 0


def serving_pools(isvc: InferenceService, view: ControlView | None) -> tuple[PoolName, ...]:
    """The pools whose serving pods get traffic (both during a split rollout step)."""
    if view is None:
        return (PoolName.PRIMARY,)
    if view.observed.split and isvc.spec.rollout.baseline is not None:
        return (PoolName.PRIMARY, PoolName.BASELINE)
    return (resolve_active_pool(isvc, view.observed),)


def _due(
    sent: tuple[Any, float] | None, value: Any, acked: bool, now: float, s: FleetSettings
) -> bool:
    """Whether a push of ``value`` is due, given what was sent last and when."""
    if sent is None or sent[0] != value:
        return True
    return now - sent[1] >= (s.resync_seconds if acked else s.retry_seconds)


class FleetController:
    """Runs one fleet loop per InferenceService that has ``spec.fleet``."""

    def __init__(
        self,
        kube: Kube,
        store: Store,
        enqueue: Enqueue,
        control: Callable[[Key], ControlView | None],
        settings: FleetSettings | None = None,
        *,
        on_held: Callable[[Key], None] = lambda key: None,
        clock: Clock = CLOCK,
    ) -> None:
        self.kube, self.store, self.enqueue, self.control = kube, store, enqueue, control
        self.settings = settings or FleetSettings()
        self.clock = clock
        self.on_held = on_held
        self.states: dict[Key, FleetState] = {}
        self._wakes: dict[Key, asyncio.Event] = {}
        self.tasks: dict[Key, asyncio.Task[None]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._poll_session: aiohttp.ClientSession | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def view(self, key: Key) -> FleetView | None:
        state = self.states.get(key)
        return state.view if state is not None else None

    def held(self, key: Key) -> int:
        """Requests the service's gateway pods hold now (as their long-polls last said)."""
        state = self.states.get(key)
        return sum(state.held.values()) if state is not None else 0

    def arrivals(self, key: Key) -> tuple[dict[str, int], float] | None:
        """Each gateway pod's cumulative count of requests received, as its long-poll last
        said (it answers on every change of the held count, within ``arrivals_every_seconds``
        of arrivals, else every ``held_wait_seconds``),
        and the wall time of the oldest of those answers (the counts cover arrivals up to
        then); None while no pod has reported one (none yet, or an older gateway)."""
        state = self.states.get(key)
        if state is None or not state.arrivals:
            return None
        counts = {name: count for name, (count, _) in state.arrivals.items()}
        return counts, min(at for _, at in state.arrivals.values())

    def poke(self, key: Key) -> None:
        """A child of the service changed: an activator's loop ticks now, so a replica that
        turned Ready reaches its gateway within milliseconds, not at the next tick (a fleet's
        loop keeps its period: its tick asks every runtime for its hot set)."""
        wake = self._wakes.get(key)
        if wake is not None:
            wake.set()

    def ensure(self, key: Key) -> None:
        """Start the key's loop if it has ``spec.fleet`` or may scale to zero (its gateway is
        then an activator) and the loop is not running."""
        if not self._fronted(key):
            return
        task = self.tasks.get(key)
        if task is None or task.done():
            self.tasks[key] = asyncio.create_task(self._run(key), name=f"fleet {key[0]}/{key[1]}")

    async def stop(self, key: Key) -> None:
        task = self.tasks.pop(key, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._wakes.pop(key, None)
        state = self.states.pop(key, None)
        if state is not None:
            await _stop_polls(state, set(state.held_polls))

    async def close(self) -> None:
        for key in list(self.tasks):
            await self.stop(key)
        for session in (self._session, self._poll_session):
            if session is not None:
                await session.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.settings.request_timeout),
                connector=aiohttp.TCPConnector(limit=64),
            )
        return self._session

    async def _run(self, key: Key) -> None:
        next_at = self.clock.monotonic()
        while self._fronted(key):
            body = self.store.services.get(key)
            wake = None
            if ((body or {}).get("spec") or {}).get("fleet") is None:
                wake = self._wakes.setdefault(key, asyncio.Event())
                wake.clear()  # events from here on are seen by the next tick
            try:
                await self.tick(key)
            except asyncio.CancelledError:
                raise
            except Exception:  # one bad tick must not end the loop
                log.exception("fleet tick of %s/%s failed", *key)
            next_at = max(next_at + self.settings.tick_seconds, self.clock.monotonic())
            if wake is None:
                self._wakes.pop(key, None)
                await asyncio.sleep(next_at - self.clock.monotonic())
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), next_at - self.clock.monotonic())
                next_at = self.clock.monotonic()
        self._wakes.pop(key, None)
        state = self.states.pop(key, None)
        if state is not None:
            await _stop_polls(state, set(state.held_polls))
        self.tasks.pop(key, None)
        if key in self.store.services:
            await self.enqueue(key)  # so that status.fleet goes with spec.fleet

    def _fronted(self, key: Key) -> bool:
        """Whether the key needs a loop: its spec asks for a gateway, or a gateway left over
        from ``minReplicas: 0`` still runs (the Service selects it until a serving pod is
        ready, and it must learn of that pod to forward what it holds)."""
        if fronted(self.store.services.get(key)):
            return True
        kids = self.store.children.get(key)
        return key in self.store.services and kids is not None and kids.gateway_live()

    # -- one tick ----------------------------------------------------------------------------

    async def tick(self, key: Key) -> None:
        body = self.store.services.get(key)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return
        try:
            isvc = self.store.parse(body)
        except ValidationError:
            return  # the reconciler reports it as Degraded
        fleet = isvc.spec.fleet
        if find_spec_problems(isvc) or not (fronted_by_gateway(isvc) or self._fronted(key)):
            return
        st = self.states.setdefault(key, FleetState())
        if fleet is None:
            await self._activator_tick(key, isvc, st)
            return
        if not st.forecast_loaded:
            st.demand = replace(st.demand, forecasts=await self._load_forecasts(isvc))
            st.forecast_loaded = True
        kids = self.store.children.get(key)
        bodies = list(kids.pod_bodies.values()) if kids is not None else []
        pools = {p.value for p in serving_pools(isvc, self.control(key))}
        runtimes = [
            b
            for b in bodies
            if _labels(b).get(LABEL_POOL) in pools
            and _labels(b).get(LABEL_ROLE) == ROLE_SERVING
            and _usable(b)
            and _ready(b)
        ]
        gateways = [
            b for b in bodies if _labels(b).get(LABEL_COMPONENT) == COMPONENT_GATEWAY and _usable(b)
        ]
        reports = await self._reports(runtimes)
        mono, wall = self.clock.monotonic(), self.clock.wall()
        if mono - st.placed_at >= fleet.placement.interval_seconds:
            self._place(isvc, st, reports, mono, wall)
        await self._push_pins(st, reports, mono)
        await self._push_gateways(st, reports, gateways, mono)
        saved = st.forecast_saved_at
        if st.demand.forecasts and mono - saved >= self.settings.forecast_save_seconds:
            await self._save_forecasts(isvc, st, mono)
        view = FleetView(
            status=fleet_status(
                isvc.spec.models,
                reports,
                st.placement,
                dict(st.demand.smoothed),
                sum(1 for g in gateways if _ready(g)),
                st.loaded_bytes,
                st.placed_wall,
            ),
            problems=tuple(too_large_problems(isvc, st.placement)),
        )
        await self._publish(key, st, view, mono)

    async def _publish(self, key: Key, st: FleetState, view: FleetView, mono: float) -> None:
        """Hand the view to the reconciler: at once when what status shows changed, else
        (new figures only) at most every ``status_interval``."""
        before, st.view = st.view, view
        if before == view:
            return
        urgent = (
            before is None
            or before.problems != view.problems
            or before.status.summary != view.status.summary
            or before.status.gateways_ready != view.status.gateways_ready
        )
        if urgent or mono - st.enqueued_at >= self.settings.status_interval:
            st.enqueued_at = mono
            await self.enqueue(key)

    def _place(
        self,
        isvc: InferenceService,
        st: FleetState,
        reports: Sequence[ReplicaReport],
        mono: float,
        wall: float,
    ) -> None:
        fleet = isvc.spec.fleet
        assert fleet is not None
        st.demand, demands = learn_demands(
            st.demand,
            list(isvc.spec.models),
            reports,
            mono,
            wall,
            window_seconds=fleet.placement.rate_window_seconds,
            forecast=_forecast_policy(isvc) if fleet.forecast.enabled else None,
            lead_seconds=fleet.forecast.lead_seconds,
        )
        st.placed_at = mono
        if not reports:
            return
        placement = plan_placement(
            PlacementPolicy(
                rate_per_copy=fleet.placement.rate_per_copy,
                max_copies=fleet.placement.max_copies,
                min_rate=fleet.placement.min_rate,
                headroom_fraction=placement_headroom(isvc),
                landing_share=placement_landing_share(isvc),
            ),
            demands,
            reports,
            {r: pins for r, (pins, _) in st.pins_sent.items()},
            st.placement,
            wall,
        )
        pins = placement.pinned
        if st.placement is None or st.placement.pinned != pins:
            st.placed_wall = datetime.fromtimestamp(wall, UTC)
            metrics.PLACEMENT_CHANGES.labels(namespace=isvc.namespace, isvc=isvc.name).inc()
            sizes = {d.name: d.size_bytes for d in demands}
            resident = {r.name: r.resident for r in reports}
            st.loaded_bytes += sum(
                sizes.get(m, 0)
                for replica, pins in placement.pinned.items()
                for m in pins - resident.get(replica, frozenset())
            )
            log.info(
                "%s/%s placement: %s",
                isvc.namespace,
                isvc.name,
                "; ".join(f"{r}={','.join(sorted(p))}" for r, p in sorted(pins.items())),
            )
        st.placement = placement

    # -- I/O ---------------------------------------------------------------------------------

    async def _reports(self, pods: Sequence[Mapping[str, Any]]) -> list[ReplicaReport]:
        async def one(pod: Mapping[str, Any]) -> ReplicaReport | None:
            name = str(pod["metadata"]["name"])
            url = f"http://{pod['status']['podIP']}:{RUNTIME_PORT}"
            try:
                async with self._http().get(f"{url}/v2/tidal/models") as response:
                    if response.status != 200:
                        return None
                    data = await response.json(content_type=None)
                return parse_replica_report(name, url, data, self.clock.monotonic())
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                log.debug("hot set of %s: %s", name, exc)
                return None

        found = await asyncio.gather(*(one(p) for p in pods))
        return [r for r in found if r is not None]

    async def _put(self, url: str, document: Mapping[str, Any]) -> bool:
        try:
            async with self._http().put(url, json=document) as response:
                if response.status == 200:
                    return True
                log.warning("PUT %s: %d %s", url, response.status, (await response.text())[:300])
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("PUT %s: %s", url, exc)
        return False

    async def _push_pins(
        self, st: FleetState, reports: Sequence[ReplicaReport], mono: float
    ) -> None:
        """Tell each runtime its pinned set when it changed (or to resync)."""
        if st.placement is None:
            return

        async def send(report: ReplicaReport, pins: frozenset[str]) -> None:
            if await self._put(f"{report.url}/v2/tidal/placement", {"pinned": sorted(pins)}):
                st.pins_sent[report.name] = (pins, mono)

        due = [
            (r, pins)
            for r in reports
            # A replica first seen after the last placement waits for the next one.
            if (pins := st.placement.pinned.get(r.name)) is not None
            and _due(st.pins_sent.get(r.name), pins, r.pinned == pins, mono, self.settings)
        ]
        await asyncio.gather(*(send(r, p) for r, p in due))
        for gone in set(st.pins_sent) - {r.name for r in reports}:
            del st.pins_sent[gone]

    async def _push_gateways(
        self,
        st: FleetState,
        reports: Sequence[ReplicaReport],
        gateways: Sequence[Mapping[str, Any]],
        mono: float,
    ) -> None:
        """Tell each gateway the serving replicas and the placement when they changed."""
        await self._send_gateways(st, gateway_push(reports, st.placement), gateways, mono)

    async def _send_gateways(
        self,
        st: FleetState,
        document: Mapping[str, Any],
        gateways: Sequence[Mapping[str, Any]],
        mono: float,
    ) -> None:
        digest = json.dumps(document, sort_keys=True)

        async def send(pod: Mapping[str, Any]) -> None:
            name = str(pod["metadata"]["name"])
            # An unready gateway may have restarted and lost the list: it counts as unacked.
            if not _due(st.gateway_sent.get(name), digest, _ready(pod), mono, self.settings):
                return
            url = f"http://{pod['status']['podIP']}:{GATEWAY_PORT}/v2/tidal/replicas"
            if await self._put(url, document):
                st.gateway_sent[name] = (digest, mono)

        await asyncio.gather(*(send(g) for g in gateways))
        for gone in set(st.gateway_sent) - {str(g["metadata"]["name"]) for g in gateways}:
            del st.gateway_sent[gone]

    # -- the activator (a service that may scale to zero, without spec.fleet) ----------------

    async def _activator_tick(self, key: Key, isvc: InferenceService, st: FleetState) -> None:
        """Push the ready serving pods to the gateway pods (from the pod cache: no request to
        the runtimes) and keep one long-poll of the held count per gateway pod."""
        kids = self.store.children.get(key)
        bodies = list(kids.pod_bodies.values()) if kids is not None else []
        pools = {p.value for p in serving_pools(isvc, self.control(key))}
        runtimes = sorted(
            (
                b
                for b in bodies
                if _labels(b).get(LABEL_POOL) in pools
                and _labels(b).get(LABEL_ROLE) == ROLE_SERVING
                and _usable(b)
                and _ready(b)
            ),
            key=lambda b: str(b["metadata"]["name"]),
        )
        gateways = [
            b for b in bodies if _labels(b).get(LABEL_COMPONENT) == COMPONENT_GATEWAY and _usable(b)
        ]
        document = {
            "replicas": [
                {
                    "name": str(b["metadata"]["name"]),
                    "url": f"http://{b['status']['podIP']}:{RUNTIME_PORT}",
                }
                for b in runtimes
            ],
            "placement": {},
        }
        routed = tuple(r["name"] for r in document["replicas"])
        if routed != st.routed:
            st.routed = routed
            log.info("%s/%s: gateway routes to %s", *key, ", ".join(routed) or "no replica")
        await self._send_gateways(st, document, gateways, self.clock.monotonic())
        if holds_requests(isvc):
            urls = {
                str(g["metadata"]["name"]): f"http://{g['status']['podIP']}:{GATEWAY_PORT}"
                for g in gateways
            }
        else:
            urls = {}
        stale = {n for n, (url, task) in st.held_polls.items() if urls.get(n) != url or task.done()}
        await _stop_polls(st, stale)
        for name, url in urls.items():
            if name not in st.held_polls:
                task = asyncio.create_task(
                    self._poll_held(key, st, name, url), name=f"held {key[0]}/{key[1]} {name}"
                )
                st.held_polls[name] = (url, task)

    async def _poll_held(self, key: Key, st: FleetState, name: str, url: str) -> None:
        """Long-poll one gateway pod's held count; on every change hand it over and poke the
        service's control loop (a quiet one ticks at once). Each answer carries the pod's
        arrival count, which the zero forecast learns: the poll asks for an answer within
        ``arrivals_every_seconds`` of requests arriving, so it learns them within a sample."""
        if self._poll_session is None or self._poll_session.closed:
            # Apart from the pushes' session: parked long-polls must not take its connections.
            self._poll_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        session = self._poll_session
        wait = self.settings.held_wait_seconds
        retry = Retry(HELD_POLL_BACKOFF)
        seen = -1
        while True:
            params = {"seen": str(seen), "wait": str(wait)}
            known = st.arrivals.get(name)
            if known is not None and seen >= 0:
                # Answer within `every` of an arrival too (an older gateway ignores these).
                params |= {
                    "arrivals": str(known[0]),
                    "every": str(self.settings.arrivals_every_seconds),
                }
            try:
                async with session.get(
                    f"{url}/v2/tidal/held",
                    params=params,
                    timeout=aiohttp.ClientTimeout(total=wait + 5),
                ) as response:
                    if response.status != 200:
                        raise ValueError(f"answered {response.status}")
                    data = await response.json(content_type=None)
                held = int(data["held"])
                if "arrivals" in data:
                    st.arrivals[name] = (int(data["arrivals"]), self.clock.wall())
                retry.reset()
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError) as exc:
                log.debug("held count of gateway %s: %s", name, exc)
                # Unknown: counted as none (a gateway that cannot answer cannot hold either).
                if st.held.pop(name, 0):
                    self.on_held(key)
                seen = -1
                await retry.wait()
                continue
            if held != seen:
                seen = held
                if st.held.get(name, 0) != held:
                    st.held[name] = held
                    if held:
                        log.info("%s/%s: %d requests held at gateway %s", *key, held, name)
                    self.on_held(key)

    async def _load_forecasts(self, isvc: InferenceService) -> dict[str, ModelForecast]:
        try:
            cm = await self.kube.get_config_map(isvc.namespace, state_config_map_name(isvc.name))
        except KubeError as exc:
            if exc.status != 404:
                log.warning("forecast state of %s/%s: %s", isvc.namespace, isvc.name, exc)
            return {}
        text = (cm.get("data") or {}).get(FORECAST_KEY, "")
        restored = forecasts_from_json(_forecast_policy(isvc), text)
        log.info("%s/%s: restored the forecast of %d models", *_key(isvc), len(restored))
        return restored

    async def _save_forecasts(self, isvc: InferenceService, st: FleetState, mono: float) -> None:
        obj = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": state_config_map_name(isvc.name),
                "namespace": isvc.namespace,
                "labels": common_labels(isvc),
                "ownerReferences": [owner_reference(isvc)],
            },
            "data": {FORECAST_KEY: forecasts_to_json(_forecast_policy(isvc), st.demand.forecasts)},
        }
        try:
            await self.kube.apply(obj)
            st.forecast_saved_at = mono
        except KubeError as exc:
            log.warning("saving the forecast of %s/%s: %s", *_key(isvc), exc)
            st.forecast_saved_at = mono - self.settings.forecast_save_seconds / 2


async def _stop_polls(st: FleetState, names: set[str]) -> None:
    tasks = []
    for name in names:
        _, task = st.held_polls.pop(name)
        st.held.pop(name, None)
        st.arrivals.pop(name, None)
        task.cancel()
        tasks.append(task)
    await asyncio.gather(*tasks, return_exceptions=True)


def _key(isvc: InferenceService) -> tuple[str, str]:
    return isvc.namespace, isvc.name


def _forecast_policy(isvc: InferenceService) -> ForecastPolicy:
    fleet = isvc.spec.fleet
    assert fleet is not None
    return ForecastPolicy(
        period_seconds=duration_seconds(fleet.forecast.period), slots=fleet.forecast.slots
    )
