"""Level-triggered reconciliation of InferenceServices: observe, decide (pure), apply.

This module owns the loop body and the in-memory picture of the world it works from:

* :class:`Store` — the latest InferenceServices and a compact view of their children
  (Deployments, pods, Services, ConfigMaps), fed by kopf's watch handlers in
  ``tidal.operator.shell.handlers``; no request is made to read state.
* :class:`Reconciler` — for one key: parse the spec, ask the pure core for the desired
  children and the status, server-side apply only the children whose applied hash differs
  from what the watch shows or whose owned fields drifted (``core.drift.find_drift``: someone
  edited the image, a label, a port; a forced pass, at start and on each resync, checks the
  same way and so writes only what drifted), write the status when it changed, post the
  Events the core asked for. The replica counts, the pool the Service selects and the
  control loop's status fields come from the per-service control loop
  (``tidal.operator.shell.controller``) once it has decided; before that, the Deployments'
  current replicas stay. The Service's switch between an activator gateway and
  the pods reads the watched readiness of both (``resources.service_selects_gateway``); a
  gateway left over from ``minReplicas: 0`` is scaled to zero pods once it is not selected.

A spec that passes the schema but cannot work touches nothing but the status (Degraded).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ...common.backoff import Backoff
from ...common.clock import CLOCK, utc_now
from ..core.api import (
    LABEL_ISVC,
    LABEL_POOL,
    LABEL_ROLE,
    Backend,
    InferenceService,
    InferenceServiceStatus,
    PoolName,
    format_validation_error,
    parse_inference_service,
)
from ..core.buildapi import ModelBuild, parse_model_build
from ..core.builds import (
    BuildResolution,
    PodPlacement,
    build_refs,
    builds_per_gpu,
    find_missing_engines,
    resolve_build_refs,
)
from ..core.control import ControlView, follow_planner, stamp_template_hash
from ..core.drift import COMPARED_KINDS, find_drift, trim_child
from ..core.events import EventSpec
from ..core.fleet import FleetView
from ..core.images import DEFAULT_RUNTIME_IMAGES, with_default_images
from ..core.resources import (
    ANNOTATION_APPLIED_HASH,
    COMPONENT_GATEWAY,
    LABEL_COMPONENT,
    ROLE_SERVING,
    Observed,
    deployment_name,
    desired_objects,
    explain_pool_failure,
    find_spec_problems,
    gateway_name,
    gateway_retired,
    object_key,
    pools_of,
    resolve_active_pool,
)
from ..core.rules import Outcome, find_setting_findings
from ..core.status import (
    DeploymentState,
    PodState,
    StatusInput,
    compute_status,
)
from . import metrics
from .kube import Kube, KubeError

log = logging.getLogger("tidal.operator.reconciler")

Key = tuple[str, str]  # (namespace, InferenceService name)
# The pools whose Deployments the control loop sizes.
_ROUTED = (PoolName.PRIMARY.value, PoolName.BASELINE.value)


def _owner(body: Mapping[str, Any]) -> Key | None:
    meta = body.get("metadata", {})
    isvc = (meta.get("labels") or {}).get(LABEL_ISVC)
    return (meta.get("namespace", ""), isvc) if isvc else None


LABEL_SERVICE_NAME = "kubernetes.io/service-name"


def slice_ready_pods(body: Mapping[str, Any]) -> frozenset[str]:
    """The pods an EndpointSlice lists as ready (``conditions.ready`` true or unset, which
    consumers are told to read as ready)."""
    return frozenset(
        str(ref["name"])
        for ep in body.get("endpoints") or []
        if (ep.get("conditions") or {}).get("ready") is not False
        and (ref := ep.get("targetRef") or {}).get("kind") == "Pod"
        and ref.get("name")
    )


def deployment_state(body: Mapping[str, Any]) -> DeploymentState:
    meta, spec, status = body["metadata"], body.get("spec", {}), body.get("status") or {}
    failure = None
    for cond in status.get("conditions") or []:
        if (cond.get("type") == "ReplicaFailure" and cond.get("status") == "True") or (
            cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded"
        ):
            failure = cond.get("message") or cond.get("reason")
    return DeploymentState(
        generation=int(meta.get("generation", 0)),
        observed_generation=int(status.get("observedGeneration", 0)),
        spec_replicas=int(spec.get("replicas", 0)),
        replicas=int(status.get("replicas", 0)),
        ready_replicas=int(status.get("readyReplicas", 0)),
        updated_replicas=int(status.get("updatedReplicas", 0)),
        available_replicas=int(status.get("availableReplicas", 0)),
        failure=failure,
    )


def _named_failure(isvc: InferenceService, state: DeploymentState) -> DeploymentState:
    """``state`` with its failure naming the spec field it comes from, where known."""
    if state.failure is None:
        return state
    return replace(state, failure=explain_pool_failure(isvc, state.failure))


def pod_state(body: Mapping[str, Any]) -> PodState:
    meta, status = body["metadata"], body.get("status") or {}
    labels = meta.get("labels") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return PodState(
        pool=labels.get(LABEL_POOL, ""),
        role=labels.get(LABEL_ROLE, ""),
        ready=ready,
        terminating=meta.get("deletionTimestamp") is not None
        or status.get("phase") in ("Succeeded", "Failed"),
    )


@dataclass(slots=True)
class LiveChild:
    """A child's owned fields as the watch last showed them (``drift.trim_child`` as compact
    JSON: a few KB for a Deployment), and the applied hash it was found to match ("": not
    compared since it changed)."""

    text: str
    clean: str = ""


@dataclass
class Children:
    """What the watches show of one InferenceService's children."""

    applied: dict[tuple[str, str], str] = field(default_factory=dict)  # (kind, name) -> hash
    deployments: dict[str, DeploymentState] = field(default_factory=dict)  # by pool
    pods: dict[str, PodState] = field(default_factory=dict)  # by pod name
    # Whole pod objects (without managedFields), for the control loop's signals.
    pod_bodies: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The <isvc>-gateway Deployment (a fleet's, or the activator's), None: there is none.
    gateway: DeploymentState | None = None
    # What drift detection reads of each applied child, (kind, name) -> LiveChild.
    live: dict[tuple[str, str], LiveChild] = field(default_factory=dict)
    # The Service <isvc>'s selector as the watch last showed it (None: not seen), and its
    # EndpointSlices: slice name -> the pods it lists as ready (``core.traffic``).
    service_selector: dict[str, str] | None = None
    endpoint_slices: dict[str, frozenset[str]] = field(default_factory=dict)

    def ready_endpoints(self) -> frozenset[str] | None:
        """The pods the Service's EndpointSlices list as ready; None: no slice seen."""
        if not self.endpoint_slices:
            return None
        return frozenset().union(*self.endpoint_slices.values())

    def put_live(self, kind: str, name: str, body: Mapping[str, Any], clean: str = "") -> None:
        """Record a child as the API shows it. ``clean``: the applied hash it is known to
        match (the answer to our own apply); an unchanged body keeps its earlier verdict."""
        text = json.dumps(trim_child(body), sort_keys=True, separators=(",", ":"))
        known = self.live.get((kind, name))
        if not clean and known is not None and known.text == text:
            return
        self.live[(kind, name)] = LiveChild(text, clean)

    def gateway_live(self) -> bool:
        """Whether the gateway Deployment asks for pods (it exists and is not retired)."""
        return self.gateway is not None and self.gateway.spec_replicas > 0


