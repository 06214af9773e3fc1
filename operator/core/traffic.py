"""Make-before-break traffic moves: which routing the shell writes on this tick.

A runtime pod gets traffic when the Service ``<isvc>`` selects its pool (``resources._service``:
one pool, or both during a staged rollout step or an overflow) and its role label says
``serving`` (the control loop relabels pods ``standby`` and back). Clients do not follow the
labels, though: kube-proxy, client-side balancers and the sandbox's load generator follow the
Service's EndpointSlices, which the EndpointSlice controller rewrites some time after a label or
the selector changed -- on a loaded node, seconds later, and not in the order the operator wrote
them. A move written in one go (flip the selector, demote one pod while another is promoted,
shrink a pool whose newest pod is not listed yet) can so leave the slices with no ready endpoint
for a moment, and every request in that moment fails.

:func:`plan_traffic` makes every move two-phase, on every tick, from the state of the world
alone (level-triggered: an operator restarted mid-move picks up where the cluster is):

1. **Make**: what the move adds is written at once -- the pools the Service is to select join
   the ones it selects now (both selected is a selector without the pool), pods to promote get
   ``serving``.
2. **Break**: what the move takes away (a pool the Service stops selecting, pods demoted to
   standby) and any scale-down of a pool that gets traffic wait until the EndpointSlices list
   every Ready pod of the routing that remains as ready (and at least one of them). Removing
   pods that no slice lists as ready never waits: they carry no traffic.

The wait is bounded by :attr:`TrafficPolicy.wait_seconds`: past it the move completes as soon as
one pod of the remaining routing is listed ready (the slow ones join later), with the step
marked ``overdue`` so the shell says so (a Warning Event). It never completes onto a routing with
no endpoint listed ready -- that would fail every request, while the pods it would take away
still answer -- unless no EndpointSlice of the Service was ever seen (the operator may not read
them: an old chart's RBAC), where past the wait it moves without looking, as it did before.

:func:`move_traffic` is the control loop's step around it: one :class:`TrafficTick` in (the
decision's routing, the live Service and its slices, the move's memory), one
:class:`TrafficMove` out (what to publish, the demotions to write, the memory, a Warning).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .api import LABEL_POOL, LABEL_ROLE, PoolName
from .events import EventSpec
from .resources import ROLE_SERVING, Observed
from .signals import pod_ready


def pod_live(pod: Mapping[str, Any]) -> bool:
    """Neither being deleted nor finished (pods as plain dicts, as the API returns them)."""
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return meta.get("deletionTimestamp") is None and phase not in ("Succeeded", "Failed")


@dataclass(frozen=True)
class RoutePod:
    """One runtime pod as the pod cache shows it."""

    name: str
    pool: PoolName
    serving: bool  # labelled role=serving now
    ready: bool  # Ready condition True, not terminating


@dataclass(frozen=True)
class TrafficPolicy:
    """How long a move's second half waits for the EndpointSlices before it says so."""

    wait_seconds: float = 60.0


@dataclass(frozen=True)
class TrafficWant:
    """Where the decision wants traffic: the pools the Service selects, the pods to relabel,
    and whether a pool that gets traffic is to lose replicas."""

    pools: frozenset[PoolName]
    promote: frozenset[str] = frozenset()
    demote: frozenset[str] = frozenset()
    shrink: bool = False


@dataclass(frozen=True)
class TrafficStep:
    """What to write this tick.

    ``pools``: the pools the Service selects; ``promote``/``demote``: the role labels to write;
    ``shrink``: whether the pools that get traffic may lose replicas now (else they keep the
    replicas their Deployments ask for). ``complete``: the routing written is the one wanted.
    ``waiting_since``: when the wait for endpoints began (None: nothing waits); ``missing``:
    the Ready pods of the remaining routing that no EndpointSlice lists as ready yet.
    """

    pools: frozenset[PoolName]
    promote: frozenset[str]
    demote: frozenset[str]
    shrink: bool
    complete: bool
    reason: str
    waiting_since: float | None = None
    overdue: bool = False
    missing: tuple[str, ...] = field(default=())


def routed(
    pods: Iterable[RoutePod],
    pools: frozenset[PoolName],
    promote: frozenset[str] = frozenset(),
    demote: frozenset[str] = frozenset(),
) -> frozenset[str]:
    """The pods the Service sends traffic to once ``pools`` are selected and the labels are
    relabelled (``demote`` wins over ``promote``)."""
    return frozenset(
        p.name
        for p in pods
        if p.pool in pools and (p.serving or p.name in promote) and p.name not in demote
    )


def endpoints_settled(
    pods: Sequence[RoutePod], routing: frozenset[str], endpoints: frozenset[str]
) -> tuple[bool, tuple[str, ...]]:
    """Whether every Ready pod of ``routing`` is listed ready by the EndpointSlices, and at
    least one is; and the Ready ones that are not listed yet."""
    ready = {p.name for p in pods if p.name in routing and p.ready}
    missing = tuple(sorted(ready - endpoints))
    return (not missing and bool(routing & endpoints)), missing


