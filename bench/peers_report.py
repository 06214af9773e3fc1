"""The pure half of bench/peers_bench.py: the traces, the figures taken from one run of one
autoscaler on one trace, and the table with ratios to tidal. No I/O, no clock: the shell
records answers and replica counts and hands them in, the tests inject them.

Figures, per trace and autoscaler (times in seconds from the trace's surge onset):
  decision    the first raise of the Deployment's replicas (spec) after the onset
  warm        the first time its ready replicas reach what the trace's peak needs at the
              replicas' capacity (``needed``); "-" when never within the trace
  late %      share of requests answered after the SLO, failed ones counted late too
  late p99    99th percentile of how far past the SLO the late answers came
  failed      requests not answered 200 (connection refused, no ready endpoint, 5xx, timeout)
  rep·s       replica-seconds: pods that exist (starting or ready), integrated over the trace
  0→1st       for a service at zero at the onset: from its first request to its first answer
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Point = tuple[float, float]


@dataclass(frozen=True)
class Trace:
    """A request-rate schedule: piecewise linear through ``points`` (t seconds, requests/s);
    a vertical step is two points at the same t. The same schedule is replayed to every
    autoscaler (the load generator's arrivals are a deterministic function of it)."""

    name: str
    points: tuple[Point, ...]
    onset: float  # the surge the decision and warm-capacity times count from
    what: str

    @property
    def duration(self) -> float:
        return self.points[-1][0]

    @property
    def peak(self) -> float:
        return max(r for _, r in self.points)

    def rate(self, t: float) -> float:
        pts = self.points
        if t <= pts[0][0]:
            return pts[0][1]
        for (t0, r0), (t1, r1) in itertools.pairwise(pts):
            if t0 <= t < t1:
                return r0 + (r1 - r0) * (t - t0) / (t1 - t0)
        return pts[-1][1]

    def needed(self, capacity_rps: float) -> int:
        """Replicas the peak needs at ``capacity_rps`` a replica."""
        return max(1, math.ceil(self.peak / capacity_rps - 1e-9))


def traces(base: float, scale: float = 1.0) -> dict[str, Trace]:
    """The four schedules, compressed to 2-3 minutes each; ``base`` is the quiet rate
    (requests/s), ``scale`` stretches time (1.0 = the bench's lengths)."""

    def pts(*p: Point) -> tuple[Point, ...]:
        return tuple((t * scale, r) for t, r in p)

    b = base
    saw = [(0.0, b), (20.0, b)]
    for k in range(3):
        start = 20.0 + 40.0 * k
        saw += [(start, b), (start + 40.0, 5 * b), (start + 40.0, b)]
    saw.append((150.0, b))
    return {
        "step": Trace(
            "step",
            pts((0, b), (30, b), (30, 5 * b), (150, 5 * b)),
            30 * scale,
            f"{b:g} req/s, then 5x from 30 s for 120 s",
        ),
        "herd": Trace(
            "herd",
            pts((0, b), (30, b), (30, 8 * b), (50, 8 * b), (50, b), (120, b)),
            30 * scale,
            f"{b:g} req/s, a herd of 8x for 20 s at 30 s, then quiet again",
        ),
        "sawtooth": Trace(
            "sawtooth",
            pts(*saw),
            20 * scale,
            f"three 40 s ramps from {b:g} to {5 * b:g} req/s, each dropping back at once",
        ),
        "day": Trace(
            "day",
            pts(
                (0, 0.0),
                (50, 0.0),
                (50, b / 4),
                (70, b),
                (100, 4 * b),
                (130, 4 * b),
                (160, b / 2),
                (165, 0.0),
                (200, 0.0),
            ),
            50 * scale,
            f"a compressed day: 50 s of night (no request), a morning ramp to {4 * b:g} "
            "req/s, an evening fall, night again",
        ),
    }


@dataclass(frozen=True)
class Answer:
    sent: float  # seconds since the trace started
    latency: float
    ok: bool


@dataclass(frozen=True)
class Replicas:
    """One observation of a Deployment: desired (spec), existing (status.replicas), ready."""

    t: float
    desired: int
    existing: int
    ready: int


@dataclass(frozen=True)
class Row:
    autoscaler: str
    requests: int
    decision: float | None
    warm: float | None
    late_share: float
    late_p99: float
    failed: int
    replica_seconds: float
    zero_first_answer: float | None
    # Of replica_seconds, the seconds of the pods in front of the replicas (tidal's gateway:
    # the activator and burst buffer), counted in its cost as any pod is.
    gateway_seconds: float = 0.0


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def replica_seconds(series: Sequence[Replicas], end: float) -> float:
    """Existing pods integrated over [first observation, end], step-wise."""
    total = 0.0
    for a, b in zip(series, [*series[1:], None], strict=False):
        stop = end if b is None else min(b.t, end)
        if stop > a.t:
            total += a.existing * (stop - a.t)
    return total


def first_decision(series: Sequence[Replicas], onset: float) -> float | None:
    """Seconds from ``onset`` to the first rise of the desired replicas after it."""
    before = [s.desired for s in series if s.t <= onset]
    level = before[-1] if before else (series[0].desired if series else 0)
    for s in series:
        if s.t > onset and s.desired > level:
            return s.t - onset
    return None


def warm_capacity(series: Sequence[Replicas], onset: float, needed: int) -> float | None:
    """Seconds from ``onset`` until ``needed`` replicas are ready (0 if they already were)."""
    for s in series:
        if s.t >= onset and s.ready >= needed:
            return max(0.0, s.t - onset)
    return None


def zero_first_answer(
    series: Sequence[Replicas], answers: Sequence[Answer], onset: float
) -> float | None:
    """For a pool at zero when the surge began: from its first request to its first answer
    (the first request itself when it is held until answered, as tidal's gateway does; a
    later one when the first ones fail, as with no endpoint to send to). None when the pool
    was not at zero, or nothing was answered."""
    before = [s for s in series if s.t <= onset]
    if not before or before[-1].existing != 0:
        return None
    after = [a for a in answers if a.sent >= onset]
    if not after:
        return None
    first = min(a.sent for a in after)
    done = [a.sent + a.latency for a in after if a.ok]
    return min(done) - first if done else None


def measure(
    autoscaler: str,
    trace: Trace,
    answers: Sequence[Answer],
    series: Sequence[Replicas],
    *,
    slo: float,
    capacity_rps: float,
    gateway: Sequence[Replicas] = (),
) -> Row:
    """One autoscaler's figures on one trace; ``gateway``: the series of the pods in front of
    its replicas (tidal's gateway), whose pod-seconds count in its cost."""
    late = [a for a in answers if not a.ok or a.latency > slo]
    gateway_seconds = replica_seconds(gateway, trace.duration) if gateway else 0.0
    return Row(
        autoscaler=autoscaler,
        requests=len(answers),
        decision=first_decision(series, trace.onset),
        warm=warm_capacity(series, trace.onset, trace.needed(capacity_rps)),
        late_share=len(late) / len(answers) if answers else 0.0,
        late_p99=_percentile([a.latency - slo for a in late if a.ok], 0.99),
        failed=sum(1 for a in answers if not a.ok),
        replica_seconds=replica_seconds(series, trace.duration) + gateway_seconds,
        zero_first_answer=zero_first_answer(series, answers, trace.onset),
        gateway_seconds=gateway_seconds,
    )


def _ratio(value: float, ref: float) -> str:
    if ref == 0:
        return "-" if value == 0 else "inf"
    return f"{value / ref:.2f}x"


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def verdict(rows: Sequence[Row], tuned: Callable[[str], bool]) -> str:
    """The issue's goal on one trace: tidal's late share at most half the best-tuned real
    peer's (the tuned peer with the lowest late share), at no more than 1.2x its
    replica-seconds, with no failed request."""
    tidal = next((r for r in rows if r.autoscaler == "tidal"), None)
    peers = [r for r in rows if r.autoscaler != "tidal" and tuned(r.autoscaler)]
    if tidal is None or not peers:
        return "goal: not judged (tidal or a tuned peer missing)"
    best = min(peers, key=lambda r: (r.late_share, r.replica_seconds))
    late_ok = tidal.late_share <= best.late_share / 2 or tidal.late_share == 0
    cost = tidal.replica_seconds / best.replica_seconds if best.replica_seconds else math.inf
    met = late_ok and cost <= 1.2 and tidal.failed == 0
    return (
        f"goal vs best tuned peer ({best.autoscaler}): late {100 * tidal.late_share:.1f} % vs "
        f"{100 * best.late_share:.1f} % (need <= half), replica-seconds {cost:.2f}x (need <= "
        f"1.2x), failed {tidal.failed} -> {'met' if met else 'NOT met'}"
    )


def table(trace: Trace, rows: Sequence[Row], tuned: Callable[[str], bool]) -> str:
    """One trace's rows, tidal first, with the ratio of each peer's figure to tidal's."""
    tidal = next((r for r in rows if r.autoscaler == "tidal"), None)
    head = (
        f"{'autoscaler':16} {'req':>5} {'decide s':>8} {'warm s':>7} {'late %':>7} "
        f"{'late p99 s':>10} {'failed':>6} {'rep*s':>7} {'0->1st s':>8} "
        f"{'late/tidal':>10} {'rep*s/tidal':>11}"
    )
    lines = [f"trace {trace.name}: {trace.what}", head, "-" * len(head)]
    ordered = sorted(rows, key=lambda r: (r.autoscaler != "tidal", r.autoscaler))
    for r in ordered:
        late_ratio = rep_ratio = "1.00x" if r is tidal else "-"
        if tidal is not None and r is not tidal:
            late_ratio = _ratio(r.late_share, tidal.late_share)
            rep_ratio = _ratio(r.replica_seconds, tidal.replica_seconds)
        lines.append(
            f"{r.autoscaler:16} {r.requests:5d} {_secs(r.decision):>8} {_secs(r.warm):>7} "
            f"{100 * r.late_share:7.1f} {r.late_p99:10.2f} {r.failed:6d} "
            f"{r.replica_seconds:7.0f} {_secs(r.zero_first_answer):>8} "
            f"{late_ratio:>10} {rep_ratio:>11}"
        )
    lines.append(verdict(rows, tuned))
    return "\n".join(lines)


def median_rows(runs: Sequence[Sequence[Row]]) -> list[Row]:
    """Per autoscaler, a row of the medians of its runs (failed: the total of every run)."""
    names = sorted({r.autoscaler for rows in runs for r in rows})
    out = []
    for name in names:
        rows = [r for run in runs for r in run if r.autoscaler == name]

        def med(values: Sequence[float | None]) -> float | None:
            known = [v for v in values if v is not None]
            return statistics.median(known) if known else None

        out.append(
            Row(
                autoscaler=name,
                requests=round(statistics.median(r.requests for r in rows)),
                decision=med([r.decision for r in rows]),
                warm=med([r.warm for r in rows]),
                late_share=statistics.median(r.late_share for r in rows),
                late_p99=statistics.median(r.late_p99 for r in rows),
                failed=sum(r.failed for r in rows),
                replica_seconds=statistics.median(r.replica_seconds for r in rows),
                zero_first_answer=med([r.zero_first_answer for r in rows]),
                gateway_seconds=statistics.median(r.gateway_seconds for r in rows),
            )
        )
    return out


def summary(trace: Trace, runs: Sequence[Sequence[Row]], tuned: Callable[[str], bool]) -> str:
    """A trace over several runs: the medians' table (failed: every run's total), each
    autoscaler's range of late share and replica-seconds, and the goal judged on the medians
    with no run allowed a failed request."""
    lines = [
        table(trace, median_rows(runs), tuned).replace(
            f"trace {trace.name}:", f"trace {trace.name} (median of {len(runs)} runs):", 1
        )
    ]
    for name in sorted({r.autoscaler for rows in runs for r in rows}):
        rows = [r for run in runs for r in run if r.autoscaler == name]
        late = [100 * r.late_share for r in rows]
        rep = [r.replica_seconds for r in rows]
        lines.append(
            f"  {name:16} late % {min(late):.1f}-{max(late):.1f}, rep*s {min(rep):.0f}-"
            f"{max(rep):.0f}, runs with failed requests {sum(1 for r in rows if r.failed)}"
        )
    return "\n".join(lines)
