"""Engine-cache admission and eviction policy (pure).

The hot set lives on the device under a budget in bytes.  :func:`plan_admission` decides, for an
engine about to load, which resident engines to evict; the order of eviction comes from an
:class:`EvictionPolicy`, an interface so that policies can be compared (``bench/``).  Engines in
use (queued or running requests, or still loading) are never evicted, and neither are pinned
engines (the fleet placement wants them hot): only idle, unpinned engines make room.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class CacheEntry:
    """One engine that holds (or has reserved) device memory."""

    name: str
    size_bytes: int
    last_used: float
    loaded_at: float
    uses: int = 0
    in_use: bool = False
    load_seconds: float = 0.0
    pinned: bool = False

    @property
    def evictable(self) -> bool:
        return not self.in_use and not self.pinned


class EvictionPolicy(Protocol):
    """Orders resident engines from most to least evictable."""

    name: str

    def order(self, entries: Sequence[CacheEntry], now: float) -> list[CacheEntry]: ...


class LRUPolicy:
    """Least recently used first."""

    name = "lru"

    def order(self, entries: Sequence[CacheEntry], now: float) -> list[CacheEntry]:
        return sorted(entries, key=lambda e: (e.last_used, e.name))


class LFUPolicy:
    """Least frequently used first, ties broken by recency."""

    name = "lfu"

    def order(self, entries: Sequence[CacheEntry], now: float) -> list[CacheEntry]:
        return sorted(entries, key=lambda e: (e.uses, e.last_used, e.name))


class CostAwarePolicy:
    """GreedyDual-style: evict what is cheapest to get back per byte, and cold.

    Value of keeping an engine = (uses + 1) * reload seconds / size, decayed by idle time.  A large
    engine that is quick to reload and rarely used goes first.
    """

    name = "cost"

    def order(self, entries: Sequence[CacheEntry], now: float) -> list[CacheEntry]:
        def value(e: CacheEntry) -> float:
            idle = max(0.0, now - e.last_used)
            return (e.uses + 1) * max(e.load_seconds, 1e-3) / max(1, e.size_bytes) / (1.0 + idle)

        return sorted(entries, key=lambda e: (value(e), e.last_used, e.name))


POLICIES: dict[str, type[LRUPolicy] | type[LFUPolicy] | type[CostAwarePolicy]] = {
    "lru": LRUPolicy,
    "lfu": LFUPolicy,
    "cost": CostAwarePolicy,
}


def make_policy(name: str) -> EvictionPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown eviction policy {name!r}; known: {sorted(POLICIES)}") from None


@dataclass(frozen=True)
class AdmissionPlan:
    admit: bool
    evict: tuple[str, ...]
    reason: str
    # Refused: the engines in use (requests in flight, or loading) whose end alone makes room
    # (empty: pinned engines hold the bytes, no end of a request frees them).
    waiting_on: tuple[str, ...] = ()


def plan_admission(
    resident: Sequence[CacheEntry],
    incoming_bytes: int,
    budget_bytes: int,
    policy: EvictionPolicy,
    now: float,
) -> AdmissionPlan:
    """Which engines to evict so that ``incoming_bytes`` more fit under ``budget_bytes``."""
    if incoming_bytes > budget_bytes:
        return AdmissionPlan(
            False,
            (),
            f"too-large:{incoming_bytes}B exceeds the whole cache budget of {budget_bytes}B",
        )
    used = sum(e.size_bytes for e in resident)
    free = budget_bytes - used
    if incoming_bytes <= free:
        return AdmissionPlan(True, (), "fits")
    victims: list[str] = []
    for entry in policy.order([e for e in resident if e.evictable], now):
        victims.append(entry.name)
        free += entry.size_bytes
        if incoming_bytes <= free:
            return AdmissionPlan(True, tuple(victims), f"evict:{policy.name}")
    busy = sorted(e.name for e in resident if e.in_use)
    pinned = sorted(e.name for e in resident if e.pinned and not e.in_use)
    held = [e for e in resident if e.in_use and not e.pinned]
    once_idle = free + sum(e.size_bytes for e in held)
    waiting_on = tuple(sorted(e.name for e in held)) if incoming_bytes <= once_idle else ()
    return AdmissionPlan(
        False,
        (),
        f"blocked:needs {incoming_bytes}B, only {free}B can be freed; in use: {busy}, "
        f"pinned: {pinned}",
        waiting_on,
    )
