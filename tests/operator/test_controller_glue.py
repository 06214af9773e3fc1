"""Tables for the control loop's pure glue (tidal.operator.core.control): spec -> deciders'
inputs, decisions -> children, status conditions and Events."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from isvc_fixtures import minimal

from tidal.operator.core.api import (
    LABEL_POOL,
    ConditionStatus,
    PoolName,
    parse_inference_service,
)
from tidal.operator.core.autoscaler import (
    Observation,
    ScalerState,
    ScalingPolicy,
    decide_scale,
)
from tidal.operator.core.autoscaler_pods import PodView, choose_standby
from tidal.operator.core.control import (
    ANNOTATION_TEMPLATE_HASH,
    combine_observations,
    follow_planner,
    initial_scaler_state,
    metrics_condition,
    overflow_observation,
    plan_children,
    prewarmed_condition,
    primary_template_hash,
    restore_rollout_state,
    rfc3339_ms,
    role_targets,
    rollout_spec_of,
    rollout_status,
    scale_event,
    scaling_condition,
    slo_policy_of,
    stamp_template_hash,
)
from tidal.operator.core.resources import Observed, desired_objects
from tidal.operator.core.rollout import (
    PoolObservation,
    RolloutObservation,
    Traffic,
    plan_rollout,
)
from tidal.operator.core.slo import PoolSignals

BASELINE = {"baseline": {"minReplicas": 1}}


def isvc(**spec: object):  # type: ignore[no-untyped-def]
    return parse_inference_service(minimal(**spec))


def decision_for(obs: Observation, policy: ScalingPolicy | None = None):  # type: ignore[no-untyped-def]
    return decide_scale(policy or ScalingPolicy(max_replicas=6), obs, ScalerState())[0]


@pytest.mark.parametrize(
    ("replicas", "standby", "expected"),
    [(None, 0, None), (1, 0, 1), (3, 1, 2), (1, 1, 1), (20, 0, 10)],
)
def test_initial_scaler_state_does_not_count_standby_as_serving(
    replicas: int | None, standby: int, expected: int | None
) -> None:
    policy = ScalingPolicy(min_replicas=1, max_replicas=10, standby_replicas=standby)
    assert initial_scaler_state(policy, replicas).desired_serving == expected


def test_slo_policy_reads_units_from_the_spec() -> None:
    svc = isvc(
        rollout={
            **BASELINE,
            "slo": {"p99Ms": 80, "for": "1m30s", "gpuMemoryHeadroom": "10%", "minRequests": 5},
            "onBreach": "alert",
        }
    )
    policy = slo_policy_of(svc)
    assert (policy.p99_ms, policy.for_seconds, policy.gpu_memory_headroom) == (80, 90, 0.1)
    assert policy.min_requests == 5 and policy.on_breach.value == "alert"


@pytest.mark.parametrize(
    ("rollout", "has_planner"),
    [({}, False), (BASELINE, True), ({**BASELINE, "activePool": "baseline"}, True)],
)
def test_planner_only_with_a_baseline(rollout: dict[str, object], has_planner: bool) -> None:
    spec = rollout_spec_of(isvc(rollout=rollout), "h1")
    assert (spec is not None) is has_planner


def test_template_hash_ignores_replicas_and_its_own_annotation() -> None:
    svc = isvc()
    one = desired_objects(svc, Observed(replicas={PoolName.PRIMARY: 1}))
    three = desired_objects(svc, Observed(replicas={PoolName.PRIMARY: 3}))
    digest = stamp_template_hash(one, svc.name)
    assert digest == primary_template_hash(three, svc.name) == primary_template_hash(one, svc.name)
    deployment = next(o for o in one if o["kind"] == "Deployment")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations[ANNOTATION_TEMPLATE_HASH] == digest
    changed = isvc(runtime={"backend": "onnxruntime", "env": [{"name": "A", "value": "1"}]})
    assert primary_template_hash(desired_objects(changed, Observed()), svc.name) != digest


def test_combine_observations_adds_counts_and_keeps_the_worst_p99() -> None:
    a = Observation(
        now=5, ready_serving=2, warming=1, queue_depth=3, hot_p99_ms=40, arrival_rate=10
    )
    b = Observation(now=6, ready_serving=1, queue_depth=1, hot_p99_ms=90, arrival_rate=5)
    both = combine_observations([a, b])
    assert (both.ready_serving, both.warming, both.queue_depth) == (3, 1, 4)
    assert (both.hot_p99_ms, both.arrival_rate, both.now) == (90, 15, 6)
    missing = combine_observations([a, Observation(now=6, ready_serving=1, queue_depth=None)])
    assert missing.queue_depth is None  # half a picture holds the autoscaler


def test_plan_children_single_pool_takes_serving_plus_standby() -> None:
    svc = isvc(autoscaling={"minReplicas": 1, "maxReplicas": 6, "standbyReplicas": 1})
    policy = ScalingPolicy(max_replicas=6, standby_replicas=1)
    obs = Observation(now=0, ready_serving=1, queue_depth=20, arrival_rate=None)
    decision = decision_for(obs, policy)
    observed = plan_children(svc, decision, None, {PoolName.PRIMARY: 2})
    assert observed.replicas[PoolName.PRIMARY] == decision.desired_total
    assert decision.desired_total > 2 and observed.active_pool is PoolName.PRIMARY


def test_role_targets_keep_the_autoscalers_standby_only_where_one_pool_serves() -> None:
    policy = ScalingPolicy(max_replicas=6, standby_replicas=1)
    decision = decision_for(Observation(now=0, ready_serving=1, queue_depth=0), policy)
    assert decision.desired_standby == 1
    alone = role_targets((PoolName.BASELINE,), decision)
    assert alone == {PoolName.BASELINE: (decision.desired_serving, 1)}
    split = role_targets((PoolName.PRIMARY, PoolName.BASELINE), decision)
    assert set(split) == {PoolName.PRIMARY, PoolName.BASELINE}
    # The demo's case (CI): a new primary's only pod was demoted to standby while the primary
    # still served alone; in the 50 % step it must serve, or the step never sees a sample.
    primary = [PodView("primary-new", ready=True, standby=True, ready_for_seconds=30)]
    baseline = [
        PodView("baseline-a", ready=True),
        PodView("baseline-b", ready=True, standby=True, ready_for_seconds=5),
    ]
    for pool, pods in ((PoolName.PRIMARY, primary), (PoolName.BASELINE, baseline)):
        assignment = choose_standby(pods, *split[pool])
        assert set(assignment.serving) == {p.name for p in pods}, pool
        assert assignment.promote == tuple(p.name for p in pods if p.standby), pool
        assert assignment.standby == assignment.demote == (), pool


def test_the_baselines_rollback_reserve_waits_as_standby_during_a_split() -> None:
    from tidal.operator.core.rollout import RolloutSpec, RolloutState

    spec = RolloutSpec(primary_hash="h2", steps=(50, 100))
    state = RolloutState(
        traffic=Traffic.SPLIT,
        applied_hash="h2",
        promoted_hash="h1",
        step=0,
        step_ready_at=0.0,
        reserve=4,
    )
    obs = RolloutObservation(
        primary=PoolObservation(ready_replicas=2),
        baseline=PoolObservation(ready_replicas=4),
        autoscaler_desired=4,
    )
    rollout, _ = plan_rollout(spec, obs, state, 1.0)
    assert rollout.baseline_standby == 2 and rollout.desired_replicas.baseline == 4
    decision = decision_for(Observation(now=0, ready_serving=4, queue_depth=0), ScalingPolicy())
    targets = role_targets((PoolName.PRIMARY, PoolName.BASELINE), decision, (), rollout)
    assert targets[PoolName.BASELINE] == (2, 2)
    pods = [PodView(f"baseline-{i}", ready=True, ready_for_seconds=60) for i in range(4)]
    assignment = choose_standby(pods, *targets[PoolName.BASELINE])
    assert len(assignment.serving) == 2 and len(assignment.standby) == 2
    # Without a reserve every ready pod of both pools serves, as before.
    no_reserve = role_targets((PoolName.PRIMARY, PoolName.BASELINE), decision)
    assert no_reserve[PoolName.BASELINE][1] == 0


def test_overflow_observation_sizes_the_primary_for_all_demand_with_its_own_capacity() -> None:
    primary = Observation(now=5, ready_serving=4, warming=4, queue_depth=12, arrival_rate=80)
    baseline = Observation(now=5, ready_serving=2, queue_depth=3, arrival_rate=30)
    seen = overflow_observation(primary, baseline)
    assert (seen.arrival_rate, seen.queue_depth) == (110, 15)
    assert (seen.ready_serving, seen.warming) == (4, 4)  # the baseline is not its capacity
    unknown = overflow_observation(primary, Observation(now=5, ready_serving=2, queue_depth=None))
    assert unknown.queue_depth == 12 and unknown.arrival_rate == 80


def test_an_overflow_selects_both_pools_and_keeps_the_standby_with_the_primary() -> None:
    svc = isvc(
        autoscaling={"minReplicas": 1, "maxReplicas": 10, "standbyReplicas": 1},
        rollout={"baseline": {"minReplicas": 2, "overflow": True}},
    )
    spec = rollout_spec_of(svc, "h1")
    assert spec is not None and spec.overflow
    obs = RolloutObservation(
        primary=PoolObservation(ready_replicas=4),
        baseline=PoolObservation(ready_replicas=2),
        autoscaler_desired=8,
    )
    rollout, _ = plan_rollout(spec, obs, None, 0.0)
    assert rollout.traffic is Traffic.OVERFLOW
    policy = ScalingPolicy(max_replicas=10, standby_replicas=1)
    scale = decision_for(Observation(now=0, ready_serving=4, queue_depth=0), policy)
    observed = plan_children(svc, scale, rollout, {PoolName.PRIMARY: 5, PoolName.BASELINE: 2})
    assert observed.split  # the Service selects the serving pods of both pools
    assert observed.replicas[PoolName.PRIMARY] == 8 + scale.desired_standby
    assert observed.replicas[PoolName.BASELINE] == 2
    targets = role_targets((PoolName.PRIMARY,), scale, (PoolName.BASELINE,))
    assert targets[PoolName.PRIMARY] == (scale.desired_serving, scale.desired_standby)
    assert targets[PoolName.BASELINE][1] == 0  # every ready baseline pod serves
    service = next(o for o in desired_objects(svc, observed) if o["kind"] == "Service")
    assert LABEL_POOL not in service["spec"]["selector"]


def test_plan_children_keeps_a_manual_replica_count() -> None:
    svc = isvc(replicas=3)
    observed = plan_children(svc, None, None, {PoolName.PRIMARY: 3})
    assert observed.replicas == {PoolName.PRIMARY: 3}


def _rollout(svc, primary_signals: PoolSignals, state=None, now=0.0):  # type: ignore[no-untyped-def]
    spec = rollout_spec_of(svc, "h1")
    assert spec is not None
    obs = RolloutObservation(
        primary=PoolObservation(ready_replicas=1, signals=primary_signals),
        baseline=PoolObservation(ready_replicas=1),
        autoscaler_desired=1,
    )
    return plan_rollout(spec, obs, state, now)


def test_plan_children_routes_where_the_planner_says_and_state_round_trips() -> None:
    svc = isvc(rollout={**BASELINE, "slo": {"p99Ms": 50, "for": "5s", "minRequests": 1}})
    bad = PoolSignals(p99_hot_ms=200, requests=100, observed_at=0.0)
    decision, state = _rollout(svc, bad, None, 0.0)
    assert decision.traffic is Traffic.PRIMARY
    observed = plan_children(svc, None, decision, {})
    assert observed.active_pool is PoolName.PRIMARY
    # Persisted in status and read back by a restarted operator: the breach clock goes on.
    restored = restore_rollout_state(rollout_status(decision, state))
    assert restored == state
    later = PoolSignals(p99_hot_ms=200, requests=100, observed_at=6.0)
    decision, state = _rollout(svc, later, restored, 6.0)
    assert decision.traffic is Traffic.BASELINE and decision.rollback is not None
    observed = plan_children(svc, None, decision, {})
    assert observed.active_pool is PoolName.BASELINE and not observed.split
    assert observed.replicas[PoolName.PRIMARY] == 1  # control group
    assert json.loads(rollout_status(decision, state).state)["rollback"]["switchedAt"] == 6.0


def test_follow_planner_only_clears_a_manual_pin() -> None:
    pinned = isvc(rollout={**BASELINE, "activePool": "baseline"})
    assert follow_planner(pinned).spec.rollout.active_pool.value == "auto"
    assert follow_planner(pinned).spec.models == pinned.spec.models
    auto = isvc(rollout=BASELINE)
    assert follow_planner(auto) is auto


@pytest.mark.parametrize(
    ("ready", "warming", "queue", "status", "reason"),
    [
        (1, 0, 0.0, ConditionStatus.FALSE, "Steady"),
        (1, 0, 6.0, ConditionStatus.TRUE, "SurgeQueue"),
        (1, 0, None, ConditionStatus.FALSE, "HoldMetricsMissing"),
        (2, 1, 0.0, ConditionStatus.TRUE, None),
    ],
)
def test_scaling_condition(
    ready: int, warming: int, queue: float | None, status: ConditionStatus, reason: str | None
) -> None:
    obs = Observation(now=0, ready_serving=ready, warming=warming, queue_depth=queue)
    decision = decision_for(obs)
    kind, got, why, message = scaling_condition(decision, obs, manual=False)
    assert (kind, got) == ("Scaling", status)
    if reason is not None:
        assert why == reason
    assert decision.reason in message


def test_scaling_condition_manual() -> None:
    assert scaling_condition(None, None, manual=True)[2] == "Manual"


@pytest.mark.parametrize(
    ("standby_asked", "standby_ready", "status", "reason"),
    [
        (0, 0, ConditionStatus.TRUE, "NoStandby"),
        (1, 1, ConditionStatus.TRUE, "StandbyReady"),
        (1, 0, ConditionStatus.FALSE, "StandbyWarming"),
    ],
)
def test_prewarmed_condition(
    standby_asked: int, standby_ready: int, status: ConditionStatus, reason: str
) -> None:
    policy = ScalingPolicy(max_replicas=6, standby_replicas=standby_asked)
    obs = Observation(now=0, ready_serving=1, ready_standby=standby_ready, queue_depth=0)
    decision = decision_for(obs, policy)
    assert prewarmed_condition(decision, obs)[1:3] == (status, reason)


@pytest.mark.parametrize(
    ("queue", "age", "status", "reason"),
    [
        (0.0, 0.1, ConditionStatus.FALSE, "Fresh"),
        (None, 0.1, ConditionStatus.TRUE, "MetricsMissing"),
        (1.0, 60.0, ConditionStatus.TRUE, "MetricsStale"),
    ],
)
def test_metrics_condition_says_when_the_pool_is_held(
    queue: float | None, age: float, status: ConditionStatus, reason: str
) -> None:
    obs = Observation(now=0, ready_serving=1, queue_depth=queue, metrics_age_seconds=age)
    verdict = metrics_condition(decision_for(obs), ["queue:missing"])
    assert verdict[1:3] == (status, reason)


def test_metrics_condition_says_prometheus_is_unavailable_while_pods_drive_scale_up() -> None:
    obs = Observation(now=0, ready_serving=1, queue_depth=1.0, prometheus_unavailable=True)
    notes = ["prometheus:unavailable (ConnectionError: refused)", "p99:missing prometheus"]
    verdict = metrics_condition(decision_for(obs), notes)
    assert verdict[1:3] == (ConditionStatus.TRUE, "PrometheusUnavailable")
    assert "no scale-down" in verdict[3] and "refused" in verdict[3]


def test_scale_event_only_on_change() -> None:
    obs = Observation(now=0, ready_serving=1, queue_depth=30)
    decision = decision_for(obs)
    assert scale_event(PoolName.PRIMARY, None, decision) is None
    assert scale_event(PoolName.PRIMARY, decision.desired_total, decision) is None
    kind, reason, message = scale_event(PoolName.PRIMARY, 1, decision)  # type: ignore[misc]
    assert (kind, reason) == ("Normal", "ScaledUp") and decision.reason in message


def test_decision_time_keeps_milliseconds() -> None:
    at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    assert rfc3339_ms(at) == "2026-01-02T03:04:05.678Z"


@pytest.mark.parametrize(
    ("autoscaling", "utilization", "queue_depth"),
    [
        ({}, 0.7, None),
        ({"targetUtilization": 0.5}, 0.5, None),
        ({"targetQueueDepth": 3}, 0.7, 3.0),
    ],
)
def test_scaling_policy_reads_the_target_from_the_spec(
    autoscaling: dict[str, object], utilization: float, queue_depth: float | None
) -> None:
    from tidal.operator.core.control import scaling_policy_of

    policy = scaling_policy_of(isvc(autoscaling=autoscaling))
    assert policy.target_utilization == utilization
    assert policy.target_queue_depth == queue_depth


def test_provisional_view_holds_the_pools_where_the_last_operator_left_them() -> None:
    from tidal.operator.core.api import AutoscalerStatus, InferenceServiceStatus, RolloutStatus
    from tidal.operator.core.control import provisional_view

    assert provisional_view(None, {}) is None
    assert provisional_view(InferenceServiceStatus(), {}) is None
    previous = InferenceServiceStatus.model_validate(
        {
            "pools": {"primary": {"desired": 6}, "baseline": {"desired": 2}},
            "activePool": "baseline",
            "autoscaler": {"state": "{}"},
        }
    )
    # Deployments not listed yet: the previous operator's asks; listed ones win.
    view = provisional_view(previous, {PoolName.BASELINE: 3})
    assert view is not None
    assert dict(view.observed.replicas) == {PoolName.PRIMARY: 6, PoolName.BASELINE: 3}
    assert view.observed.active_pool is PoolName.BASELINE and not view.observed.split
    assert view.status.autoscaler == AutoscalerStatus(state="{}")
    assert view.status.conditions == ()
    # Mid-overflow or mid-step the Service keeps selecting both pools.
    for traffic in ("split", "overflow"):
        mid = previous.model_copy(update={"rollout": RolloutStatus(traffic=traffic)})
        held = provisional_view(mid, {})
        assert held is not None and held.observed.split, traffic


def test_scaling_condition_names_pending_pods_whatever_the_decision() -> None:
    obs = Observation(now=0, ready_serving=2, pending_unschedulable=1, queue_depth=0.0)
    verdict = scaling_condition(decision_for(obs), obs, False)
    assert verdict[1:3] == (ConditionStatus.TRUE, "Unschedulable")
    assert "1 pod(s) pending unschedulable" in verdict[3]


def test_a_change_of_the_pods_problems_is_written_at_once() -> None:
    """Degraded follows the pods' problems: a pod that cannot start (a missing credentials
    Secret) keeps no probe or timer busy, so a quiet loop would hold the news until its next
    periodic write; a metrics-only change waits for that write."""
    from tidal.operator.core.control import ControlStatus, ControlView, urgent_change

    quiet = ControlView(Observed(), ControlStatus())
    stuck = ControlView(
        Observed(),
        ControlStatus(pod_problems=("pool primary: pod p not ready: cannot start: ...",)),
    )
    assert urgent_change(None, quiet)
    assert urgent_change(quiet, stuck)
    assert urgent_change(stuck, quiet)
    assert not urgent_change(quiet, ControlView(Observed(), ControlStatus()))


def test_zero_policy_of_takes_the_specs_timer_and_the_operators_wake_margin() -> None:
    from tidal.operator.core.control import zero_policy_of

    service = isvc(autoscaling={"minReplicas": 0, "scaleToZeroAfterSeconds": 45})
    zero = zero_policy_of(service, 12.5)
    assert (zero.after_seconds, zero.wake_margin_seconds) == (45.0, 12.5)
