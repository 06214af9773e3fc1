"""Table and property tests of the pure signal helpers (tidal.operator.core.signals)."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidal.operator.core.signals import (
    SCRAPE_BACKOFF_MAX_SECONDS,
    FastPoolSignals,
    PodCounts,
    PodMissing,
    PodScrape,
    PodTarget,
    PoolKey,
    PromPoolSignals,
    RateMemory,
    ScrapeBackoff,
    advance_backoff,
    count_pods,
    fold_scrapes,
    measured_warmup_seconds,
    observation_from_signals,
    parse_pool_signals,
    plan_scrapes,
    pod_views,
    pool_of,
    pool_signals_from_prometheus,
    pool_signals_query,
    scrape_targets,
    time_to_routable,
)

KEY = PoolKey("ns", "svc", "primary")


def pod(
    name: str,
    *,
    ready: bool = True,
    role: str = "serving",
    ip: str | None = "10.244.0.5",
    unschedulable: bool = False,
    deleting: bool = False,
    phase: str = "Running",
    scheduled_at: str | None = "2026-12-02T10:00:00Z",
    ready_at: str | None = "2026-12-02T10:00:07Z",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = []
    if unschedulable:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"})
        phase = "Pending"
    else:
        conditions.append(
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled_at}
        )
        conditions.append(
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "lastTransitionTime": ready_at,
            }
        )
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "labels": {
            "serving.tidal.dev/isvc": "svc",
            "serving.tidal.dev/pool": "primary",
            "serving.tidal.dev/role": role,
        },
        "annotations": annotations or {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T10:01:00Z"
    status: dict[str, Any] = {"phase": phase, "conditions": conditions}
    if ip and not unschedulable:
        status["podIP"] = ip
    return {"metadata": meta, "status": status}


# -- pods -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([], PodCounts()),
        ([pod("a")], PodCounts(ready_serving=1, serving=("a",))),
        ([pod("a", ready=False)], PodCounts(warming=1)),
        ([pod("a", role="standby")], PodCounts(ready_standby=1)),
        # A standby pod that is not ready yet is warming like any other.
        ([pod("a", role="standby", ready=False)], PodCounts(warming=1)),
        ([pod("a", unschedulable=True)], PodCounts(pending_unschedulable=1)),
        ([pod("a", deleting=True)], PodCounts(terminating=1)),
        ([pod("a", phase="Failed", ready=False)], PodCounts(terminating=1)),
        (
            [
                pod("b"),
                pod("a"),
                pod("c", ready=False),
                pod("d", role="standby"),
                pod("e", unschedulable=True),
                pod("f", deleting=True),
            ],
            PodCounts(
                ready_serving=2,
                warming=1,
                ready_standby=1,
                pending_unschedulable=1,
                terminating=1,
                serving=("a", "b"),
            ),
        ),
    ],
)
def test_count_pods(pods: list[dict[str, Any]], expected: PodCounts) -> None:
    assert count_pods(pods) == expected


def test_a_pod_without_status_is_warming() -> None:
    assert count_pods([{"metadata": {"name": "x"}}]) == PodCounts(warming=1)


def test_pool_of_reads_the_labels() -> None:
    assert pool_of(pod("a")) == KEY
    assert pool_of({"metadata": {"name": "x", "labels": {"app": "y"}}}) is None


def test_scrape_targets_skip_pods_without_ip_and_terminating_ones() -> None:
    pods = [
        pod("a", ip="10.244.0.9"),
        pod("b", ip=None, ready=False),
        pod("c", deleting=True),
        pod("d", ip="10.244.0.10", ready=False, annotations={"prometheus.io/port": "9000"}),
        pod("e", ip="fd00::1", annotations={"prometheus.io/path": "/m"}),
    ]
    targets = scrape_targets(pods)
    assert [(t.pod, t.url) for t in targets] == [
        ("a", "http://10.244.0.9:8080/metrics"),
        ("d", "http://10.244.0.10:9000/metrics"),
        ("e", "http://[fd00::1]:8080/m"),
    ]


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        ([], None),
        ([pod("a", ready=False)], None),
        ([pod("a")], 7.0),
        (
            [
                pod("a", ready_at="2026-12-02T10:00:03Z"),
                pod("b", ready_at="2026-12-02T10:00:05Z"),
                pod("c", ready_at="2026-12-02T10:01:00Z"),
            ],
            5.0,
        ),
        ([pod("a", ready_at="garbage")], None),
        ([pod("a", ready_at="2026-12-02T09:00:00Z")], None),  # ready before scheduled: skip
    ],
)
def test_measured_warmup_is_the_median_from_scheduled_to_ready(
    pods: list[dict[str, Any]], expected: float | None
) -> None:
    assert measured_warmup_seconds(pods) == expected


def test_pod_views_carry_in_flight_and_cache_warmth() -> None:
    scrapes = {
        "a": PodScrape("a", 1.0, in_flight=3, queued=1, answered=5, models_ready=1, models=2),
    }
    wall_now = 1796205607.0 + 60  # 60 s after a's Ready transition
    views = {v.name: v for v in pod_views([pod("a"), pod("b", ready=False)], scrapes, wall_now)}
    assert views["a"].in_flight == 3 and views["a"].cache_warmth == 0.5
    assert views["a"].ready_for_seconds == pytest.approx(
        wall_now - measured_ready("2026-12-02T10:00:07Z")
    )
    assert views["b"] == views["b"].__class__("b", ready=False, standby=False)


def measured_ready(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# -- fast path --------------------------------------------------------------------------------


def scrape(name: str, at: float, in_flight: float, answered: float, queued: float = 0) -> PodScrape:
    return PodScrape(name, at, in_flight=in_flight, queued=queued, answered=answered)


def test_in_flight_is_summed_over_serving_pods_only() -> None:
    results = [scrape("a", 10, 3, 0, queued=1), scrape("b", 10, 2, 0), scrape("s", 10, 9, 0)]
    fast, _ = fold_scrapes(results, RateMemory(), serving=["a", "b"])
    assert fast.in_flight == 5 and fast.queued == 1 and fast.missing == ()
    assert fast.per_pod_in_flight == {"a": 3, "b": 2, "s": 9}


def test_arrivals_are_answers_plus_growth_of_in_flight() -> None:
    memory = RateMemory()
    _, memory = fold_scrapes([scrape("a", 10.0, 0, 100)], memory, ["a"])
    # 20 answered and 30 more in flight over 2 s: 50 arrived, 25 req/s.
    fast, memory = fold_scrapes([scrape("a", 12.0, 30, 120)], memory, ["a"])
    assert fast.arrival_rate == pytest.approx(25.0)
    # Draining: 40 answered, in flight fell by 30 -> 10 arrived in 1 s.
    fast, _ = fold_scrapes([scrape("a", 13.0, 0, 160)], memory, ["a"])
    assert fast.arrival_rate == pytest.approx(10.0)


def test_first_sight_has_no_rate_and_says_so() -> None:
    fast, memory = fold_scrapes([scrape("a", 10.0, 1, 5)], RateMemory(), ["a"])
    assert fast.arrival_rate is None and fast.in_flight == 1
    assert any(n.startswith("rate:unknown") for n in fast.notes)
    assert set(memory.last) == {"a"}


def test_counter_reset_restarts_the_rate() -> None:
    _, memory = fold_scrapes([scrape("a", 10.0, 0, 500)], RateMemory(), ["a"])
    fast, memory = fold_scrapes([scrape("a", 11.0, 0, 3)], memory, ["a"])
    assert fast.arrival_rate is None
    fast, _ = fold_scrapes([scrape("a", 12.0, 0, 13)], memory, ["a"])
    assert fast.arrival_rate == pytest.approx(10.0)


def test_scrapes_closer_than_the_minimum_interval_repeat_the_last_rate() -> None:
    _, memory = fold_scrapes([scrape("a", 10.0, 0, 0)], RateMemory(), ["a"])
    _, memory = fold_scrapes([scrape("a", 11.0, 0, 10)], memory, ["a"])
    fast, memory2 = fold_scrapes([scrape("a", 11.1, 0, 11)], memory, ["a"])
    assert fast.arrival_rate == pytest.approx(10.0)
    assert memory2.last["a"].at == 11.0


def test_a_missing_pod_is_never_zero() -> None:
    results = [scrape("a", 10, 4, 0), PodMissing("b", 10, "timeout")]
    fast, _ = fold_scrapes(results, RateMemory(), serving=["a", "b"])
    # One of two missing: the other's load stands for it (4 + 4), not 4 + 0.
    assert fast.in_flight == 8 and fast.missing == ("b",)
    assert "queue:extrapolated 1/2 pods missing" in fast.notes
    results = [scrape("a", 10, 4, 0), PodMissing("b", 10, "x"), PodMissing("c", 10, "x")]
    fast, _ = fold_scrapes(results, RateMemory(), serving=["a", "b", "c"])
    assert fast.in_flight is None and fast.queued is None
    assert "queue:missing 2/3 pods" in fast.notes


def test_a_serving_pod_not_even_scraped_counts_as_missing() -> None:
    fast, _ = fold_scrapes([], RateMemory(), serving=["a"])
    assert fast.in_flight is None and fast.missing == ("a",)


def test_an_empty_pool_has_no_load() -> None:
    fast, _ = fold_scrapes([], RateMemory(), serving=[])
    assert fast.in_flight == 0 and fast.arrival_rate == 0


def test_memory_forgets_pods_that_left_and_long_missing_ones() -> None:
    _, memory = fold_scrapes([scrape("a", 0, 0, 0), scrape("b", 0, 0, 0)], RateMemory(), ["a"])
    _, memory = fold_scrapes([scrape("a", 1, 0, 0), PodMissing("b", 1, "x")], memory, ["a"])
    assert set(memory.last) == {"a", "b"}  # b kept: its next answer still has a base
    _, memory = fold_scrapes([scrape("a", 40, 0, 0), PodMissing("b", 40, "x")], memory, ["a"])
    assert set(memory.last) == {"a"}  # b missing for longer than forget_after
    _, memory = fold_scrapes([scrape("c", 41, 0, 0)], memory, ["c"])
    assert set(memory.last) == {"c"}


@given(
    st.lists(
        st.tuples(st.floats(0.5, 5.0), st.integers(0, 200), st.integers(0, 50)),
        min_size=2,
        max_size=30,
    )
)
def test_arrival_rate_is_never_negative_and_conserves_requests(
    steps: list[tuple[float, int, int]],
) -> None:
    """Property: over a run, the rates integrate to the requests that arrived."""
    memory, t, answered, arrived_total, integral = RateMemory(), 0.0, 0, 0, 0.0
    in_flight = 0
    _, memory = fold_scrapes([scrape("a", t, in_flight, answered)], memory, ["a"])
    for dt_, arrivals, answers in steps:
        answers = min(answers, in_flight + arrivals)
        in_flight += arrivals - answers
        answered += answers
        arrived_total += arrivals
        t += dt_
        fast, memory = fold_scrapes([scrape("a", t, in_flight, answered)], memory, ["a"])
        assert fast.arrival_rate is not None and fast.arrival_rate >= 0
        integral += fast.arrival_rate * dt_
    assert math.isclose(integral, arrived_total, rel_tol=1e-9, abs_tol=1e-6)


# -- Prometheus path --------------------------------------------------------------------------


def test_query_groups_by_pool_and_tags_every_signal() -> None:
    q = pool_signals_query('namespace="ns"', latency_window="20s")
    for signal in (
        "p99_hot",
        "p99_cold",
        "requests",
        "errors",
        "cold_start",
        "cold_samples",
        "transfer_wait",
        "transfer_samples",
        "startup",
        "engine_load",
        "in_flight",
        "arrival_rate",
        "pods",
        "age",
    ):
        assert f'"signal", "{signal}"' in q
    assert 'cache="hot",isvc!="",namespace="ns"' in q and "[20s]" in q
    assert q.count("label_replace(") == 15  # 14 pool signals + GPU memory per pod
    assert "tidal_transfer_wait_seconds_bucket{" in q
    # Counters: series born inside the window count in full, role relabels do not.
    assert "(sum without (role) (tidal_requests_total{" in q
    assert (
        'unless sum without (role) (tidal_requests_total{isvc!="",namespace="ns"} offset 20s)' in q
    )
    assert "sum by (namespace, isvc, pool, le)" in q


def sample(signal: str, value: str, **labels: str) -> dict[str, Any]:
    metric = {"namespace": "ns", "isvc": "svc", "pool": "primary", "signal": signal, **labels}
    return {"metric": metric, "value": [1796205600.0, value]}


def test_parse_pool_signals_converts_units_and_nan() -> None:
    result = [
        sample("p99_hot", "0.012"),
        sample("p99_cold", "NaN"),
        sample("requests", "120.4"),
        sample("errors", "3"),
        sample("cold_start", "1.5"),
        sample("cold_samples", "1"),
        sample("transfer_wait", "2.5"),
        sample("transfer_samples", "3"),
        sample("startup", "4.2"),
        sample("engine_load", "0.8"),
        sample("in_flight", "7"),
        sample("arrival_rate", "33"),
        sample("pods", "2"),
        sample("age", "0.4"),
        sample("gpu_used", "60", pod="p1"),
        sample("gpu_total", "100", pod="p1"),
        sample("gpu_used", "90", pod="p2"),
        sample("gpu_total", "100", pod="p2"),
        sample("gpu_used", "99", pod="p3"),  # no total: ignored
        sample("requests", "5", isvc="other"),
        sample("mystery", "1"),
        {"metric": {"signal": "requests"}, "value": [0, "1"]},  # no isvc: not a pool
    ]
    pools = parse_pool_signals(result, queried_at=50.0)
    assert set(pools) == {KEY, PoolKey("ns", "other", "primary")}
    p = pools[KEY]
    assert p.p99_hot_ms == pytest.approx(12.0) and p.p99_cold_ms is None
    assert p.requests == 120.4 and p.errors == 3 and p.error_rate == pytest.approx(3 / 120.4)
    assert p.cold_start_ms == 1500.0 and p.cold_samples == 1
    assert p.transfer_wait_ms == 2500.0 and p.transfer_samples == 3
    assert p.startup_seconds == 4.2 and p.engine_load_seconds == 0.8
    assert p.in_flight == 7 and p.arrival_rate == 33 and p.pods_reporting == 2
    assert p.age_seconds == 0.4 and p.observed_at == pytest.approx(49.6)
    assert (p.gpu_memory_used_bytes, p.gpu_memory_total_bytes) == (90, 100)  # the worst pod
    assert pools[PoolKey("ns", "other", "primary")].requests == 5


@pytest.mark.parametrize(
    ("requests", "errors", "rate"),
    [(None, None, None), (0.0, None, None), (10.0, None, 0.0), (10.0, 2.0, 0.2), (1.0, 3.0, 1.0)],
)
def test_error_rate_needs_requests(
    requests: float | None, errors: float | None, rate: float | None
) -> None:
    assert PromPoolSignals(KEY, 0.0, requests=requests, errors=errors).error_rate == rate


def test_pool_signals_for_the_slo_evaluator() -> None:
    prom = PromPoolSignals(
        KEY,
        queried_at=100.0,
        p99_hot_ms=42.0,
        requests=99.6,
        errors=1.0,
        cold_start_ms=900.0,
        cold_samples=2.2,
        transfer_wait_ms=1800.0,
        transfer_samples=2.6,
        gpu_memory_used_bytes=7.0,
        gpu_memory_total_bytes=10.0,
        age_seconds=3.0,
    )
    signals = pool_signals_from_prometheus(prom)
    assert signals.p99_hot_ms == 42.0 and signals.requests == 100 and signals.cold_samples == 2
    assert signals.transfer_wait_ms == 1800.0 and signals.transfer_samples == 3
    assert signals.error_rate == pytest.approx(1 / 99.6)
    assert (signals.gpu_memory_used_bytes, signals.gpu_memory_total_bytes) == (7, 10)
    assert signals.observed_at == 97.0
    assert pool_signals_from_prometheus(None).p99_hot_ms is None


# -- merging ----------------------------------------------------------------------------------

COUNTS = PodCounts(ready_serving=2, warming=1, ready_standby=1, serving=("a", "b"))


def fast_at(at: float, in_flight: float | None = 6.0, rate: float | None = 20.0) -> FastPoolSignals:
    return FastPoolSignals(
        at=at, in_flight=in_flight, queued=1.0, arrival_rate=rate, pods_scraped=2
    )


def prom_at(queried_at: float, age: float | None = 0.5, **kw: Any) -> PromPoolSignals:
    values: dict[str, Any] = {
        "p99_hot_ms": 30.0,
        "in_flight": 4.0,
        "arrival_rate": 15.0,
        "pods_reporting": 2,
    }
    values.update(kw)
    return PromPoolSignals(KEY, queried_at, age_seconds=age, **values)


@pytest.mark.parametrize(
    ("fast", "prom", "queue", "rate", "p99", "source", "age", "note"),
    [
        # Both fresh: the queue from the pods, P99 from Prometheus; age = the older of the two.
        (fast_at(99.8), prom_at(99.5), 6.0, 20.0, 30.0, "pods", 1.0, None),
        # Pods stale: fall back to Prometheus' in-flight and rate.
        (fast_at(90.0), prom_at(99.5), 4.0, 15.0, 30.0, "prometheus", 1.0, "queue:stale pods"),
        # Pods missing too many: Prometheus.
        (fast_at(99.8, None), prom_at(99.5), 4.0, 15.0, 30.0, "prometheus", 1.0, None),
        # Pods missing, and Prometheus lost one of the two serving pods as well: no sum of zeros.
        (
            fast_at(99.8, None),
            prom_at(99.5, pods_reporting=1),
            None,
            None,
            30.0,
            "none",
            1.0,
            "queue:prometheus has 1/2 pods",
        ),
        # Prometheus stale: P99 dropped, queue from pods still drives the decision.
        (fast_at(99.8), prom_at(99.5, age=9.0), 6.0, 20.0, None, "pods", 0.2, "p99:stale 9.5s"),
        # Prometheus down.
        (fast_at(99.8), None, 6.0, 20.0, None, "pods", 0.2, "p99:missing prometheus"),
        # No age from Prometheus (no series at all): treated as stale.
        (fast_at(99.8), prom_at(99.5, age=None), 6.0, 20.0, None, "pods", 0.2, "p99:stale"),
        # Both gone: queue missing, the autoscaler holds.
        (None, None, None, None, None, "none", None, "queue:missing"),
        (fast_at(80.0), prom_at(99.0, age=30.0), None, None, None, "none", None, "queue:stale"),
        # Queue known, rate unknown: said so.
        (fast_at(99.8, rate=None), None, 6.0, None, None, "pods", 0.2, "rate:missing (pods)"),
    ],
)
def test_observation_from_signals(
    fast: FastPoolSignals | None,
    prom: PromPoolSignals | None,
    queue: float | None,
    rate: float | None,
    p99: float | None,
    source: str,
    age: float | None,
    note: str | None,
) -> None:
    observed = observation_from_signals(100.0, COUNTS, fast, prom, max_age_seconds=5.0)
    obs = observed.observation
    assert (obs.queue_depth, obs.arrival_rate, obs.hot_p99_ms) == (queue, rate, p99)
    assert observed.queue_source == source
    if age is None:
        assert obs.metrics_age_seconds is None
    else:
        assert obs.metrics_age_seconds == pytest.approx(age)
    assert (obs.ready_serving, obs.warming, obs.ready_standby) == (2, 1, 1)
    if note is not None:
        assert any(n.startswith(note) for n in observed.notes), observed.notes


def test_an_unavailable_prometheus_is_noted_and_flagged_while_the_pods_still_count() -> None:
    observed = observation_from_signals(
        100.0, COUNTS, fast_at(99.8), None, prometheus_error="ConnectionError: refused"
    )
    obs = observed.observation
    assert obs.prometheus_unavailable and obs.queue_depth is not None
    assert observed.notes[0] == "prometheus:unavailable (ConnectionError: refused)"
    fine = observation_from_signals(100.0, COUNTS, fast_at(99.8), prom_at(99.5))
    assert not fine.observation.prometheus_unavailable


def test_an_empty_pool_is_known_to_be_idle_without_any_metrics() -> None:
    observed = observation_from_signals(
        5.0, PodCounts(warming=2, pending_unschedulable=1), None, None
    )
    obs = observed.observation
    assert obs.queue_depth == 0 and obs.metrics_age_seconds == 0
    assert (obs.warming, obs.pending_unschedulable) == (2, 1)


@pytest.mark.parametrize(
    ("given_warmup", "startup", "load", "expected"),
    [(9.0, 4.0, 1.0, 9.0), (None, 4.0, 1.0, 4.0), (None, None, 1.0, 1.0), (None, None, None, None)],
)
def test_warmup_prefers_the_pods_measure_then_startup_then_load_time(
    given_warmup: float | None, startup: float | None, load: float | None, expected: float | None
) -> None:
    prom = prom_at(99.5, startup_seconds=startup, engine_load_seconds=load)
    observed = observation_from_signals(
        100.0, COUNTS, fast_at(99.8), prom, warmup_seconds=given_warmup
    )
    assert observed.observation.warmup_seconds == expected


# -- capacity evidence and deadlines -------------------------------------------------------------


def worked(name: str, at: float, batches: float, seconds: float, **kw: Any) -> PodScrape:
    from tidal.operator.core.autoscaler import BatchWork

    work = BatchWork(batches, 2 * batches, 2 * batches, seconds, 2 * seconds, 4 * batches)
    fields: dict[str, Any] = {"in_flight": 4, "queued": 3, "answered": 2 * batches}
    fields.update(kw)
    return PodScrape(name, at, work=work, **fields)


def test_batch_work_is_the_growth_of_every_pods_counters() -> None:
    memory = RateMemory()
    first = [worked("a", 10, 5, 1.0, slots=2, max_batch_rows=8), worked("s", 10, 0, 0.0)]
    fast, memory = fold_scrapes(first, memory, serving=["a"])
    assert fast.work is None  # first sight: nothing to difference
    later = [worked("a", 11, 9, 1.8, slots=2, max_batch_rows=8), worked("s", 11, 1, 0.3)]
    fast, memory = fold_scrapes(later, memory, serving=["a"])
    assert fast.work is not None
    assert fast.work.work.batches == 5 and fast.work.work.seconds == pytest.approx(1.1)
    assert (fast.work.slots, fast.work.max_batch_rows) == (2, 8)
    # Closer than the rate interval: the base stays, and its work is not counted twice.
    fast, memory = fold_scrapes([worked("a", 11.2, 10, 2.0)], memory, serving=["a"])
    assert fast.work is None
    # A restarted pod (counters went down) gives no work, never negative work.
    fast, _ = fold_scrapes([worked("a", 13, 1, 0.1)], memory, serving=["a"])
    assert fast.work is None


def test_unreachable_requests_are_queued_minus_reachable_and_extrapolated() -> None:
    results = [
        worked("a", 10, 1, 0.1, queued=5, reachable=2.0, request_timeout_seconds=10.0),
        worked("b", 10, 1, 0.1, queued=1, reachable=1.0, request_timeout_seconds=4.0),
    ]
    fast, _ = fold_scrapes(results, RateMemory(), serving=["a", "b", "c"])
    assert fast.unreachable == pytest.approx((3 + 0) * 3 / 2)
    assert fast.deadline_seconds == 4.0
    observed = observation_from_signals(
        10.0, PodCounts(ready_serving=3, serving=("a", "b", "c")), fast, None
    )
    assert observed.observation.unreachable == fast.unreachable
    assert observed.observation.deadline_seconds == 4.0


def test_a_runtime_without_deadline_gauges_reports_no_unreachable_requests() -> None:
    fast, _ = fold_scrapes([scrape("a", 10, 3, 0, queued=2)], RateMemory(), serving=["a"])
    assert fast.unreachable is None and fast.deadline_seconds is None and fast.work is None


def test_time_to_routable_by_phase_over_recently_ready_pods() -> None:
    def timed(name: str, created: str, scheduled: str, started: str, ready: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "creationTimestamp": created},
            "status": {
                "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled},
                    {"type": "Ready", "status": "True", "lastTransitionTime": ready},
                ],
                "containerStatuses": [{"state": {"running": {"startedAt": started}}}],
            },
        }

    pods = [
        timed("a", "2026-12-03T12:00:00Z", "2026-12-03T12:00:01Z", "2026-12-03T12:00:02Z",
              "2026-12-03T12:00:05Z"),
        timed("b", "2026-12-03T12:00:00Z", "2026-12-03T12:00:00Z", "2026-12-03T12:00:01Z",
              "2026-12-03T12:00:04Z"),
        timed("old", "2026-12-03T11:00:00Z", "2026-12-03T11:00:00Z", "2026-12-03T11:00:01Z",
              "2026-12-03T11:00:04Z"),
    ]  # fmt: skip
    now = 1796299210.0  # 12:00:10
    scrapes = {
        "a": replace(scrape("a", 1.0, 0, 0), startup_seconds=2.5, load_phases=(("warmup", 1.5),)),
        "b": replace(scrape("b", 1.0, 0, 0), startup_seconds=2.0, load_phases=(("warmup", 0.5),)),
    }
    got = time_to_routable(pods, scrapes, now)
    assert got is not None and got.samples == 2  # "old" turned Ready an hour ago
    assert (got.total_seconds, got.schedule_seconds, got.process_start_seconds) == (4.5, 0.5, 1.0)
    assert got.runtime_seconds == 2.25 and got.phases == {"warmup": 1.0}
    assert time_to_routable(pods[2:], scrapes, now) is None


# -- scrape back-off ----------------------------------------------------------------------------


def _rounds(outcomes: list[bool], every: float = 1.0) -> list[tuple[float, bool]]:
    """Drive one pod through ticks ``every`` s apart; ``outcomes`` says whether it answers
    when asked. Returns (time, asked) for each tick."""
    target = [PodTarget("p", "10.0.0.1:8080")]
    backoff, seen, answers = ScrapeBackoff(), [], iter(outcomes)
    for i in range(len(outcomes) * 4):
        now = i * every
        asked, skipped = plan_scrapes(target, backoff, now)
        if asked:
            ok = next(answers, None)
            if ok is None:
                break
            result = scrape("p", now, 1, 0) if ok else PodMissing("p", now, "timeout after 0.3s")
            backoff = advance_backoff(backoff, [result], target)
        else:
            assert skipped[0].pod == "p" and "backing off" in skipped[0].error
            assert skipped[0].error.startswith("timeout after 0.3s")
        seen.append((now, bool(asked)))
    return seen


def test_a_pod_that_keeps_missing_is_asked_less_and_less_often() -> None:
    asked_at = [t for t, asked in _rounds([False] * 7) if asked]
    # Two misses a second apart, then 1, 2, 4, 8, 8 s between tries.
    assert asked_at == [0, 1, 2, 4, 8, 16, 24]


def test_a_pod_missing_for_hours_stays_at_the_cap() -> None:
    """2 ** misses once overflowed a float after ~1,000 misses in a row (hours of a pod
    that never answers): the back-off stays at its cap however long the misses go on."""
    target = [PodTarget("p", "10.0.0.1:8080")]
    backoff = ScrapeBackoff()
    for n in range(1100):
        backoff = advance_backoff(backoff, [PodMissing("p", n * 8.0, "refused")], target)
    assert backoff.retry_at["p"] == 1099 * 8.0 + SCRAPE_BACKOFF_MAX_SECONDS


def test_one_answer_resets_the_back_off() -> None:
    asked_at = [t for t, asked in _rounds([False, False, True, False, True, True]) if asked]
    assert asked_at == [0, 1, 2, 3, 4, 5]


def test_pods_no_longer_targeted_are_forgotten() -> None:
    a, b = PodTarget("a", "x:1"), PodTarget("b", "y:1")
    backoff = advance_backoff(
        ScrapeBackoff(), [PodMissing("a", 0, "e"), PodMissing("b", 0, "e")], [a, b]
    )
    backoff = advance_backoff(backoff, [], [b])
    assert set(backoff.misses) == {"b"}


@given(st.lists(st.booleans(), min_size=1, max_size=40))
def test_a_missing_pod_is_never_left_unasked_longer_than_the_cap(outcomes: list[bool]) -> None:
    asked_at = [t for t, asked in _rounds(outcomes, every=0.5) if asked]
    gaps = [b - a for a, b in itertools.pairwise(asked_at)]
    assert all(g <= SCRAPE_BACKOFF_MAX_SECONDS + 0.5 for g in gaps)


def test_a_pod_that_turns_ready_is_asked_at_once() -> None:
    target = [PodTarget("p", "10.0.0.1:8080")]
    backoff = ScrapeBackoff()
    for now in (0.0, 1.0, 2.0):  # three misses while it starts: retry at 4 s
        backoff = advance_backoff(backoff, [PodMissing("p", now, "refused")], target)
    assert plan_scrapes(target, backoff, 3.0)[0] == []
    assert plan_scrapes(target, backoff, 3.0, ready={"p"})[0] == target
    backoff = advance_backoff(backoff, [PodMissing("p", 3.0, "refused")], target, ready={"p"})
    assert plan_scrapes(target, backoff, 3.5, ready={"p"})[0] == []  # Ready before: backs off
