"""Why runtime pods are not Ready, for the InferenceService's status.

A runtime whose engines cannot load (a corrupt file, a sha256 mismatch, an engine built for
another GPU or TensorRT version, a store that times out) stays up and not Ready, and says why
in its readiness answer (``GET /v2/health/ready`` -> 503 ``{"ready": false, "error": ...}``).
The control loop asks the pods that have been running but not Ready for a while
(:func:`pods_to_probe`), remembers the answers (:class:`PodFaults`) and reports them as the
``Degraded`` condition (reason ``EngineLoadFailed``; its change posts an Event) naming the
pool, the pod and the runtime's own message. Pure: pods arrive as plain dicts, time as an
argument.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Literal

from .api import LABEL_POOL
from .signals import pod_address, pod_ready

# A pod gets this long after its container started before a not-Ready answer counts (the
# runtime is still loading), and is asked again at most this often.
PROBE_GRACE_SECONDS = 5.0
PROBE_EVERY_SECONDS = 3.0


class _NoAnswer(Enum):
    """A probe that got no answer in time: it says nothing about the pod."""

    NO_ANSWER = auto()


NO_ANSWER = _NoAnswer.NO_ANSWER
# One probe's answer: a reason, None (ready or no reason given) or NO_ANSWER.
ProbeAnswer = str | Literal[_NoAnswer.NO_ANSWER] | None
MAX_MESSAGE = 300


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    pod: str
    pool: str
    url: str


@dataclass
class PodFaults:
    """The last readiness answer of each not-Ready pod (pod name -> (pool, message))."""

    probed_at: dict[str, float] = field(default_factory=dict)
    faults: dict[str, tuple[str, str]] = field(default_factory=dict)
    # Pods whose container cannot even be created (no probe can reach them): pod -> (pool,
    # message), replaced on every tick from the pods' own status (:func:`unstartable_pods`).
    unstartable: dict[str, tuple[str, str]] = field(default_factory=dict)

    def record(self, target: ProbeTarget, message: ProbeAnswer, now: float) -> None:
        """The answer of one probe: a reason, None (ready or no reason given: nothing to
        report), or ``NO_ANSWER`` (timed out, refused): the last reason stands, since a runtime
        busy retrying its loads on a loaded node can be slow to answer (CI saw a pod's fault
        cleared by such timeouts for 90 s)."""
        self.probed_at[target.pod] = now
        if message is NO_ANSWER:
            return
        if message:
            self.faults[target.pod] = (target.pool, message[:MAX_MESSAGE])
        else:
            self.faults.pop(target.pod, None)

    def keep_only(self, pods: Iterable[str]) -> None:
        """Forget pods that are Ready, gone or no longer probed."""
        keep = set(pods)
        for table in (self.probed_at, self.faults):
            for name in [n for n in table if n not in keep]:
                del table[name]

    def problems(self) -> tuple[str, ...]:
        """``pool P: pod X not ready: <message>``, sorted, for the Degraded condition."""
        return tuple(
            f"pool {pool}: pod {pod} not ready: {message}"
            for pod, (pool, message) in sorted({**self.faults, **self.unstartable}.items())
        )


# kubelet's reason for a container it cannot create from the pod's spec: a Secret or ConfigMap
# (or one of its keys) that an env or volume names does not exist.
CREATE_CONFIG_ERROR = "CreateContainerConfigError"


def unstartable_pods(
    pods: Sequence[Mapping[str, Any]], fields: Mapping[str, str]
) -> dict[str, tuple[str, str]]:
    """Pods whose container kubelet cannot create (``CreateContainerConfigError``), with its
    message; ``fields`` maps a Secret's name to the spec field that names it, so the message
    says what to change (e.g. ``spec.runtime.storage.s3.credentialsSecret``)."""
    out: dict[str, tuple[str, str]] = {}
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        for container in status.get("containerStatuses") or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") != CREATE_CONFIG_ERROR:
                continue
            said = str(waiting.get("message") or CREATE_CONFIG_ERROR)
            named = [f for name, f in sorted(fields.items()) if f'"{name}"' in said]
            prefix = f"{named[0]}: " if named else ""
            pool = (meta.get("labels") or {}).get(LABEL_POOL, "")
            out[meta.get("name", "")] = (pool, f"cannot start: {prefix}{said}"[:MAX_MESSAGE])
            break
    return out


def _started_at(pod: Mapping[str, Any]) -> float | None:
    status = pod.get("status") or {}
    times = [
        ((c.get("state") or {}).get("running") or {}).get("startedAt")
        for c in status.get("containerStatuses") or []
    ]
    text = next((t for t in times if t), None) or status.get("startTime")
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


_ready = pod_ready


def not_ready_pods(pods: Sequence[Mapping[str, Any]], wall_now: float) -> list[ProbeTarget]:
    """Running, not terminating, not Ready pods with an address whose container started
    ``PROBE_GRACE_SECONDS`` ago or more: the ones whose reason is worth asking for."""
    out = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        address = pod_address(pod)
        if meta.get("deletionTimestamp") or status.get("phase") != "Running" or not address:
            continue
        started = _started_at(pod)
        if _ready(pod) or started is None or wall_now - started < PROBE_GRACE_SECONDS:
            continue
        pool = (meta.get("labels") or {}).get(LABEL_POOL, "")
        out.append(ProbeTarget(meta.get("name", ""), pool, f"http://{address}/v2/health/ready"))
    return sorted(out, key=lambda t: t.pod)


def due(targets: Sequence[ProbeTarget], faults: PodFaults, now: float) -> list[ProbeTarget]:
    """The targets not asked within ``PROBE_EVERY_SECONDS``."""
    return [t for t in targets if now - faults.probed_at.get(t.pod, -1e9) >= PROBE_EVERY_SECONDS]
