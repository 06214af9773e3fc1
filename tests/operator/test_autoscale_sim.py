"""Smoke test of the autoscaling simulator (bench/autoscale_sim.py) on a short surge."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "autoscale_sim.py"


@pytest.fixture(scope="module")
def sim() -> ModuleType:
    spec = importlib.util.spec_from_file_location("autoscale_sim", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["autoscale_sim"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def short_surge(sim: ModuleType) -> object:
    def rate(t: np.ndarray) -> np.ndarray:
        return np.where((t >= 30) & (t < 150), 2000.0, 400.0)

    return sim.Trace("short", 200, rate, surge=(30, 150))


def test_tidal_reaches_capacity_within_bounds(sim: ModuleType) -> None:
    cfg = replace(sim.SimConfig(), warmup_seconds=10.0, max_replicas=60, tidal_standby=2)
    trace = short_surge(sim)
    arrivals = sim.make_arrivals(cfg, trace)
    result = sim.simulate(cfg, trace, sim.Tidal(cfg), arrivals)
    assert result.decisions, "tidal decided"
    for _, d in result.decisions:
        assert cfg.min_replicas <= d.desired_serving <= cfg.max_replicas
        assert d.desired_total <= cfg.max_replicas
    assert result.max_pods <= cfg.max_replicas
    # Warm capacity for 2000 req/s arrives after one warm-up plus at most a few ticks.
    assert result.time_to_capacity is not None
    assert result.time_to_capacity <= cfg.warmup_seconds + 5
    # The surge was answered on the tick after it began (decisions run once a second).
    first_up = next(t for t, d in result.decisions if t >= 30 and d.desired_serving > 10)
    assert first_up <= 31.5
    assert 0.0 <= result.late_share < 0.5


def test_runs_are_deterministic_and_peers_run(sim: ModuleType) -> None:
    cfg = replace(sim.SimConfig(), warmup_seconds=10.0, max_replicas=60)
    trace = short_surge(sim)
    results = sim.run_all(cfg, [trace])
    again = sim.run_all(cfg, [trace])
    assert [r.policy for r in results] == ["tidal", "HPA", "KEDA", "KPA"]
    key = [(r.late_share, r.replica_seconds, r.p99) for r in results]
    assert key == [(r.late_share, r.replica_seconds, r.p99) for r in again]
    for r in results:
        assert cfg.min_replicas <= r.min_pods <= r.max_pods <= cfg.max_replicas
