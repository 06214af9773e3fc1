"""The operator's own Prometheus metrics (names are part of the public contract).

- ``tidal_operator_reconcile_duration_seconds`` histogram: one reconcile of one InferenceService.
- ``tidal_operator_reconciles_total{result}``: ``ok``, ``degraded``, ``retry``, ``gone``.
- ``tidal_operator_reconcile_errors_total{kind}``: failed reconciles by error kind.
- ``tidal_operator_queue_depth`` gauge: InferenceServices waiting for a worker.
- ``tidal_operator_api_requests_total{verb,resource}``: requests the operator made itself
  (kopf's watch streams not included).
- ``tidal_operator_children_applied_total{kind}``: children written by server-side apply.
- ``tidal_operator_events_total{type,reason}``: Events posted.

Counted where the control and fleet loops decide (labels ``namespace``, ``isvc``):

- ``tidal_operator_scale_decisions_total{pool,reason}``: autoscaler decisions that changed
  ``status.lastDecision`` (its reason or the sizes it asks for), by the decision's reason.
- ``tidal_operator_rollbacks_total{reason}``: rollbacks decided, by the Event that announced
  them: ``RollingBack`` (a stable primary breached) or ``RolloutAborted`` (a staged rollout did).
- ``tidal_operator_placement_changes_total``: fleet placements that changed a replica's pins.

Computed at scrape time from the operator's watch cache, kube-state-metrics style (one set per
InferenceService; labels ``namespace``, ``isvc``; no request is made to produce them):

- ``tidal_inferenceservice_replicas{pool,state}``: ``desired`` (the pool Deployment's
  replicas, standby included), ``ready`` (ready, serving), ``warming``, ``standby`` (ready, held
  out of the Service), ``unschedulable`` (Pending, the scheduler found no room), ``terminating``.
- ``tidal_inferenceservice_active_pool{pool}``: 1 for the pool the Service routes to, else 0.
- ``tidal_inferenceservice_condition{condition,reason}``: 1 while the condition is True, else 0.
- ``tidal_inferenceservice_last_decision_timestamp_seconds{pool,reason}``: ``status.lastDecision``.
- ``tidal_inferenceservice_queue_depth{pool}``, ``tidal_inferenceservice_arrival_rate{pool}``:
  the signals the autoscaler last saw (``status.pools.<pool>.metrics``).
- ``tidal_inferenceservice_slo_p99_seconds``, ``..._slo_error_rate``,
  ``..._slo_cold_start_seconds``, ``..._slo_transfer_wait_seconds``, ``..._slo_for_seconds``
  (``spec.rollout.slo``) and
  ``tidal_inferenceservice_target_p99_seconds`` (``spec.autoscaling.targetP99Ms``): the lines the
  dashboard draws and the alerts compare with; absent when the spec leaves them unset.
- ``tidal_inferenceservice_fleet_models{state=hot|total}``,
  ``tidal_inferenceservice_fleet_copies{state=hot|pinned}``,
  ``tidal_inferenceservice_fleet_gateways_ready``, ``tidal_inferenceservice_fleet_loaded_bytes``
  (``status.fleet``; bytes placement asked replicas to load since the operator started).

The ``namespace`` label is the InferenceService's: scrape the operator with ``honor_labels``
(``honorLabels: true`` in a PodMonitor or ServiceMonitor), or Prometheus renames it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..core.api import LABEL_POOL, duration_seconds
from ..core.signals import count_pods

RECONCILE_DURATION = Histogram(
    "tidal_operator_reconcile_duration_seconds",
    "Duration of one reconcile of one InferenceService.",
    buckets=(
        0.0005,
        0.001,
        0.002,
        0.003,
        0.005,
        0.0075,
        0.01,
        0.015,
        0.02,
        0.03,
        0.05,
        0.075,
        0.1,
        0.15,
        0.2,
        0.3,
        0.5,
        0.75,
        1.0,
        2.0,
        5.0,
        10.0,
    ),
)
TICK_LAG = Histogram(
    "tidal_operator_tick_lag_seconds",
    "How late a control-loop tick started after it was due (the loop's own scheduling delay).",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0),
)
LEADER = Gauge(
    "tidal_operator_leader",
    "1 while this operator process holds its leader-election Lease (0: a waiting follower, "
    "or leader election is off).",
)
LEADER_TRANSITIONS = Counter(
    "tidal_operator_leader_transitions_total",
    "Times this process became the leader.",
)
TICKS_SKIPPED = Counter(
    "tidal_operator_ticks_skipped_total",
    "Control-loop ticks not run because the one before ran past their time (the loop resumes "
    "at the next second instead of bunching them up); tick lag alone hides them.",
)
SCRAPES_SKIPPED = Counter(
    "tidal_operator_scrapes_skipped_total",
    "Pod scrapes not sent because the pod missed its last ones (backing off, at most 8 s "
    "between tries); each reads as a missing pod.",
)
TICKS = Counter(
    "tidal_operator_ticks_total",
    "Control-loop ticks run, by the loop's state before the tick: busy (the one-second loop) "
    "or quiet (woken by an event or the slow timer, see --quiet-tick-seconds).",
    ["loop"],
)
QUIET_LOOPS = Gauge(
    "tidal_operator_quiet_loops",
    "Control loops waiting quietly now (nothing going on: ticked on events and a slow timer).",
)
ACTIVITY_WAKES = Counter(
    "tidal_operator_activity_wakes_total",
    "Quiet control loops woken because a request reached one of their pods (the runtime's "
    "GET /v2/tidal/activity long-poll answered).",
)
TICK_DURATION = Histogram(
    "tidal_operator_tick_duration_seconds",
    "Duration of one control-loop tick of one InferenceService (observe, decide, publish).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
)
RECONCILES = Counter("tidal_operator_reconciles_total", "Reconciles by result.", ["result"])
RECONCILE_ERRORS = Counter(
    "tidal_operator_reconcile_errors_total", "Failed reconciles by error kind.", ["kind"]
)
QUEUE_DEPTH = Gauge("tidal_operator_queue_depth", "InferenceServices waiting for a worker.")
API_REQUESTS = Counter(
    "tidal_operator_api_requests_total",
    "Kubernetes API requests made by the operator (watches excluded).",
    ["verb", "resource"],
)
CHILDREN_APPLIED = Counter(
    "tidal_operator_children_applied_total", "Children written by server-side apply.", ["kind"]
)
CHILDREN_DRIFTED = Counter(
    "tidal_operator_children_drifted_total",
    "Children applied again because a field the operator owns was changed by someone else.",
    ["kind"],
)
EVENTS = Counter("tidal_operator_events_total", "Events posted.", ["type", "reason"])

SCALE_DECISIONS = Counter(
    "tidal_operator_scale_decisions_total",
    "Autoscaler decisions that changed status.lastDecision, by reason.",
    ["namespace", "isvc", "pool", "reason"],
)
ROLLBACKS = Counter(
    "tidal_operator_rollbacks_total",
    "Rollbacks decided (traffic taken off a breaching primary), by the Event's reason.",
    ["namespace", "isvc", "reason"],
)
PLACEMENT_CHANGES = Counter(
    "tidal_operator_placement_changes_total",
    "Fleet placements that changed the models pinned on some replica.",
    ["namespace", "isvc"],
)

# Rollout Events (tidal.operator.core.rollout) that announce a rollback decision: exactly one
# of them per rollback, whether traffic was on the primary or still on the baseline.
ROLLBACK_EVENT_REASONS = frozenset({"RollingBack", "RolloutAborted"})


def count_rollout_events(namespace: str, isvc: str, reasons: Iterable[str]) -> None:
    """Count the rollbacks among one tick's rollout Event reasons."""
    for reason in reasons:
        if reason in ROLLBACK_EVENT_REASONS:
            ROLLBACKS.labels(namespace=namespace, isvc=isvc, reason=reason).inc()


