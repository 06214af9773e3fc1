"""The simulated peers (bench/autoscale_sim.py) replayed on the real run's traces, beside the
real peers' figures from bench/peers_bench.py's raw outputs: does the model of KEDA-on-HPA give
the late share and replica-seconds the real KEDA gave on the real node?

The simulator is configured like the real run: one slot of SERVICE_MS a replica, the quiet
rate, 1..MAX_REPLICAS replicas, the SLO as its latency target, the load generator's 15 s
timeout, and the warm-up the real pods took (median time from a raise of the Deployment's
replicas to the new replica's readiness, measured per trace in the raw series). Its HPA model
is on a concurrency metric (the sim's own), so it is compared with the real KEDA, which scales
on the runtime's in-flight requests; the real HPA on CPU has no simulated counterpart. Seeds
1-10 give the simulator's spread; the real run is one run.

Usage:  python bench/peers_vs_sim.py RAW_DIR
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import autoscale_sim as sim
from peers_bench import read_raw
from peers_report import Replicas, Trace


def warmup_seconds(series: list[Replicas]) -> float | None:
    """Median seconds from each rise of desired replicas to the ready count reaching it."""
    waits = []
    for i, s in enumerate(series[1:], 1):
        if s.desired > series[i - 1].desired:
            done = next((r.t for r in series[i:] if r.ready >= s.desired), None)
            if done is not None:
                waits.append(done - s.t)
    return statistics.median(waits) if waits else None


def main() -> int:
    raw_dir = Path(sys.argv[1])
    print(f"{'trace':9} {'who':22} {'late % (min..median..max)':>26} {'rep*s':>20}")
    for raw in read_raw(raw_dir):
        t = raw["trace"]
        trace = Trace(t["name"], tuple(tuple(p) for p in t["points"]), t["onset"], t["what"])
        if trace.name == "day":
            continue  # the sim's peers do not scale to zero
        keda = raw["autoscalers"].get("keda-default")
        if keda is None:
            continue
        series = [Replicas(**r) for r in keda["replicas"]]
        warm = warmup_seconds(series) or 5.0
        real = keda["row"]
        cfg = replace(
            sim.SimConfig(),
            service_seconds=1.0 / raw["capacity_rps"],
            slots=1,
            warmup_seconds=warm,
            latency_target_seconds=raw["slo_s"],
            client_timeout_seconds=15.0,
            base_rate=trace.rate(0.0),
            max_replicas=8,
            tidal_standby=0,
            tidal_scale_down_delay=30.0,
        )
        sim_trace = sim.Trace(
            trace.name, trace.duration, np.vectorize(trace.rate, otypes=[np.float64])
        )
        lates, reps = [], []
        for seed in range(1, 11):
            c = replace(cfg, seed=seed)
            result = sim.simulate(c, sim_trace, sim.Keda(c), sim.make_arrivals(c, sim_trace))
            lates.append(100 * result.late_share)
            reps.append(result.replica_seconds)
        print(
            f"{trace.name:9} {'real keda-default':22} {100 * real['late_share']:14.1f} "
            f"{real['replica_seconds']:16.0f}"
        )
        print(
            f"{'':9} {f'sim KEDA (warm {warm:.1f} s)':22} "
            f"{min(lates):5.1f}..{statistics.median(lates):.1f}..{max(lates):<5.1f} "
            f"{min(reps):5.0f}..{statistics.median(reps):.0f}..{max(reps):<5.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
