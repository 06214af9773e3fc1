"""The control loop's steps in ``core.loop``, each from one tick value: the status it publishes,
the autoscaler's step and its status memory, the role labels, the host-tier moves, the first
decision's wait and the pools that serve."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from tidal.operator.core.api import LABEL_POOL, PoolName, TimeToRoutable
from tidal.operator.core.autoscaler import Observation, ScalingPolicy
from tidal.operator.core.autoscaler_pods import PodView
from tidal.operator.core.control import initial_scaler_state
from tidal.operator.core.loop import (
    HostTierTick,
    ScaleTick,
    StatusTick,
    choose_roles,
    control_status,
    first_decision_ready,
    helping_pools,
    host_tier_moves,
    scale_step,
    serving_pools,
)
from tidal.operator.core.rollout import RolloutState, Traffic
from tidal.operator.core.signals import ObservedPool
from tidal.operator.core.slo import PoolSignals

P, B = PoolName.PRIMARY, PoolName.BASELINE
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Seen:
    observed: ObservedPool
    slo: PoolSignals


def _observation(queue: float = 0.0, ready: int = 2) -> Observation:
    return Observation(now=100.0, ready_serving=ready, queue_depth=queue, arrival_rate=1.0)


def _scale(observation: Observation, **changes: Any) -> ScaleTick:
    policy = ScalingPolicy()
    tick = ScaleTick(policy, (P,), observation, 0, initial_scaler_state(policy, 2), 100.0, 1_000.0)
    return replace(tick, **changes)


def _status(decision: Any, **changes: Any) -> StatusTick:
    observation = _observation()
    tick = StatusTick(
        manual_replicas=False,
        serving=(P,),
        pools={P: Seen(ObservedPool(observation, "pods"), PoolSignals())},
        observation=observation,
        decision=decision,
        rollout=None,
        rollout_state=None,
        now=NOW,
        autoscaler=None,
        routable={P: TimeToRoutable(samples=1, total_seconds=4.0)},
        promote_seconds=None,
        pod_problems=(),
        last_decision=None,
        last_decision_key=None,
    )
    return replace(tick, **changes)


def test_a_new_decision_is_written_once_and_kept_while_it_does_not_change() -> None:
    decision = scale_step(_scale(_observation())).decision
    first = control_status(_status(decision))
    assert first.new_decision and first.status.last_decision is not None, first
    again = control_status(
        _status(
            decision,
            now=NOW.replace(minute=5),
            last_decision=first.status.last_decision,
            last_decision_key=first.decision_key,
        )
    )
    assert not again.new_decision, again
    assert again.status.last_decision == first.status.last_decision  # its time not rewritten


def test_the_promotion_time_reaches_the_serving_pools_time_to_routable_only() -> None:
    decision = scale_step(_scale(_observation())).decision
    observed = ObservedPool(_observation(), "pods")
    pools = {P: Seen(observed, PoolSignals()), B: Seen(observed, PoolSignals())}
    choice = control_status(
        _status(decision, pools=pools, promote_seconds=0.4, routable={B: TimeToRoutable()})
    )
    metrics = choice.status.pool_metrics
    assert metrics[P].time_to_routable == TimeToRoutable(promote_seconds=0.4), metrics
    assert metrics[B].time_to_routable == TimeToRoutable(), metrics


def test_the_status_memory_is_rebuilt_only_when_a_restart_would_decide_differently() -> None:
    first = scale_step(_scale(_observation()))
    same = scale_step(
        _scale(
            _observation(),
            scaler=first.scaler,
            mono=101.0,
            wall=1_001.0,
            published=first.autoscaler,
            published_key=first.autoscaler_key,
        )
    )
    assert same.autoscaler is first.autoscaler, (first.autoscaler_key, same.autoscaler_key)
    busier = scale_step(
        _scale(
            _observation(queue=200.0),
            scaler=first.scaler,
            published=first.autoscaler,
            published_key=first.autoscaler_key,
        )
    )
    assert busier.decision.desired_serving > first.decision.desired_serving, busier.decision
    assert busier.autoscaler_key != first.autoscaler_key
    assert busier.autoscaler is not first.autoscaler


def test_a_standby_pod_neither_kept_nor_serving_serves_again() -> None:
    views = [
        PodView("a", ready=True),
        PodView("b", ready=True, standby=True),
        PodView("c", ready=True, standby=True),
    ]
    assignment, changes = choose_roles(views, 3, 0)
    assert set(assignment.serving) == {"a", "b", "c"}, assignment
    assert sorted(changes) == [("b", "serving"), ("c", "serving")], changes


@pytest.mark.parametrize(
    ("now", "demote", "on_host", "due"),
    [
        (10.0, frozenset({"s1"}), frozenset(), ("s1",)),  # standby 2 s and more: goes
        (9.0, frozenset({"s1"}), frozenset(), ()),  # not long enough yet
        (10.0, frozenset(), frozenset(), ()),  # its demotion waits for endpoints
        (10.0, frozenset({"s1"}), frozenset({"s1"}), ()),  # already there (or moving)
    ],
)
def test_a_standby_pod_goes_host_warm_once_out_of_the_service_for_a_while(
    now: float, demote: frozenset[str], on_host: frozenset[str], due: tuple[str, ...]
) -> None:
    tick = HostTierTick(
        standby=("s1",),
        changes=(("s1", "standby"),),
        demote=demote,
        urls={"s1": "http://s1/v2/tidal/tier"},
        standby_since={"s1": 8.0, "gone": 1.0},
        on_host=on_host,
        now=now,
        after_seconds=2.0,
    )
    since, moves = host_tier_moves(tick)
    assert moves == due, (tick, since)
    assert "gone" not in since  # a pod no longer standby is forgotten
    assert since.get("s1", 8.0) == 8.0


def _pod(name: str, ready: bool) -> dict[str, Any]:
    status = "True" if ready else "False"
    return {
        "metadata": {"name": name, "labels": {LABEL_POOL: "primary"}},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": status}]},
    }


def test_the_first_decision_waits_for_the_pod_cache_or_the_timeout() -> None:
    pods = {P: [_pod("a", True), _pod("b", False)]}
    assert not first_decision_ready(1.0, 10.0, {P: 2}, pods)  # the Deployment reports 2 ready
    assert first_decision_ready(1.0, 10.0, {P: 1}, pods)
    assert first_decision_ready(10.0, 10.0, {P: 2}, pods)  # waited long enough


@pytest.mark.parametrize(
    ("traffic", "serving", "helping"),
    [
        (None, (P,), ()),
        (Traffic.PRIMARY, (P,), ()),
        (Traffic.BASELINE, (B,), ()),
        (Traffic.SPLIT, (P, B), ()),
        (Traffic.OVERFLOW, (P,), (B,)),
    ],
)
def test_which_pools_the_autoscaler_sizes_and_which_help(
    traffic: Traffic | None, serving: tuple[PoolName, ...], helping: tuple[PoolName, ...]
) -> None:
    state = None if traffic is None else RolloutState(traffic=traffic, applied_hash="h")
    assert (serving_pools(state), helping_pools(state)) == (serving, helping), state
