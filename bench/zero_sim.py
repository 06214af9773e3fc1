"""Scale to zero over days: forecast wake against on-demand activation and `minReplicas: 1`.

A long-tail service (the issue's "called now and then" model) over a daily cycle: quiet nights
with a few sporadic requests, a rise at about 9:00 (jittered by up to +-10 minutes a day),
office-hours traffic until 17:00, a thin evening. Stepped every second, 1 replica at most (the
load never needs two: this is about zero and one, which `core.idle.decide_zero` decides; sizing
above one is `decide_scale`'s, simulated by `autoscale_sim.py`). The policies see the same
Poisson arrivals (seeded):

* `min1`: `minReplicas: 1`, the replica never leaves;
* `on-demand`: scale to zero after `scaleToZeroAfterSeconds`, a request arriving at zero is held
  (the activator) and wakes the replica: Knative's activator / KEDA's model;
* `fc-before`: the same, plus tidal's wake ahead as first built: the service's demand forecast
  (the fleet's forecast core, learned from the arrivals, sampled every 5 s) asked for its peak
  over lead = time-to-routable + 30 s margin; the idle timer always `scaleToZeroAfterSeconds`;
* `forecast`: tidal now: that wake ahead, plus an idle timer that learns from the forecast
  (`core.idle.idle_window`: the wake lead where the forecast vouches that the next
  `scaleToZeroAfterSeconds` are empty) and a forecast that today's demand can refute
  (`core.idle.learn_demand`: a usual busy bucket past the rise that brought nothing).

The activator as built (`bench/zero_first_answer.py`): a request at zero is held at the
gateway, never lost; the pool wakes at once (the gateway's long-poll, milliseconds); a woken
replica is routable `--routable` seconds after the decision, and held requests are answered
`--activator` seconds after that (Ready -> pushed to the gateway -> forwarded: 0.49 s, the
real node's median). A request is late when it waits longer than `--late` seconds, failed (503
with Retry-After) when longer than the hold timeout (`--hold`, the operator's 120 s). Like the
operator, a pool with a replica still starting is not idle, and a quiet pool (awake and idle, or
at zero) is decided every 5 s (`--quiet-tick-seconds`) and at once on a request. GPU-hours count
every second a replica exists (warming included), split by phase: `day` (from the day's rise to
the end of its evening traffic), `tail` (the idle timer after that), `ahead` (woken by the
forecast before the rise), `night` (woken by a night request, and its idle timer). The first
`--learn` days train the forecast; the figures are for the days after.

Shapes (`--shape`): `daily` (every day alike), `jitter30` (the rise jittered +-30 min), `week`
(5 weekdays then 2 weekend days with the night rate all day: the daily forecast expects a rise
that does not come; measure whole weeks, e.g. --days 17 --learn 3).

    .venv/bin/python bench/zero_sim.py [--days 5] [--learn 3] [--routable 60] [--late 2]
        [--shape daily] [--seeds 11 12 13]
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from tidal.operator.core.forecast import ForecastPolicy
from tidal.operator.core.idle import (
    IdleSignals,
    IdleState,
    ZeroMemory,
    ZeroPolicy,
    decide_zero,
    forecast_peak,
    forecast_quiet_peak,
    learn_demand,
    wake_lead,
)

DAY = 86_400
POLICIES = ("min1", "on-demand", "fc-before", "forecast")
PHASES = ("day", "tail", "ahead", "night")


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
    weekend: bool = False  # days 5 and 6 of each week: the night rate all day

    def is_workday(self, d: int) -> bool:
        return not self.weekend or d % 7 < 5

    def rates(self, days: int, seed: int) -> tuple[np.ndarray, list[tuple[int, int]]]:
        """Rates per second, and each workday's busy span (its rise, the end of its evening)."""
        rng = np.random.default_rng(seed)
        out = np.full(days * DAY, self.night_rate)
        spans = []
        for d in range(days):
            rise = self.rise_hour * 3600 + rng.uniform(-1, 1) * self.jitter_minutes * 60
            if not self.is_workday(d):
                continue
            start, end = d * DAY + int(rise), d * DAY + int(self.end_hour * 3600)
            evening_end = d * DAY + int(self.evening_end_hour * 3600)
            out[start:end] = self.day_rate
            out[end:evening_end] = self.evening_rate
            spans.append((start, evening_end))
        return out, spans


