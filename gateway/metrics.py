"""Prometheus metrics of the gateway (own registry; documented in gateway/README.md).

The hot path touches only pre-bound children: :meth:`GatewayMetrics.answered` keeps one child
per (model, code, cache) in a dict, so a request costs two dictionary look-ups and two
increments, never a ``labels()`` call.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from .core.routing import REASONS

disable_created_metrics()  # type: ignore[no-untyped-call]

# Sub-millisecond at the bottom: the gateway's own cost is what its users watch.
LATENCY_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LOAD_RESULTS = ("ok", "refused", "failed", "error")
HOLD_OUTCOMES = ("forwarded", "expired", "full", "gone", "drained", "other")
UPSTREAM_ERRORS = ("connect", "disconnect", "timeout", "unavailable")
CACHES = ("hot", "cold", "none")


# Every metric's help, by name (without the ``tidal_gateway_`` prefix).
HELP = {
    "requests": "Requests answered by the gateway, by model, HTTP status and whether it was "
    "held (cold), forwarded unheld (hot) or refused before the hold (none).",
    "request_duration_seconds": "Arrival to response at the gateway; cache=cold when the "
    "request was held, none when it was refused before the hold.",
    "route_decisions": "Routing decisions, by reason (a held request counts one per "
    "re-evaluation).",
    "held_requests": "Requests held now, waiting for a model to become hot somewhere.",
    "hold_outcomes": "Requests that had to wait for a replica, by outcome: forwarded, expired "
    "(503 at the deadline), full (503 at once: maxHeldRequests or maxHeldBytes held already), "
    "gone (the client hung up while held), drained (503 when the gateway stopped), other (any "
    "other answer).",
    "slot_waits": "Requests that found every hot replica at its request slots (the burst "
    "buffer) and waited here for one, rather than in a replica's queue.",
    "held_bytes": "Request body bytes held now (bounded by maxHeldBytes).",
    "load_wait_seconds": "How long each held request was held (until forwarded or given up).",
    "loads": "Loads the gateway asked a replica for, by result.",
    "upstream_errors": "Failed forwards to a replica, by kind (each is retried once on another "
    "replica).",
    "replicas": "Replicas known to the gateway, by state.",
}


def _about(name: str) -> tuple[str, str]:
    return f"tidal_gateway_{name}", HELP[name]


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(*_about("requests"), ["model", "code", "cache"], registry=r)
        self.duration = Histogram(
            *_about("request_duration_seconds"), ["cache"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.decisions = Counter(*_about("route_decisions"), ["reason"], registry=r)
        self.held = Gauge(*_about("held_requests"), registry=r)
        self.hold_outcomes = Counter(*_about("hold_outcomes"), ["outcome"], registry=r)
        self.slot_waits = Counter(*_about("slot_waits"), registry=r)
        self.held_bytes = Gauge(*_about("held_bytes"), registry=r)
        self.load_wait = Histogram(*_about("load_wait_seconds"), buckets=WAIT_BUCKETS, registry=r)
        self.loads = Counter(*_about("loads"), ["result"], registry=r)
        self.upstream_errors = Counter(*_about("upstream_errors"), ["kind"], registry=r)
        self.replicas = Gauge(*_about("replicas"), ["state"], registry=r)
        self.decision = {reason: self.decisions.labels(reason) for reason in REASONS}
        self.load_result = {result: self.loads.labels(result) for result in LOAD_RESULTS}
        self.hold_outcome = {o: self.hold_outcomes.labels(o) for o in HOLD_OUTCOMES}
        self.upstream_error = {kind: self.upstream_errors.labels(kind) for kind in UPSTREAM_ERRORS}
        self._durations = {cache: self.duration.labels(cache) for cache in CACHES}
        self._answered: dict[tuple[str, int, str], Counter] = {}
        for state in ("healthy", "unhealthy"):
            self.replicas.labels(state).set(0)

    def answered(self, model: str, code: int, cache: str, seconds: float) -> None:
        """One answer; ``cache``: ``hot`` (never held), ``cold`` (held), ``none`` (refused
        before the hold: a request no model serves, neither held nor forwarded)."""
        key = (model, code, cache)
        child = self._answered.get(key)
        if child is None:
            child = self.requests.labels(model, str(code), cache)
            self._answered[key] = child
        child.inc()
        self._durations[cache].observe(seconds)
