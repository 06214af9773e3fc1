"""Rules across the settings of a working spec: the one table of them (pure).

This module owns the settings that pass the schema and build a working service, but that can
never act as written (``IneffectiveSetting``) or that contradict another setting
(``ConflictingSettings``). Each :class:`SettingRule` is one row: the field it names, the
condition in words, the ``Degraded`` reason the user sees, and the check. The shell reports
what :func:`find_setting_findings` returns as the ``Degraded`` condition with a Warning Event;
the service is built and serves all the same.

Where the line is drawn: a contradiction that is wrong whatever the cluster holds is refused at
admission instead — a CEL rule (``x-kubernetes-validations``) on the model in
:mod:`tidal.operator.core.api` whose fields it reads, with the same rule as a pydantic
validator; ``tidal.operator.crdgen`` lists those beside these rows in the operator README's
table (``make crds`` writes it, a test checks it). A spec that cannot work at all is
``InvalidSpec`` (:func:`tidal.operator.core.resources.find_spec_problems`). The rows here are
the ones a user may mean for a while (a cap above reach, a standby squeezed at the floor, an
SLO kept for a backend change), so refusing them would be harsher than the mistake.

Defaults the API server fills in cannot be told from values the user wrote (the stored object
holds both the same way), so a rule on a defaulted field fires only on a value other than the
default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from .api import (
    Backend,
    FleetForecast,
    InferenceService,
    duration_seconds,
    percent_value,
    quantity_bytes,
)
from .idle import DEFAULT_SCALE_TO_ZERO_AFTER_SECONDS
from .resources import (
    activator_hold_seconds,
    engine_budget_bytes,
    holds_requests,
    may_scale_to_zero,
    paths_of,
    pools_of,
    too_large_for_the_budget,
)

# The runtime's fault injection (tidal.runtime.config, faults.extraTransferSeconds): the one way
# a CPU runtime's loads have a host->device transfer phase (the end-to-end tests use it).
FAULT_TRANSFER_ENV = "TIDAL_FAULT_EXTRA_TRANSFER_SECONDS"
_FORECAST_DEFAULTS = FleetForecast()
# The fastest wake from zero measured on this project: a CPU replica's time to routable on a
# warm node, 1.95 s median (README, "Three figures"); a GPU replica takes longer. A hold
# shorter than this answers every request held at zero with 503 before any replica can serve.
FASTEST_WAKE_SECONDS = 2.0


class Outcome(StrEnum):
    """What the user sees for a setting rule: the ``Degraded`` condition's reason."""

    INEFFECTIVE = "IneffectiveSetting"  # the setting can never act as written
    CONFLICTING = "ConflictingSettings"  # two settings contradict; the one named loses


@dataclass(frozen=True)
class Finding:
    """One rule that fired: which, its outcome, and a message naming the field."""

    rule: str
    outcome: Outcome
    message: str


@dataclass(frozen=True)
class SettingRule:
    """One row of the table: ``check`` returns one message per place the rule fires."""

    id: str
    field: str
    condition: str
    outcome: Outcome
    check: Callable[[InferenceService], list[str]]


def _standby_squeezed(isvc: InferenceService) -> list[str]:
    scaling = isvc.spec.autoscaling
    standby, low, high = scaling.standby_replicas, scaling.min_replicas, scaling.max_replicas
    # minReplicas 0: the first replica's own floor is 1 once woken (the activator fronts it).
    floor = max(low, 1) if standby else low
    if standby == 0 or floor + standby <= high:
        return []
    return [
        f"spec.autoscaling.standbyReplicas {standby}: standby pods count against "
        f"maxReplicas {high}, which leaves room for only {high - floor} of them beside "
        f"{floor} serving; raise spec.autoscaling.maxReplicas to {floor + standby} or lower "
        "standbyReplicas"
    ]


def _max_standby_equals_standby(isvc: InferenceService) -> list[str]:
    scaling = isvc.spec.autoscaling
    top, standby = scaling.max_standby_replicas, scaling.standby_replicas
    if top is None or top != standby or standby == 0:
        return []
    return [
        f"spec.autoscaling.maxStandbyReplicas {top} equals standbyReplicas: sizing the "
        "standby from surges cannot change anything; raise maxStandbyReplicas above "
        "standbyReplicas, or remove it"
    ]


