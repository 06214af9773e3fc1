"""Scale to zero over days: forecast wake against on-demand activation and `minReplicas: 1`.

A long-tail service (the issue's "called now and then" model) over a daily cycle: quiet nights
with a few sporadic requests, a rise at about 9:00 (jittered by up to +-10 minutes a day),
office-hours traffic until 17:00, a thin evening. Stepped every second, 1 replica at most (the
load never needs two: this is about zero and one, which `core.idle.decide_zero` decides; sizing
above one is `decide_scale`'s, simulated by `autoscale_sim.py`). Three policies see the same
Poisson arrivals (seeded):

* `min1`: `minReplicas: 1`, the replica never leaves;
* `on-demand`: scale to zero after `scaleToZeroAfterSeconds`, a request arriving at zero is held
  (the activator) and wakes the replica: Knative's activator / KEDA's model;
* `forecast`: the same, plus tidal's wake ahead: the service's demand forecast (the fleet's
  forecast core, learned from the arrivals, sampled every 5 s) asked every tick for its peak
  over lead = time-to-routable + 30 s margin.

A woken replica is routable `--routable` seconds after the decision (scheduling, engine load
from the node-local cache, warm-up); held requests are answered then. A request is late when it
waits longer than `--late` seconds. GPU-hours count every second a replica exists (warming
included). The first `--learn` days train the forecast; the figures are for the days after.

    .venv/bin/python bench/zero_sim.py [--days 5] [--learn 3] [--routable 60] [--late 2]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tidal.operator.core.forecast import ForecastPolicy
from tidal.operator.core.idle import (
    IdleSignals,
    IdleState,
    ZeroMemory,
    ZeroPolicy,
    decide_zero,
    forecast_peak,
    learn_demand,
    wake_lead,
)

DAY = 86_400


@dataclass(frozen=True)
class DayTrace:
    """Requests per second over the day (hours, local time), and the rise's daily jitter."""

    night_rate: float = 0.5 / 3600  # a request every two hours, sporadic
    rise_hour: float = 9.0
    jitter_minutes: float = 10.0
    day_rate: float = 0.5
    end_hour: float = 17.0
    evening_rate: float = 0.02  # until 20:00
    evening_end_hour: float = 20.0

    def rates(self, days: int, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        out = np.full(days * DAY, self.night_rate)
        for d in range(days):
            rise = self.rise_hour * 3600 + rng.uniform(-1, 1) * self.jitter_minutes * 60
            start, end = d * DAY + int(rise), d * DAY + int(self.end_hour * 3600)
            out[start:end] = self.day_rate
            out[end : d * DAY + int(self.evening_end_hour * 3600)] = self.evening_rate
        return out


@dataclass
class Outcome:
    policy: str
    requests: int = 0
    late: int = 0
    late_at_rise: int = 0  # late within the hour after each day's rise
    gpu_seconds: float = 0.0
    wakes: int = 0
    forecast_wakes: int = 0
    worst_wait: float = 0.0


def simulate(
    policy: str,
    arrivals: np.ndarray,
    rise_times: Sequence[float],
    zero: ZeroPolicy,
    routable_seconds: float,
    late_seconds: float,
    measure_from: int,
) -> Outcome:
    """One policy over the arrivals (one count per second); figures from `measure_from` on."""
    fpolicy = ForecastPolicy()
    memory = ZeroMemory()
    idle = IdleState()
    out = Outcome(policy)
    awake, routable_at = True, 0.0
    held: list[tuple[int, int]] = []  # (arrival second, count)
    window = 0  # arrivals over the forecast's sampling interval
    lead = wake_lead(zero, routable_seconds)
    rise_set = sorted(rise_times)
    for t in range(len(arrivals)):
        n = int(arrivals[t])
        measured = t >= measure_from
        window += n
        ready = awake and t >= routable_at
        if n and not ready:
            held.append((t, n))
        if ready and held:
            for at, k in held:
                wait = t - at
                if measured:
                    out.worst_wait = max(out.worst_wait, wait)
                    if wait > late_seconds:
                        out.late += k
                        if _at_rise(at, rise_set):
                            out.late_at_rise += k
            held = []
        if measured:
            out.requests += n
            out.gpu_seconds += 1.0 if awake else 0.0
        if policy == "min1":
            continue
        if t % int(fpolicy.sample_interval_seconds) == 0:
            if policy == "forecast":
                rate = window / fpolicy.sample_interval_seconds
                memory = learn_demand(fpolicy, memory, rate, float(t))
            window = 0
        peak = forecast_peak(fpolicy, memory, float(t), lead) if policy == "forecast" else None
        signals = IdleSignals(
            float(t),
            active=bool(n) if ready else False,
            held=sum(k for _, k in held),
            forecast_rate=peak,
        )
        verdict, idle = decide_zero(zero, signals, idle, at_zero=not awake)
        if verdict.wake:
            awake, routable_at = True, t + routable_seconds
            if measured:
                out.wakes += 1
                out.forecast_wakes += verdict.reason == "wake:forecast"
        elif verdict.to_zero and awake:
            awake = False
    return out


def _at_rise(t: float, rises: Sequence[float]) -> bool:
    return any(0 <= t - r < 3600 for r in rises)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=5)
    parser.add_argument("--learn", type=int, default=3, help="days that train the forecast")
    parser.add_argument("--routable", type=float, default=60.0, help="time-to-routable, s")
    parser.add_argument("--late", type=float, default=2.0, help="a request waiting longer is late")
    parser.add_argument("--after", type=float, default=300.0, help="scaleToZeroAfterSeconds")
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)
    started = time.monotonic()
    trace = DayTrace()
    rates = trace.rates(args.days, args.seed)
    arrivals = np.random.default_rng(args.seed + 1).poisson(rates)
    # The rise of each day: the first second at the day rate.
    rises = [
        float(d * DAY + int(np.argmax(rates[d * DAY : (d + 1) * DAY] >= trace.day_rate)))
        for d in range(args.days)
    ]
    zero = ZeroPolicy(after_seconds=args.after)
    measure_from = args.learn * DAY
    days = args.days - args.learn
    results = [
        simulate(p, arrivals, rises, zero, args.routable, args.late, measure_from)
        for p in ("min1", "on-demand", "forecast")
    ]
    base = results[0]
    print(
        f"scale-to-zero simulation: {days} measured day(s) after {args.learn} learning, "
        f"time-to-routable {args.routable:.0f} s, late > {args.late:.0f} s, "
        f"scaleToZeroAfterSeconds {args.after:.0f}, seed {args.seed}"
    )
    print(
        f"{'policy':<10} {'requests':>8} {'late':>5} {'late@rise':>9} {'worst wait s':>12} "
        f"{'GPU-h/day':>9} {'vs min1':>8} {'wakes':>6} {'ahead':>6}"
    )
    for r in results:
        hours = r.gpu_seconds / 3600 / days
        ratio = r.gpu_seconds / base.gpu_seconds if base.gpu_seconds else math.nan
        print(
            f"{r.policy:<10} {r.requests:>8} {r.late:>5} {r.late_at_rise:>9} "
            f"{r.worst_wait:>12.0f} {hours:>9.2f} {ratio:>8.2f} {r.wakes:>6} "
            f"{r.forecast_wakes:>6}"
        )
    fc, od = results[2], results[1]
    saved = 1 - fc.gpu_seconds / base.gpu_seconds
    print(
        f"goal >= 50 % fewer GPU-hours than minReplicas 1: {saved:.1%} fewer "
        f"({'met' if saved >= 0.5 else 'NOT met'}); "
        f"no more late requests than minReplicas 1 ({base.late}): forecast {fc.late} "
        f"({'met' if fc.late <= base.late else 'NOT met'}); "
        f"late at the rise: forecast {fc.late_at_rise} vs on-demand {od.late_at_rise}"
    )
    print(f"elapsed {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
