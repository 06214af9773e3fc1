"""SLO evaluation: sustained breaches, resets, gaps, sample sizes, stale data, reasons."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tidal.operator.core.slo import (
    BreachAction,
    PoolSignals,
    Signal,
    SignalStatus,
    SloPolicy,
    SloState,
    SloVerdict,
    evaluate_slo,
)

POLICY = SloPolicy(p99_ms=80, error_rate=0.01, cold_start_ms=5000, gpu_memory_headroom=0.1)
GiB = 2**30


def sig(**kw: float | int | None) -> PoolSignals:
    """Healthy signals with enough samples, overridden by keyword."""
    base: dict[str, float | int | None] = {
        "p99_hot_ms": 20.0,
        "error_rate": 0.0,
        "cold_start_ms": 900.0,
        "cold_samples": 2,
        "gpu_memory_used_bytes": 40 * GiB,
        "gpu_memory_total_bytes": 80 * GiB,
        "requests": 500,
    }
    base.update(kw)
    return PoolSignals.model_validate(base)


def every(seconds: float, until: float, signals: PoolSignals) -> list[tuple[float, PoolSignals]]:
    """Observations every `seconds` from 0 to `until` inclusive."""
    count = int(until // seconds)
    return [(i * seconds, signals) for i in range(count + 1)]


def run(
    policy: SloPolicy, trace: Sequence[tuple[float, PoolSignals]]
) -> list[tuple[SloVerdict, SloState]]:
    state: SloState | None = None
    out = []
    for now, signals in trace:
        verdict, state = evaluate_slo(policy, signals, state, now)
        out.append((verdict, state))
    return out


def test_policy_parses_api_forms() -> None:
    p = SloPolicy.model_validate(
        {"p99Ms": 80, "gpuMemoryHeadroom": "10%", "for": "1m30s", "onBreach": "alert"}
    )
    assert p.for_seconds == 90
    assert p.gpu_memory_headroom == pytest.approx(0.1)
    assert p.on_breach is BreachAction.ALERT
    assert SloPolicy.model_validate({"for": "500ms"}).for_seconds == pytest.approx(0.5)
    assert SloPolicy.model_validate({"for": 15}).for_seconds == 15


@pytest.mark.parametrize(
    "doc",
    [
        {"for": "1 minute"},
        {"for": "60"},
        {"gpuMemoryHeadroom": 0.1, "gpuMemoryHeadroomBytes": 1},
        {"errorRate": 1.5},
        {"p99Ms": 0},
        {"unknownField": 1},
    ],
)
def test_policy_rejects(doc: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        SloPolicy.model_validate(doc)


def test_breach_counts_only_after_for_seconds() -> None:
    trace = [(t, sig(p99_hot_ms=182.0)) for t in (0, 15, 30, 45, 59.9, 60, 75)]
    verdicts = [v for v, _ in run(POLICY, trace)]
    assert [v.breached for v in verdicts] == [False] * 5 + [True, True]
    assert [v.onset for v in verdicts] == [False] * 5 + [True, False]
    assert verdicts[4].reading(Signal.P99).status is SignalStatus.PENDING
    assert verdicts[5].reason == "breach:p99 182ms > 80ms for 60s"
    assert verdicts[4].reason == "pending:p99 182ms > 80ms for 60s of 60s"
    breach = verdicts[6].breaches[0]
    assert (breach.signal, breach.value, breach.threshold) == (Signal.P99, 182.0, 80.0)
    assert (breach.breaching_since, breach.breaching_for_seconds) == (0, 75)


def test_recovery_resets_the_clock() -> None:
    bad, good = sig(p99_hot_ms=200.0), sig()
    trace = [(0, bad), (30, bad), (45, good), (50, bad), (80, bad), (110, bad)]
    verdicts = [v for v, _ in run(POLICY, trace)]
    assert [v.breached for v in verdicts] == [False, False, False, False, False, True]
    assert verdicts[-1].breaches[0].breaching_since == 50


def test_value_at_the_objective_is_within_it() -> None:
    trace = [(t, sig(p99_hot_ms=80.0, error_rate=0.01)) for t in (0, 100)]
    assert not any(v.breached for v, _ in run(POLICY, trace))


@pytest.mark.parametrize(
    ("gap", "breached"),
    [(10, True), (25, True), (31, False), (100, False)],
)
def test_short_gap_keeps_onset_long_gap_resets(gap: int, breached: bool) -> None:
    bad = sig(p99_hot_ms=200.0)
    # Bad at 0 and 20, a gap (no data) `gap` s after that, then bad again 5 s later.
    trace: list[tuple[float, PoolSignals]] = [(0, bad), (20, bad)]
    trace += [(20 + gap, sig(p99_hot_ms=None)), (25 + gap, bad)]
    trace += [(25 + gap + i, bad) for i in range(5, 61 - gap, 5)]
    verdicts = [v for v, _ in run(POLICY, trace)]
    assert verdicts[2].reading(Signal.P99).status is SignalStatus.NO_DATA
    assert not verdicts[2].breached  # missing data is never a breach by itself
    assert verdicts[-1].breached is breached


@pytest.mark.parametrize(
    ("signals", "status"),
    [
        (sig(p99_hot_ms=500.0, error_rate=0.5, requests=3), SignalStatus.TOO_FEW_SAMPLES),
        (sig(p99_hot_ms=500.0, error_rate=0.5, requests=None), SignalStatus.TOO_FEW_SAMPLES),
        (sig(p99_hot_ms=math.nan, error_rate=math.nan), SignalStatus.NO_DATA),
        (sig(p99_hot_ms=500.0, error_rate=0.5, observed_at=-500.0), SignalStatus.STALE),
    ],
)
def test_insufficient_or_missing_data_never_breaches(
    signals: PoolSignals, status: SignalStatus
) -> None:
    verdicts = [v for v, _ in run(POLICY, [(t, signals) for t in range(0, 600, 10)])]
    assert not any(v.breached for v in verdicts)
    last = verdicts[-1]
    for s in (Signal.P99, Signal.ERROR_RATE):
        assert last.reading(s).status is status
    assert "no data:" in last.reason


def test_sample_rule_reports_counts() -> None:
    (verdict, _), *_ = run(POLICY, [(0, sig(p99_hot_ms=500.0, requests=3))])
    assert verdict.reason == "ok (no data: p99 3<20 samples, errorRate 3<20 samples)"


def test_cold_start_is_separate_from_hot_p99() -> None:
    verdict = run(POLICY, every(15, 60, sig(cold_start_ms=9000.0, cold_samples=1)))[-1][0]
    assert [r.signal for r in verdict.breaches] == [Signal.COLD_START]
    assert verdict.reading(Signal.P99).status is SignalStatus.OK
    none_cold = run(POLICY, every(15, 60, sig(cold_start_ms=9000.0, cold_samples=0)))
    assert not none_cold[-1][0].breached


TRANSFER = SloPolicy(p99_ms=80, transfer_wait_ms=500, for_seconds=10, min_cold_samples=2)


@pytest.mark.parametrize(
    ("case", "trace", "status", "breached"),
    [
        (
            "sustained for the window: breach",
            [(t, sig(transfer_wait_ms=2000.0, transfer_samples=3)) for t in (0, 5, 10)],
            SignalStatus.BREACHED,
            True,
        ),
        (
            "not yet for the window: pending",
            [(t, sig(transfer_wait_ms=2000.0, transfer_samples=3)) for t in (0, 5, 9)],
            SignalStatus.PENDING,
            False,
        ),
        (
            "at the objective: within it",
            [(t, sig(transfer_wait_ms=500.0, transfer_samples=3)) for t in (0, 5, 10)],
            SignalStatus.OK,
            False,
        ),
        (
            "one recovery restarts the window",
            [
                (0, sig(transfer_wait_ms=2000.0, transfer_samples=3)),
                (5, sig(transfer_wait_ms=20.0, transfer_samples=3)),
                (10, sig(transfer_wait_ms=2000.0, transfer_samples=3)),
            ],
            SignalStatus.PENDING,
            False,
        ),
        (
            "fewer waiting requests than minColdSamples: no verdict",
            [(t, sig(transfer_wait_ms=9000.0, transfer_samples=1)) for t in (0, 5, 10)],
            SignalStatus.TOO_FEW_SAMPLES,
            False,
        ),
        (
            "no request waited on a transfer (a CPU backend): no data",
            [(t, sig(transfer_wait_ms=None, transfer_samples=None)) for t in (0, 5, 10)],
            SignalStatus.NO_DATA,
            False,
        ),
        (
            "a short gap keeps the onset",
            [
                (0, sig(transfer_wait_ms=2000.0, transfer_samples=3)),
                (5, sig(transfer_wait_ms=math.nan, transfer_samples=0)),
                (10, sig(transfer_wait_ms=2000.0, transfer_samples=3)),
            ],
            SignalStatus.BREACHED,
            True,
        ),
    ],
)
def test_transfer_wait_is_judged_like_the_other_triggers(
    case: str,
    trace: list[tuple[float, PoolSignals]],
    status: SignalStatus,
    breached: bool,
) -> None:
    verdict = run(TRANSFER, trace)[-1][0]
    reading = verdict.reading(Signal.TRANSFER_WAIT)
    assert reading.status is status, (case, verdict.reason)
    assert verdict.breached is breached, (case, verdict.reason)
    if breached:
        assert verdict.reason == "breach:transferWait 2000ms > 500ms for 10s", case


def test_transfer_wait_is_a_cold_signal_apart_from_the_hot_p99() -> None:
    # Requests held by slow transfers breach transferWait; the hot P99 stays clean (DESIGN §6).
    slow = sig(transfer_wait_ms=3000.0, transfer_samples=4, p99_hot_ms=20.0)
    verdict = run(TRANSFER, every(5, 10, slow))[-1][0]
    assert [r.signal for r in verdict.breaches] == [Signal.TRANSFER_WAIT]
    assert verdict.reading(Signal.P99).status is SignalStatus.OK
    # Without the objective it is reported, never judged.
    assert (
        run(POLICY, every(5, 10, slow))[-1][0].reading(Signal.TRANSFER_WAIT).status
        is SignalStatus.DISABLED
    )
    (few, _), *_ = run(TRANSFER, [(0, sig(transfer_wait_ms=3000.0, transfer_samples=1))])
    assert few.reason == "ok (no data: transferWait 1<2 samples)"


def test_gpu_memory_headroom_fraction_and_bytes() -> None:
    tight = sig(gpu_memory_used_bytes=76 * GiB)  # 5 % free of 80 GiB
    verdict = run(POLICY, every(15, 60, tight))[-1][0]
    assert verdict.reason == "breach:gpuMemoryHeadroom 5% < 10% for 60s"
    by_bytes = SloPolicy(gpu_memory_headroom_bytes=2 * GiB)
    assert not run(by_bytes, every(15, 60, tight))[-1][0].breached  # 4 GiB free
    full = sig(gpu_memory_used_bytes=79 * GiB)
    verdict = run(by_bytes, every(15, 60, full))[-1][0]
    assert verdict.reason == "breach:gpuMemoryHeadroom 1GiB < 2GiB for 60s"
    unknown_total = sig(gpu_memory_total_bytes=None)
    verdict = run(POLICY, [(0, unknown_total)])[0][0]
    assert verdict.reading(Signal.GPU_MEMORY_HEADROOM).status is SignalStatus.NO_DATA


def test_several_signals_and_disabled_ones() -> None:
    policy = SloPolicy(p99_ms=80, error_rate=0.01, for_seconds=10)
    bad = sig(p99_hot_ms=95.0, error_rate=0.05, cold_start_ms=99999.0)
    verdict = run(policy, [(0, bad), (10, bad)])[-1][0]
    assert verdict.reason == "breach:p99 95ms > 80ms for 10s, errorRate 5% > 1% for 10s"
    assert verdict.reading(Signal.COLD_START).status is SignalStatus.DISABLED
    assert verdict.reading(Signal.COLD_START).value == 99999.0  # still reported


def test_infinite_quantile_is_a_breach() -> None:
    # histogram_quantile answers +Inf when the quantile lies in the top bucket.
    trace = every(20, 60, sig(p99_hot_ms=math.inf))
    assert run(POLICY, trace)[-1][0].reason == "breach:p99 +Infms > 80ms for 60s"


def test_zero_window_breaches_at_once() -> None:
    verdict = run(SloPolicy(p99_ms=80, for_seconds=0), [(5, sig(p99_hot_ms=81.0))])[0][0]
    assert verdict.breached and verdict.onset


def test_sparse_observations_do_not_sum_into_a_sustained_breach() -> None:
    # Two bad samples 60 s apart say nothing about the minute between them.
    assert not run(POLICY, [(0, sig(p99_hot_ms=200.0)), (60, sig(p99_hot_ms=200.0))])[-1][
        0
    ].breached


def test_clock_stepping_back_never_gives_negative_duration() -> None:
    bad = sig(p99_hot_ms=200.0)
    verdict = run(POLICY, [(100, bad), (40, bad)])[-1][0]
    reading = verdict.reading(Signal.P99)
    assert reading.breaching_for_seconds == 0 and not verdict.breached


def test_state_round_trips_through_json() -> None:
    bad = sig(p99_hot_ms=200.0)
    _, state = evaluate_slo(POLICY, bad, None, 0)
    for now in (20, 40):
        stored = SloState.model_validate_json(state.model_dump_json(by_alias=True))
        _, state = evaluate_slo(POLICY, bad, stored, now)
    verdict, _ = evaluate_slo(POLICY, bad, state, 60)
    assert verdict.breached


# --- properties ---------------------------------------------------------------------------

OBS = st.sampled_from(["good", "bad", "none", "few"])
STEP = st.integers(min_value=1, max_value=80).map(lambda half: half / 2)  # exact in binary


def _signals(kind: str) -> PoolSignals:
    return {
        "good": sig(),
        "bad": sig(p99_hot_ms=300.0),
        "none": sig(p99_hot_ms=None),
        "few": sig(p99_hot_ms=300.0, requests=1),
    }[kind]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(STEP, OBS), min_size=1, max_size=40), st.sampled_from([0, 10, 60]))
def test_breached_means_over_for_the_whole_window(
    steps: list[tuple[float, str]], window: float
) -> None:
    """Reference check: breached iff the current run of 'bad' (gaps <= maxGap allowed,
    any 'good' or longer gap ends it) began at least `for` seconds ago."""
    policy = SloPolicy(p99_ms=80, for_seconds=window, max_gap_seconds=30)
    now, state = 0.0, None
    run_start: float | None = None
    last_bad: float | None = None
    for dt, kind in steps:
        now += dt
        verdict, state = evaluate_slo(policy, _signals(kind), state, now)
        if kind == "good":
            run_start = last_bad = None
        elif kind == "bad":
            if run_start is None or last_bad is None or now - last_bad > 30:
                run_start = now
            last_bad = now
        elif last_bad is not None and now - last_bad > 30:
            run_start = last_bad = None
        expect = kind == "bad" and run_start is not None and now - run_start >= window
        assert verdict.breached is expect
        assert verdict.reading(Signal.P99).status is not SignalStatus.BREACHED or expect


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(STEP, st.sampled_from(["good", "none", "few"])), max_size=40))
def test_without_a_bad_sample_nothing_ever_breaches(steps: list[tuple[float, str]]) -> None:
    now, state = 0.0, None
    for dt, kind in steps:
        now += dt
        verdict, state = evaluate_slo(POLICY, _signals(kind), state, now)
        assert not verdict.breached and not verdict.breaching


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(STEP, OBS), min_size=1, max_size=30),
    st.integers(min_value=-(10**6), max_value=10**6),
)
def test_verdicts_do_not_depend_on_the_clock_origin(
    steps: list[tuple[float, str]], shift: int
) -> None:
    a = b = None
    now = 0.0
    for dt, kind in steps:
        now += dt
        va, a = evaluate_slo(POLICY, _signals(kind), a, now)
        vb, b = evaluate_slo(POLICY, _signals(kind), b, now + shift)
        assert (va.breached, va.onset) == (vb.breached, vb.onset)
        assert [r.status for r in va.readings] == [r.status for r in vb.readings]