def _hold_with_fleet(isvc: InferenceService) -> list[str]:
    hold = isvc.spec.autoscaling.hold_timeout_seconds
    if hold is None or isvc.spec.fleet is None:
        return []
    return [
        f"spec.autoscaling.holdTimeoutSeconds {hold:g} never acts with spec.fleet: the "
        "fleet's gateway holds requests for spec.fleet.gateway.holdTimeoutSeconds; set "
        "that instead, and remove spec.autoscaling.holdTimeoutSeconds"
    ]


def _never_zero(isvc: InferenceService) -> str:
    if isvc.spec.replicas is not None:
        return "spec.replicas is set"
    return f"minReplicas is {isvc.spec.autoscaling.min_replicas}"


def _hold_without_zero(isvc: InferenceService) -> list[str]:
    hold = isvc.spec.autoscaling.hold_timeout_seconds
    if hold is None or isvc.spec.fleet is not None or holds_requests(isvc):
        return []
    return [
        f"spec.autoscaling.holdTimeoutSeconds {hold:g} never acts: {_never_zero(isvc)}, so "
        "the service never reaches zero and no gateway holds its requests; set "
        "spec.autoscaling.minReplicas to 0 or spec.autoscaling.burstBuffer, or remove "
        "holdTimeoutSeconds"
    ]


def _burst_buffer_in_fleet(isvc: InferenceService) -> list[str]:
    if isvc.spec.fleet is None or not isvc.spec.autoscaling.burst_buffer:
        return []
    return [
        "spec.autoscaling.burstBuffer never acts with spec.fleet: the fleet's gateway routes "
        "every request already (its busyOutstanding loads more copies); remove burstBuffer"
    ]


def _zero_after_without_zero(isvc: InferenceService) -> list[str]:
    after = isvc.spec.autoscaling.scale_to_zero_after_seconds
    if after == DEFAULT_SCALE_TO_ZERO_AFTER_SECONDS or may_scale_to_zero(isvc):
        return []
    return [
        f"spec.autoscaling.scaleToZeroAfterSeconds {after} never acts: {_never_zero(isvc)}, "
        "so the service never goes to zero; set spec.autoscaling.minReplicas to 0 (and leave "
        "spec.replicas unset), or remove scaleToZeroAfterSeconds"
    ]


def _max_copies_above_reach(isvc: InferenceService) -> list[str]:
    fleet = isvc.spec.fleet
    copies = fleet.placement.max_copies if fleet is not None else None
    high = isvc.spec.autoscaling.max_replicas
    if copies is None or copies <= high:
        return []
    return [
        f"spec.fleet.placement.maxCopies {copies} never binds: a model has at most one copy "
        f"per replica and spec.autoscaling.maxReplicas is {high}; lower maxCopies to {high} "
        "or less, or remove it"
    ]


def _forecast_off_with_settings(isvc: InferenceService) -> list[str]:
    fleet = isvc.spec.fleet
    if fleet is None or fleet.forecast.enabled:
        return []
    changed = [
        f"{FleetForecast.model_fields[name].alias or name}"
        for name in ("period", "slots", "lead_seconds")
        if getattr(fleet.forecast, name) != getattr(_FORECAST_DEFAULTS, name)
    ]
    if not changed:
        return []
    named = ", ".join(f"spec.fleet.forecast.{n}" for n in changed)
    return [
        f"{named} never acts: spec.fleet.forecast.enabled is false, so nothing is preloaded "
        "ahead of a forecast; set enabled: true, or remove them"
    ]


def _model_larger_than_budget(isvc: InferenceService) -> list[str]:
    if isvc.spec.fleet is not None:
        return []  # placement plans on the declared size: a spec problem there (InvalidSpec)
    found = []
    for pool in pools_of(isvc):
        for text in too_large_for_the_budget(pool, paths_of(isvc, pool.name)):
            found.append(f"{pool.name.value} pool: {text}; its load will be refused")
    return found


def _has_fault_transfer(isvc: InferenceService) -> bool:
    return any(e.name == FAULT_TRANSFER_ENV for e in isvc.spec.runtime.env)


def _slo_on_cpu(isvc: InferenceService, name: str, value: str, unmeasured: str) -> list[str]:
    """An SLO objective that onnxruntime pods never measure: ``unmeasured`` says why."""
    if isvc.spec.runtime.backend is not Backend.ONNXRUNTIME:
        return []
    return [
        f"spec.rollout.slo.{name} {value} never acts: spec.runtime.backend is onnxruntime, "
        f"{unmeasured}, so it cannot breach; remove {name}, or use it with backend tensorrt"
    ]