@dataclass
class Store:
    """Latest InferenceService bodies and their children's compact state, keyed by owner."""

    services: dict[Key, dict[str, Any]] = field(default_factory=dict)
    children: dict[Key, Children] = field(default_factory=dict)
    # The runtime image of a pool that names none, per backend (--runtime-image).
    runtime_images: Mapping[Backend, str] = field(default_factory=lambda: DEFAULT_RUNTIME_IMAGES)

    # ModelBuild bodies by key (the build store's own table, shared): models[].build resolve
    # against their status.
    builds: Mapping[Key, dict[str, Any]] = field(default_factory=dict)

    def parse(self, body: dict[str, Any]) -> InferenceService:
        """The InferenceService of a body, every pool's image set and every ``models[].build``
        resolved to its published engine where it has one (raises ValidationError)."""
        return self.parse_resolved(body).isvc

    def parse_resolved(self, body: dict[str, Any]) -> BuildResolution:
        """:meth:`parse`, with what about its ``models[].build`` cannot be served yet and
        the engines served from builds (``status.builds`` keeps the previous ones)."""
        isvc = with_default_images(parse_inference_service(body), self.runtime_images)
        names = build_refs(isvc)
        if not names:
            return BuildResolution(isvc)
        found: dict[str, ModelBuild] = {}
        for name in names:
            raw = self.builds.get((isvc.namespace, name))
            if raw is None:
                continue
            try:
                found[name] = parse_model_build(raw)
            except ValidationError:
                continue  # its own status says why; here it is "not built"
        previous = _previous_status(body)
        return resolve_build_refs(isvc, found, (previous.builds or []) if previous else ())

    def put_service(self, body: Mapping[str, Any]) -> Key:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        self.services[key] = dict(body)
        return key

    def drop_service(self, key: Key) -> None:
        self.services.pop(key, None)

    def put_child(self, body: Mapping[str, Any], deleted: bool) -> Key | None:
        """Record a child's new state; returns its owner's key (None: not ours)."""
        owner = _owner(body)
        if owner is None:
            return None
        kids = self.children.setdefault(owner, Children())
        meta, kind = body["metadata"], str(body.get("kind", ""))
        name = meta["name"]
        if kind == "EndpointSlice":
            # Only the slices of the Service <isvc> (they carry its labels, so its owner's).
            if (meta.get("labels") or {}).get(LABEL_SERVICE_NAME) != owner[1]:
                return None
            if deleted:
                kids.endpoint_slices.pop(name, None)
            else:
                kids.endpoint_slices[name] = slice_ready_pods(body)
            return owner
        if kind == "Service" and name == owner[1]:
            selector = (body.get("spec") or {}).get("selector")
            kids.service_selector = None if deleted or selector is None else dict(selector)
        if kind == "Pod":
            if deleted:
                kids.pods.pop(name, None)
                kids.pod_bodies.pop(name, None)
            else:
                kids.pods[name] = pod_state(body)
                kids.pod_bodies[name] = dict(body)
            return owner
        if deleted:
            kids.applied.pop((kind, name), None)
            kids.live.pop((kind, name), None)
        else:
            applied = (meta.get("annotations") or {}).get(ANNOTATION_APPLIED_HASH, "")
            kids.applied[(kind, name)] = applied
            if applied:
                kids.put_live(kind, name, body)
            else:
                # Not one the reconciler applies (the fleet loop's saved state): no copy kept.
                kids.live.pop((kind, name), None)
        if kind == "Deployment" and (meta.get("labels") or {}).get(LABEL_COMPONENT) == (
            COMPONENT_GATEWAY
        ):
            kids.gateway = None if deleted else deployment_state(body)
        if kind == "Deployment":
            pool = (meta.get("labels") or {}).get(LABEL_POOL, "")
            if deleted:
                kids.deployments.pop(pool, None)
            else:
                kids.deployments[pool] = deployment_state(body)
        return owner


