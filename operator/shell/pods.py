"""What the control loop writes to and asks of its runtime pods, and what it remembers of them.

This module owns the loop's pod I/O (``Controller`` decides, this writes): role labels and
deletion costs as JSON merge patches of metadata only (field manager ``tidal-operator-pods``;
a patch the watch has not confirmed yet is not sent again within ``patch_grace_seconds``), the
host-warm standby's tier moves (``PUT /v2/tidal/tier``: a pod about to serve loads its engines
back onto the device first; standby pods go host-warm ``HOST_TIER_AFTER_SECONDS`` after they
left the Service, in the background), and the readiness probes of pods that run but stay not
Ready (``core.podfaults``; in the background, their answers reach the status from the next
tick on). The choices are ``core.loop``'s (``choose_roles``, ``host_tier_moves``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from ...common.clock import Clock
from ..core.api import LABEL_ROLE, StandbyTier
from ..core.autoscaler_pods import (
    ANNOTATION_POD_DELETION_COST,
    StandbyAssignment,
    pod_deletion_cost,
)
from ..core.loop import HostTierTick, RoleChange, choose_roles, host_tier_moves, pod_annotations
from ..core.podfaults import PodFaults, due, not_ready_pods
from ..core.resources import ROLE_SERVING
from ..core.signals import pod_address, pod_views
from .kube import Kube, KubeError
from .podmetrics import new_scrape_session, probe_ready
from .signals import PoolReading

log = logging.getLogger("tidal.operator.controller")

Key = tuple[str, str]  # (namespace, InferenceService name)

TIER_TIMEOUT_SECONDS = 30.0
HOST_TIER_AFTER_SECONDS = 2.0


@dataclass
class PodMemory:
    """What the loop remembers of one service's pods between ticks (memory only)."""

    patched: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)
    faults: PodFaults = field(default_factory=PodFaults)
    probing: asyncio.Task[None] | None = None  # the readiness probes under way, if any
    # Host-warm standby: pods known to be on the host tier, tier moves under way, since when
    # each standby pod is standby (monotonic), and how long the last promotion took.
    host_tier: set[str] = field(default_factory=set)
    tier_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    standby_since: dict[str, float] = field(default_factory=dict)
    promote_seconds: float | None = None

    def busy(self) -> bool:
        """Readiness probes or tier moves under way, or standby pods waiting for their move to
        the host tier (a timer of its own): the loop must come back to them."""
        if self.probing is not None and not self.probing.done():
            return True
        if any(not t.done() for t in self.tier_tasks.values()):
            return True
        return any(name not in self.host_tier for name in self.standby_since)


@dataclass(frozen=True)
class RoleChanges:
    """One pool's role labels to write (``PodWriter.choose_roles``)."""

    assignment: StandbyAssignment
    changes: tuple[RoleChange, ...]  # (pod, role)
    urls: Mapping[str, str]  # pod -> its tier URL (host-warm standby)
    tier: StandbyTier
    started: float  # monotonic, for the promotion's duration


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name"))


def _tier_url(pod: Mapping[str, Any]) -> str | None:
    address = pod_address(pod)
    return None if address is None else f"http://{address}/v2/tidal/tier"