def _transfer_wait_without_transfers(isvc: InferenceService) -> list[str]:
    # Only the torch backend times its loads' host->device phases (stage, h2d), and an
    # InferenceService cannot run it yet: onnxruntime loads into host memory, and the TensorRT
    # backend reports no transfer phase (runtime/enginecache.py).
    slo = isvc.spec.rollout.slo
    if slo is None or slo.transfer_wait_ms is None or _has_fault_transfer(isvc):
        return []
    backend = isvc.spec.runtime.backend.value
    return [
        f"spec.rollout.slo.transferWaitMs {slo.transfer_wait_ms:g} never acts: the {backend} "
        "backend records no host->device transfer wait (neither onnxruntime nor tensorrt "
        "does in this release; only the torch backend, which an InferenceService cannot run "
        "yet), so it cannot breach; remove transferWaitMs"
    ]


def _hold_shorter_than_any_wake(isvc: InferenceService) -> list[str]:
    hold = isvc.spec.autoscaling.hold_timeout_seconds
    if hold is None or isvc.spec.fleet is not None or not may_scale_to_zero(isvc):
        return []  # without zero it never acts at all (hold-timeout-without-zero)
    if hold >= FASTEST_WAKE_SECONDS:
        return []
    return [
        f"spec.autoscaling.holdTimeoutSeconds {hold:g} is shorter than any wake from zero "
        f"(the fastest measured, a CPU replica on a warm node, takes {FASTEST_WAKE_SECONDS:g} "
        "s): every request held at zero gets 503 before a replica can serve it; raise it to "
        "a replica's time to routable or more (unset: 120)"
    ]


