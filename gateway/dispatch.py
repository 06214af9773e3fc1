"""The loop every request goes through, whichever front it came by: route, forward, retry once,
hold while nothing can take it.

A front (HTTP, :mod:`tidal.gateway.http_front`; gRPC, :mod:`tidal.gateway.grpc_proxy`) wraps a
request in a :class:`Call` (how to send it to a replica, how long it may be held, whether its
client left) and renders what :meth:`Dispatcher.dispatch` returns: the replica's answer, or a
:class:`Refusal` saying why there is none. Each turn's decision is
:mod:`tidal.gateway.core.dispatch`'s; what may be held and for how long,
:mod:`tidal.gateway.core.hold`'s.

* **Failures**: a forward that fails before any answer (connection refused or reset, replica
  gone, or a 502/503 from it) is retried once on another replica; then the replica's own answer
  or a clear 502.  Where the request may be held, a replica's 503 also marks that replica as
  refusing the model for ``refusedCooldownSeconds`` (its loads go elsewhere) and earns the
  request one more replica.
* **Holding**: a request for a cold model waits on :class:`~tidal.gateway.holding.Changes`
  (woken by every hot-set change and every load that ends, never by a timer loop) and is
  routed again, until it can be forwarded or its deadline passes (``holdTimeoutSeconds``, the
  request's own deadline if smaller, the drain's end on SIGTERM): then a 503 with
  ``Retry-After``.  A client that hangs up while held leaves at once (its slot freed, never
  forwarded).
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeAlias, TypeVar

from .core.dispatch import Step, hold_end, least_busy, next_step, tries
from .core.hold import admit
from .holding import Held, Holds
from .loads import LoadFailure, Loads
from .replicas import Replica

A = TypeVar("A")
T = TypeVar("T", covariant=True)  # a front's answer type

RefusalKind = Literal[
    "unknown", "unavailable", "full", "expired", "drained", "gone", "gave-up", "load-failed"
]


@dataclass(frozen=True)
class Failed(Generic[T]):
    """A forward that failed before any answer was served; ``answer``: the replica's own
    (a 502/503, an ``UNAVAILABLE``), passed on when the gateway gives up."""

    kind: str
    detail: str
    answer: T | None = None
    refused: bool = False  # the replica answered 503: no room or no capacity there now


@dataclass(frozen=True)
class Refusal:
    """Why a request gets no replica's answer; each front words it its own way."""

    kind: RefusalKind
    model: str
    reason: str = ""  # the route's reason
    held_s: float = 0.0
    detail: str = ""  # full: why it cannot be held; gave-up: what was tried
    retry_after: int | None = None
    failure: LoadFailure | None = None  # load-failed: the load's answer


# The answer (the replica's, or why there is none) and whether the request was held for a cold
# model (one held only for a request slot was hot). A tuple: it is made once per request.
Dispatched: TypeAlias = "tuple[T | Refusal, bool]"


@dataclass(eq=False)
class Call(Generic[T]):
    """One request of a front, as the loop needs it: a front's own kind of call says how to
    send it and how long it may be held (and, for HTTP, when its client left)."""

    model: str  # "" for a call that names none
    size: int  # body bytes: what a hold weighs
    may_hold: bool

    async def send(self, replica: Replica) -> T | Failed[T]:
        raise NotImplementedError

    async def hold_seconds(self) -> float:
        """How long it may be held; raises the front's own error for a request no model
        would serve (it is then neither held nor demand)."""
        raise NotImplementedError

    def gone(self) -> bool:
        """The client hung up."""
        return False

    async def wait(self, waiting: Awaitable[None]) -> bool:
        """Await ``waiting``; False when the client left meanwhile."""
        await waiting
        return True


@dataclass(slots=True)
class Turns(Generic[A]):
    """One request's dispatch so far."""

    excluded: frozenset[str] = frozenset()
    failures: list[Failed[A]] = field(default_factory=list)
    held: Held | None = None
    holding: bool = False  # counted in the hold: from the first hold until forwarded or answered
    outcome: str = "other"
    in_line: bool = False  # waited for a slot (the burst buffer) and was woken or timed out
    cold: bool = False  # held for a model that was not hot (else only for a slot)

    def refuse(self, refusal: Refusal) -> Dispatched[A]:
        return refusal, self.held is not None


