"""bench/operator_scale.py's arithmetic: histogram quantiles, counter deltas, /proc parsing and
the goal verdicts (the sandbox run itself takes minutes; see bench/RESULTS.md)."""

from __future__ import annotations

import importlib.util
import math
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "operator_scale.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("operator_scale", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["operator_scale"] = module
    spec.loader.exec_module(module)
    return module


EXPOSITION = """\
# HELP tidal_operator_tick_lag_seconds How late a tick started.
# TYPE tidal_operator_tick_lag_seconds histogram
tidal_operator_tick_lag_seconds_bucket{le="0.1"} 50.0
tidal_operator_tick_lag_seconds_bucket{le="1.0"} 90.0
tidal_operator_tick_lag_seconds_bucket{le="10.0"} 99.0
tidal_operator_tick_lag_seconds_bucket{le="+Inf"} 100.0
tidal_operator_tick_lag_seconds_count 100.0
tidal_operator_api_requests_total{resource="pods",verb="patch"} 7.0
tidal_operator_api_requests_total{resource="inferenceservices",verb="patch_status"} 3.0
"""


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.25, 0.05),  # halfway into the first bucket, from 0
        (0.5, 0.1),  # exactly the first bucket's bound
        (0.7, 0.55),  # halfway between 0.1 and 1.0
        (0.99, 10.0),
        (0.995, math.inf),  # beyond the last finite bucket
    ],
)
def test_quantile_interpolates_within_the_bucket(bench: Any, q: float, expected: float) -> None:
    metrics = bench.parse_exposition(EXPOSITION)
    assert bench.quantile(metrics, "tidal_operator_tick_lag_seconds", q) == pytest.approx(expected)


def test_quantile_without_observations_is_none(bench: Any) -> None:
    empty = bench.minus(bench.parse_exposition(EXPOSITION), bench.parse_exposition(EXPOSITION))
    assert bench.quantile(empty, "tidal_operator_tick_lag_seconds", 0.99) is None
    assert bench.quantile({}, "tidal_operator_tick_lag_seconds", 0.99) is None


def test_minus_counts_only_what_happened_between_scrapes(bench: Any) -> None:
    before = bench.parse_exposition(EXPOSITION)
    after = bench.parse_exposition(
        EXPOSITION.replace('verb="patch"} 7.0', 'verb="patch"} 9.0')
        + 'tidal_operator_api_requests_total{resource="events",verb="create"} 1.0\n'
    )
    delta = bench.minus(after, before)
    assert bench.by_call(delta) == {"create events": 1, "patch pods": 2}
    assert bench.total(delta, "tidal_operator_api_requests_total") == 3


def test_merge_sums_the_same_series_of_several_operators(bench: Any) -> None:
    one = bench.parse_exposition(EXPOSITION)
    both = bench.merge([one, one])
    assert bench.by_call(both) == {"patch pods": 14, "patch_status inferenceservices": 6}
    # Buckets add up, so quantiles of the merged histogram are those of all ticks.
    assert bench.quantile(both, "tidal_operator_tick_lag_seconds", 0.7) == pytest.approx(0.55)
    assert bench.total(both, "tidal_operator_tick_lag_seconds_count") == 200


def test_cpu_and_rss_of_this_process_are_read_from_proc(bench: Any) -> None:
    before = bench.cpu_seconds(os.getpid())
    sum(i * i for i in range(300_000))  # burn a little CPU
    assert bench.cpu_seconds(os.getpid()) >= before > 0
    current, peak = bench.rss_mib(os.getpid())
    assert 0 < current <= peak