def start_service(namespace: str, isvc: str) -> None:
    """Expose the service's rollback and placement counters at 0 from its first tick, so the
    first event is an increase Prometheus can see (a series born at 1 has no increase)."""
    for reason in sorted(ROLLBACK_EVENT_REASONS):
        ROLLBACKS.labels(namespace=namespace, isvc=isvc, reason=reason)
    PLACEMENT_CHANGES.labels(namespace=namespace, isvc=isvc)


def forget_service(namespace: str, isvc: str) -> None:
    """Drop a deleted service's series from the operator's own counters."""
    for counter in (SCALE_DECISIONS, ROLLBACKS, PLACEMENT_CHANGES):
        # prometheus_client has no lookup of a metric's label sets: its own dict it is.
        for labels in list(counter._metrics):
            if labels[:2] == (namespace, isvc):
                counter.remove(*labels)


# -- kube-state-style series from the watch cache ---------------------------------------------

POOLS = ("primary", "baseline")
PREFIX = "tidal_inferenceservice_"


class _DeploymentLike(Protocol):
    @property
    def spec_replicas(self) -> int: ...


class _ChildrenLike(Protocol):
    @property
    def deployments(self) -> Mapping[str, _DeploymentLike]: ...

    @property
    def pod_bodies(self) -> Mapping[str, Mapping[str, Any]]: ...