@dataclass
class Reconciler:
    """Reconciles one key at a time; the work queue calls :meth:`reconcile`."""

    kube: Kube
    store: Store
    clock: Callable[[], datetime] = field(default=utc_now)
    # The control loop's view of a key (None: it has not decided yet, or there is none).
    control: Callable[[Key], ControlView | None] = field(default=lambda key: None)
    # The fleet loop's view (spec.fleet only; None: it has not looked yet).
    fleet: Callable[[Key], FleetView | None] = field(default=lambda key: None)
    retry_seconds: float = 2.0
    max_retry_seconds: float = 60.0
    _failures: dict[Key, int] = field(default_factory=dict)

    def _backoff(self, key: Key) -> float:
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        return Backoff(self.retry_seconds, self.max_retry_seconds).nth(n)

    async def reconcile(self, key: Key, force: bool) -> float | None:
        """Bring one InferenceService's children and status in line; returns a retry delay."""
        body = self.store.services.get(key)
        if body is None or body["metadata"].get("deletionTimestamp"):
            # Deleted: the garbage collector removes the children through owner references.
            self._failures.pop(key, None)
            metrics.RECONCILES.labels(result="gone").inc()
            return None
        started = CLOCK.monotonic()
        try:
            delay = await self._reconcile(key, body, force)
        finally:
            metrics.RECONCILE_DURATION.observe(CLOCK.monotonic() - started)
        return delay

    async def _reconcile(self, key: Key, body: dict[str, Any], force: bool) -> float | None:
        now = self.clock()
        previous = _previous_status(body)
        resolution = await self._parse(key, body, previous, now)
        if resolution is None:
            return None
        isvc = resolution.isvc
        # Kept in the store (not a throwaway) so what this pass applies is recorded at once.
        kids = self.store.children.setdefault(key, Children())
        view = self.control(key)
        routed, observed = _routing(isvc, view, kids, previous)
        blocked, waiting, problems = _build_problems(resolution)
        held = blocked or waiting
        target_problems = [] if held else await self._missing_engines(resolution, kids)
        events, error, retry = (
            await self._apply(key, routed, observed, kids, force, view)
            if not problems and not waiting
            else ([], None, None)
        )
        findings = find_setting_findings(isvc)
        fleet_view = self.fleet(key) if isvc.spec.fleet is not None else None
        result = compute_status(
            StatusInput(
                generation=isvc.generation,
                now=now,
                isvc_name=isvc.name,
                active_pool=resolve_active_pool(routed, observed),
                desired={pool.name: _desired(isvc, pool.name, observed) for pool in pools_of(isvc)},
                deployments=_pool_deployments(isvc, kids),
                pods=list(kids.pods.values()),
                problems=problems,
                error=error,
                previous=previous,
                control=view.status if view is not None else None,
                fleet_enabled=isvc.spec.fleet is not None,
                fleet=fleet_view.status if fleet_view else None,
                fleet_problems=fleet_view.problems if fleet_view else (),
                warnings=[f.message for f in findings if f.outcome is Outcome.INEFFECTIVE],
                conflicts=[f.message for f in findings if f.outcome is Outcome.CONFLICTING],
                build_problems=() if blocked else resolution.problems,
                builds=resolution.served if not held else None,
                build_pending=resolution.pending,
                target_problems=target_problems,
            )
        )
        events += result.events
        try:
            await self._write_status(key, body, result.to_wire())
        except KubeError as exc:
            self._failed(key, "status", exc)
            retry = retry or self._backoff(key)
        await self._post_events(key, body, events, now)
        if retry is None:
            self._failures.pop(key, None)
        metrics.RECONCILES.labels(
            result="retry" if retry else "degraded" if problems else "ok"
        ).inc()
        return retry

    async def _parse(
        self,
        key: Key,
        body: dict[str, Any],
        previous: InferenceServiceStatus | None,
        now: datetime,
    ) -> BuildResolution | None:
        """The spec with its builds resolved; None (the status says Degraded) when the API
        server accepted what the models refuse: the CRD and the models disagree (an older
        CRD?)."""
        try:
            return self.store.parse_resolved(body)
        except ValidationError as exc:
            problem = f"spec does not match the operator's API: {format_validation_error(exc)}"
            await self._write_status_degraded(key, body, [problem], previous, now)
            metrics.RECONCILES.labels(result="degraded").inc()
            return None

    async def _apply(
        self,
        key: Key,
        isvc: InferenceService,
        observed: Observed,
        kids: Children,
        force: bool,
        view: ControlView | None,
    ) -> tuple[list[EventSpec], str | None, float | None]:
        """Apply the children: their Events, or the failure to report and when to retry."""
        hold = view is not None and view.hold_primary_template
        try:
            return await self._apply_children(isvc, observed, kids, force, hold), None, None
        except KubeError as exc:
            error = explain_pool_failure(isvc, self._failed(key, "api", exc))
            return [], error, self._backoff(key)

    @staticmethod
    def _failed(key: Key, kind: str, exc: KubeError) -> str:
        """Count and log a failed API call of the pass; its message."""
        metrics.RECONCILE_ERRORS.labels(kind=kind).inc()
        what = "reconcile" if kind == "api" else "status of"
        log.warning("%s %s/%s: %s", what, *key, exc)
        return str(exc)

    async def _post_events(
        self, key: Key, body: Mapping[str, Any], events: Sequence[EventSpec], now: datetime
    ) -> None:
        """Count and post the pass's Events, all at once (they are independent of each other
        and of the next reconcile), and log the children it created or updated."""
        for event in events:
            metrics.EVENTS.labels(type=event.type, reason=event.reason).inc()
        await asyncio.gather(*(self.kube.post_event(body, e, now) for e in events))
        changes = [e.message for e in events if e.reason in ("Created", "Updated")]
        if changes:
            log.info("%s/%s: %s", key[0], key[1], "; ".join(changes))

    async def _missing_engines(self, resolution: BuildResolution, kids: Children) -> list[str]:
        """Pods on nodes whose target (GPU product) has no engine from the build their model
        names (``EngineMissingForTarget``). The nodes are listed only for a service that
        serves a build made per GPU and has pods scheduled: a pod that moves, or an engine
        published (the build's watch), reconciles the service again and clears it."""
        if not any(builds_per_gpu(b) for b in resolution.builds.values()):
            return []
        scheduled = {
            name: str(node)
            for name, body in kids.pod_bodies.items()
            if (node := (body.get("spec") or {}).get("nodeName"))
            and not kids.pods[name].terminating
        }
        if not scheduled:
            return []
        try:
            labels = await self.kube.list_node_labels()
        except KubeError as exc:
            log.warning("list nodes for %s: %s", resolution.isvc.name, exc)
            return []
        if labels is None:
            return []  # the operator may not list nodes (RBAC): nothing to compare
        placements = [
            PodPlacement(name, kids.pods[name].pool, node, labels.get(node, {}))
            for name, node in sorted(scheduled.items())
        ]
        return find_missing_engines(resolution.isvc, resolution.builds, placements)

    async def _apply_children(
        self,
        isvc: InferenceService,
        observed: Observed,
        kids: Children,
        force: bool,
        hold_primary: bool = False,
    ) -> list[EventSpec]:
        # A pool's ConfigMap must exist before its Deployment's pods read it, so each pool is
        # applied in order; pools and the Service do not depend on each other and go at once.
        objects = desired_objects(isvc, observed)
        stamp_template_hash(objects, isvc.name)
        chains: dict[str, list[dict[str, Any]]] = {}
        for obj in objects:
            chains.setdefault(obj["metadata"]["labels"].get(LABEL_POOL, ""), []).append(obj)
        held = kids.deployments.get(PoolName.PRIMARY.value)
        if hold_primary and held is not None:
            # Staged rollout: the primary's pods keep their template (and config) while they
            # serve; only the replica count follows the planner.
            chain = chains.pop(PoolName.PRIMARY.value, [])
            want = next((o["spec"]["replicas"] for o in chain if o["kind"] == "Deployment"), None)
            if want is not None and want != held.spec_replicas:
                await self.kube.scale_deployment(
                    isvc.namespace, deployment_name(isvc.name, PoolName.PRIMARY), want
                )
        results = await asyncio.gather(
            *(self._apply_chain(chain, kids, force) for chain in chains.values()),
            return_exceptions=True,
        )
        events: list[EventSpec] = []
        for result in results:
            if isinstance(result, BaseException):
                raise result
            events += result
        if gateway_retired(isvc, observed) and kids.gateway_live():
            # The Service (applied above) selects the serving pods now: the gateway left over
            # from minReplicas 0 goes to zero pods; each drains as it stops (not Ready, still
            # answering for its shutdownDrainSeconds while the endpoints catch up).
            name = gateway_name(isvc.name)
            await self.kube.retire_deployment(isvc.namespace, name)
            if kids.gateway is not None:
                kids.gateway = replace(kids.gateway, spec_replicas=0)
            kids.applied.pop(("Deployment", name), None)
            events.append(EventSpec("Normal", "Updated", f"Scaled Deployment {name} to 0"))
        return events

    async def _apply_chain(
        self, chain: list[dict[str, Any]], kids: Children, force: bool
    ) -> list[EventSpec]:
        events = []
        for obj in chain:
            kind, name = object_key(obj)
            want = obj["metadata"]["annotations"][ANNOTATION_APPLIED_HASH]
            have = kids.applied.get((kind, name))
            if have == want:
                drift = _drift(kids, obj, want, force)
                if drift is None:
                    continue
                metrics.CHILDREN_DRIFTED.labels(kind=kind).inc()
                log.info(
                    "%s %s/%s drifted (%s): applying it again",
                    kind,
                    obj["metadata"]["namespace"],
                    name,
                    drift,
                )
            stored = await self.kube.apply(obj)
            metrics.CHILDREN_APPLIED.labels(kind=kind).inc()
            # Record it at once: the watch confirms later, and a reconcile in between must not
            # apply the same object again. What the API server answered is what it made of
            # our apply (defaults, canonical quantities): that holds what we want.
            kids.applied[(kind, name)] = want
            kids.put_live(kind, name, stored or obj, clean=want)
            if have != want:
                verb = "Created" if have is None else "Updated"
                events.append(EventSpec("Normal", verb, f"{verb} {kind} {name}"))
        return events

    async def _write_status(self, key: Key, body: dict[str, Any], status: dict[str, Any]) -> None:
        current = body.get("status") or {}
        if current == status:
            return
        # Send removed fields as null so a merge patch deletes them.
        patch: dict[str, Any] = {k: None for k in current if k not in status}
        patch.update(status)
        await self.kube.patch_status(key[0], key[1], patch)
        body["status"] = status  # until the watch delivers the stored version

    async def _write_status_degraded(
        self,
        key: Key,
        body: dict[str, Any],
        problems: list[str],
        previous: InferenceServiceStatus | None,
        now: datetime,
    ) -> None:
        generation = int(body["metadata"].get("generation", 0))
        active = previous.active_pool if previous else PoolName.PRIMARY
        result = compute_status(
            StatusInput(
                generation=generation,
                now=now,
                isvc_name=key[1],
                active_pool=active,
                desired={},
                problems=problems,
                previous=previous,
            )
        )
        await self._write_status(key, body, result.to_wire())
        for event in result.events:
            await self.kube.post_event(body, event, now)


