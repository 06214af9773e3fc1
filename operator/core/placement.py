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
  on-demand loads of cold models. A hot model (score at or above `hot_threshold`: `hot_rate`,
  or `hot_share` of all models' scores together when that is lower) may also pin into
  the headroom (up to the whole budget): the headroom is room for the tail that must not come
  out of the hot set, and a hot model larger than the pinnable share would otherwise never be
  pinned and be evicted by every on-demand tail load that needs its bytes (fleet simulator,
  seed 23: the busiest model, 4.0 GB on 4.7 GB budgets, P99 3-4 s instead of 40 ms). Colder
  models never pin into the headroom, the landing replicas keep their landing room, and with
  fewer than two replicas (no landing replica) the headroom stays the tail's. Hot status has
  hysteresis for a model larger than the pinnable share: pinned now, it keeps the hot cap
  while it wants a copy at all (its daily low can be 100x below its peak; no fixed band covers
  that). Hot models are granted before all others (a viral model takes room from colder
  incumbents at the next placement, whatever their stickiness). Once the previous placement's
  hot set is known (`place(hot_before=)`, `Placement.hot`), hot status has a band: a model
  becomes hot at (1 + tolerance) / (1 - tolerance) times the threshold and stays hot down to
  the threshold over that factor, so noise within the tolerance never flips a model between
  the hot group and the rest (which reorders who gets room).
  A hot model that must displace incumbents to get a copy (no replica has room that no pending
  incumbent needs) goes where it displaces the fewest bytes of hot models, then the fewest
  bytes, then by load: least load first let a small hot newcomer take the replica of the
  fleet's busiest model (4.0 GB, fitting nowhere else), which then stayed cold for minutes
  (fleet simulator, seed 23, hot P99 360 ms against 40 without the tail).
  A fractional headroom is smaller than a large engine, so
  (with two replicas or more) the landing replicas — `landing_share` of them rounded up, at
  least one; the largest budgets, then by name, so always the same ones — take a copy of a
  model X only while room (budget - pinned) stays for the largest model that fits, is not X
  and is not pinned there: a cold request for any model always finds a replica that can load
  it by evicting only unpinned engines. One landing replica is enough for that guarantee but
  serialises every large cold load on it (fleet simulator, 8 replicas: P99 of all requests
  14 s with one, about 3 s with two); a quarter of the replicas spreads the tail's loads for
  about a point of cold share. With `landing_follows_tail` more replicas keep landing room as
  the tail's share of demand (the rates of models not hot) grows — that share of the replicas,
  rounded up, all but one at most (fleet simulator, 6 trace families x 10 seeds: P99 of all
  requests 2-3x ModelMesh-like's instead of 6-9x with the fixed quarter). The count in use
  (`ReplicaSlot.landing`) holds while the tail's share stays within the tolerance band of a
  share that asks for it. (Capping the count so that every hot copy also fits outside the
  landing replicas was tried and dropped: with a hot set of 15-20 models at 2 % of demand the
  cap held the count near the quarter, and the tail's P99 went back to 6x.)
  Models are granted their copies greedily in order of score, a whole model at a time. A copy
  already pinned (an incumbent) has its priority raised by `stickiness` and stays on its
  replica: a newcomer displaces it only with a score more than (1 + stickiness) times higher.
  With stickiness above (1 + noise) / (1 - noise) - 1 (0.22 for 10 % noise) demand noise
  cannot reorder who gets room, so it moves nothing.
* Sizes: a model whose size nobody has measured or declared (`size_known=False`) is pinned
  nowhere (`cold:size-unknown`): its first load is on demand, where the gateway finds the most
  room, and measures it; the next placement pins it by its rate. While any model's size is
  unknown, the first landing replica keeps its whole budget unpinned, so that such a model
  fits there whatever its size (the placement never depends on declared sizes). Before, an
  unmeasured model was taken to be the median size: landing room never fitted the largest
  models, and a 4.0 GB model on 4.04 GB budgets was refused until its requests timed out
  (fleet simulator, small easy fleet seed 3: 2.7 % of all requests lost).
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

import itertools
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
REASON_COLD_SIZE_UNKNOWN = "cold:size-unknown"  # never measured nor declared: loaded on demand
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
    # Share of the replicas (rounded up, at least one with two or more replicas; 0: none) that
    # keep room for the largest model not pinned on them (see "Room").
    landing_share: float = 0.25
    # Whether models at or above hot_rate may pin into the headroom (see "Room"); False is the
    # earlier rule (every model within the pinnable share), kept for same-run comparisons.
    hot_in_headroom: bool = True
    # A model is also hot when its score is at least this share of all models' scores together
    # (scale-free: a fleet whose busiest model has 1 req/s still has hot models).
    hot_share: float = 0.02
    # Whether the number of landing replicas follows the tail's share of demand, with
    # `landing_share` as the least (see "Room"); False: `landing_share` alone (the earlier
    # rule, kept for same-run comparisons).
    landing_follows_tail: bool = True

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
        if not 0 <= self.hot_share <= 1:
            problems.append("hot_share must be in [0, 1]")
        if not 0 <= self.landing_share <= 1:
            problems.append("landing_share must be in [0, 1]")
        if problems:
            raise ValueError("invalid PlacementPolicy: " + "; ".join(problems))

    def hot_threshold(self, total_score: float) -> float:
        """The score at or above which a model is hot, given all models' scores together:
        hot_rate, or hot_share of the total when that is lower (and above zero)."""
        share = self.hot_share * total_score
        return min(self.hot_rate, share) if share > 0 else self.hot_rate

    @property
    def band(self) -> float:
        """(1 + tolerance) / (1 - tolerance): the factor by which demand noise within the
        tolerance can move a score, the hot threshold or the tail's share, and so the band of
        hot status and of the landing count (see "Room")."""
        return (1.0 + self.tolerance) / (1.0 - self.tolerance)

    def landing_replicas(self, replicas: int, tail_share: float = 0.0) -> int:
        """How many of `replicas` keep landing room (none with fewer than two).

        At least `landing_share` of them (rounded up, at least one); more where the tail asks
        for more (`landing_follows_tail`): `tail_share` of the replicas (rounded up), the
        tail's share of all demand (models below the hot threshold), all but one at most.
        """
        if replicas < 2 or self.landing_share <= 0:
            return 0
        base = max(1, math.ceil(replicas * self.landing_share - _EPS))
        if not self.landing_follows_tail:
            return base
        by_tail = math.ceil(replicas * min(max(tail_share, 0.0), 1.0) - _EPS)
        return max(base, min(by_tail, replicas - 1))


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
    # False: nobody has measured or declared the size; `size_bytes` is a guess (see "Sizes").
    size_known: bool = True

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
    # Whether the last placement kept landing room here (`Placement.landing`): the landing
    # count in use, which demand noise does not move (see "Room").
    landing: bool = False

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
    # The replicas that kept landing room for the tail (see "Room").
    landing: frozenset[str] = frozenset()
    # The models counted hot (`place(hot_before=)` of the next placement).
    hot: frozenset[str] = frozenset()

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
    hot_before: frozenset[str] | None = None,
) -> Placement:
    """Decide the pinned set of every replica; deterministic, pure.

    `history` says whether the replicas' `pinned` sets are the result of an earlier placement
    (then the hysteresis bands apply, also to models pinned nowhere); None infers it from
    whether any replica has pins, which misreads a previous placement that pinned nothing. The
    shell passes True once it has published a placement. `hot_before` is the previous
    placement's `hot` set (None: unknown, no band on hot status; see "Room").
    """
    _check_unique(models, replicas)
    usable = {r.name: _usable_bytes(policy, r) for r in replicas}
    hot, hot_now = _hot_models(policy, models, replicas, usable, hot_before)
    if history is None:
        history = any(r.pinned for r in replicas)
    asked = _copy_requests(policy, models, replicas, usable, hot, history)
    # Hot models first (score at or above the threshold now), then the rest, each by priority:
    # a hot newcomer (a viral model) takes room from colder incumbents at once instead of
    # waiting until its score is (1 + stickiness) times theirs.
    requests = sorted(asked.requests, key=lambda q: (q[1] not in hot_now, q[0], q[1], q[2]))
    # With `landing_follows_tail`, the tail's share of demand sets how many replicas keep
    # landing room (see "Room").
    landing = _landing(replicas, _landing_count(policy, models, replicas, hot))
    # While a model's size is unknown, the first landing replica keeps its whole budget.
    keeper = (
        _landing(replicas, min(len(landing), 1)) if any(not m.size_known for m in models) else None
    )
    demand = {m.name: m for m in models}
    hosted = _grant(
        requests,
        replicas,
        usable,
        demand,
        asked.wanted,
        landing,
        asked.too_large,
        hot,
        keeper or frozenset(),
    )
    assignments, pinned = _assign(models, replicas, hosted, asked)
    return Placement(
        assignments=assignments,
        pinned=pinned,
        cold=tuple(sorted(name for name, where in assignments.items() if not where)),
        too_large=asked.too_large,
        reasons=asked.reasons,
        wanted=asked.wanted,
        resident={r.name: r.resident for r in replicas},
        at=now,
        landing=landing,
        hot=hot,
    )


def _hot_models(
    policy: PlacementPolicy,
    models: Sequence[ModelDemand],
    replicas: Sequence[ReplicaSlot],
    usable: Mapping[str, int],
    hot_before: frozenset[str] | None,
) -> tuple[frozenset[str], frozenset[str]]:
    """The hot models (which may pin up to the whole budget, see "Room"), and those hot now on
    their score alone (they take room first)."""
    # On the rates (not the scores: forecast peaks over each model's horizon inflate the sum),
    # the same total the rate smoothing's fast attack uses, so a model taken at once as hot by
    # the smoothing is hot here too.
    threshold = policy.hot_threshold(sum(m.rate for m in models))
    # Hot status has a band (see "Room"): with the previous placement's hot set known, a model
    # becomes hot at `band` times the threshold and stays hot down to the threshold / `band`.
    band = policy.band

    def above(m: ModelDemand) -> bool:
        if hot_before is None:
            return m.score >= threshold
        return m.score >= (threshold / band if m.name in hot_before else threshold * band)

    # Only where landing replicas keep room for the tail (two replicas or more); with one
    # replica the headroom is the tail's only room.
    headroom_for_hot = policy.hot_in_headroom and policy.landing_replicas(len(replicas)) > 0
    # A model larger than every pinnable share that is pinned now keeps the hot cap while it
    # wants a copy at all: at its daily low it would otherwise lose its pin, be evicted by the
    # tail's loads within seconds and pay a reload on every rise (simulator, zipf 0.8 seed 23:
    # 80 of 1,100 hot requests). A model that fits a pinnable share needs no such hysteresis
    # (below the threshold it stays pinned within the share); given to every pinned model it
    # made all pins hot and filled every replica's headroom, the tail's room (issue 23). A
    # model nobody asks for any more (score 0: no rate, no forecast) lets it go.
    pinned_now = frozenset(name for r in replicas for name in r.pinned)
    largest_share = max(usable.values(), default=0)
    hot = frozenset(
        m.name
        for m in models
        if headroom_for_hot
        and (
            above(m)
            or (
                m.name in pinned_now
                and m.score > 0
                and m.score >= policy.min_rate
                and m.size_bytes > largest_share
            )
        )
    )
    return hot, frozenset(m.name for m in models if headroom_for_hot and above(m))


@dataclass
class _Asked:
    """Each model's wanted copies and why, the requests for them (priority, model, copy number,
    incumbent replica), and the models no replica can hold."""

    requests: list[tuple[float, str, int, str | None]] = field(default_factory=list)
    wanted: dict[str, int] = field(default_factory=dict)
    drivers: dict[str, str] = field(default_factory=dict)
    reasons: dict[str, str] = field(default_factory=dict)
    too_large: dict[str, int] = field(default_factory=dict)


def _copy_requests(
    policy: PlacementPolicy,
    models: Sequence[ModelDemand],
    replicas: Sequence[ReplicaSlot],
    usable: Mapping[str, int],
    hot: frozenset[str],
    history: bool,
) -> _Asked:
    """How many copies each model wants and the requests for them, incumbents first."""
    sizes = {m.name: m.size_bytes for m in models}
    cap = len(replicas) if policy.max_copies is None else min(policy.max_copies, len(replicas))
    largest_budget = max((r.budget_bytes for r in replicas), default=0)
    largest_usable = max(usable.values(), default=0)
    # Free bytes each replica would have with only its previous pins: incumbents to keep when a
    # model needs fewer copies are those where it is resident, then where room is plentiful.
    previous_free = {
        r.name: usable[r.name] - sum(sizes.get(m, 0) for m in r.pinned) for r in replicas
    }
    pinned_at = _incumbents(replicas, usable, sizes, hot)
    asked = _Asked()
    reasons = asked.reasons
    for model in models:
        name = model.name
        asked.wanted[name] = 0
        if replicas and model.size_known and model.size_bytes > largest_budget:
            asked.too_large[name] = model.size_bytes - largest_budget
            reasons[name] = REASON_TOO_LARGE
            continue
        if not replicas:
            reasons[name] = REASON_COLD_NO_REPLICAS
            continue
        hosts = list(pinned_at.get(name, ()))
        count, driver = _wanted(policy, model, len(hosts) if history else None, cap, len(replicas))
        asked.wanted[name] = count
        asked.drivers[name] = driver
        if count == 0:
            reasons[name] = REASON_COLD_STICKY if driver == DRIVER_STICKY else REASON_COLD_BELOW_MIN
            continue
        if not model.size_known:
            reasons[name] = REASON_COLD_SIZE_UNKNOWN
            continue
        if model.size_bytes > (largest_budget if name in hot else largest_usable):
            reasons[name] = REASON_COLD_OVER_PIN_BUDGET
            continue
        hosts.sort(key=lambda r: (name not in r.resident, -previous_free[r.name], r.name))
        incumbents = hosts[:count]
        score = model.score
        for j in range(1, count + 1):
            if j <= len(incumbents):
                priority = -score * (1.0 + policy.stickiness)
                asked.requests.append((priority, name, j, incumbents[j - 1].name))
            else:
                asked.requests.append((-score, name, j, None))
    return asked


def _incumbents(
    replicas: Sequence[ReplicaSlot],
    usable: Mapping[str, int],
    sizes: Mapping[str, int],
    hot: frozenset[str],
) -> dict[str, list[ReplicaSlot]]:
    """Per model, the replicas that pin it and can still hold it (a hot model up to the whole
    budget). A pin where it no longer fits (the budget shrank) is a copy to place anew, without
    the incumbent's stickiness: counted as one, it would let an impossible copy jump the queue
    on another replica, and the same placement fed its own output would then decide
    differently."""
    pinned_at: dict[str, list[ReplicaSlot]] = {}
    for r in replicas:
        for name in r.pinned:
            cap = r.budget_bytes if name in hot else usable[r.name]
            if name in sizes and sizes[name] <= cap:
                pinned_at.setdefault(name, []).append(r)
    return pinned_at


def _assign(
    models: Sequence[ModelDemand],
    replicas: Sequence[ReplicaSlot],
    hosted: Mapping[str, Sequence[str]],
    asked: _Asked,
) -> tuple[dict[str, tuple[str, ...]], dict[str, frozenset[str]]]:
    """Each model's replicas in order and each replica's pinned set; the reason of every model
    not decided earlier (``asked.reasons``, completed here)."""
    # Final load per replica (each pinned copy carries its share of the model's score) orders
    # each model's replicas, so equal pinned sets give equal assignments whatever the order.
    demand = {m.name: m for m in models}
    final_load = {r.name: 0.0 for r in replicas}
    for name, where in hosted.items():
        for replica in where:
            final_load[replica] += demand[name].score / len(where)
    assignments: dict[str, tuple[str, ...]] = {}
    pinned: dict[str, set[str]] = {r.name: set() for r in replicas}
    reasons, wanted = asked.reasons, asked.wanted
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
            reasons[name] = f"copies={len(where)}:{asked.drivers[name]}"
    return assignments, {replica: frozenset(names) for replica, names in pinned.items()}


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
    landing: frozenset[str] = frozenset(),
    too_large: Mapping[str, int] | None = None,
    hot: frozenset[str] = frozenset(),
    keeper: frozenset[str] = frozenset(),
) -> dict[str, list[str]]:
    """Grant copy requests in priority order; model -> replicas granted, in grant order.

    Replicas are indexed in name order so that ties fall to the first name; a new copy looks at
    the replicas where the model is resident first and scans all of them only when none has room.

    A copy of X goes to a ``landing`` replica only if room (budget - pinned) stays there for
    the largest model that fits its budget, is not X and is not pinned there yet (sizes only,
    never demand). The last grant on a landing replica thus leaves room for the largest model
    with no copy anywhere, which is what a cold request may have to load there; and the rule
    reads only sizes and what is on that replica, so a placement fed its own output grants the
    same copies in the same order. On a ``keeper`` replica the largest is its whole budget
    (a model of unknown size may need all of it).
    """
    grants = _Grants(requests, replicas, usable, demand, landing, too_large or {}, hot, keeper)
    for _, name, _, bound in requests:
        size = demand[name].size_bytes
        chosen = grants.choose(name, size, bound)
        if chosen >= 0:
            grants.record(chosen, name, size, demand[name].score / wanted[name])
    return {name: [grants.slots[i].name for i in where] for name, where in grants.hosted.items()}


class _Grants:
    """One pass of `_grant`: per replica (indexed in name order) its free bytes, load, the
    incumbent copies not granted yet, and on landing replicas the room kept for the largest
    model; per model, the replicas granted."""

    def __init__(
        self,
        requests: Sequence[tuple[float, str, int, str | None]],
        replicas: Sequence[ReplicaSlot],
        usable: Mapping[str, int],
        demand: Mapping[str, ModelDemand],
        landing: frozenset[str],
        too_large: Mapping[str, int],
        hot: frozenset[str],
        keeper: frozenset[str],
    ) -> None:
        self.slots = slots = sorted(replicas, key=lambda r: r.name)
        self.usable, self.demand, self.hot = usable, demand, hot
        index = {r.name: i for i, r in enumerate(slots)}
        self.index = index
        self.free = [usable[r.name] for r in slots]
        self.load = [0.0] * len(slots)
        self.resident_at: dict[str, list[int]] = {name: [] for name in demand}
        for i, r in enumerate(slots):
            for name in r.resident:
                if name in self.resident_at:
                    self.resident_at[name].append(i)
        self.hosted: dict[str, list[int]] = {name: [] for name in demand}
        by_size = sorted(
            ((m.size_bytes, name) for name, m in demand.items() if name not in too_large),
            key=lambda e: (-e[0], e[1]),
        )
        # Per landing replica: the models of `by_size` that fit its budget, and how many of
        # them from the front are pinned there already (they need no room kept: a skipped
        # prefix).
        self.fits = {
            i: (
                [(r.budget_bytes, "")]
                if r.name in keeper
                else [e for e in by_size if e[0] <= r.budget_bytes]
            )
            for i, r in enumerate(slots)
            if r.name in landing or r.name in keeper
        }
        self.skip = dict.fromkeys(self.fits, 0)
        self.headroom = [r.budget_bytes - usable[r.name] for r in slots]
        # Bytes of incumbent copies not granted yet, per replica: a newcomer granted before
        # them (a hot model ahead of colder incumbents) takes free room first and displaces an
        # incumbent only where no replica has room without doing so (a small viral model would
        # otherwise take the replica of a large hot incumbent that fits nowhere else).
        self.reserved = [0] * len(slots)
        # The incumbents not granted yet, per replica, in the order they will be: a newcomer
        # that must displace some goes where it displaces the fewest hot bytes, then the
        # fewest bytes.
        self.pending: list[list[str]] = [[] for _ in slots]
        for _, name, _, bound in requests:
            if bound is not None:
                self.reserved[index[bound]] += demand[name].size_bytes
                self.pending[index[bound]].append(name)

    def room(self, i: int, name: str) -> int:
        """Free bytes on replica i for a copy of `name` (a hot model may use the headroom)."""
        return self.free[i] + (self.headroom[i] if name in self.hot else 0)

    def allowed(self, i: int, name: str, size: int) -> bool:
        if self.room(i, name) < size:
            return False
        if i not in self.fits:
            return True
        keep = 0
        for b, n in itertools.islice(self.fits[i], self.skip[i], None):
            if n != name and (not n or i not in self.hosted[n]):
                keep = b
                break
        # Pinned after the grant (usable - free + size) must stay within budget - keep.
        slot = self.slots[i]
        return self.free[i] - size >= self.usable[slot.name] - (slot.budget_bytes - keep)

    def displaced(self, i: int, name: str, size: int) -> tuple[int, int]:
        """(hot bytes, bytes) of the incumbents pending on replica i that a copy of `name`
        granted there now would leave no room for: the last to be granted go first."""
        short = size - (self.room(i, name) - self.reserved[i])
        hot_bytes = total = 0
        for other in reversed(self.pending[i]):
            if short <= 0:
                break
            other_size = self.demand[other].size_bytes
            short -= other_size
            total += other_size
            if other in self.hot:
                hot_bytes += other_size
        return hot_bytes, total

    def choose(self, name: str, size: int, bound: str | None) -> int:
        """The replica a copy of `name` goes to (-1: none has room): its incumbent's, else the
        least damaging, least loaded, freest of the first tier with a candidate."""
        mine = self.hosted[name]
        if bound is not None:
            b = self.index[bound]
            self.reserved[b] -= size
            self.pending[b].remove(name)
            if b not in mine and self.allowed(b, name, size):
                return b
        n = len(self.slots)
        spare = [i for i in range(n) if self.room(i, name) - self.reserved[i] >= size]
        spare_resident = [i for i in self.resident_at[name] if i in spare]
        tiers = (spare_resident, spare, self.resident_at[name], range(n))
        load, free = self.load, self.free
        for tier, candidates in enumerate(tiers):
            # In the last two tiers every candidate displaces incumbents: least damage first.
            cost = {
                i: self.displaced(i, name, size) if tier >= 2 else (0, 0)
                for i in candidates
                if i not in mine and self.allowed(i, name, size)
            }
            chosen = -1
            for i in candidates:
                if i not in cost:
                    continue
                if (
                    chosen < 0
                    or cost[i] < cost[chosen]
                    or (
                        cost[i] == cost[chosen]
                        and (
                            load[i] < load[chosen]
                            or (load[i] == load[chosen] and free[i] > free[chosen])
                        )
                    )
                ):
                    chosen = i
            if chosen >= 0:
                return chosen
        return -1

    def record(self, chosen: int, name: str, size: int, share: float) -> None:
        """A copy of `name` granted on replica `chosen`, carrying `share` of its score."""
        self.hosted[name].append(chosen)
        self.free[chosen] -= size
        self.load[chosen] += share
        if chosen in self.fits:
            entries, skip = self.fits[chosen], self.skip
            while (
                skip[chosen] < len(entries)
                and entries[skip[chosen]][1]
                and chosen in self.hosted[entries[skip[chosen]][1]]
            ):
                skip[chosen] += 1


def _landing_count(
    policy: PlacementPolicy,
    models: Sequence[ModelDemand],
    replicas: Sequence[ReplicaSlot],
    hot: frozenset[str],
) -> int:
    """How many replicas keep landing room (see "Room"): `policy.landing_replicas` for the
    tail's share of demand (the rates of models not hot). A count already in use
    (`ReplicaSlot.landing`) is kept while the tail's share is within the band
    (1 + tolerance) / (1 - tolerance) of a share that asks for it: demand noise within the
    tolerance moves nothing (it would move pins: a replica that becomes a landing one makes
    room, one that stops takes pins).
    """
    total_rate = sum(m.rate for m in models)
    tail = sum(m.rate for m in models if m.name not in hot) / total_rate if total_rate > 0 else 0.0
    count = len(replicas)
    previous = sum(1 for r in replicas if r.landing)
    if not previous:
        return policy.landing_replicas(count, tail)
    lower = policy.landing_replicas(count, tail / policy.band)
    upper = policy.landing_replicas(count, min(tail * policy.band, 1.0))
    return min(max(previous, lower), upper)


def _landing(replicas: Sequence[ReplicaSlot], count: int) -> frozenset[str]:
    """The first `count` landing replicas: the largest budgets, then by name (always the same
    ones, so a larger count only adds replicas)."""
    ranked = sorted(replicas, key=lambda r: (-r.budget_bytes, r.name))
    return frozenset(r.name for r in ranked[:count])


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
