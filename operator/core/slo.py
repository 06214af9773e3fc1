"""SLO evaluation for one pool: is a breach sustained, which signal, by how much, since when.

This module owns the pure verdict on a pool's service level objectives. The shell queries
Prometheus, fills a :class:`PoolSignals`, and calls :func:`evaluate_slo` with the policy, the
previous :class:`SloState` and the current time; it gets back a :class:`SloVerdict` (for status,
Events and the rollout planner) and the next state. Nothing here reads a clock or does I/O.

Signals and their objectives (each optional; an objective left unset is ``disabled``):

* ``p99``: hot-path P99 latency in ms must stay ``<= p99Ms``. Cold-start samples are a separate
  signal and must not be folded into it (DESIGN §6).
* ``errorRate``: fraction of requests that failed (5xx and timeouts) must stay ``<= errorRate``.
* ``coldStart``: latency of the first request after a model load, ms, ``<= coldStartMs``.
* ``transferWait``: P99 of the time requests waited on host->device weight transfer, ms,
  ``<= transferWaitMs`` (the runtime's ``tidal_transfer_wait_seconds``: a request held by an
  engine load waits out its ``stage``/``h2d`` phases). Only requests that waited on a transfer
  are samples, so, like ``coldStart``, it never mixes with the hot P99; ``minColdSamples``.
* ``gpuMemoryHeadroom``: free GPU memory, ``1 - used/total``, must stay ``>= gpuMemoryHeadroom``
  (a fraction; or an absolute ``gpuMemoryHeadroomBytes``).

Rules, and why:

* **Missing data is never a breach by itself.** A signal without a value, with too few samples
  (``minRequests`` for p99 and errorRate, ``minColdSamples`` for coldStart and transferWait; an
  unknown sample
  count counts as too few) or from a stale observation (older than ``staleAfterSeconds``) is
  reported as ``no-data`` / ``too-few-samples`` / ``stale`` and never trips the switch: a pool
  that served three requests, one of them slow, has not shown anything yet.
* **A breach counts only when sustained.** Each signal keeps the time its current breach began.
  The verdict is ``breached`` when some signal has been continuously over its objective for at
  least ``for`` seconds at this evaluation (and the current observation is itself a breach).
* **A recovery resets the clock.** One good observation ends the breach; the next breach
  starts a new ``for`` window. Continuous means continuous, so a flapping signal (bad, good,
  bad ...) never accumulates into a rollback.
* **Short gaps do not reset the clock.** A failed scrape or a window with too few samples
  neither counts as breach nor as recovery: the breach onset is kept if the last breaching
  observation is at most ``maxGapSeconds`` old, otherwise the clock resets (also when two
  breaching observations simply lie further apart than that). Without this one
  failed Prometheus query would restart a 60 s window.
* Values exactly at the objective are within it (strict ``>``, ``<`` for a breach).

Times are seconds on whatever clock the shell uses consistently (monotonic in memory; wall time
if the state is persisted across operator restarts). Durations are clamped at zero, so a clock
that steps back never produces a negative "for".
"""

from __future__ import annotations

import math
import re
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .api import BreachAction

__all__ = [
    "BreachAction",
    "PoolSignals",
    "Signal",
    "SignalReading",
    "SignalStatus",
    "SignalTrack",
    "SloPolicy",
    "SloState",
    "SloVerdict",
    "evaluate_slo",
    "format_value",
]


