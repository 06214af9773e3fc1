"""The scale-to-zero simulator (bench/zero_sim.py): three days, the last one measured."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "zero_sim.py"


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("zero_sim", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["zero_sim"] = module
    spec.loader.exec_module(module)
    return module


def test_forecast_wake_finds_the_morning_rise_routable_and_zero_saves_gpu_hours(
    sim: ModuleType,
) -> None:
    days, learn = 3, 2
    trace = sim.DayTrace()
    rates, spans = trace.rates(days, seed=3)
    arrivals = np.random.default_rng(4).poisson(rates)
    setup = sim.Setup(
        zero=sim.ZeroPolicy(after_seconds=300.0),
        routable_seconds=60.0,
        activator_seconds=0.49,
        late_seconds=2.0,
        hold_seconds=120.0,
        quiet_tick_seconds=5.0,
        measure_from=learn * sim.DAY,
    )
    out = {p: sim.simulate(p, arrivals, spans, setup) for p in ("min1", "on-demand", "forecast")}
    min1, demand, ahead = out["min1"], out["on-demand"], out["forecast"]
    assert min1.late == 0 and min1.gpu_seconds == sim.DAY, min1
    # On demand, the rise waits one time-to-routable; woken ahead, it finds a replica.
    assert demand.late_at_rise > 0, demand
    assert ahead.late_at_rise == 0 and ahead.forecast_wakes >= 1, ahead
    # Both release the GPU at night: at most 60 % of minReplicas 1's GPU-hours; held
    # requests wait, none fails (the hold outlasts a wake).
    for r in (demand, ahead):
        assert r.gpu_seconds <= 0.6 * min1.gpu_seconds, r
        assert r.failed == 0, r
    assert ahead.requests == min1.requests == demand.requests
