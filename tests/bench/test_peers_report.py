"""bench/peers_report.py: the traces and the figures of the peers bench, on injected answers and
replica series (the bench itself runs minutes on the real node; see bench/RESULTS.md)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import peers_report


@pytest.fixture
def rep() -> ModuleType:
    return peers_report


def test_step_trace_is_five_times_the_base_after_the_onset(rep: ModuleType) -> None:
    step = rep.traces(3.0)["step"]
    assert step.rate(0) == 3.0 and step.rate(29.9) == 3.0
    assert step.rate(30.0) == 15.0 and step.rate(149) == 15.0
    assert step.duration == 150 and step.needed(5.0) == 3


def test_day_trace_is_silent_at_night_and_ramps_linearly(rep: ModuleType) -> None:
    day = rep.traces(4.0)["day"]
    assert day.rate(10) == 0.0 and day.rate(180) == 0.0
    assert day.rate(60) == pytest.approx(2.5)  # halfway from 1 to 4 req/s
    assert day.peak == 16.0


def test_scale_stretches_time_only(rep: ModuleType) -> None:
    a, b = rep.traces(3.0)["herd"], rep.traces(3.0, scale=2.0)["herd"]
    assert b.duration == 2 * a.duration and b.onset == 2 * a.onset and b.peak == a.peak


def series(rep: ModuleType, *obs: tuple[float, int, int, int]) -> list[object]:
    return [rep.Replicas(*o) for o in obs]


def test_decision_is_the_first_rise_of_desired_after_the_onset(rep: ModuleType) -> None:
    s = series(rep, (0, 1, 1, 1), (29, 2, 1, 1), (31, 2, 2, 1), (44, 4, 2, 2), (50, 4, 4, 4))
    # desired was already 2 at the onset (30): the next rise, at 44 s, is the decision
    assert rep.first_decision(s, 30.0) == pytest.approx(14.0)
    assert rep.first_decision(s, 60.0) is None


def test_warm_capacity_waits_for_enough_ready_replicas(rep: ModuleType) -> None:
    s = series(rep, (0, 1, 1, 1), (35, 3, 3, 1), (41, 3, 3, 2), (47.5, 3, 3, 3))
    assert rep.warm_capacity(s, 30.0, 3) == pytest.approx(17.5)
    assert rep.warm_capacity(s, 30.0, 4) is None
    assert rep.warm_capacity(s, 30.0, 1) == pytest.approx(5.0)  # first observation after onset


def test_replica_seconds_integrate_existing_pods_up_to_the_end(rep: ModuleType) -> None:
    s = series(rep, (0, 1, 1, 1), (10, 3, 3, 1), (20, 1, 1, 1))
    assert rep.replica_seconds(s, 30.0) == pytest.approx(10 * 1 + 10 * 3 + 10 * 1)
    assert rep.replica_seconds(s, 15.0) == pytest.approx(10 + 5 * 3)


def test_measure_counts_failed_requests_as_late(rep: ModuleType) -> None:
    trace = rep.traces(3.0)["step"]
    answers = [
        rep.Answer(1.0, 0.2, True),
        rep.Answer(31.0, 1.5, True),  # 0.5 s late
        rep.Answer(32.0, 0.0, False),  # failed: late too
        rep.Answer(33.0, 0.3, True),
    ]
    s = series(rep, (0, 1, 1, 1), (35, 3, 3, 1), (40, 3, 3, 3))
    row = rep.measure("x", trace, answers, s, slo=1.0, capacity_rps=5.0)
    assert row.requests == 4 and row.failed == 1
    assert row.late_share == pytest.approx(0.5)
    assert row.late_p99 == pytest.approx(0.5)
    assert row.decision == pytest.approx(5.0) and row.warm == pytest.approx(10.0)
    assert row.zero_first_answer is None  # one replica at the onset, not zero


def test_zero_first_answer_runs_from_the_first_request_to_the_first_answer(
    rep: ModuleType,
) -> None:
    s = series(rep, (0, 1, 1, 1), (20, 0, 0, 0), (52, 1, 1, 0), (56, 1, 1, 1))
    held = [rep.Answer(50.4, 6.1, True), rep.Answer(50.1, 6.3, True)]
    assert rep.zero_first_answer(s, held, 50.0) == pytest.approx(6.3)
    # the first two fail at once (no endpoint), the third is answered at 57.0
    failing = [rep.Answer(50.1, 0.0, False), rep.Answer(51.0, 0.0, False)]
    failing.append(rep.Answer(56.5, 0.5, True))
    assert rep.zero_first_answer(s, failing, 50.0) == pytest.approx(6.9)
    assert rep.zero_first_answer(s, failing[:2], 50.0) is None
    assert rep.zero_first_answer(s, held, 10.0) is None  # one replica then, not zero


def row(rep: ModuleType, name: str, late: float, reps: float, failed: int = 0) -> object:
    return rep.Row(name, 100, 1.0, 5.0, late, 0.1, failed, reps, None)


def tuned(name: str) -> bool:
    return name.endswith("-tuned")


def test_verdict_compares_with_the_best_tuned_peer_only(rep: ModuleType) -> None:
    rows = [
        row(rep, "tidal", 0.04, 110.0),
        row(rep, "hpa-default", 0.01, 50.0),  # a default peer never counts
        row(rep, "hpa-tuned", 0.30, 90.0),
        row(rep, "keda-tuned", 0.10, 100.0),
    ]
    text = rep.verdict(rows, tuned)
    assert "keda-tuned" in text and "1.10x" in text and text.endswith("met")
    rows[0] = row(rep, "tidal", 0.06, 110.0)  # more than half keda-tuned's late share
    assert rep.verdict(rows, tuned).endswith("NOT met")
    rows[0] = row(rep, "tidal", 0.0, 130.0)  # over 1.2x its replica-seconds
    assert rep.verdict(rows, tuned).endswith("NOT met")
    rows[0] = row(rep, "tidal", 0.0, 100.0, failed=1)
    assert rep.verdict(rows, tuned).endswith("NOT met")


def test_table_puts_tidal_first_with_ratios_to_it(rep: ModuleType) -> None:
    trace = rep.traces(3.0)["step"]
    rows = [row(rep, "keda-tuned", 0.10, 100.0), row(rep, "tidal", 0.05, 80.0)]
    lines = rep.table(trace, rows, tuned).splitlines()
    assert lines[0].startswith("trace step")
    assert lines[3].startswith("tidal") and lines[3].rstrip().endswith("1.00x")
    assert lines[4].startswith("keda-tuned") and "2.00x" in lines[4] and "1.25x" in lines[4]


def test_warmup_is_the_median_wait_from_a_raise_to_its_readiness(rep: ModuleType) -> None:
    import peers_vs_sim

    s = series(rep, (0, 1, 1, 1), (10, 3, 3, 1), (14, 3, 3, 2), (16, 3, 3, 3), (30, 4, 4, 3))
    # 10 -> 16 s for the raise to 3; the raise to 4 never became ready
    assert peers_vs_sim.warmup_seconds(s) == pytest.approx(6.0)
    assert peers_vs_sim.warmup_seconds(s[:1]) is None


def test_the_gateway_counts_in_the_cost(rep: ModuleType) -> None:
    # v0.4 left tidal's gateway pod out of its replica-seconds (issue 40).
    trace = rep.traces(3.0)["step"]
    answers = [rep.Answer(1.0, 0.2, True)]
    replicas = series(rep, (0, 1, 1, 1))
    gateway = series(rep, (0, 1, 1, 1))
    alone = rep.measure("tidal", trace, answers, replicas, slo=1.0, capacity_rps=5.0)
    fronted = rep.measure(
        "tidal", trace, answers, replicas, slo=1.0, capacity_rps=5.0, gateway=gateway
    )
    assert fronted.gateway_seconds == pytest.approx(trace.duration)
    assert fronted.replica_seconds == pytest.approx(alone.replica_seconds + trace.duration)


def test_runs_are_summarised_by_their_medians_and_ranges(rep: ModuleType) -> None:
    trace = rep.traces(3.0)["herd"]
    runs = [
        [row(rep, "tidal", 0.02, 100.0), row(rep, "keda-tuned", 0.20, 100.0)],
        [row(rep, "tidal", 0.04, 120.0, failed=1), row(rep, "keda-tuned", 0.10, 90.0)],
        [row(rep, "tidal", 0.03, 110.0), row(rep, "keda-tuned", 0.30, 95.0)],
    ]
    medians = {r.autoscaler: r for r in rep.median_rows(runs)}
    assert medians["tidal"].late_share == pytest.approx(0.03)
    assert medians["tidal"].replica_seconds == pytest.approx(110.0)
    assert medians["tidal"].failed == 1  # the total: one run with a failure fails the goal
    text = rep.summary(trace, runs, tuned)
    assert text.startswith("trace herd (median of 3 runs)")
    assert "late % 2.0-4.0" in text and "runs with failed requests 1" in text
    assert "NOT met" in text