class Dispatcher:
    """Routes one request of either front, forwards it, retries once, holds it."""

    def __init__(self, holds: Holds, loads: Loads) -> None:
        self.holds = holds
        self.loads = loads
        self.fleet = holds.fleet
        self.metrics = holds.metrics
        self.clock = holds.clock

    async def dispatch(self, call: Call[A]) -> Dispatched[A]:
        """The replica's answer, or why there is none; and whether the request was held."""
        turns: Turns[A] = Turns()
        try:
            while True:
                if turns.held is not None and call.gone():
                    turns.outcome = "gone"
                    return turns.refuse(Refusal("gone", call.model))
                step = self._step(call, turns.excluded)
                if step.action == "unknown":
                    return turns.refuse(Refusal("unknown", call.model, step.reason or ""))
                if step.action == "unavailable":
                    retry = self.holds.retry_after(call.model)
                    reason = step.reason or ""
                    return turns.refuse(
                        Refusal("unavailable", call.model, reason, retry_after=retry)
                    )
                if step.action == "forward":
                    done = await self._forward(call, turns, step)
                else:
                    done = await self._hold(call, turns, step)
                if done is not None:
                    return done
        finally:
            if turns.holding and turns.held is not None:
                self.holds.end(turns.held)
                if turns.in_line:  # left the line unserved: a slot it was woken for goes on
                    self.fleet.changes.notify_one()
            if turns.held is not None:
                self.metrics.hold_outcome[turns.outcome].inc()

    def _step(self, call: Call[A], excluded: frozenset[str]) -> Step:
        if not call.model:
            return least_busy(self.fleet.views(), excluded)
        route = self.fleet.route(call.model, excluded, may_wait=call.may_hold)
        if route.action == "reject" and excluded:
            route = self.fleet.route(call.model, may_wait=call.may_hold)  # the failed one, healed
        self.metrics.decision[route.reason].inc()
        return next_step(route, may_hold=call.may_hold)

    async def _forward(self, call: Call[A], turns: Turns[A], step: Step) -> Dispatched[A] | None:
        assert step.replica is not None
        if turns.holding and turns.held is not None:  # forwarded: the replica's, not held
            turns.holding = False
            self.holds.end(turns.held, forwarded=True)
        if step.extra_load is not None:
            self.loads.start(step.extra_load, call.model)
        replica = self.fleet.replicas[step.replica]
        replica.outstanding += 1
        try:
            answer = await call.send(replica)
        finally:
            replica.outstanding -= 1
            self.fleet.changes.notify_one()  # a slot is free: the oldest request in line takes it
        if not isinstance(answer, Failed):
            turns.outcome = "forwarded"
            # held for a slot alone, the model was hot: not a cold request
            return answer, turns.held is not None and turns.cold
        turns.failures.append(answer)
        if call.may_hold and answer.refused:  # no room or no capacity there now
            self.loads.refuse(replica, call.model)  # its loads go elsewhere for a while
        refused = sum(1 for f in turns.failures if f.refused)
        if len(turns.failures) == tries(call.may_hold, refused):
            return self._give_up(call.model, turns)
        turns.excluded = turns.excluded | {replica.name}
        return None

    def _give_up(self, model: str, turns: Turns[A]) -> Dispatched[A]:
        last = turns.failures[-1]
        if last.answer is not None:  # the replica's own answer says why (with Retry-After)
            return last.answer, turns.held is not None
        tried = "; then ".join(f.detail for f in turns.failures)
        return turns.refuse(Refusal("gave-up", model, detail=tried))

    async def _hold(self, call: Call[A], turns: Turns[A], step: Step) -> Dispatched[A] | None:
        now = self.clock()
        if turns.held is None:
            refused = await self._begin(call, turns, step, now)
            if refused is not None:
                return refused
        held = turns.held
        assert held is not None
        failure = self.loads.failure(call.model, since=held.held_at)
        if failure is not None:
            return turns.refuse(Refusal("load-failed", call.model, failure=failure))
        if step.replica is not None:
            self.loads.start(step.replica, call.model)
        deadline = self.holds.deadline(held)
        ended = hold_end(now, deadline, held.deadline)
        if ended is not None:
            turns.outcome = ended
            retry = self.holds.retry_after(call.model)
            reason = step.reason or ""
            return turns.refuse(Refusal(ended, call.model, reason, now - held.held_at, "", retry))
        turns.cold = turns.cold or not step.slot
        if step.slot and not turns.in_line:
            self.metrics.slot_waits.inc()
        if await call.wait(self.holds.wait(step.slot, deadline - now, turns.in_line)):
            turns.in_line = turns.in_line or step.slot
        return None

    async def _begin(
        self, call: Call[A], turns: Turns[A], step: Step, now: float
    ) -> Dispatched[A] | None:
        """Hold the request from now (None), or why it is not held."""
        if call.gone():  # never held, never demand
            return turns.refuse(Refusal("gone", call.model))
        seconds = await call.hold_seconds()
        refusal = admit(self.holds.count, self.holds.bytes, call.size, self.holds.limits)
        if refusal is not None:
            self.metrics.hold_outcome["full"].inc()
            retry = self.holds.retry_after(call.model, full=True)
            return turns.refuse(Refusal("full", call.model, step.reason or "", 0.0, refusal, retry))
        turns.held = self.holds.begin(call.model, call.size, now, now + seconds)
        turns.holding = True
        return None