SHAPES = {
    "daily": DayTrace(),
    "jitter30": DayTrace(jitter_minutes=30.0),
    "week": DayTrace(weekend=True),
}


@dataclass
class Outcome:
    policy: str
    requests: int = 0
    late: int = 0
    late_at_rise: int = 0  # late within the hour after each day's rise
    failed: int = 0  # held past the hold timeout: 503
    gpu_seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    wakes: int = 0
    forecast_wakes: int = 0
    quick_zeros: int = 0
    worst_wait: float = 0.0


@dataclass(frozen=True)
class Setup:
    zero: ZeroPolicy
    routable_seconds: float
    activator_seconds: float
    late_seconds: float
    hold_seconds: float
    quiet_tick_seconds: float
    measure_from: int


def simulate(
    policy: str, arrivals: np.ndarray, spans: Sequence[tuple[int, int]], setup: Setup
) -> Outcome:
    """One policy over the arrivals (one count per second); figures from `measure_from` on."""
    out = Outcome(policy)
    n_total = len(arrivals)
    in_day = np.zeros(n_total, dtype=bool)
    for a, b in spans:
        in_day[a:b] = True
    measure_from = setup.measure_from
    if policy == "min1":
        out.requests = int(arrivals[measure_from:].sum())
        out.gpu_seconds = float(n_total - measure_from)
        out.phases["day"] = float(in_day[measure_from:].sum())
        out.phases["night"] = out.gpu_seconds - out.phases["day"]
        return out
    zero, fpolicy = setup.zero, ForecastPolicy()
    use_forecast = policy in ("fc-before", "forecast")
    learns = policy == "forecast"  # the idle timer and the refutation
    memory = ZeroMemory()
    idle = IdleState()
    awake, routable_at = True, 0.0
    phase = "day"  # what the current awake spell is charged to, outside the day spans
    held: list[tuple[int, int]] = []  # (arrival second, count)
    window = 0  # arrivals over the forecast's sampling interval
    lead = wake_lead(zero, setup.routable_seconds)
    rises = sorted(a for a, _ in spans)
    interval = int(fpolicy.sample_interval_seconds)
    tick = max(1, int(setup.quiet_tick_seconds))
    arr = arrivals.tolist()
    for t in range(n_total):
        n = arr[t]
        measured = t >= measure_from
        window += n
        ready = awake and t >= routable_at
        if n and not ready:
            held.append((t, n))
        if held and awake and t + 1 > routable_at + setup.activator_seconds:
            answered = routable_at + setup.activator_seconds
            for at, k in held:
                wait = answered - at
                if at >= measure_from:
                    out.worst_wait = max(out.worst_wait, wait)
                    if wait > setup.late_seconds:
                        out.late += k
                        if _at_rise(at, rises):
                            out.late_at_rise += k
                    if wait > setup.hold_seconds:
                        out.failed += k
            held = []
        if measured:
            out.requests += n
            if awake:
                out.gpu_seconds += 1.0
                out.phases["day" if in_day[t] else phase] += 1.0
        if t % interval == 0:
            if use_forecast:
                rate = window / interval
                wake_rate = zero.wake_threshold if learns else None
                memory = learn_demand(fpolicy, memory, rate, float(t), wake_rate)
            window = 0
        warming = awake and not ready
        busy = bool(n) or bool(held) or warming
        if not busy and t % tick:
            continue  # a quiet pool: decided on the slow timer (a request pokes it at once)
        peak = quiet = None
        if use_forecast and not (awake and busy):
            peak = forecast_peak(fpolicy, memory, float(t), lead)
            if learns and awake:
                quiet = forecast_quiet_peak(fpolicy, memory, float(t), zero.after_seconds)
        signals = IdleSignals(
            float(t),
            active=(bool(n) or warming) if awake else False,
            held=sum(k for _, k in held),
            forecast_rate=peak,
            quiet_rate=quiet,
            lead_seconds=lead,
        )
        verdict, idle = decide_zero(zero, signals, idle, at_zero=not awake)
        if verdict.wake:
            awake, routable_at = True, t + setup.routable_seconds
            forecast_wake = verdict.reason == "wake:forecast"
            phase = "ahead" if forecast_wake else "night"
            if measured:
                out.wakes += 1
                out.forecast_wakes += forecast_wake
        elif verdict.to_zero and awake:
            awake = False
            if measured:
                out.quick_zeros += verdict.reason == "scale-to-zero:forecast-quiet"
        if awake and in_day[t]:
            phase = "tail"  # after the day's span, the idle timer runs on the day's account
    return out


