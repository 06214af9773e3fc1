"""kopf wiring: watches feed the store and the work queue; nothing else happens here.

This module owns the kopf handlers. They are all ``on.event`` handlers, on purpose: they keep
no per-object progress in annotations or ``status.kopf`` and add no finalizers, so the
operator's state lives in the cluster (spec, children, status) and an InferenceService deleted
while the operator is down is still cleaned up by the garbage collector.

* InferenceService events store the body and enqueue the key.
* Events of labelled children (Deployments, pods, Services, ConfigMaps) update the store and
  enqueue the owner, so a deleted or edited child is put back, and status follows the pods.
  The Service's EndpointSlices (labelled like it) update the store and poke the control loop,
  whose traffic moves wait for them (``tidal.operator.core.traffic``).
* ModelBuild events, and those of its Jobs and their pods (labelled ``serving.tidal.dev/build``),
  update the build store and enqueue the build on a queue of its own
  (``tidal.operator.shell.builds``): one build Job per target, status and Events.
* Every InferenceService gets a control loop (``tidal.operator.shell.controller``), started
  on its first event and stopped when it is deleted; the loop publishes replica counts,
  routing and its status fields for the reconciler and enqueues the key when they change.
  One with ``spec.fleet`` also gets a fleet loop (``tidal.operator.shell.fleet``: placement,
  forecast, the gateways' replica lists) publishing ``status.fleet`` the same way; one that
  may scale to zero (``minReplicas: 0``) gets the same loop's activator part (its gateway's
  replica list, and the count of requests it holds, which pokes the control loop).
* The initial listing of InferenceServices (at start and after a re-list) and a periodic
  resync enqueue every key with ``force``, so the operator compares every child with what it
  wants even if a change happened while nobody watched; only a child that drifted is written
  (``tidal.operator.core.drift``). The resync is spread over its period, each key at its own
  offset, so a thousand services are looked at a few per second, not in one burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from ..core.api import GROUP, LABEL_ISVC, PLURAL, VERSION, Backend
from ..core.buildapi import BUILD_PLURAL, LABEL_BUILD, BuildBackend
from ..core.drift import resync_due, resync_offset
from ..core.images import DEFAULT_RUNTIME_IMAGES
from . import metrics
from .builds import BuildReconciler, BuildStore, services_naming
from .builds import Key as BuildKey
from .controller import Controller, ControllerSettings
from .fleet import FleetController
from .kube import Kube
from .reconciler import Key, Reconciler, Store
from .signals import PrometheusSignals, SignalCollector
from .workqueue import WorkQueue

log = logging.getLogger("tidal.operator")


@dataclass
class OperatorSettings:
    """Settings of the operator process (from environment and command line, see __main__)."""

    workers: int = 4
    resync_seconds: float = 300.0
    # Control loop: tick period (<= 1 s), Prometheus (None: pod scrapes only, no SLO signals).
    tick_seconds: float = 1.0
    # A quiet service's period (ticked on its watch events too); <= tick_seconds: off.
    quiet_tick_seconds: float = 5.0
    # ... and of a quiet one whose pods all wake it at their first request (no idle timer).
    watched_quiet_tick_seconds: float = 60.0
    # Scale to zero: the wake's margin and the forecast's cycle (see ControllerSettings).
    wake_margin_seconds: float = 30.0
    forecast_period_seconds: float = 86400.0
    prometheus_url: str | None = None
    # PromQL matchers narrowing every query (e.g. namespace=~"a|b" when watching namespaces).
    prometheus_matchers: str = ""
    # The runtime image of a pool that names none, per backend.
    runtime_images: Mapping[Backend, str] = field(default_factory=lambda: DEFAULT_RUNTIME_IMAGES)


@dataclass
class Runtime:
    """The running operator's shared state (one per process)."""

    settings: OperatorSettings = field(default_factory=OperatorSettings)
    store: Store = field(default_factory=Store)
    queue: WorkQueue[Key] | None = None
    reconciler: Reconciler | None = None
    controller: Controller | None = None
    fleet: FleetController | None = None
    started: asyncio.Event | None = None
    resync_task: asyncio.Task[None] | None = None
    builds: BuildStore = field(default_factory=BuildStore)
    build_queue: WorkQueue[BuildKey] | None = None


RUNTIME = Runtime()


def configure(settings: OperatorSettings) -> None:
    RUNTIME.settings = settings


