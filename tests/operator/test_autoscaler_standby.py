"""Standby sized from the surges a pool has seen (``maxStandbyReplicas``): tables and properties
of decide_scale with injected time, replicas of 100 req/s learned capacity (1 row per 10 ms)."""

from __future__ import annotations

import math
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.operator.core.autoscaler import (
    BatchWork,
    CapacityMemory,
    Observation,
    ScaleDecision,
    ScalerState,
    ScalingPolicy,
    decide_scale,
    dump_state,
    load_state,
)

WARMUP = 30.0
# 50 batches of one row, 10 ms each: 100 req/s a replica at saturation.
LEARNED = CapacityMemory(
    BatchWork(batches=50, rows=50, requests=50, seconds=0.5, row_seconds=0.5, rows_squared=50),
    1,
    1,
)


def policy(**kw: float | int | None) -> ScalingPolicy:
    fields: dict[str, float | int | None] = {
        "min_replicas": 1,
        "max_replicas": 60,
        "standby_replicas": 1,
        "max_standby_replicas": 8,
        "scale_down_delay_seconds": 600.0,
    }
    fields.update(kw)
    return ScalingPolicy(**fields)  # type: ignore[arg-type]


def run(
    p: ScalingPolicy,
    rate: Callable[[float], float],
    seconds: int,
    state: ScalerState | None = None,
    start: float = 0.0,
) -> tuple[list[ScaleDecision], ScalerState]:
    """One tick a second; the pool serves what it is asked (no backlog), capacity learned."""
    state = state or ScalerState(capacity=LEARNED)
    decisions = []
    for i in range(seconds):
        now = start + i
        serving = state.desired_serving or 10
        r = rate(now)
        obs = Observation(
            now=now,
            ready_serving=serving,
            ready_standby=1,
            queue_depth=min(r / 100.0, float(serving)),
            arrival_rate=r,
            warmup_seconds=WARMUP,
        )
        decision, state = decide_scale(p, obs, state)
        decisions.append(decision)
    return decisions, state


def step(at: float, before: float, after: float) -> Callable[[float], float]:
    return lambda t: before if t < at else after


def test_without_a_maximum_the_standby_is_fixed() -> None:
    decisions, _ = run(policy(max_standby_replicas=None), step(20, 700, 1400), 60)
    assert {d.desired_standby for d in decisions} == {1}


def test_a_surge_sizes_the_standby_for_the_next_one() -> None:
    decisions, _ = run(policy(), step(20, 700, 1050), 60)
    assert decisions[10].desired_standby == 1  # nothing seen yet: the floor
    # +350 req/s within one warm-up = 5 replicas of 100 req/s at utilisation 0.7.
    assert decisions[-1].desired_standby == math.ceil(350 / 70)
    assert decisions[-1].inputs.surge_rate is not None
    assert abs(decisions[-1].inputs.surge_rate - 350) < 1.0


def test_a_surge_beyond_the_maximum_is_capped() -> None:
    decisions, _ = run(policy(max_replicas=200), step(20, 700, 5600), 60)
    assert decisions[-1].desired_standby == 8


def test_a_slow_creep_is_not_a_surge() -> None:
    # 700 -> 1400 req/s over 600 s: 35 req/s per 30 s warm-up, half a replica.
    decisions, _ = run(policy(), lambda t: 700 + 700 * min(t, 600) / 600, 700)
    assert max(d.desired_standby for d in decisions) == 1


def test_the_remembered_surge_fades_with_its_half_life() -> None:
    p = policy(surge_memory_seconds=600.0)
    _, state = run(p, step(5, 700, 1050), 40)  # +350 req/s: 5 standby
    decisions, _ = run(p, lambda t: 1050, 2000, state=state, start=40)
    sizes = {int(i): d.desired_standby for i, d in enumerate(decisions)}
    assert sizes[0] == 5
    assert sizes[600] == math.ceil(175 / 70)  # one half-life: 175 req/s -> 3
    assert sizes[1999] == 1  # 2,035 s after the surge: 33 req/s -> the floor


def test_unknown_capacity_keeps_the_floor() -> None:
    decisions, _ = run(policy(), step(20, 700, 1400), 60, state=ScalerState())
    assert {d.desired_standby for d in decisions} == {1}


def test_the_surge_survives_a_restart() -> None:
    p = policy()
    _, state = run(p, step(5, 700, 1050), 40)
    restored = load_state(dump_state(state, 1000.0), 1000.0)
    assert restored.surge is not None and state.surge is not None
    assert abs(restored.surge[0] - state.surge[0]) < 1e-3
    assert restored.rise_window == ()  # the window restarts (as the trend does)
    after, _ = run(p, lambda t: 1050, 2, state=restored, start=40)
    assert after[-1].desired_standby == 5


@settings(max_examples=60, deadline=None)
@given(
    rates=st.lists(st.floats(min_value=0, max_value=20000), min_size=1, max_size=80),
    floor=st.integers(min_value=0, max_value=5),
    extra=st.integers(min_value=0, max_value=20),
    max_replicas=st.integers(min_value=5, max_value=40),
)
def test_the_standby_stays_within_its_bounds_and_the_gpu_budget(
    rates: list[float], floor: int, extra: int, max_replicas: int
) -> None:
    p = policy(
        standby_replicas=min(floor, max_replicas),
        max_standby_replicas=min(floor + extra, max_replicas),
        max_replicas=max_replicas,
    )
    decisions, state = run(p, lambda t: rates[int(t) % len(rates)], len(rates))
    for d in decisions:
        assert p.standby_replicas >= 0
        assert d.desired_standby <= max(p.max_standby_replicas or 0, p.standby_replicas)
        assert d.desired_standby >= min(p.standby_replicas, p.max_replicas - d.desired_serving)
        assert d.desired_total <= p.max_replicas
    assert len(state.rise_window) <= WARMUP + 1


def test_the_spec_field_reaches_the_policy_and_is_checked() -> None:
    import pytest
    from pydantic import ValidationError

    from tidal.operator.core.api import Autoscaling

    spec = Autoscaling.model_validate({"standbyReplicas": 1, "maxStandbyReplicas": 5})
    assert ScalingPolicy.from_spec(spec).max_standby_replicas == 5
    assert ScalingPolicy.from_spec(Autoscaling()).max_standby_replicas is None
    with pytest.raises(ValidationError, match="maxStandbyReplicas must be >= standbyReplicas"):
        Autoscaling.model_validate({"standbyReplicas": 3, "maxStandbyReplicas": 2})
