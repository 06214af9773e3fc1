"""Fleet placement: which models are kept hot (pinned) on which replicas (pure).

Owns `place`, a pure function of a `PlacementPolicy`, each model's demand (`ModelDemand`: size
in bytes as measured by the runtime or declared in the spec, load time, arrival rate now and the
forecast peak over its load-time horizon) and each replica's engine budget and current state
(`ReplicaSlot`: what is resident, what the last placement pinned). It returns a `Placement`:
replicas per model, the pinned set of every replica, the cold models, the models too large for
any replica, and a reason per model. The shell publishes the pinned sets to the runtimes and the
assignments to the gateway; `placement_summary` is what status, the gateway and the fleet
simulator show. Replicas for the service come from `decide_scale`; this only decides models
within them. Nothing here reads a clock or does I/O; `now` is only recorded in the result.

How it decides:

* Score = max(rate, forecast_rate): the forecast peak over the load-time horizon makes a model
  hot a load time before its predicted rise (predictive preloading).
* Copies wanted: 0 below `min_rate` (the model stays cold in the store and is loaded on demand
  into the headroom), else ceil(score / rate_per_copy), at least `hot_min_copies` for models at
  or above `hot_rate` (availability: losing one replica does not make a busy model cold), at most
  `max_copies` and the number of replicas. The availability rule is on the model's own rate, not
  its share of the fleet, so that other models' traffic cannot move its copies.
* Hysteresis: once a placement exists (`history`), a model keeps its current number
  of copies k while k lies between the counts for score / (1 + tolerance) and for score /
  (1 - tolerance). Demand noise within the tolerance moves nothing; a larger change re-sizes.
  Without any pins (first placement) the plain counts apply.
* Room: each replica may pin `budget * (1 - headroom_fraction)` bytes; the headroom is for
  on-demand loads of cold models. A fractional headroom is smaller than a large engine, so
  (with two replicas or more) `landing_replicas` replicas — the largest budgets, then by name,
  so always the same ones — also keep room for the largest model that is not pinned on every
  replica: a cold request for it always finds a replica that can load it by evicting only
  unpinned engines. Models are granted their copies greedily in order of score,
  a whole model at a time. A copy already pinned (an incumbent) has its priority raised by
  `stickiness` and stays on its replica: a newcomer displaces it only with a score more than
  (1 + stickiness) times higher. With stickiness above (1 + noise) / (1 - noise) - 1 (0.22 for
  10 % noise) demand noise cannot reorder who gets room, so it moves nothing.
* A new copy goes to a replica where the model is already resident (no load), then to the one
  with the least demand assigned so far, then the most free bytes, then by name.
* Monotone: copies wanted never decrease with the score (outside the hysteresis and stickiness
  bands once a placement exists). Copies granted are monotone too wherever bytes allow: a hotter
  model is served first, and if it comes up short every replica with room for it already has
  it, so a colder model at least as large cannot get more copies. A hotter but *larger* model
  can end with fewer copies than a small colder one when bytes run out: that is packing, not
  ranking. Whole-model order (rather than interleaving copies by score / j) is what makes these
  guarantees hold exactly; the price is that a cold model's first copy yields to a hot model's
  extra copies when room is short (the cold model is still served on demand from the headroom).

Complexity: O(C log C + C * R) for C copies wanted (at most models x replicas; about models +
a few dozen for a power-law fleet) over R replicas; 200 models on 50 replicas is a few ms.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# Reasons (a closed vocabulary the shell copies into status, Events and metric labels). Pinned
# models read "copies=<n>:<driver>" or "copies=<n>/<wanted>:no-room".
DRIVER_RATE = "rate"  # ceil(score / rate_per_copy), the rate now decided
DRIVER_FORECAST = "forecast"  # the same, the forecast peak decided (preloading)
DRIVER_AVAILABLE = "available"  # raised to hot_min_copies for availability
DRIVER_STICKY = "sticky"  # kept at its current count by the hysteresis band
DRIVER_MAX = "max"  # capped by max_copies or the number of replicas
REASON_NO_ROOM = "no-room"
REASON_COLD_BELOW_MIN = "cold:below-min-rate"
REASON_COLD_STICKY = "cold:sticky"  # over min_rate, but not out of the band yet
REASON_COLD_NO_ROOM = "cold:no-room"
REASON_COLD_OVER_PIN_BUDGET = "cold:over-pin-budget"  # fits a budget, not its pinnable part
REASON_COLD_NO_REPLICAS = "cold:no-replicas"
REASON_TOO_LARGE = "too-large"

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class PlacementPolicy:
    """How models are spread over replicas."""

    # Requests per second one hot copy should serve before another copy is wanted.
    rate_per_copy: float = 50.0
    # Most copies of one model; None: one per replica.
    max_copies: int | None = None
    # Below this score (req/s) a model is pinned nowhere: cold in the store, loaded on demand.
    min_rate: float = 0.1
    # Fraction of each replica's budget never pinned, kept for on-demand loads.
    headroom_fraction: float = 0.2
    # Half-width of the hysteresis band on copy counts (relative demand change that moves none).
    tolerance: float = 0.15
    # A pinned copy keeps its place unless a challenger's priority exceeds it by this factor.
    stickiness: float = 0.25
    # Models at or above this score get at least hot_min_copies (with >= 2 replicas).
    hot_rate: float = 10.0
    hot_min_copies: int = 2
    # Replicas that keep room for the largest model not pinned everywhere (see "Room").
    landing_replicas: int = 1

    def __post_init__(self) -> None:
        problems = []
        if not (math.isfinite(self.rate_per_copy) and self.rate_per_copy > 0):
            problems.append("rate_per_copy must be > 0")
        if self.max_copies is not None and self.max_copies < 1:
            problems.append("max_copies must be >= 1 (or None)")
        if not (math.isfinite(self.min_rate) and self.min_rate >= 0):
            problems.append("min_rate must be >= 0")
        if not 0 <= self.headroom_fraction < 1:
            problems.append("headroom_fraction must be in [0, 1)")
        if not 0 <= self.tolerance < 1:
            problems.append("tolerance must be in [0, 1)")
        if not (math.isfinite(self.stickiness) and self.stickiness >= 0):
            problems.append("stickiness must be >= 0")
        if not self.hot_rate >= 0:
            problems.append("hot_rate must be >= 0")
        if self.hot_min_copies < 1:
            problems.append("hot_min_copies must be >= 1")
        if self.landing_replicas < 0:
            problems.append("landing_replicas must be >= 0")
        if problems:
            raise ValueError("invalid PlacementPolicy: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class ModelDemand:
    """One model's size and demand.

    `forecast_rate` is the forecast's peak over [now, now + load_seconds + margin]
    (`forecast.predict_peak`); `load_seconds` is carried so that one object describes a model to
    both the forecast horizon and the simulator.
    """

    name: str
    size_bytes: int
    load_seconds: float = 0.0
    rate: float = 0.0
    forecast_rate: float = 0.0

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a model needs a name")
        if self.size_bytes < 0:
            raise ValueError(f"model {self.name!r}: size_bytes must be >= 0")
        for label in ("load_seconds", "rate", "forecast_rate"):
            value = getattr(self, label)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"model {self.name!r}: {label} must be finite and >= 0")

    @property
    def score(self) -> float:
        return max(self.rate, self.forecast_rate)


@dataclass(frozen=True, slots=True)
class ReplicaSlot:
    """One serving replica: its engine budget, what is hot there, what the last placement pinned."""

    name: str
    budget_bytes: int
    resident: frozenset[str] = frozenset()
    pinned: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a replica needs a name")
        if self.budget_bytes < 0:
            raise ValueError(f"replica {self.name!r}: budget_bytes must be >= 0")


@dataclass(frozen=True)
class Placement:
    """Where models are hot. Every input model appears in `assignments`, `wanted` and
    `reasons`; every input replica in `pinned`."""

    # Model -> replicas pinning it, least loaded first (empty for cold models).
    assignments: Mapping[str, tuple[str, ...]]
    # Replica -> the models it must keep hot.
    pinned: Mapping[str, frozenset[str]]
    # Models pinned nowhere, sorted.
    cold: tuple[str, ...]
    # Model -> bytes by which it exceeds the largest replica budget.
    too_large: Mapping[str, int]
    reasons: Mapping[str, str]
    # Model -> copies wanted from demand (more than granted when room ran out).
    wanted: Mapping[str, int]
    # Replica -> what was resident when the placement was made (for `loads`).
    resident: Mapping[str, frozenset[str]] = field(default_factory=dict)
    at: float = 0.0

    def copies(self, model: str) -> int:
        return len(self.assignments.get(model, ()))

    def loads(self) -> list[tuple[str, str]]:
        """(replica, model) pinned but not resident: the loads (churn) this placement causes."""
        empty: frozenset[str] = frozenset()
        return sorted(
            (replica, model)
            for replica, models in self.pinned.items()
            for model in models
            if model not in self.resident.get(replica, empty)
        )

    def bytes_to_load(self, sizes: Mapping[str, int]) -> int:
        """Bytes the loads of this placement move (models missing from `sizes` count 0)."""
        return sum(sizes.get(model, 0) for _, model in self.loads())


@dataclass(frozen=True, slots=True)
class PlacementSummary:
    """Counts for status (`kubectl get` shows hot/total), the gateway and the simulator."""

    hot_models: int
    total_models: int
    copies: int
    cold_models: int
    too_large_models: int = 0


def placement_summary(placement: Placement, models: Sequence[ModelDemand]) -> PlacementSummary:
    names = {m.name for m in models}
    hot = sum(1 for name in names if placement.copies(name) > 0)
    return PlacementSummary(
        hot_models=hot,
        total_models=len(names),
        copies=sum(placement.copies(name) for name in names),
        cold_models=len(names) - hot,
        too_large_models=sum(1 for name in names if name in placement.too_large),
    )


def place(
    policy: PlacementPolicy,
    models: Sequence[ModelDemand],
    replicas: Sequence[ReplicaSlot],
    now: float,
    *,
    history: bool | None = None,
) -> Placement:
    """Decide the pinned set of every replica; deterministic, pure.

    `history` says whether the replicas' `pinned` sets are the result of an earlier placement
    (then the hysteresis bands apply, also to models pinned nowhere); None infers it from
    whether any replica has pins, which misreads a previous placement that pinned nothing. The
    shell passes True once it has published a placement.
    """
    _check_unique(models, replicas)
    usable = {r.name: _usable_bytes(policy, r) for r in replicas}
    sizes = {m.name: m.size_bytes for m in models}
    if history is None:
        history = any(r.pinned for r in replicas)
    cap = len(replicas) if policy.max_copies is None else min(policy.max_copies, len(replicas))
    largest_budget = max((r.budget_bytes for r in replicas), default=0)
    largest_usable = max(usable.values(), default=0)
    # Free bytes each replica would have with only its previous pins: incumbents to keep when a
    # model needs fewer copies are those where it is resident, then where room is plentiful.
    previous_free = {
        r.name: usable[r.name] - sum(sizes.get(m, 0) for m in r.pinned) for r in replicas
    }

    pinned_at: dict[str, list[ReplicaSlot]] = {}
    for r in replicas:
        for name in r.pinned:
            pinned_at.setdefault(name, []).append(r)
    reasons: dict[str, str] = {}
    wanted: dict[str, int] = {}
    drivers: dict[str, str] = {}
    too_large: dict[str, int] = {}
    requests: list[tuple[float, str, int, str | None]] = []
    for model in models:
        name = model.name
        wanted[name] = 0
        if replicas and model.size_bytes > largest_budget:
            too_large[name] = model.size_bytes - largest_budget
            reasons[name] = REASON_TOO_LARGE
            continue
        if not replicas:
            reasons[name] = REASON_COLD_NO_REPLICAS
            continue
        hosts = list(pinned_at.get(name, ()))
        count, driver = _wanted(policy, model, len(hosts) if history else None, cap, len(replicas))
        wanted[name] = count
        drivers[name] = driver
        if count == 0:
            reasons[name] = REASON_COLD_STICKY if driver == DRIVER_STICKY else REASON_COLD_BELOW_MIN
            continue
        if model.size_bytes > largest_usable:
            reasons[name] = REASON_COLD_OVER_PIN_BUDGET
            continue
        hosts.sort(key=lambda r: (name not in r.resident, -previous_free[r.name], r.name))
        incumbents = hosts[:count]
        score = model.score
        for j in range(1, count + 1):
            if j <= len(incumbents):
                requests.append(
                    (-score * (1.0 + policy.stickiness), name, j, incumbents[j - 1].name)
                )
            else:
                requests.append((-score, name, j, None))
    requests.sort(key=lambda q: (q[0], q[1], q[2]))
    reserve = _landing_reserve(policy, models, replicas, too_large)

    demand = {m.name: m for m in models}
    hosted = _grant(requests, replicas, usable, demand, wanted, reserve)

    # Final load per replica (each pinned copy carries its share of the model's score) orders
    # each model's replicas, so equal pinned sets give equal assignments whatever the order.
    final_load = {r.name: 0.0 for r in replicas}
    for name, where in hosted.items():
        for replica in where:
            final_load[replica] += demand[name].score / len(where)
    assignments: dict[str, tuple[str, ...]] = {}
    pinned: dict[str, set[str]] = {r.name: set() for r in replicas}
    for model in models:
        name = model.name
        where = sorted(hosted[name], key=lambda r: (final_load[r], r))
        assignments[name] = tuple(where)
        for replica in where:
            pinned[replica].add(name)
        if name in reasons:
            continue
        if not where:
            reasons[name] = REASON_COLD_NO_ROOM
        elif len(where) < wanted[name]:
            reasons[name] = f"copies={len(where)}/{wanted[name]}:{REASON_NO_ROOM}"
        else:
            reasons[name] = f"copies={len(where)}:{drivers[name]}"
    return Placement(
        assignments=assignments,
        pinned={replica: frozenset(names) for replica, names in pinned.items()},
        cold=tuple(sorted(name for name, where in assignments.items() if not where)),
        too_large=too_large,
        reasons=reasons,
        wanted=wanted,
        resident={r.name: r.resident for r in replicas},
        at=now,
    )


# ------------------------------------------------------------------------------------------
# Steps.


def _check_unique(models: Sequence[ModelDemand], replicas: Sequence[ReplicaSlot]) -> None:
    for kind, names in (
        ("model", [m.name for m in models]),
        ("replica", [r.name for r in replicas]),
    ):
        twice = sorted(name for name, n in Counter(names).items() if n > 1)
        if twice:
            raise ValueError(f"duplicate {kind} names: {', '.join(twice)}")


def _grant(
    requests: Sequence[tuple[float, str, int, str | None]],
    replicas: Sequence[ReplicaSlot],
    usable: Mapping[str, int],
    demand: Mapping[str, ModelDemand],
    wanted: Mapping[str, int],
    reserve: Mapping[str, int] | None = None,
) -> dict[str, list[str]]:
    """Grant copy requests in priority order; model -> replicas granted, in grant order.

    Replicas are indexed in name order so that ties fall to the first name; a new copy looks at
    the replicas where the model is resident first and scans all of them only when none has room.

    ``reserve``: bytes the landing replicas keep free in a first pass. A second pass offers
    them to the copies still missing of models wanted on every replica (they cannot go
    anywhere else), as long as room stays for the largest model left with no copy.
    """
    reserve = reserve or {}
    slots = sorted(replicas, key=lambda r: r.name)
    index = {r.name: i for i, r in enumerate(slots)}
    held = [reserve.get(r.name, 0) for r in slots]
    free = [usable[r.name] - held[i] for i, r in enumerate(slots)]
    load = [0.0] * len(slots)
    resident_at: dict[str, list[int]] = {name: [] for name in demand}
    for i, r in enumerate(slots):
        for name in r.resident:
            if name in resident_at:
                resident_at[name].append(i)
    everywhere = range(len(slots))
    hosted: dict[str, list[int]] = {name: [] for name in demand}
    missing = _grant_pass(
        requests, demand, wanted, index, free, load, resident_at, everywhere, hosted
    )
    if any(held) and missing:
        # Room (budget - pins) kept for the largest model left with no copy, not for any model.
        cold = [demand[n].size_bytes for n, where in hosted.items() if not where]
        for i, r in enumerate(slots):
            if held[i]:
                keep = max([c for c in cold if c <= r.budget_bytes], default=0)
                free[i] += held[i] - max(0, usable[r.name] - (r.budget_bytes - keep))
        wide = [q for q in missing if wanted[q[1]] >= len(slots)]
        _grant_pass(wide, demand, wanted, index, free, load, resident_at, everywhere, hosted)
    return {name: [slots[i].name for i in where] for name, where in hosted.items()}


def _grant_pass(
    requests: Sequence[tuple[float, str, int, str | None]],
    demand: Mapping[str, ModelDemand],
    wanted: Mapping[str, int],
    index: Mapping[str, int],
    free: list[int],
    load: list[float],
    resident_at: Mapping[str, list[int]],
    everywhere: range,
    hosted: dict[str, list[int]],
) -> list[tuple[float, str, int, str | None]]:
    """One pass over the requests in order (updates `free`, `load`, `hosted`); returns the
    requests it could not grant."""
    missing = []
    for request in requests:
        _, name, _, bound = request
        size = demand[name].size_bytes
        mine = hosted[name]
        chosen = -1
        if bound is not None:
            b = index[bound]
            if free[b] >= size and b not in mine:
                chosen = b
        if chosen < 0:
            for candidates in (resident_at[name], everywhere):
                for i in candidates:
                    room = free[i]
                    if room < size or i in mine:
                        continue
                    if (
                        chosen < 0
                        or load[i] < load[chosen]
                        or (load[i] == load[chosen] and room > free[chosen])
                    ):
                        chosen = i
                if chosen >= 0:
                    break
        if chosen < 0:
            missing.append(request)
            continue
        mine.append(chosen)
        free[chosen] -= size
        load[chosen] += demand[name].score / wanted[name]
    return missing


def _landing_reserve(
    policy: PlacementPolicy,
    models: Sequence[ModelDemand],
    replicas: Sequence[ReplicaSlot],
    too_large: Mapping[str, int],
) -> dict[str, int]:
    """Bytes each landing replica keeps free of pins beyond its headroom, so that the largest
    model that fits a budget can always be loaded there on demand. Sizes only, never demand:
    demand noise cannot move it."""
    if len(replicas) < 2 or policy.landing_replicas < 1:
        return {}
    sizes = [m.size_bytes for m in models if m.name not in too_large]
    if not sizes:
        return {}
    largest = max(sizes)
    out = {}
    landing = sorted(replicas, key=lambda r: (-r.budget_bytes, r.name))[: policy.landing_replicas]
    for r in landing:
        usable = _usable_bytes(policy, r)
        out[r.name] = max(0, min(usable, usable - (r.budget_bytes - largest)))
    return out


def _usable_bytes(policy: PlacementPolicy, replica: ReplicaSlot) -> int:
    return math.floor(replica.budget_bytes * (1.0 - policy.headroom_fraction))


def _copies_for(policy: PlacementPolicy, score: float, replicas: int) -> int:
    """Copies a score asks for, before the cap (monotone in the score)."""
    if score < policy.min_rate:
        return 0
    copies = max(1, math.ceil(score / policy.rate_per_copy - _EPS))
    if score >= policy.hot_rate and replicas >= 2:
        copies = max(copies, policy.hot_min_copies)
    return copies


def _wanted(
    policy: PlacementPolicy, model: ModelDemand, current: int | None, cap: int, replicas: int
) -> tuple[int, str]:
    """Copies wanted and what decided them; `current` is None before any placement exists."""
    score = model.score
    plain = _copies_for(policy, score, replicas)
    count = plain
    if current is not None:
        low = _copies_for(policy, score / (1.0 + policy.tolerance), replicas)
        high = _copies_for(policy, score / (1.0 - policy.tolerance), replicas)
        count = min(max(current, low), high)
    capped = min(count, cap)
    if capped < count:
        return capped, DRIVER_MAX
    if count != plain:
        return count, DRIVER_STICKY
    if (
        count > 0
        and count == policy.hot_min_copies
        and count > math.ceil(score / policy.rate_per_copy - _EPS)
    ):
        return count, DRIVER_AVAILABLE
    if model.forecast_rate > model.rate:
        return count, DRIVER_FORECAST
    return count, DRIVER_RATE