def _tune_kopf(settings: kopf.OperatorSettings) -> None:
    # Standalone: one operator per cluster (or namespace); no peering resources needed.
    settings.peering.standalone = True
    settings.peering.mandatory = False
    # Our handlers post their own Events; kopf's per-handler log events would double them.
    settings.posting.enabled = False
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.batching.idle_timeout = 60.0
    # Our handlers only record state and enqueue; coalescing happens in the work queue, so
    # kopf need not hold events back (its default window is 0.1 s per object).
    settings.batching.batch_window = 0.01
    settings.networking.request_timeout = 60.0


@kopf.on.startup()
async def on_startup_configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    _tune_kopf(settings)
    kube = Kube.from_environment()
    config = RUNTIME.settings
    RUNTIME.store.runtime_images = config.runtime_images
    prometheus = (
        PrometheusSignals(config.prometheus_url, matchers=config.prometheus_matchers)
        if config.prometheus_url
        else None
    )
    RUNTIME.controller = Controller(
        kube,
        RUNTIME.store,
        _enqueue,
        SignalCollector(prometheus),
        ControllerSettings(
            tick_seconds=config.tick_seconds,
            quiet_tick_seconds=config.quiet_tick_seconds,
            watched_quiet_tick_seconds=config.watched_quiet_tick_seconds,
            wake_margin_seconds=config.wake_margin_seconds,
            forecast_period_seconds=config.forecast_period_seconds,
        ),
    )
    RUNTIME.fleet = FleetController(
        kube, RUNTIME.store, _enqueue, RUNTIME.controller.view, on_held=RUNTIME.controller.poke
    )
    RUNTIME.controller.held = RUNTIME.fleet.held  # the activator's push of demand at zero
    RUNTIME.controller.arrivals = RUNTIME.fleet.arrivals  # ... and its count of every arrival
    RUNTIME.reconciler = Reconciler(
        kube=kube,
        store=RUNTIME.store,
        control=RUNTIME.controller.view,
        fleet=RUNTIME.fleet.view,
    )
    RUNTIME.queue = WorkQueue(
        RUNTIME.reconciler.reconcile,
        workers=RUNTIME.settings.workers,
        on_depth=metrics.QUEUE_DEPTH.set,
    )
    RUNTIME.queue.start()
    # A build's Jobs run the runtime image of its backend (the same flags choose it).
    images = {**DEFAULT_RUNTIME_IMAGES, **config.runtime_images}
    builder = BuildReconciler(
        kube, RUNTIME.builds, images={BuildBackend(b.value): ref for b, ref in images.items()}
    )
    RUNTIME.store.builds = RUNTIME.builds.builds  # models[].build resolve against these
    RUNTIME.build_queue = WorkQueue(builder.reconcile, workers=1)
    RUNTIME.build_queue.start()
    metrics.publish_inference_services(RUNTIME.store)
    RUNTIME.resync_task = asyncio.create_task(_resync_forever())
    log.info(
        "tidal-operator started with %d workers, control tick %.2fs, %s",
        config.workers,
        config.tick_seconds,
        f"Prometheus at {config.prometheus_url}" if prometheus else "pod scrapes only",
    )


@kopf.on.cleanup()
async def on_cleanup_stop(**_: Any) -> None:
    if RUNTIME.resync_task is not None:
        RUNTIME.resync_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await RUNTIME.resync_task
    if RUNTIME.controller is not None:
        await RUNTIME.controller.close()
    if RUNTIME.fleet is not None:
        await RUNTIME.fleet.close()
    if RUNTIME.queue is not None:
        await RUNTIME.queue.stop()
    if RUNTIME.build_queue is not None:
        await RUNTIME.build_queue.stop()


async def _resync_forever() -> None:
    """Enqueue every key with ``force`` once per resync period, each at its own offset in the
    period (``drift.resync_offset``): a few keys at a time, never the whole store at once."""
    period = RUNTIME.settings.resync_seconds
    step = max(0.01, min(1.0, period / 100))
    loop = asyncio.get_running_loop()
    offsets: dict[Key, float] = {}
    since = loop.time()
    while True:
        await asyncio.sleep(step)
        now = loop.time()
        offsets = {
            key: offsets[key] if key in offsets else resync_offset(key, period)
            for key in RUNTIME.store.services
        }
        queue = RUNTIME.queue
        if queue is not None:
            for key in resync_due(offsets, period, since, now):
                await queue.add(key, force=True)
        since = now


async def _enqueue(key: Key) -> None:
    if RUNTIME.queue is not None:
        await RUNTIME.queue.add(key)