def _drift(kids: Children, obj: Mapping[str, Any], want: str, force: bool) -> str | None:
    """Why a child whose applied hash matches must be applied again (None: it need not).

    When in doubt, apply: a child the watch has not shown, or (on a forced pass) one of a kind
    the comparison does not know. A verdict holds for one live text and one applied hash; the
    answer to our own apply counts as clean, so a value the API server stores in another form
    than we sent (one :func:`find_drift` does not know) costs one apply, not one per pass.
    """
    kind, name = object_key(obj)
    known = kids.live.get((kind, name))
    if known is None:
        return "live state unknown"
    if kind not in COMPARED_KINDS:
        return f"{kind} not compared" if force else None
    if known.clean == want:
        return None
    drift = find_drift(obj, json.loads(known.text))
    if drift is None:
        known.clean = want
    return drift


def _build_problems(resolution: BuildResolution) -> tuple[list[str], bool, list[str]]:
    """(the build problems that hold every child back, whether the pass waits for a build,
    the problems that make the service Degraded).

    A models[].build not servable (not built yet, or refused by its gate) is Degraded while its
    pods keep the engine they had (status.builds); one with none to keep (a first deploy)
    holds every child back. Nothing that failed its gate reaches a pod. One whose build is only
    pending or running waits (Progressing=BuildPending): a real build takes minutes, and that
    is no spec problem."""
    blocked = list(resolution.problems) if resolution.blocked else []
    waiting = resolution.blocked and not blocked
    return blocked, waiting, blocked or ([] if waiting else find_spec_problems(resolution.isvc))


