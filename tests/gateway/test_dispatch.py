"""Each turn of a request's dispatch, as both fronts take it (tidal.gateway.core.dispatch)."""

from __future__ import annotations

import pytest

from tidal.gateway.core.dispatch import Step, hold_end, least_busy, next_step, tries
from tidal.gateway.core.routing import ReplicaView, Route

ROUTES = [
    # (route, may_hold, the step)
    (
        Route("forward", "busy:extra-copy", "r0", extra_load="r1"),
        True,
        Step("forward", "busy:extra-copy", "r0", "r1"),
    ),
    (Route("load", "cold:load-placed", "r2"), True, Step("hold", "cold:load-placed", "r2")),
    (Route("wait", "cold:wait-loading", "r1"), True, Step("hold", "cold:wait-loading")),
    (Route("wait", "busy:wait-slot"), True, Step("hold", "busy:wait-slot", slot=True)),
    (
        Route("reject", "unavailable:no-replica", status=503),
        True,
        Step("hold", "unavailable:no-replica"),
    ),
    (Route("reject", "unknown:model", status=404), True, Step("unknown", "unknown:model")),
    # A request that may not be held (metadata) goes to the replica loading the model, or the
    # one that would load it: it answers for the model without a load being started.
    (
        Route("load", "cold:load-most-free", "r2"),
        False,
        Step("forward", "cold:load-most-free", "r2"),
    ),
    (Route("wait", "cold:wait-loading", "r1"), False, Step("forward", "cold:wait-loading", "r1")),
    (
        Route("reject", "unavailable:load-limit", status=503),
        False,
        Step("unavailable", "unavailable:load-limit"),
    ),
    (Route("reject", "unknown:model", status=404), False, Step("unknown", "unknown:model")),
]


@pytest.mark.parametrize(("route", "may_hold", "step"), ROUTES)
def test_each_route_becomes_one_step_for_both_fronts(
    route: Route, may_hold: bool, step: Step
) -> None:
    assert next_step(route, may_hold=may_hold) == step, (route, may_hold)


def _view(name: str, outstanding: int, healthy: bool = True) -> ReplicaView:
    return ReplicaView(name, healthy, frozenset(), frozenset(), outstanding=outstanding)


def test_a_call_naming_no_model_goes_to_the_least_busy_healthy_replica() -> None:
    views = [_view("a", 3), _view("b", 1), _view("c", 0, healthy=False), _view("d", 1)]
    assert least_busy(views, frozenset()) == Step("forward", None, "b")
    assert least_busy(views, frozenset({"b"})).replica == "d"
    step = least_busy(views, frozenset({"a", "b", "d"}))
    assert step.action == "unavailable", step


def test_a_request_that_may_be_held_gets_a_third_replica_after_a_refusal() -> None:
    assert tries(may_hold=False, refused=0) == 2
    assert tries(may_hold=False, refused=1) == 2
    assert tries(may_hold=True, refused=0) == 2
    assert tries(may_hold=True, refused=1) == 3


def test_a_hold_ends_at_its_deadline_or_at_the_drain_whichever_is_first() -> None:
    assert hold_end(now=5.0, deadline=10.0, own_deadline=10.0) is None
    assert hold_end(now=10.0, deadline=10.0, own_deadline=10.0) == "expired"
    assert hold_end(now=7.0, deadline=7.0, own_deadline=10.0) == "drained"
    assert hold_end(now=6.9, deadline=7.0, own_deadline=10.0) is None