def plan_traffic(
    want: TrafficWant,
    pods: Sequence[RoutePod],
    selected: frozenset[PoolName],
    endpoints: frozenset[str] | None,
    waiting_since: float | None,
    now: float,
    policy: TrafficPolicy = TrafficPolicy(),
) -> TrafficStep:
    """This tick's routing for a move from ``selected`` (the pools the live Service selects,
    with the pods' labels as they are) to ``want``.

    ``endpoints``: the pods the Service's EndpointSlices list as ready, None when no slice of
    the Service has been seen. ``waiting_since``: the step's value on the previous tick (memory
    only; after a restart the wait starts again). ``now``: monotonic seconds.
    """
    promote = want.promote - want.demote
    target = routed(pods, want.pools, promote, want.demote)
    leaving = routed(pods, selected | want.pools, promote) - target
    done = TrafficStep(
        pools=want.pools,
        promote=promote,
        demote=want.demote,
        shrink=want.shrink,
        complete=True,
        reason="unchanged",
    )
    if not (leaving or want.shrink):
        # Nothing that serves is taken away (pools or labels that route no pod may go at once).
        return done
    if not target:
        # Nothing is to get traffic (the way to zero, where the gateway takes the Service).
        return replace(done, reason="to-nothing")
    if endpoints is not None and not leaving & endpoints and not want.shrink:
        # What leaves carries no traffic: no slice lists it as ready.
        return replace(done, reason="leaving-not-listed")
    since = now if waiting_since is None else waiting_since
    overdue = now - since >= policy.wait_seconds
    held = replace(
        done, pools=selected | want.pools, demote=frozenset(), shrink=False, complete=False
    )
    held = replace(held, reason="waiting-for-endpoints", waiting_since=since)
    if endpoints is None:
        if overdue:
            return replace(done, reason="endpoints-unseen", waiting_since=since, overdue=True)
        return replace(held, reason="endpoints-unseen")
    settled, missing = endpoints_settled(pods, target, endpoints)
    if settled:
        return replace(done, reason="endpoints-ready")
    if overdue and target & endpoints:
        return replace(
            done, reason="endpoints-slow", waiting_since=since, overdue=True, missing=missing
        )
    if overdue:
        return replace(held, reason="endpoints-not-ready", overdue=True, missing=missing)
    return replace(held, missing=missing)


@dataclass(frozen=True)
class TrafficMemory:
    """What a move remembers between ticks: since when it waits for endpoints (monotonic), the
    reason of its last step, and whether its wait ran out (its Warning posted)."""

    since: float | None = None
    reason: str = "unchanged"
    overdue: bool = False


@dataclass(frozen=True)
class TrafficTick:
    """One tick's traffic move, as one value: what the decision wants (``observed``, the pods
    to promote and demote), the live Service (its selector, the pods its EndpointSlices list
    as ready; None: not seen), the pods, the Deployments' replicas and the move's memory."""

    service: str
    routes_itself: bool  # a fleet, or the Service selects the gateway: no move to make
    has_baseline: bool
    selector: Mapping[str, str] | None
    endpoints: frozenset[str] | None
    pods: tuple[RoutePod, ...]
    observed: Observed
    current: Mapping[PoolName, int]
    promote: frozenset[str]
    demote: frozenset[str]
    memory: TrafficMemory
    now: float  # monotonic
    policy: TrafficPolicy = TrafficPolicy()


@dataclass(frozen=True)
class TrafficMove:
    """The routing and replicas to publish, the demotions that may be written now, the memory
    for the next tick, the Warning to post (a wait that ran out) and the step (None: nothing to
    move) -- ``announce``: its reason changed, worth a log line."""

    observed: Observed
    demote: frozenset[str]
    memory: TrafficMemory
    event: EventSpec | None = None
    step: TrafficStep | None = None
    announce: bool = False


def move_traffic(t: TrafficTick) -> TrafficMove:
    """Make before break (:func:`plan_traffic`) for this tick. What a move adds goes at once;
    what it takes away (a pool the Service stops selecting, pods demoted to standby, replicas
    of a pool that gets traffic) waits until the Service's EndpointSlices list the pods that
    stay."""
    observed = t.observed
    if t.routes_itself:
        return TrafficMove(observed, t.demote, t.memory)
    both = frozenset(PoolName) if t.has_baseline else frozenset({PoolName.PRIMARY})
    active = observed.active_pool if t.has_baseline else PoolName.PRIMARY
    want_pools = both if observed.split and t.has_baseline else frozenset({active})
    selected = selected_pools(t.selector, both, want_pools)
    shrink = any(
        observed.replicas.get(pool, t.current[pool]) < t.current[pool]
        for pool in selected | want_pools
        if pool in t.current
    )
    want = TrafficWant(pools=want_pools, promote=t.promote, demote=t.demote, shrink=shrink)
    step = plan_traffic(want, t.pods, selected, t.endpoints, t.memory.since, t.now, t.policy)
    replicas = dict(observed.replicas)
    if not step.shrink:
        for pool in step.pools:
            if pool in replicas and pool in t.current:
                replicas[pool] = max(replicas[pool], t.current[pool])
    first_overdue = step.overdue and not t.memory.overdue
    return TrafficMove(
        observed=replace(observed, replicas=replicas, split=len(step.pools) > 1),
        demote=step.demote,
        memory=TrafficMemory(step.waiting_since, step.reason, step.overdue),
        event=traffic_event(t.service, step, t.policy) if first_overdue else None,
        step=step,
        announce=step.reason not in (t.memory.reason, "unchanged"),
    )


def selected_pools(
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


def route_pods(pods: Mapping[PoolName, Sequence[Mapping[str, Any]]]) -> tuple[RoutePod, ...]:
    """The live pods of each pool (plain dicts, as the API returns them) as a move sees them."""
    return tuple(
        RoutePod(
            str((b.get("metadata") or {}).get("name")),
            pool,
            ((b.get("metadata") or {}).get("labels") or {}).get(LABEL_ROLE) == ROLE_SERVING,
            pod_ready(b),
        )
        for pool, bodies in pods.items()
        for b in bodies
        if pod_live(b)
    )