def _forecast_slots_below_interval(isvc: InferenceService) -> list[str]:
    fleet = isvc.spec.fleet
    if fleet is None or not fleet.forecast.enabled:
        return []
    forecast, interval = fleet.forecast, fleet.placement.interval_seconds
    slot = duration_seconds(forecast.period) / forecast.slots
    if slot >= interval:
        return []
    most = int(duration_seconds(forecast.period) // interval)
    message = (
        f"spec.fleet.forecast.slots {forecast.slots} over a period of {forecast.period} makes "
        f"slots of {slot:g} s, shorter than spec.fleet.placement.intervalSeconds {interval:g}: "
        "the forecast learns one rate per placement interval, so most slots never get a "
        f"sample; use at most {most} slots, or a shorter intervalSeconds"
    )
    return [message]


def _engine_cache_without_downloads(isvc: InferenceService) -> list[str]:
    found = []
    for pool in pools_of(isvc):
        cache = pool.runtime.engine_cache
        named = [
            n
            for n, value in (("hostPath", cache.host_path), ("sizeLimit", cache.size_limit))
            if value is not None
        ]
        if not named or any(m.build is not None for m in pool.models):
            continue  # a build's engines are read from its output, often s3://
        uris = [e.uri for m in pool.models for e in m.engines]
        if not all(u.startswith(("file://", "/")) for u in uris):
            continue
        at = paths_of(isvc, pool.name).runtime("engineCache")
        settings = ", ".join(f"{at}.{n}" for n in named)
        found.append(
            f"{pool.name.value} pool: {settings} never acts: every engine of the pool is a "
            "file:// URI, read in place, so nothing is downloaded into the engine cache; "
            "remove it, or serve engines from http(s):// or s3://"
        )
    return found


def _gpu_headroom_without_gpu(isvc: InferenceService) -> list[str]:
    slo = isvc.spec.rollout.slo
    if slo is None or slo.gpu_memory_headroom is None:
        return []
    return _slo_on_cpu(
        isvc,
        "gpuMemoryHeadroom",
        slo.gpu_memory_headroom,
        "whose pods have no GPU: no GPU memory is measured",
    )


def _hold_below_cold_start(isvc: InferenceService) -> list[str]:
    slo = isvc.spec.rollout.slo
    if slo is None or slo.cold_start_ms is None:
        return []
    fleet = isvc.spec.fleet
    if fleet is not None:
        hold, field = fleet.gateway.hold_timeout_seconds, "spec.fleet.gateway.holdTimeoutSeconds"
        waits = "a request for a cold model while it loads"
    elif may_scale_to_zero(isvc):
        hold, field = activator_hold_seconds(isvc), "spec.autoscaling.holdTimeoutSeconds"
        waits = "a request while the service wakes from zero (and its models load)"
    else:
        return []
    if hold * 1000 >= slo.cold_start_ms:
        return []
    return [
        f"{field} {hold:g} is shorter than spec.rollout.slo.coldStartMs {slo.cold_start_ms:g}: "
        f"the gateway holds {waits} for at most {hold:g} s and then answers 503, so a load "
        "the SLO accepts as on time still fails its requests; raise holdTimeoutSeconds to "
        f"{slo.cold_start_ms / 1000:g} or more, or lower coldStartMs"
    ]


def _cache_budget_above_memory_limit(isvc: InferenceService) -> list[str]:
    found = []
    for pool in pools_of(isvc):
        if pool.runtime.backend is not Backend.ONNXRUNTIME:
            continue  # a GPU budget is device memory, not the container's
        limit = pool.runtime.resources.limits.get("memory")
        if pool.memory.engine_cache_budget is None or limit is None:
            continue
        budget = engine_budget_bytes(pool.memory)
        if budget <= quantity_bytes(limit):
            continue
        paths = paths_of(isvc, pool.name)
        found.append(
            f"{pool.name.value} pool: {paths.memory}.engineCacheBudget "
            f"{pool.memory.engine_cache_budget} is more than "
            f"{paths.runtime('resources')}.limits.memory {limit}: onnxruntime keeps engines in "
            "the container's memory, so the pod is OOM-killed before its engine cache is full "
            "and would evict; lower engineCacheBudget below the memory limit, or raise the limit"
        )
    return found


def _streaming_budget_above_engine_budget(isvc: InferenceService) -> list[str]:
    found = []
    for pool in pools_of(isvc):
        wanted = pool.memory.weight_streaming_budget
        if pool.runtime.backend is not Backend.TENSORRT or wanted is None:
            continue  # without TensorRT it is a spec problem (find_spec_problems)
        if wanted == "auto" or percent_value(wanted) is not None:
            continue
        budget = engine_budget_bytes(pool.memory)
        if quantity_bytes(wanted) < budget:
            continue
        paths = paths_of(isvc, pool.name)
        found.append(
            f"{pool.name.value} pool: {paths.memory}.weightStreamingBudget {wanted} never acts "
            f"as written: it is at least the engine budget ({budget} bytes: "
            f"{paths.memory}.engineCacheBudget less reserve), and the runtime clamps it to what "
            "that budget leaves each engine, as auto does; set auto, or a byte count below the "
            "engine budget"
        )
    return found


# The table. Order is the README's; ids are what tests/operator/invalid/ineffective/ names.
SETTING_RULES: tuple[SettingRule, ...] = (
    SettingRule(
        "standby-squeezed-at-the-floor",
        "spec.autoscaling.standbyReplicas",
        "max(minReplicas, 1) + standbyReplicas > maxReplicas (standby pods count against "
        "maxReplicas, so the standby never reaches its size)",
        Outcome.INEFFECTIVE,
        _standby_squeezed,
    ),
    SettingRule(
        "max-standby-equals-standby",
        "spec.autoscaling.maxStandbyReplicas",
        "equal to standbyReplicas (above 0): sizing the standby from surges has no room",
        Outcome.INEFFECTIVE,
        _max_standby_equals_standby,
    ),
    SettingRule(
        "hold-timeout-with-fleet",
        "spec.autoscaling.holdTimeoutSeconds",
        "set with spec.fleet (the fleet's gateway holds for spec.fleet.gateway.holdTimeoutSeconds)",
        Outcome.INEFFECTIVE,
        _hold_with_fleet,
    ),
    SettingRule(
        "hold-timeout-without-zero",
        "spec.autoscaling.holdTimeoutSeconds",
        "set while the service never reaches zero (minReplicas > 0, or spec.replicas set) and "
        "has no burstBuffer",
        Outcome.INEFFECTIVE,
        _hold_without_zero,
    ),
    SettingRule(
        "burst-buffer-with-fleet",
        "spec.autoscaling.burstBuffer",
        "set with spec.fleet (the fleet's gateway routes every request already)",
        Outcome.INEFFECTIVE,
        _burst_buffer_in_fleet,
    ),
    SettingRule(
        "scale-to-zero-after-without-zero",
        "spec.autoscaling.scaleToZeroAfterSeconds",
        f"other than its default ({DEFAULT_SCALE_TO_ZERO_AFTER_SECONDS}) while the service "
        "never reaches zero (minReplicas > 0, or spec.replicas set)",
        Outcome.INEFFECTIVE,
        _zero_after_without_zero,
    ),
    SettingRule(
        "hold-timeout-below-cold-start",
        "spec.fleet.gateway.holdTimeoutSeconds, spec.autoscaling.holdTimeoutSeconds",
        "the hold of the gateway in front of the service (the fleet's, or the activator's at "
        "zero: 120 s unset) is shorter than spec.rollout.slo.coldStartMs",
        Outcome.CONFLICTING,
        _hold_below_cold_start,
    ),
    SettingRule(
        "max-copies-above-max-replicas",
        "spec.fleet.placement.maxCopies",
        "above spec.autoscaling.maxReplicas (at most one copy per replica: the cap never binds)",
        Outcome.INEFFECTIVE,
        _max_copies_above_reach,
    ),
    SettingRule(
        "forecast-settings-while-disabled",
        "spec.fleet.forecast.period, slots, leadSeconds",
        "other than their defaults while spec.fleet.forecast.enabled is false",
        Outcome.INEFFECTIVE,
        _forecast_off_with_settings,
    ),
    SettingRule(
        "transfer-wait-without-transfers",
        "spec.rollout.slo.transferWaitMs",
        "with backend onnxruntime or tensorrt (neither records a host->device transfer wait; "
        f"only torch does), unless {FAULT_TRANSFER_ENV} in spec.runtime.env emulates one",
        Outcome.INEFFECTIVE,
        _transfer_wait_without_transfers,
    ),
    SettingRule(
        "hold-timeout-shorter-than-any-wake",
        "spec.autoscaling.holdTimeoutSeconds",
        f"below {FASTEST_WAKE_SECONDS:g} s while the service may reach zero (shorter than "
        "the fastest wake measured: every request held at zero gets 503)",
        Outcome.INEFFECTIVE,
        _hold_shorter_than_any_wake,
    ),
    SettingRule(
        "forecast-slots-shorter-than-interval",
        "spec.fleet.forecast.slots",
        "period / slots shorter than spec.fleet.placement.intervalSeconds (the forecast "
        "learns one rate per interval: most slots never get a sample)",
        Outcome.INEFFECTIVE,
        _forecast_slots_below_interval,
    ),
    SettingRule(
        "engine-cache-without-downloads",
        "spec.runtime.engineCache.hostPath, sizeLimit",
        "set while every engine of the pool is file:// (read in place: nothing is downloaded "
        "into the cache)",
        Outcome.INEFFECTIVE,
        _engine_cache_without_downloads,
    ),
    SettingRule(
        "gpu-memory-headroom-without-gpu",
        "spec.rollout.slo.gpuMemoryHeadroom",
        "with backend onnxruntime (no GPU memory is measured)",
        Outcome.INEFFECTIVE,
        _gpu_headroom_without_gpu,
    ),
    SettingRule(
        "engine-cache-budget-above-memory-limit",
        "spec.memory.engineCacheBudget",
        "with backend onnxruntime, engineCacheBudget less reserve above "
        "runtime.resources.limits.memory (the pod is OOM-killed before the cache evicts)",
        Outcome.CONFLICTING,
        _cache_budget_above_memory_limit,
    ),
    SettingRule(
        "weight-streaming-budget-above-engine-budget",
        "spec.memory.weightStreamingBudget",
        "with backend tensorrt, a byte count at or above the engine budget (engineCacheBudget "
        "less reserve): clamped to what the budget leaves, as auto",
        Outcome.INEFFECTIVE,
        _streaming_budget_above_engine_budget,
    ),
    SettingRule(
        "model-larger-than-budget",
        "spec.models[].memory",
        "without spec.fleet, a model declared larger than a replica's engine budget (its load "
        "will be refused; the other models serve)",
        Outcome.INEFFECTIVE,
        _model_larger_than_budget,
    ),
)


def find_setting_findings(isvc: InferenceService) -> list[Finding]:
    """Every rule of :data:`SETTING_RULES` that fires for ``isvc``, in table order."""
    return [
        Finding(rule.id, rule.outcome, message)
        for rule in SETTING_RULES
        for message in rule.check(isvc)
    ]


def find_spec_warnings(isvc: InferenceService) -> list[str]:
    """The messages of :func:`find_setting_findings` (each names the field to change)."""
    return [finding.message for finding in find_setting_findings(isvc)]