class Frozen(BaseModel):
    """Base of the core's typed data: immutable, strict about keys, camelCase on the wire."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class Signal(StrEnum):
    """The measured signals, named as the SLO fields of the API."""

    P99 = "p99"
    ERROR_RATE = "errorRate"
    COLD_START = "coldStart"
    GPU_MEMORY_HEADROOM = "gpuMemoryHeadroom"
    TRANSFER_WAIT = "transferWait"


class SignalStatus(StrEnum):
    """Where one signal stands at one evaluation."""

    OK = "ok"
    PENDING = "pending"  # over the objective, not yet for `for` seconds
    BREACHED = "breached"  # over the objective for at least `for` seconds
    NO_DATA = "no-data"
    TOO_FEW_SAMPLES = "too-few-samples"
    STALE = "stale"
    DISABLED = "disabled"  # no objective configured for this signal


_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def _parse_seconds(value: Any) -> Any:
    """Accept a number of seconds or a Go-style duration string such as ``60s`` or ``1m30s``."""
    if isinstance(value, str):
        text = value.strip()
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"not a duration: {value!r} (e.g. 60s, 1m30s, 500ms)")
        return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
    return value


def _parse_fraction(value: Any) -> Any:
    """Accept a fraction (0.1) or a percentage string ("10%")."""
    if isinstance(value, str) and value.strip().endswith("%"):
        return float(value.strip()[:-1]) / 100.0
    return value


class SloPolicy(Frozen):
    """The objectives of a pool (``spec.rollout.slo`` plus ``onBreach``), in base units."""

    p99_ms: float | None = Field(default=None, gt=0, description="Hot-path P99 bound, ms.")
    error_rate: float | None = Field(
        default=None, ge=0, le=1, description="Highest tolerated failed fraction (5xx, timeouts)."
    )
    cold_start_ms: float | None = Field(
        default=None, gt=0, description="Bound on the first request after a model load, ms."
    )
    gpu_memory_headroom: float | None = Field(
        default=None, ge=0, le=1, description="Fraction of GPU memory that must stay free."
    )
    transfer_wait_ms: float | None = Field(
        default=None, gt=0, description="Bound on the P99 wait for host->device transfer, ms."
    )
    gpu_memory_headroom_bytes: int | None = Field(
        default=None, ge=0, description="Bytes of GPU memory that must stay free (alternative)."
    )
    for_seconds: float = Field(
        default=60.0, ge=0, alias="for", description="How long a breach must last to count."
    )
    on_breach: BreachAction = BreachAction.ROLLBACK
    min_requests: int = Field(
        default=20, ge=1, description="Requests a window needs before p99/errorRate can breach."
    )
    min_cold_samples: int = Field(
        default=1,
        ge=1,
        description="Cold samples a window needs before coldStart or transferWait can breach.",
    )
    max_gap_seconds: float = Field(
        default=30.0, ge=0, description="A data gap this short keeps a breach's onset."
    )
    stale_after_seconds: float = Field(
        default=120.0, gt=0, description="Observations older than this count as no data."
    )

    @field_validator("for_seconds", "max_gap_seconds", "stale_after_seconds", mode="before")
    @classmethod
    def _seconds(cls, value: Any) -> Any:
        return _parse_seconds(value)

    @field_validator("gpu_memory_headroom", mode="before")
    @classmethod
    def _fraction(cls, value: Any) -> Any:
        return _parse_fraction(value)

    @model_validator(mode="after")
    def _one_headroom(self) -> SloPolicy:
        if self.gpu_memory_headroom is not None and self.gpu_memory_headroom_bytes is not None:
            raise ValueError("set gpuMemoryHeadroom or gpuMemoryHeadroomBytes, not both")
        return self


def _finite_or_none(value: Any) -> Any:
    # Prometheus answers NaN for a quantile or ratio over an empty window: that is no data.
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


class PoolSignals(Frozen):
    """What Prometheus says about one pool over the evaluation window; ``None`` means no data.

    ``requests`` is the sample size behind ``p99_hot_ms`` and ``error_rate`` (requests in the
    window); ``cold_samples`` the number of cold starts behind ``cold_start_ms``;
    ``transfer_samples`` the number of requests that waited on a weight transfer behind
    ``transfer_wait_ms`` (a P99). ``observed_at``
    is when the query ran (same clock as ``now``); ``None`` means "just now".
    """

    p99_hot_ms: float | None = Field(default=None, ge=0)
    error_rate: float | None = Field(default=None, ge=0, le=1)
    cold_start_ms: float | None = Field(default=None, ge=0)
    transfer_wait_ms: float | None = Field(default=None, ge=0)
    gpu_memory_used_bytes: int | None = Field(default=None, ge=0)
    gpu_memory_total_bytes: int | None = Field(default=None, ge=0)
    requests: int | None = Field(default=None, ge=0)
    cold_samples: int | None = Field(default=None, ge=0)
    transfer_samples: int | None = Field(default=None, ge=0)
    observed_at: float | None = None

    @field_validator("p99_hot_ms", "error_rate", "cold_start_ms", "transfer_wait_ms", mode="before")
    @classmethod
    def _nan_is_no_data(cls, value: Any) -> Any:
        return _finite_or_none(value)


class SignalTrack(Frozen):
    """Breach bookkeeping of one signal: when the current breach began, when last seen."""

    breaching_since: float | None = None
    last_breach_at: float | None = None


class SloState(Frozen):
    """What :func:`evaluate_slo` remembers between evaluations (persist it as is)."""

    p99: SignalTrack = SignalTrack()
    error_rate: SignalTrack = SignalTrack()
    cold_start: SignalTrack = SignalTrack()
    gpu_memory_headroom: SignalTrack = SignalTrack()
    transfer_wait: SignalTrack = SignalTrack()
    breached: bool = False  # the verdict of the previous evaluation, to report onsets once

    def track(self, signal: Signal) -> SignalTrack:
        return {
            Signal.P99: self.p99,
            Signal.ERROR_RATE: self.error_rate,
            Signal.COLD_START: self.cold_start,
            Signal.GPU_MEMORY_HEADROOM: self.gpu_memory_headroom,
            Signal.TRANSFER_WAIT: self.transfer_wait,
        }[signal]


class SignalReading(Frozen):
    """One signal at one evaluation: status, measured value against the objective."""

    signal: Signal
    status: SignalStatus
    value: float | None = None  # ms for latencies, a fraction for rates and headroom
    threshold: float | None = None  # same unit as value
    unit: str = ""  # "ms", "%" (value is a fraction), or "B" (bytes of headroom)
    samples: int | None = None
    breaching_since: float | None = None
    breaching_for_seconds: float | None = None

    def describe(self, for_seconds: float | None = None) -> str:
        """``p99 182ms > 80ms for 60s`` (with ``of 60s`` appended while pending)."""
        lower_is_bad = self.signal is Signal.GPU_MEMORY_HEADROOM
        text = (
            f"{self.signal.value} {format_value(self.value, self.unit)} "
            f"{'<' if lower_is_bad else '>'} {format_value(self.threshold, self.unit)}"
        )
        if self.breaching_for_seconds is not None:
            text += f" for {self.breaching_for_seconds:.0f}s"
            if for_seconds is not None:
                text += f" of {for_seconds:.0f}s"
        return text


class SloVerdict(Frozen):
    """The result of one evaluation: sustained or not, and the evidence."""

    breached: bool
    onset: bool  # breached now but not at the previous evaluation (report it once)
    readings: tuple[SignalReading, ...]
    reason: str

    def with_status(self, *statuses: SignalStatus) -> tuple[SignalReading, ...]:
        return tuple(r for r in self.readings if r.status in statuses)

    @property
    def breaches(self) -> tuple[SignalReading, ...]:
        return self.with_status(SignalStatus.BREACHED)

    @property
    def breaching(self) -> tuple[SignalReading, ...]:
        """Signals over their objective now, sustained or not yet."""
        return self.with_status(SignalStatus.BREACHED, SignalStatus.PENDING)

    @property
    def missing(self) -> tuple[SignalReading, ...]:
        return self.with_status(
            SignalStatus.NO_DATA, SignalStatus.TOO_FEW_SAMPLES, SignalStatus.STALE
        )

    def reading(self, signal: Signal) -> SignalReading:
        return next(r for r in self.readings if r.signal is signal)


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "%":
        return f"{value * 100:.3g}%"
    if unit == "B":
        return f"{value / 2**30:.3g}GiB"
    if math.isinf(value):
        return f"+Inf{unit}"
    return f"{value:.0f}{unit}" if abs(value) >= 10 else f"{value:.3g}{unit}"


def _measure(
    policy: SloPolicy, signals: PoolSignals, signal: Signal
) -> tuple[float | None, float | None, str, int | None, int | None, bool]:
    """(value, threshold, unit, samples, min samples, is the value over the objective)."""
    if signal is Signal.P99:
        value, limit = signals.p99_hot_ms, policy.p99_ms
        over = value is not None and limit is not None and value > limit
        return value, limit, "ms", signals.requests, policy.min_requests, over
    if signal is Signal.ERROR_RATE:
        value, limit = signals.error_rate, policy.error_rate
        over = value is not None and limit is not None and value > limit
        return value, limit, "%", signals.requests, policy.min_requests, over
    if signal is Signal.COLD_START:
        value, limit = signals.cold_start_ms, policy.cold_start_ms
        over = value is not None and limit is not None and value > limit
        return value, limit, "ms", signals.cold_samples, policy.min_cold_samples, over
    if signal is Signal.TRANSFER_WAIT:
        value, limit = signals.transfer_wait_ms, policy.transfer_wait_ms
        over = value is not None and limit is not None and value > limit
        return value, limit, "ms", signals.transfer_samples, policy.min_cold_samples, over
    used, total = signals.gpu_memory_used_bytes, signals.gpu_memory_total_bytes
    if policy.gpu_memory_headroom_bytes is not None:
        free = None if used is None or total is None else float(max(total - used, 0))
        limit_b = float(policy.gpu_memory_headroom_bytes)
        return free, limit_b, "B", None, None, free is not None and free < limit_b
    fraction = None if used is None or not total else max(total - used, 0) / total
    limit_f = policy.gpu_memory_headroom
    over = fraction is not None and limit_f is not None and fraction < limit_f
    return fraction, limit_f, "%", None, None, over


def _judge(
    policy: SloPolicy, signals: PoolSignals, signal: Signal, track: SignalTrack, now: float
) -> tuple[SignalReading, SignalTrack]:
    value, threshold, unit, samples, min_samples, over = _measure(policy, signals, signal)

    def reading(status: SignalStatus, since: float | None = None) -> SignalReading:
        return SignalReading(
            signal=signal,
            status=status,
            value=value,
            threshold=threshold,
            unit=unit,
            samples=samples,
            breaching_since=since,
            breaching_for_seconds=None if since is None else now - since,
        )

    if threshold is None:
        return reading(SignalStatus.DISABLED), SignalTrack()

    stale = (
        signals.observed_at is not None and now - signals.observed_at > policy.stale_after_seconds
    )
    if value is None or stale or (min_samples is not None and (samples or 0) < min_samples):
        status = (
            SignalStatus.STALE
            if stale
            else SignalStatus.NO_DATA
            if value is None
            else SignalStatus.TOO_FEW_SAMPLES
        )
        # A gap is neither breach nor recovery; a long gap forgets the breach.
        last = track.last_breach_at
        keep = last is not None and now - last <= policy.max_gap_seconds
        return reading(status), track if keep else SignalTrack()

    if not over:
        return reading(SignalStatus.OK), SignalTrack()

    # Two breaching observations further apart than maxGap (the operator was down, scrapes
    # were rare) say nothing about the time between them: the breach starts again.
    last = track.last_breach_at
    continuing = last is not None and now - last <= policy.max_gap_seconds
    since = track.breaching_since if continuing and track.breaching_since is not None else now
    since = min(since, now)  # a clock that stepped back never yields a negative duration
    sustained = now - since >= policy.for_seconds
    status = SignalStatus.BREACHED if sustained else SignalStatus.PENDING
    return reading(status, since), SignalTrack(breaching_since=since, last_breach_at=now)


def evaluate_slo(
    policy: SloPolicy, signals: PoolSignals, state: SloState | None, now: float
) -> tuple[SloVerdict, SloState]:
    """Judge one pool's signals at ``now``; return the verdict and the state to keep."""
    state = state or SloState()
    readings: list[SignalReading] = []
    tracks: dict[str, SignalTrack] = {}
    for signal, field in (
        (Signal.P99, "p99"),
        (Signal.ERROR_RATE, "error_rate"),
        (Signal.COLD_START, "cold_start"),
        (Signal.GPU_MEMORY_HEADROOM, "gpu_memory_headroom"),
        (Signal.TRANSFER_WAIT, "transfer_wait"),
    ):
        reading, tracks[field] = _judge(policy, signals, signal, state.track(signal), now)
        readings.append(reading)

    breaches = [r for r in readings if r.status is SignalStatus.BREACHED]
    pending = [r for r in readings if r.status is SignalStatus.PENDING]
    missing = [
        r
        for r in readings
        if r.status in (SignalStatus.NO_DATA, SignalStatus.TOO_FEW_SAMPLES, SignalStatus.STALE)
    ]
    if breaches:
        reason = "breach:" + ", ".join(r.describe() for r in breaches)
    elif pending:
        reason = "pending:" + ", ".join(r.describe(policy.for_seconds) for r in pending)
    else:
        reason = "ok"
    if missing:
        reason += " (no data: " + ", ".join(_why_missing(r, policy) for r in missing) + ")"

    verdict = SloVerdict(
        breached=bool(breaches),
        onset=bool(breaches) and not state.breached,
        readings=tuple(readings),
        reason=reason,
    )
    return verdict, SloState(breached=bool(breaches), **tracks)


def _why_missing(reading: SignalReading, policy: SloPolicy) -> str:
    if reading.status is SignalStatus.TOO_FEW_SAMPLES:
        cold = reading.signal in (Signal.COLD_START, Signal.TRANSFER_WAIT)
        needed = policy.min_cold_samples if cold else policy.min_requests
        return f"{reading.signal.value} {reading.samples or 0}<{needed} samples"
    return f"{reading.signal.value} {reading.status.value}"