@kopf.on.event(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
async def on_event_inference_service(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    key = RUNTIME.store.put_service(_plain(body))
    if event.get("type") == "DELETED":
        RUNTIME.store.drop_service(key)
        RUNTIME.store.children.pop(key, None)
        if RUNTIME.queue is not None:
            RUNTIME.queue.forget(key)
        if RUNTIME.controller is not None:
            await RUNTIME.controller.stop(key)
        if RUNTIME.fleet is not None:
            await RUNTIME.fleet.stop(key)
        return
    if not body.get("metadata", {}).get("deletionTimestamp"):
        if RUNTIME.controller is not None:
            RUNTIME.controller.ensure(key)
            RUNTIME.controller.poke(key)
        if RUNTIME.fleet is not None:
            RUNTIME.fleet.ensure(key)
    if event.get("type") is None:
        # The initial listing (operator start, or a re-list after a watch error): re-assert
        # every child, since changes made while nobody watched left no event behind.
        if RUNTIME.queue is not None:
            await RUNTIME.queue.add(key, force=True)
        return
    await _enqueue(key)


async def _on_child(event: dict[str, Any], body: kopf.Body, kind: str) -> None:
    plain = _plain(body)
    plain["kind"] = kind  # items of an initial LIST carry no kind
    owner = RUNTIME.store.put_child(plain, deleted=event.get("type") == "DELETED")
    if owner is not None and RUNTIME.controller is not None:
        RUNTIME.controller.poke(owner)  # a quiet control loop looks again at once
    if owner is not None and RUNTIME.fleet is not None:
        if kind == "Deployment" and owner in RUNTIME.store.services:
            # A gateway left over from minReplicas 0 keeps a loop (also after a restart).
            RUNTIME.fleet.ensure(owner)
        RUNTIME.fleet.poke(owner)  # an activator pushes a replica that turned Ready at once
    if owner is not None and owner in RUNTIME.store.services:
        await _enqueue(owner)


_CHILD = {"labels": {LABEL_ISVC: kopf.PRESENT}}


@kopf.on.event("apps", "v1", "deployments", **_CHILD)  # type: ignore[arg-type]
async def on_event_deployment(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    await _on_child(event, body, "Deployment")


@kopf.on.event("", "v1", "pods", **_CHILD)  # type: ignore[arg-type]
async def on_event_pod(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    await _on_child(event, body, "Pod")


@kopf.on.event("", "v1", "services", **_CHILD)  # type: ignore[arg-type]
async def on_event_service(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    await _on_child(event, body, "Service")


@kopf.on.event("discovery.k8s.io", "v1", "endpointslices", **_CHILD)  # type: ignore[arg-type]
async def on_event_endpoint_slice(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    # The control loop's traffic moves wait for these (``core.traffic``); nothing to reconcile.
    plain = _plain(body)
    plain["kind"] = "EndpointSlice"
    owner = RUNTIME.store.put_child(plain, deleted=event.get("type") == "DELETED")
    if owner is not None and RUNTIME.controller is not None:
        RUNTIME.controller.poke(owner)


@kopf.on.event("", "v1", "configmaps", **_CHILD)  # type: ignore[arg-type]
async def on_event_config_map(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    await _on_child(event, body, "ConfigMap")


# -- ModelBuilds (tidal.operator.shell.builds): the build, its Jobs and their pods -------------


async def _enqueue_build(key: BuildKey | None) -> None:
    if key is not None and RUNTIME.build_queue is not None:
        await RUNTIME.build_queue.add(key)


@kopf.on.event(GROUP, VERSION, BUILD_PLURAL)  # type: ignore[arg-type]
async def on_event_model_build(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    deleted = event.get("type") == "DELETED"
    key = RUNTIME.builds.put_build(_plain(body), deleted)
    # Services serving this build look again: a version that passed its gate rolls out.
    for service in services_naming(RUNTIME.store.services, key):
        if RUNTIME.controller is not None:
            RUNTIME.controller.poke(service)
        await _enqueue(service)
    if deleted:
        if RUNTIME.build_queue is not None:
            RUNTIME.build_queue.forget(key)
        return
    await _enqueue_build(key)


_BUILD_CHILD = {"labels": {LABEL_BUILD: kopf.PRESENT}}


@kopf.on.event("batch", "v1", "jobs", **_BUILD_CHILD)  # type: ignore[arg-type]
async def on_event_build_job(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    await _enqueue_build(RUNTIME.builds.put_job(_plain(body), event.get("type") == "DELETED"))


@kopf.on.event("", "v1", "pods", **_BUILD_CHILD)  # type: ignore[arg-type]
async def on_event_build_pod(event: dict[str, Any], body: kopf.Body, **_: Any) -> None:
    await _enqueue_build(RUNTIME.builds.put_pod(_plain(body), event.get("type") == "DELETED"))


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A plain-dict copy with what the operator needs (no managedFields)."""
    raw = dict(body)
    meta = dict(raw.get("metadata", {}))
    meta.pop("managedFields", None)
    raw["metadata"] = meta
    return raw
