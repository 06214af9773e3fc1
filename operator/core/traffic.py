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
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from .api import PoolName


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
    held = TrafficStep(
        pools=selected | want.pools,
        promote=promote,
        demote=frozenset(),
        shrink=False,
        complete=False,
        reason="waiting-for-endpoints",
        waiting_since=since,
    )
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