def _figures(**over: Any) -> dict[str, Any]:
    figures: dict[str, Any] = {
        "converged": True,
        "all_replicas_ready_s": 120.0,
        "pods_answer": True,
        "converge": {"reconcile_p99_s": 0.4},
        "mixed": {
            "tick_lag_p99_s": 0.2,
            "tick_rate_per_loop_hz": 0.3,
            "busy_ticks_per_busy_loop_hz": 1.0,
            "active_loops": 1001,
        },
        "quiet": {"api_calls": 0, "seconds": 60.0, "operator_cpu_cores": 0.05},
        "operator_rss_peak_mib": 250.0,
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            figures[section][field] = value
        else:
            figures[section] = value
    return figures


MET = [True] * 7


def _but(**changed: bool | None) -> list[bool | None]:
    order = ["ready", "reconcile", "lag", "rate", "rss", "cpu", "calls"]
    return [changed.get(name, True) for name in order]


@pytest.mark.parametrize(
    ("over", "verdicts"),
    [
        ({}, MET),
        ({"all_replicas_ready_s": 301.0}, _but(ready=False)),
        (
            {"converged": False, "all_replicas_ready_s": None},
            _but(ready=False, cpu=None, calls=None),
        ),
        ({"converge__reconcile_p99_s": 1.2}, _but(reconcile=False)),
        ({"mixed__tick_lag_p99_s": math.inf}, _but(lag=False)),
        # Busy loops skipping ticks: the lag looks fine, the rate does not.
        ({"mixed__busy_ticks_per_busy_loop_hz": 0.56}, _but(rate=False)),
        # No busy services: every loop's rate is judged.
        ({"mixed__busy_ticks_per_busy_loop_hz": None}, _but(rate=False)),
        ({"operator_rss_peak_mib": 290.0}, _but(rss=False)),  # 304 MB > 300 MB
        ({"quiet__operator_cpu_cores": 0.25}, _but(cpu=False)),
        ({"quiet__api_calls": 4}, _but(calls=False)),
        # Silent pods (as on kwok): no service is ever known to be quiet.
        ({"pods_answer": False, "quiet__api_calls": 4}, _but(cpu=None, calls=None)),
        ({"converge__reconcile_p99_s": None}, _but(reconcile=None)),
    ],
)
def test_goals_judge_each_target(
    bench: Any, over: dict[str, Any], verdicts: list[bool | None]
) -> None:
    rows = bench.goals(_figures(**over))
    assert [g.met for g in rows] == verdicts, bench.goal_table(rows)
    table = bench.goal_table(rows)
    assert "1,001 loops" in table
    assert table.count("NOT MET") == verdicts.count(False)


def test_fake_pod_exposition_reads_as_an_idle_or_busy_runtime(bench: Any) -> None:
    """What the responder answers is what the operator's scrape parser reads."""
    from tidal.operator.shell.podmetrics import parse_pod_metrics

    idle = parse_pod_metrics(bench.exposition(0, 0), "idle", 10.0)
    assert (idle.in_flight, idle.queued, idle.answered, idle.models_ready) == (0, 0, 0, 1)
    busy = parse_pod_metrics(bench.exposition(1, 40), "busy", 10.0)
    assert (busy.in_flight, busy.answered) == (1, 40)


def test_status_changes_name_each_changed_field_with_how_many_services(bench: Any) -> None:
    ready = [{"type": "Ready", "status": "True"}, {"type": "Degraded", "status": "False"}]
    before = {
        "ns/a": {"replicas": 2, "conditions": ready, "pools": {"primary": {"ready": 2}}},
        "ns/b": {"replicas": 2, "conditions": ready},
    }
    after = {
        "ns/a": {"replicas": 2, "conditions": ready, "pools": {"primary": {"ready": 1}}},
        "ns/b": {"replicas": 3, "conditions": [{"type": "Ready", "status": "False"}]},
        "ns/c": {"replicas": 1},
    }
    changes = bench.status_changes(before, after)
    assert set(changes) == {
        "pools.primary.ready",
        "replicas",
        "conditions[Ready].status",
        "conditions[Degraded].status",  # the condition went away: its every field
        "conditions[Degraded].type",
    }, changes
    assert changes["replicas"].startswith("2 services"), changes  # b changed, c is new
    assert "ns/a: 2 -> 1" in changes["pools.primary.ready"], changes
    assert bench.status_changes(before, before) == {}
