"""Which pods of a pool serve, wait as standby, or go first on scale-down.

Owns `pod_deletion_cost` (the value of the `controller.kubernetes.io/pod-deletion-cost`
annotation, so that the ReplicaSet controller removes the cheapest replica first),
`choose_scale_down_victims` and `choose_standby`. Pure: pods arrive as `PodView`s the shell built.

A pod's loss costs least when it is not ready (it serves nothing yet), then when it is idle and
its engine cache is cold (a standby pod, or one that has served little), and most when it is
busy with a warm cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

ANNOTATION_POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

# The annotation is an int32; the ReplicaSet controller deletes lower values first. Not-ready
# pods sit below every ready one; among ready pods, being busy outweighs any cache warmth, and
# cache warmth outweighs the number of requests in flight.
_COST_NOT_READY = -1_000_000
_COST_PENDING = -2_000_000
_COST_BUSY = 1_000_000
_COST_PER_CACHE_PERMILLE = 100
_COST_MAX_IN_FLIGHT = 99


@dataclass(frozen=True, slots=True)
class PodView:
    """What the policy needs of one pod of the pool.

    `cache_warmth` in [0, 1]: how much of the pod's engine cache is worth keeping (for example
    its hot-hit rate or the share of the pool's engines it holds loaded); 0 for a cold pod.
    """

    name: str
    ready: bool
    standby: bool = False
    in_flight: int = 0
    cache_warmth: float = 0.0
    scheduled: bool = True
    # Monotonic seconds since the pod became ready (0 when not ready).
    ready_for_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.in_flight < 0 or not 0.0 <= self.cache_warmth <= 1.0:
            raise ValueError("in_flight must be >= 0 and cache_warmth in [0, 1]")


@dataclass(frozen=True, slots=True)
class StandbyAssignment:
    """Roles of the ready pods: `promote`/`demote` are the label changes to make."""

    serving: tuple[str, ...]
    standby: tuple[str, ...]
    promote: tuple[str, ...]
    demote: tuple[str, ...]
    reason: str


def pod_deletion_cost(pod: PodView) -> int:
    """The pod-deletion-cost annotation value: lower is removed first."""
    if not pod.scheduled:
        return _COST_PENDING
    if not pod.ready:
        return _COST_NOT_READY
    cost = _COST_BUSY if pod.in_flight > 0 else 0
    cost += math.floor(pod.cache_warmth * 1000) * _COST_PER_CACHE_PERMILLE
    return cost + min(pod.in_flight, _COST_MAX_IN_FLIGHT)


def _loss_key(pod: PodView) -> tuple[int, float, str]:
    # Ties: a pod ready for less time has warmed less; the name makes the order total.
    return pod_deletion_cost(pod), pod.ready_for_seconds, pod.name


def choose_scale_down_victims(pods: Sequence[PodView], count: int) -> list[PodView]:
    """The `count` pods whose loss costs least, cheapest first."""
    if count <= 0:
        return []
    return sorted(pods, key=_loss_key)[:count]


def choose_standby(
    pods: Sequence[PodView], desired_serving: int, standby: int
) -> StandbyAssignment:
    """Split the ready pods into serving and standby with as few label changes as possible.

    Serving pods stay serving while there is room (their caches are warm); surplus serving pods
    are demoted cheapest first; missing serving pods are promoted from standby, the longest
    ready first. Ready pods beyond serving + standby are left out of both (the shell deletes them
    with `choose_scale_down_victims`). Not-ready pods never serve.
    """
    ready = [p for p in pods if p.ready]
    serving_now = sorted((p for p in ready if not p.standby), key=_loss_key, reverse=True)
    standby_now = sorted(
        (p for p in ready if p.standby), key=lambda p: (-p.ready_for_seconds, p.name)
    )
    keep = serving_now[: max(desired_serving, 0)]
    demoted = serving_now[len(keep) :]
    promoted = standby_now[: max(desired_serving - len(keep), 0)]
    # Standby is filled from pods already standby, then from demoted serving pods (cheapest,
    # i.e. idle and coldest, first).
    rest = standby_now[len(promoted) :] + sorted(demoted, key=_loss_key)
    standby_pods = rest[: max(standby, 0)]
    demote = [p for p in standby_pods if not p.standby]
    serving = keep + promoted
    if promoted:
        reason = "promote-standby"
    elif demote:
        reason = "demote-to-standby"
    elif len(serving) < desired_serving:
        reason = "short-of-ready-pods"
    else:
        reason = "unchanged"
    return StandbyAssignment(
        serving=tuple(p.name for p in serving),
        standby=tuple(p.name for p in standby_pods),
        promote=tuple(p.name for p in promoted),
        demote=tuple(p.name for p in demote),
        reason=reason,
    )