class PodWriter:
    """The loop's writes to its pods and its questions to their runtimes."""

    def __init__(
        self,
        kube: Kube,
        clock: Clock,
        patch_grace_seconds: float,
    ) -> None:
        self.kube, self.clock = kube, clock
        self.patch_grace_seconds = patch_grace_seconds
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = new_scrape_session(connections=16)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- readiness probes ------------------------------------------------------------------

    def start_probes(self, memory: PodMemory, pods: Sequence[Mapping[str, Any]]) -> None:
        """Ask the not-Ready pods why, in the background: a runtime busy loading may take up to
        ``PROBE_TIMEOUT`` to answer, and the tick must not wait for it."""
        if memory.probing is not None and not memory.probing.done():
            return
        memory.probing = asyncio.create_task(self._probe_quietly(memory, pods))

    async def _probe_quietly(self, memory: PodMemory, pods: Sequence[Mapping[str, Any]]) -> None:
        try:
            await self._probe_not_ready(memory, pods)
        except Exception:  # the next tick asks again
            log.exception("readiness probes failed")

    async def _probe_not_ready(self, memory: PodMemory, pods: Sequence[Mapping[str, Any]]) -> None:
        """Ask the pods that run but stay not Ready why (``core.podfaults``)."""
        targets = not_ready_pods(pods, self.clock.wall())
        memory.faults.keep_only(t.pod for t in targets)
        asked = due(targets, memory.faults, self.clock.monotonic())
        if not asked:
            return
        session = self.session()
        answers = await asyncio.gather(*(probe_ready(session, t.url) for t in asked))
        now = self.clock.monotonic()
        for target, message in zip(asked, answers, strict=True):
            memory.faults.record(target, message, now)

    # -- labels and annotations ------------------------------------------------------------

    async def patch(
        self, key: Key, memory: PodMemory, pod: str, what: str, value: str, patch: dict[str, Any]
    ) -> None:
        sent = memory.patched.get((pod, what))
        now = self.clock.monotonic()
        if sent is not None and sent[0] == value and now - sent[1] < self.patch_grace_seconds:
            return
        memory.patched[(pod, what)] = (value, now)
        try:
            await self.kube.patch_pod(key[0], pod, patch)
        except KubeError as exc:
            log.warning("patch pod %s/%s: %s", key[0], pod, exc)

    async def choose_roles(
        self,
        key: Key,
        memory: PodMemory,
        pods: Sequence[Mapping[str, Any]],
        reading: PoolReading,
        wanted: tuple[int, int],
        tier: StandbyTier = StandbyTier.DEVICE,
    ) -> RoleChanges:
        """The role labels one pool's pods are to get for ``wanted`` (serving, standby); a
        host-warm pod to promote is moved back onto the device first (and stays standby if
        that failed)."""
        views = pod_views(pods, reading.pod_scrapes, self.clock.wall())
        assignment, changes = choose_roles(views, *wanted)
        started = self.clock.monotonic()
        urls = {_name(p): url for p in pods if (url := _tier_url(p)) is not None}
        if tier is StandbyTier.HOST:
            changes = await self._to_device_first(key, memory, changes, urls)
        return RoleChanges(assignment, changes, urls, tier, started)

    async def write_roles(
        self, key: Key, memory: PodMemory, roles: RoleChanges, demote: frozenset[str]
    ) -> None:
        """Write the promotions and those demotions the traffic move lets go now (``demote``:
        a demotion waits while the EndpointSlices do not list the pods that stay); standby
        pods of a host-warm pool go to the host tier when ``core.loop.host_tier_moves`` says."""
        assignment = roles.assignment
        changes = [(n, r) for n, r in roles.changes if r == ROLE_SERVING or n in demote]
        if changes:
            told = ", ".join(f"{n}={r}" for n, r in changes)
            log.info("%s/%s roles (%s): %s", key[0], key[1], assignment.reason, told)
        await asyncio.gather(
            *(
                self.patch(key, memory, n, "role", r, {"metadata": {"labels": {LABEL_ROLE: r}}})
                for n, r in changes
            )
        )
        if any(role == ROLE_SERVING for _, role in changes) and assignment.promote:
            memory.promote_seconds = round(self.clock.monotonic() - roles.started, 3)
        if roles.tier is not StandbyTier.HOST:
            return
        tick = HostTierTick(
            standby=assignment.standby,
            changes=roles.changes,
            demote=demote,
            urls=roles.urls,
            standby_since=memory.standby_since,
            on_host=frozenset(memory.host_tier | memory.tier_tasks.keys()),
            now=self.clock.monotonic(),
            after_seconds=HOST_TIER_AFTER_SECONDS,
        )
        memory.standby_since, to_host = host_tier_moves(tick)
        for name in to_host:
            memory.tier_tasks[name] = asyncio.create_task(
                self._to_host(memory, name, roles.urls[name]), name=f"host-tier {name}"
            )

    async def set_deletion_costs(
        self, key: Key, memory: PodMemory, pods: Sequence[Mapping[str, Any]], reading: PoolReading
    ) -> None:
        """Each pod's ``controller.kubernetes.io/pod-deletion-cost`` before a scale-down: the
        ReplicaSet removes the cheapest."""
        by_name = {_name(p): p for p in pods}
        patches = []
        for view in pod_views(pods, reading.pod_scrapes, self.clock.wall()):
            cost = str(pod_deletion_cost(view))
            if (
                pod_annotations(by_name.get(view.name, {})).get(ANNOTATION_POD_DELETION_COST)
                == cost
            ):
                continue
            patch = {"metadata": {"annotations": {ANNOTATION_POD_DELETION_COST: cost}}}
            patches.append(self.patch(key, memory, view.name, "cost", cost, patch))
        await asyncio.gather(*patches)

    # -- tiers (host-warm standby) ---------------------------------------------------------

    async def _put_tier(self, url: str, tier: str) -> bool:
        """Ask a runtime to move its engines to ``tier``; True when it did (or predates tiers:
        its engines are on the device anyway)."""
        try:
            async with (
                asyncio.timeout(TIER_TIMEOUT_SECONDS),
                self.session().put(url, json={"tier": tier}) as response,
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
        self, key: Key, memory: PodMemory, changes: Sequence[RoleChange], urls: Mapping[str, str]
    ) -> tuple[RoleChange, ...]:
        """Host-warm standby: a pod about to serve loads its engines back onto the device and
        warms them up first; only those that did get the serving label now."""
        promote = [n for n, role in changes if role == ROLE_SERVING and n in urls]
        done = await asyncio.gather(*(self._put_tier(urls[n], "device") for n in promote))
        failed = {n for n, ok in zip(promote, done, strict=True) if not ok}
        for name in promote:
            memory.host_tier.discard(name)
            task = memory.tier_tasks.pop(name, None)
            if task is not None:
                task.cancel()
        if failed:
            log.warning("%s/%s: not promoted (device tier failed): %s", *key, sorted(failed))
        return tuple((n, r) for n, r in changes if not (r == ROLE_SERVING and n in failed))

    async def _to_host(self, memory: PodMemory, name: str, url: str) -> None:
        try:
            if await self._put_tier(url, "host"):
                memory.host_tier.add(name)
        finally:
            memory.tier_tasks.pop(name, None)
