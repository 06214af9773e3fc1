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

    return sim.Trace("short", 200, rate)


def test_tidal_sizes_the_surge_within_bounds(sim: ModuleType) -> None:
    cfg = replace(sim.SimConfig(), warmup_seconds=10.0, max_replicas=60, tidal_standby=2)
    trace = short_surge(sim)
    arrivals = sim.make_arrivals(cfg, trace)
    result = sim.simulate(cfg, trace, sim.Tidal(cfg), arrivals)
    assert result.decisions, "tidal decided"
    for _, d in result.decisions:
        assert cfg.min_replicas <= d.desired_serving <= cfg.max_replicas
        assert d.desired_total <= cfg.max_replicas
    # It learned what a replica serves (100 req/s) from the simulated runtime's batches.
    assert result.decisions[-1][1].inputs.capacity_per_replica == pytest.approx(100.0)
    # The surge was answered on the tick after it began (decisions run once a second), and
    # sized for 2000 req/s at 70 % plus a bounded backlog: never to the maximum.
    first_up = next(t for t, d in result.decisions if t >= 30 and d.desired_serving > 6)
    assert first_up <= 31.5
    assert not result.hit_max
    assert result.max_pods <= 2000 / 70 * 1.4 + cfg.tidal_standby  # Poisson: the rate wobbles
    assert 0.0 <= result.late_share < 0.5


def test_starting_saturated_every_policy_gets_the_same_start(sim: ModuleType) -> None:
    cfg = replace(sim.SimConfig(), warmup_seconds=10.0, start="saturated")
    trace = short_surge(sim)
    results = sim.run_all(cfg, [trace])
    tidal = next(r for r in results if r.policy == "tidal")
    oracle = next(r for r in results if r.policy == "oracle")
    assert not tidal.hit_max and tidal.max_pods <= 1.5 * oracle.max_pods


def test_runs_are_deterministic_and_peers_run(sim: ModuleType) -> None:
    cfg = replace(sim.SimConfig(), warmup_seconds=10.0, max_replicas=60)
    trace = short_surge(sim)
    results = sim.run_all(cfg, [trace], what_if_warmup=2.0)
    again = sim.run_all(cfg, [trace], what_if_warmup=2.0)
    assert [r.policy for r in results] == ["tidal", "HPA", "KEDA", "KPA", "oracle", "tidal@W=2s"]
    key = [(r.late_share, r.replica_seconds, r.p99) for r in results]
    assert key == [(r.late_share, r.replica_seconds, r.p99) for r in again]
    for r in results:
        assert cfg.min_replicas <= r.min_pods <= r.max_pods <= cfg.max_replicas
    assert [v.trace for v in sim.verdicts(results)] == ["short"]


def test_a_warm_baseline_overflow_serves_only_while_the_primary_is_short(sim: ModuleType) -> None:
    cfg = replace(sim.SimConfig(), warmup_seconds=10.0, max_replicas=60, start="saturated")
    trace = short_surge(sim)
    arrivals = sim.make_arrivals(cfg, trace)
    alone = sim.simulate(cfg, trace, sim.Tidal(cfg), arrivals)
    helped_cfg = replace(cfg, tidal_overflow_replicas=4)
    scaler = sim.Tidal(helped_cfg)
    helped = sim.simulate(helped_cfg, trace, scaler, arrivals)
    assert helped.policy == "tidal+ovf4" and alone.helper_seconds == 0
    # The baseline served for a while, not for the whole run: only while the primary was short.
    assert 0 < helped.helper_seconds < 4 * trace.duration / 2
    assert helped.late_share < alone.late_share
    # The primary is sized as without the help (all of the demand): no scale-down because of it.
    assert helped.max_pods == alone.max_pods
    assert helped.replica_seconds == pytest.approx(alone.replica_seconds, rel=0.05)


def test_keda_reads_its_metric_live_and_counts_warming_replicas(sim: ModuleType) -> None:
    """KEDA's External metric is queried at each HPA sync (no 30 s cache), and the HPA sizes an
    AverageValue External metric against all current replicas, warming ones included."""
    cfg = sim.SimConfig()
    keda, hpa = sim.Keda(cfg), sim.Hpa(cfg)
    assert sim.Keda.metric is sim.Hpa.metric
    keda.replicas = hpa.replicas = 10
    target = cfg.target_concurrency
    # 2 ready + 8 warming with a load of 4 targets: the External formula sees 10 replicas
    # (ratio 0.4, scale down to 4); the Pods formula holds for the 8 without samples
    assert keda.calc_replicas(4 * target, 2, 8) == 4
    assert hpa.calc_replicas(4 * target, 2, 8) == 10
    assert keda.calc_replicas(10.5 * target, 10, 0) == 10  # within the 10 % tolerance
    assert keda.calc_replicas(14.5 * target, 10, 0) == 15