def _pool_deployments(isvc: InferenceService, kids: Children) -> dict[PoolName, DeploymentState]:
    """The pools' Deployments as the status reads them (a failure named by its pool)."""
    deployments = kids.deployments.items()
    return {PoolName(p): _named_failure(isvc, d) for p, d in deployments if p in _ROUTED}


def _routing(
    isvc: InferenceService,
    view: ControlView | None,
    kids: Children,
    previous: InferenceServiceStatus | None,
) -> tuple[InferenceService, Observed]:
    """The spec to route by and the replicas and routing to apply: the control loop's view;
    before its first, the Deployments' replicas and the pool the status last selected."""
    if view is not None:
        # The planner obeys a manual activePool itself, once the pinned pool is warm.
        routed, observed = follow_planner(isvc), view.observed
    else:
        replicas = {
            PoolName(p): d.spec_replicas for p, d in kids.deployments.items() if p in _ROUTED
        }
        active = previous.active_pool if previous else PoolName.PRIMARY
        routed, observed = isvc, Observed(replicas=replicas, active_pool=active)
    return routed, _with_switch(routed, observed, kids)


def _with_switch(isvc: InferenceService, observed: Observed, kids: Children) -> Observed:
    """``observed`` with what the Service's switch between gateway and pods reads
    (``resources.service_selects_gateway``): a ready gateway pod, a ready serving pod."""
    gateway = kids.gateway
    gateway_ready = gateway is not None and gateway.spec_replicas > 0 and gateway.ready_replicas > 0
    if observed.split and isvc.spec.rollout.baseline is not None:
        pools = {p.value for p in PoolName}
    else:
        pools = {resolve_active_pool(isvc, observed).value}
    serving_ready = any(
        pod.ready and not pod.terminating and pod.role == ROLE_SERVING and pod.pool in pools
        for pod in kids.pods.values()
    )
    return replace(observed, gateway_ready=gateway_ready, serving_ready=serving_ready)


def _desired(isvc: InferenceService, pool: PoolName, observed: Observed) -> int:
    from ..core.resources import desired_replicas

    return desired_replicas(isvc, pool, observed)


def _previous_status(body: Mapping[str, Any]) -> InferenceServiceStatus | None:
    raw = body.get("status")
    if not raw:
        return None
    try:
        return InferenceServiceStatus.model_validate(raw)
    except ValidationError:
        return None  # written by an older operator: start afresh