class StoreLike(Protocol):
    """What the collector reads of ``tidal.operator.shell.reconciler.Store``."""

    @property
    def services(self) -> Mapping[tuple[str, str], Mapping[str, Any]]: ...

    @property
    def children(self) -> Mapping[tuple[str, str], _ChildrenLike]: ...


@dataclass(frozen=True)
class Sample:
    """One series of one scrape: name without the prefix, its labels and value."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _epoch(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def service_samples(
    body: Mapping[str, Any],
    pods: Iterable[Mapping[str, Any]],
    desired: Mapping[str, int],
) -> list[Sample]:
    """Every kube-state-style series of one InferenceService (pure: from its body as the watch
    has it, its pods and its pool Deployments' replicas)."""
    meta = body.get("metadata") or {}
    base = (("namespace", str(meta.get("namespace", ""))), ("isvc", str(meta.get("name", ""))))
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    series = itertools.chain(
        _pool_series(status, pods, desired),
        _status_series(status),
        _spec_series(spec),
        _fleet_series(spec, status),
    )
    return [Sample(name, base + tuple(labels.items()), value) for name, value, labels in series]


_Series = Iterator[tuple[str, float, dict[str, str]]]


def _pool_series(
    status: Mapping[str, Any], pods: Iterable[Mapping[str, Any]], desired: Mapping[str, int]
) -> _Series:
    """Each pool's replicas by state, whether it is the active one, its queue and rate."""
    by_pool: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        pool = ((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_POOL)
        if pool in POOLS:
            by_pool.setdefault(pool, []).append(pod)
    pool_status = status.get("pools") or {}
    active = str(status.get("activePool") or "primary")
    pools = [p for p in POOLS if p in desired or p in by_pool or p in pool_status or p == active]
    for pool in pools:
        counts = count_pods(by_pool.get(pool, ()))
        asked = desired.get(pool, (pool_status.get(pool) or {}).get("desired", 0))
        for state, value in (
            ("desired", asked),
            ("ready", counts.ready_serving),
            ("warming", counts.warming),
            ("standby", counts.ready_standby),
            ("unschedulable", counts.pending_unschedulable),
            ("terminating", counts.terminating),
        ):
            yield "replicas", float(value), {"pool": pool, "state": state}
        yield "active_pool", 1.0 if pool == active else 0.0, {"pool": pool}
        signals = (pool_status.get(pool) or {}).get("metrics") or {}
        for field, name in (("queueDepth", "queue_depth"), ("arrivalRate", "arrival_rate")):
            if (value := _number(signals.get(field))) is not None:
                yield name, value, {"pool": pool}


def _status_series(status: Mapping[str, Any]) -> _Series:
    """The conditions and the last decision's time."""
    for cond in status.get("conditions") or []:
        if isinstance(cond, Mapping) and cond.get("type"):
            value = 1.0 if cond.get("status") == "True" else 0.0
            reason = str(cond.get("reason") or "")
            yield "condition", value, {"condition": str(cond["type"]), "reason": reason}
    decision = status.get("lastDecision") or {}
    if (at := _epoch(decision.get("at"))) is not None:
        pool, reason = str(decision.get("pool") or ""), str(decision.get("reason") or "")
        yield "last_decision_timestamp_seconds", at, {"pool": pool, "reason": reason}


def _spec_series(spec: Mapping[str, Any]) -> _Series:
    """The SLO and the P99 target, in seconds."""
    slo = (spec.get("rollout") or {}).get("slo") or {}
    if slo:
        for field, name, scale in (
            ("p99Ms", "slo_p99_seconds", 0.001),
            ("errorRate", "slo_error_rate", 1.0),
            ("coldStartMs", "slo_cold_start_seconds", 0.001),
            ("transferWaitMs", "slo_transfer_wait_seconds", 0.001),
        ):
            if (value := _number(slo.get(field))) is not None:
                yield name, value * scale, {}
        try:
            for_seconds = duration_seconds(str(slo.get("for", "60s")))
        except ValueError:
            pass
        else:
            yield "slo_for_seconds", for_seconds, {}
    target = _number((spec.get("autoscaling") or {}).get("targetP99Ms"))
    if target is not None:
        yield "target_p99_seconds", target * 0.001, {}


def _fleet_series(spec: Mapping[str, Any], status: Mapping[str, Any]) -> _Series:
    """A fleet's models, copies, ready gateways and loaded bytes."""
    fleet = status.get("fleet")
    if spec.get("fleet") is None or not isinstance(fleet, Mapping):
        return
    yield "fleet_models", float(fleet.get("modelsHot", 0)), {"state": "hot"}
    yield "fleet_models", float(fleet.get("modelsTotal", 0)), {"state": "total"}
    yield "fleet_copies", float(fleet.get("hotCopies", 0)), {"state": "hot"}
    yield "fleet_copies", float(fleet.get("pinnedCopies", 0)), {"state": "pinned"}
    yield "fleet_gateways_ready", float(fleet.get("gatewaysReady", 0)), {}
    yield "fleet_loaded_bytes", float(fleet.get("loadedBytes", 0)), {}


HELP = {
    "replicas": "Pods of an InferenceService's pool by state (desired: the Deployment's replicas).",
    "active_pool": "1 for the pool the InferenceService's Service routes to, else 0.",
    "condition": "1 while the InferenceService's condition is True, else 0.",
    "last_decision_timestamp_seconds": "When status.lastDecision was made, by its reason.",
    "queue_depth": "In-flight plus queued requests of the pool's serving pods (autoscaler input).",
    "arrival_rate": "Requests per second arriving at the pool (autoscaler input).",
    "slo_p99_seconds": "spec.rollout.slo.p99Ms, in seconds.",
    "slo_error_rate": "spec.rollout.slo.errorRate.",
    "slo_cold_start_seconds": "spec.rollout.slo.coldStartMs, in seconds.",
    "slo_transfer_wait_seconds": "spec.rollout.slo.transferWaitMs, in seconds.",
    "slo_for_seconds": "spec.rollout.slo.for, in seconds.",
    "target_p99_seconds": "spec.autoscaling.targetP99Ms, in seconds.",
    "fleet_models": "Models hot on at least one replica, and all models (spec.fleet).",
    "fleet_copies": "Hot copies over all replicas, and copies the last placement pinned.",
    "fleet_gateways_ready": "Ready gateway pods (spec.fleet).",
    "fleet_loaded_bytes": "Engine bytes placement asked replicas to load (since operator start).",
}


class InferenceServiceCollector(Collector):
    """Produces the ``tidal_inferenceservice_*`` series from the watch cache on each scrape."""

    def __init__(self) -> None:
        self.store: StoreLike | None = None

    def describe(self) -> Iterable[Metric]:
        return ()  # the names are fixed; nothing to check against other collectors

    def collect(self) -> Iterator[Metric]:
        store = self.store
        if store is None:
            return
        families: dict[tuple[str, tuple[str, ...]], GaugeMetricFamily] = {}
        # Copies taken with the GIL held (dict views copied in C), so the event loop's writes
        # in the other thread cannot change them mid-iteration.
        for key, body in list(store.services.items()):
            kids = store.children.get(key)
            pods = list(kids.pod_bodies.values()) if kids is not None else []
            deployments = dict(kids.deployments) if kids is not None else {}
            desired = {p: d.spec_replicas for p, d in deployments.items() if p in POOLS}
            for sample in service_samples(body, pods, desired):
                names = tuple(k for k, _ in sample.labels)
                family = families.get((sample.name, names))
                if family is None:
                    help_text = HELP[sample.name]
                    family = GaugeMetricFamily(PREFIX + sample.name, help_text, labels=names)
                    families[(sample.name, names)] = family
                family.add_metric([v for _, v in sample.labels], sample.value)
        yield from families.values()


INFERENCE_SERVICES = InferenceServiceCollector()
REGISTRY.register(INFERENCE_SERVICES)


def publish_inference_services(store: StoreLike) -> None:
    """Expose the ``tidal_inferenceservice_*`` series of ``store`` (idempotent)."""
    INFERENCE_SERVICES.store = store


def count_decision(namespace: str, isvc: str, pool: str, reason: str) -> None:
    """Count an autoscaler decision that changed ``status.lastDecision``."""
    SCALE_DECISIONS.labels(namespace=namespace, isvc=isvc, pool=pool, reason=reason).inc()