def _at_rise(t: float, rises: Sequence[float]) -> bool:
    return any(0 <= t - r < 3600 for r in rises)


def run_one(args: argparse.Namespace, shape: str, seed: int) -> list[Outcome]:
    trace = SHAPES[shape]
    rates, spans = trace.rates(args.days, seed)
    arrivals = np.random.default_rng(seed + 1).poisson(rates)
    setup = Setup(
        zero=ZeroPolicy(after_seconds=args.after),
        routable_seconds=args.routable,
        activator_seconds=args.activator,
        late_seconds=args.late,
        hold_seconds=args.hold,
        quiet_tick_seconds=args.quiet_tick_seconds,
        measure_from=args.learn * DAY,
    )
    return [simulate(p, arrivals, spans, setup) for p in args.policies]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=5)
    parser.add_argument("--learn", type=int, default=3, help="days that train the forecast")
    parser.add_argument("--routable", type=float, default=60.0, help="time-to-routable, s")
    parser.add_argument(
        "--activator", type=float, default=0.49, help="Ready -> held requests answered, s"
    )
    parser.add_argument("--late", type=float, default=2.0, help="a request waiting longer is late")
    parser.add_argument("--hold", type=float, default=120.0, help="hold timeout (then 503), s")
    parser.add_argument("--after", type=float, default=300.0, help="scaleToZeroAfterSeconds")
    parser.add_argument("--quiet-tick-seconds", type=float, default=5.0)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="daily")
    parser.add_argument("--seeds", type=int, nargs="+", default=[11])
    parser.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    args = parser.parse_args(argv)
    if "min1" not in args.policies:
        args.policies = ["min1", *args.policies]
    days = args.days - args.learn
    print(
        f"scale-to-zero simulation: shape {args.shape}, {days} measured day(s) after "
        f"{args.learn} learning, time-to-routable {args.routable:g} s + activator "
        f"{args.activator:g} s, late > {args.late:g} s, failed > {args.hold:g} s, "
        f"scaleToZeroAfterSeconds {args.after:g}, quiet tick {args.quiet_tick_seconds:g} s"
    )
    for seed in args.seeds:
        started = time.monotonic()
        results = run_one(args, args.shape, seed)
        base = results[0]
        print(f"seed {seed}:")
        print(
            f"  {'policy':<10} {'requests':>8} {'late':>5} {'@rise':>5} {'failed':>6} "
            f"{'worst s':>7} {'GPU-h/day':>9} {'vs min1':>7} "
            + " ".join(f"{p:>6}" for p in PHASES)
            + f" {'wakes':>5} {'ahead':>5} {'quick':>5}"
        )
        for r in results:
            hours = r.gpu_seconds / 3600 / days
            ratio = r.gpu_seconds / base.gpu_seconds if base.gpu_seconds else math.nan
            print(
                f"  {r.policy:<10} {r.requests:>8} {r.late:>5} {r.late_at_rise:>5} "
                f"{r.failed:>6} {r.worst_wait:>7.1f} {hours:>9.2f} {ratio:>7.3f} "
                + " ".join(f"{r.phases[p] / 3600 / days:>6.2f}" for p in PHASES)
                + f" {r.wakes:>5} {r.forecast_wakes:>5} {r.quick_zeros:>5}"
            )
        for r in results[1:]:
            saved = 1 - r.gpu_seconds / base.gpu_seconds
            print(
                f"  {r.policy}: {saved:.1%} fewer GPU-hours than minReplicas 1 "
                f"({'met' if saved >= 0.5 else 'NOT met'} >= 50 %); late {r.late} vs "
                f"{base.late} ({'met' if r.late <= base.late else 'NOT met'}), "
                f"{r.late_at_rise} of them at the rise, {r.failed} failed"
            )
        print(f"  elapsed {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
