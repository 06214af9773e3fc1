"""The operator's own Prometheus metrics (names are part of the public contract).

- ``tidal_operator_reconcile_duration_seconds`` histogram: one reconcile of one InferenceService.
- ``tidal_operator_reconciles_total{result}``: ``ok``, ``degraded``, ``retry``, ``gone``.
- ``tidal_operator_reconcile_errors_total{kind}``: failed reconciles by error kind.
- ``tidal_operator_queue_depth`` gauge: InferenceServices waiting for a worker.
- ``tidal_operator_api_requests_total{verb,resource}``: requests the operator made itself
  (kopf's watch streams not included).
- ``tidal_operator_children_applied_total{kind}``: children written by server-side apply.
- ``tidal_operator_events_total{type,reason}``: Events posted.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

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
EVENTS = Counter("tidal_operator_events_total", "Events posted.", ["type", "reason"])
