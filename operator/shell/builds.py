"""ModelBuilds in the cluster: the store of builds, their Jobs and the Jobs' pods, and the
reconcile that runs ``tidal.operator.core.builds`` against them.

One pass: parse the build (an invalid spec: ``Degraded=InvalidSpec`` naming the field), list
the nodes' labels (the default targets, and whether a target has a node), read each Job of the
build with its latest pod (the builder's report in the pod's termination message, or the log's
tail), plan, create the missing Jobs, write the status and post the Events. Level-triggered and
idempotent: Jobs are named from a digest of their inputs, so a pass that runs twice creates
nothing twice; the Jobs' and pods' watch events bring the next pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from ...common.clock import utc_now
from ..core.api import format_validation_error
from ..core.buildapi import (
    BUILD_KIND,
    BUILD_PLURAL,
    BuildBackend,
    parse_model_build,
    previous_status,
)
from ..core.builds import (
    BuildPlan,
    JobOutcome,
    NodeInfo,
    invalid_build_status,
    plan_build,
    raw_build_refs,
    read_job,
)
from .kube import Kube, KubeError

log = logging.getLogger("tidal.operator.builds")

Key = tuple[str, str]  # (namespace, name)
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def _wall() -> datetime:
    return utc_now()


def _owner_build(body: Mapping[str, Any]) -> str | None:
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == BUILD_KIND and ref.get("controller"):
            return str(ref["name"])
    return None


def _put(table: dict[Key, dict[str, Any]], body: dict[str, Any], deleted: bool) -> Key:
    meta = body["metadata"]
    key = (str(meta["namespace"]), str(meta["name"]))
    if deleted:
        table.pop(key, None)
    else:
        table[key] = body
    return key


@dataclass
class BuildStore:
    """What the watches delivered: builds, their Jobs, and the Jobs' pods."""

    builds: dict[Key, dict[str, Any]] = field(default_factory=dict)
    jobs: dict[Key, dict[str, Any]] = field(default_factory=dict)
    pods: dict[Key, dict[str, Any]] = field(default_factory=dict)

    def put_build(self, body: dict[str, Any], deleted: bool) -> Key:
        body["kind"] = BUILD_KIND  # items of an initial LIST carry no kind
        return _put(self.builds, body, deleted)

    def put_job(self, body: dict[str, Any], deleted: bool) -> Key | None:
        """Store a build Job; returns its build's key."""
        namespace, _ = _put(self.jobs, body, deleted)
        owner = _owner_build(body)
        return (namespace, owner) if owner else None

    def put_pod(self, body: dict[str, Any], deleted: bool) -> Key | None:
        """Store a build Job's pod; returns its build's key (through its Job)."""
        namespace, _ = _put(self.pods, body, deleted)
        job = (body["metadata"].get("labels") or {}).get(JOB_NAME_LABEL)
        owner = _owner_build(self.jobs.get((namespace, str(job)), {})) if job else None
        return (namespace, owner) if owner else None

    def outcomes(self, key: Key) -> list[JobOutcome]:
        """Each Job of a build, read with its latest pod."""
        namespace, name = key
        out = []
        for (ns, job_name), job in self.jobs.items():
            if ns != namespace or _owner_build(job) != name:
                continue
            pods = [
                p
                for (pns, _), p in self.pods.items()
                if pns == ns
                and (p["metadata"].get("labels") or {}).get(JOB_NAME_LABEL, "") == job_name
            ]
            pods.sort(key=lambda p: str(p["metadata"].get("creationTimestamp", "")))
            out.append(read_job(job, pods[-1] if pods else None))
        return out


@dataclass
class BuildReconciler:
    """Reconciles one ModelBuild at a time (the work queue serialises each key)."""

    kube: Kube
    store: BuildStore
    images: Mapping[BuildBackend, str]  # the runtime image of each backend (none for torch)
    clock: Callable[[], datetime] = _wall
    retry_seconds: float = 5.0

    async def reconcile(self, key: Key, force: bool) -> float | None:
        body = self.store.builds.get(key)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None  # Jobs go with it (owner references)
        now = self.clock()
        try:
            build = parse_model_build(body)
        except ValidationError as exc:
            previous = previous_status(body)
            problem = format_validation_error(exc)
            plan = invalid_build_status(
                problem, int(body["metadata"].get("generation", 0)), previous, now
            )
            return None if await self._write(key, body, plan, now) else self.retry_seconds
        retry: float | None = None
        try:
            labels = await self.kube.list_node_labels()
        except KubeError as exc:
            log.warning("list nodes for build %s/%s: %s", *key, exc)
            labels, retry = None, self.retry_seconds
        nodes = None if labels is None else [NodeInfo(n, lb) for n, lb in sorted(labels.items())]
        plan = plan_build(build, nodes, self.store.outcomes(key), self.images, now)
        created: set[str] = set()
        for job in plan.create:
            try:
                made = await self.kube.create_job(job)
            except KubeError as exc:
                log.warning("build %s/%s: %s", *key, exc)
                retry = self.retry_seconds
                continue
            if made:
                created.add(job["metadata"]["name"])
                log.info("build %s/%s: created Job %s", *key, job["metadata"]["name"])
        # A Job the watch had not shown yet exists already (409): no second Created Event.
        events = tuple(
            e
            for e in plan.events
            if e.reason != "Created" or e.message.removeprefix("Created Job ") in created
        )
        if not await self._write(key, body, replace(plan, events=events), now):
            retry = self.retry_seconds
        return retry

    async def _write(self, key: Key, body: dict[str, Any], plan: BuildPlan, now: datetime) -> bool:
        """Write the status (when it changed) and post the Events; False: try again later."""
        status = plan.to_wire()
        current = body.get("status") or {}
        if current != status:
            patch: dict[str, Any] = {k: None for k in current if k not in status}
            patch.update(status)
            try:
                await self.kube.patch_status(key[0], key[1], patch, plural=BUILD_PLURAL)
            except KubeError as exc:
                log.warning("status of build %s/%s: %s", *key, exc)
                return False
            body["status"] = status
        await asyncio.gather(*(self.kube.post_event(body, e, now) for e in plan.events))
        return True


def services_naming(services: Mapping[Key, Mapping[str, Any]], build: Key) -> list[Key]:
    """InferenceServices (raw bodies by key) whose models name ``build`` in ``models[].build``,
    the primary's or the baseline's."""
    namespace, name = build
    return [
        key
        for key, body in services.items()
        if key[0] == namespace and name in raw_build_refs(body.get("spec") or {})
    ]
