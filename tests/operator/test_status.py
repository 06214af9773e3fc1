"""compute_status: conditions, replica counts and Events, with injected time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tidal.operator.core.api import ConditionStatus, InferenceServiceStatus, PoolName
from tidal.operator.core.control import ControlStatus
from tidal.operator.core.status import (
    CONFLICTING_SETTINGS,
    DEGRADED,
    INEFFECTIVE_SETTING,
    PROGRESSING,
    READY,
    DeploymentState,
    PodState,
    StatusInput,
    compute_status,
)

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
PRIMARY = PoolName.PRIMARY


def _steady(n: int) -> DeploymentState:
    return DeploymentState(
        generation=1,
        observed_generation=1,
        spec_replicas=n,
        replicas=n,
        ready_replicas=n,
        updated_replicas=n,
        available_replicas=n,
    )


def _pods(
    ready: int = 0, warming: int = 0, standby: int = 0, pool: str = "primary"
) -> list[PodState]:
    return (
        [PodState(pool, "serving", True)] * ready
        + [PodState(pool, "serving", False)] * warming
        + [PodState(pool, "standby", True)] * standby
    )


def _input(**kw: object) -> StatusInput:
    base: dict[str, object] = {
        "generation": 3,
        "now": T0,
        "isvc_name": "svc",
        "active_pool": PRIMARY,
        "desired": {PRIMARY: 2},
        "deployments": {PRIMARY: _steady(2)},
        "pods": _pods(2),
    }
    base.update(kw)
    return StatusInput(**base)  # type: ignore[arg-type]


def _cond(status: InferenceServiceStatus, kind: str) -> tuple[str, str]:
    (c,) = [c for c in status.conditions if c.type == kind]
    return c.status.value, c.reason


@pytest.mark.parametrize(
    ("kw", "ready", "progressing", "degraded"),
    [
        ({}, ("True", "Serving"), ("False", "Complete"), ("False", "AsExpected")),
        (
            {"pods": _pods(0, 2), "deployments": {}},
            ("False", "Warming"),
            ("True", "Creating"),
            ("False", "AsExpected"),
        ),
        (
            {
                "pods": _pods(1, 1),
                "deployments": {
                    PRIMARY: DeploymentState(
                        generation=2, observed_generation=2, spec_replicas=2, updated_replicas=1
                    )
                },
            },
            ("True", "Serving"),
            ("True", "RollingOut"),
            ("False", "AsExpected"),
        ),
        (
            {
                "pods": _pods(1),
                "deployments": {
                    PRIMARY: DeploymentState(
                        generation=2, observed_generation=2, spec_replicas=2, updated_replicas=2
                    )
                },
            },
            ("True", "Serving"),
            ("True", "ScalingUp"),
            ("False", "AsExpected"),
        ),
        ({"pods": _pods(3)}, ("True", "Serving"), ("True", "ScalingDown"), ("False", "AsExpected")),
        (
            {
                "desired": {PRIMARY: 0},
                "pods": [],
                "deployments": {PRIMARY: _steady(0)},
                "previous": compute_status(_input()).status,  # it served before
            },
            ("True", "ScaledToZero"),
            ("False", "Complete"),
            ("False", "AsExpected"),
        ),
        (
            # At zero without ever having served: nothing shows it works (issue 31).
            {"desired": {PRIMARY: 0}, "pods": [], "deployments": {PRIMARY: _steady(0)}},
            ("False", "NotYetServed"),
            ("False", "Complete"),
            ("False", "AsExpected"),
        ),
        (
            {"problems": ["no engine"], "pods": [], "deployments": {}},
            ("False", "InvalidSpec"),
            ("False", "InvalidSpec"),
            ("True", "InvalidSpec"),
        ),
        (
            {"problems": ["no engine"]},  # old pods still serve while the spec is fixed
            ("True", "Serving"),
            ("False", "InvalidSpec"),
            ("True", "InvalidSpec"),
        ),
        (
            {"error": "HTTP 500"},
            ("True", "Serving"),
            ("False", "Complete"),
            ("True", "ReconcileError"),
        ),
        (
            {
                "deployments": {
                    PRIMARY: DeploymentState(
                        generation=1,
                        observed_generation=1,
                        spec_replicas=2,
                        updated_replicas=2,
                        failure="exceeded quota",
                    )
                }
            },
            ("True", "Serving"),
            ("False", "Complete"),
            ("True", "DeploymentFailed"),
        ),
        (
            {"pods": _pods(0)},
            ("False", "NoReadyReplicas"),
            ("True", "ScalingUp"),
            ("False", "AsExpected"),
        ),
        (
            {
                "pods": _pods(0, 1),
                "control": ControlStatus(
                    pod_problems=("pool primary: pod p-1 not ready: m: sha256 mismatch",)
                ),
            },
            ("False", "Warming"),
            ("True", "ScalingUp"),
            ("True", "EngineLoadFailed"),
        ),
    ],
)
def test_conditions(
    kw: dict[str, object],
    ready: tuple[str, str],
    progressing: tuple[str, str],
    degraded: tuple[str, str],
) -> None:
    status = compute_status(_input(**kw)).status
    assert _cond(status, READY) == ready
    assert _cond(status, PROGRESSING) == progressing
    assert _cond(status, DEGRADED) == degraded


def test_counts_separate_ready_warming_and_standby() -> None:
    status = compute_status(_input(pods=_pods(2, 1, 1), desired={PRIMARY: 4})).status
    assert (status.ready_replicas, status.warming_replicas, status.standby_replicas) == (2, 1, 1)
    assert status.replicas == 4
    assert status.desired_replicas == 4
    assert status.selector == "serving.tidal.dev/isvc=svc,serving.tidal.dev/pool=primary"


def test_ready_message_counts_the_standby_that_desired_includes() -> None:
    # Issue 40 item 5: 3 serving + 1 standby of 4 asked for is the decided split, not a
    # replica down; the message must not read as one.
    status = compute_status(_input(pods=_pods(3, 0, 1), desired={PRIMARY: 4})).status
    (ready,) = [c for c in status.conditions if c.type == READY]
    assert ready.message == (
        "3 of 4 replicas of pool primary ready and serving, 1 ready as standby"
    ), ready.message


def test_terminating_pods_do_not_count() -> None:
    pods = [*_pods(2), PodState("primary", "serving", True, terminating=True)]
    assert compute_status(_input(pods=pods)).status.replicas == 2


def test_counts_are_per_pool_and_top_level_follows_the_active_pool() -> None:
    baseline = PoolName.BASELINE
    status = compute_status(
        _input(
            active_pool=baseline,
            desired={PRIMARY: 2, baseline: 1},
            deployments={PRIMARY: _steady(2), baseline: _steady(1)},
            pods=_pods(2) + _pods(1, pool="baseline"),
        )
    ).status
    assert status.active_pool is baseline
    assert status.ready_replicas == 1
    assert status.pools["primary"].ready == 2


def test_recomputing_is_a_fixed_point() -> None:
    first = compute_status(_input()).status
    again = compute_status(_input(previous=first, now=T0 + timedelta(minutes=5)))
    assert again.status == first
    assert again.events == ()


def test_transition_time_changes_only_with_status() -> None:
    first = compute_status(_input()).status
    later = T0 + timedelta(minutes=5)
    broken = compute_status(_input(previous=first, now=later, pods=_pods(0))).status
    ready = {c.type: c for c in broken.conditions}[READY]
    assert ready.status is ConditionStatus.FALSE
    assert ready.last_transition_time == "2026-01-01T12:05:00Z"
    degraded = {c.type: c for c in broken.conditions}[DEGRADED]
    assert degraded.last_transition_time == "2026-01-01T12:00:00Z"


def test_events_for_transitions() -> None:
    first = compute_status(_input(pods=_pods(0, 2), deployments={}))
    assert first.events == ()  # a new object's first status is no change
    ready = compute_status(_input(previous=first.status))
    assert [(e.type, e.reason) for e in ready.events] == [
        ("Normal", "ReadyTrue"),
        ("Normal", "ProgressingFalse"),
    ]
    lost = compute_status(_input(previous=ready.status, pods=_pods(0)))
    assert ("Warning", "ReadyFalse") in [(e.type, e.reason) for e in lost.events]


def test_degraded_event_names_the_problem_and_repeats_when_it_changes() -> None:
    a = compute_status(_input(problems=["model 'm' has no engine"]))
    (event,) = [e for e in a.events if e.reason == "InvalidSpec"]
    assert event.type == "Warning"
    assert "model 'm' has no engine" in event.message
    same = compute_status(_input(previous=a.status, problems=["model 'm' has no engine"]))
    assert [e for e in same.events if e.reason == "InvalidSpec"] == []
    other = compute_status(_input(previous=a.status, error="HTTP 500"))
    assert [e.reason for e in other.events if e.type == "Warning"] == ["ReconcileError"]


def test_an_ineffective_setting_is_degraded_while_the_service_serves() -> None:
    warning = "spec.autoscaling.maxStandbyReplicas 2 equals standbyReplicas: ..."
    first = compute_status(_input())
    warned = compute_status(_input(previous=first.status, warnings=[warning]))
    by_type = {c.type: c for c in warned.status.conditions}
    assert by_type[DEGRADED].status is ConditionStatus.TRUE
    assert by_type[DEGRADED].reason == INEFFECTIVE_SETTING
    assert warning in by_type[DEGRADED].message
    assert by_type[READY].status is ConditionStatus.TRUE  # serving goes on
    (event,) = [e for e in warned.events if e.reason == INEFFECTIVE_SETTING]
    assert event.type == "Warning" and warning in event.message
    # A spec problem outranks it (the children wait for a spec that can work).
    both = compute_status(_input(previous=first.status, warnings=[warning], problems=["x"]))
    assert {c.type: c for c in both.status.conditions}[DEGRADED].reason == "InvalidSpec"
    # Fixing the setting clears Degraded.
    fixed = compute_status(_input(previous=warned.status))
    assert {c.type: c for c in fixed.status.conditions}[DEGRADED].status is ConditionStatus.FALSE


def test_conflicting_settings_are_degraded_and_outrank_an_ineffective_one() -> None:
    conflict = "spec.fleet.gateway.holdTimeoutSeconds 5 is shorter than ..."
    first = compute_status(_input())
    both = compute_status(
        _input(previous=first.status, warnings=["spec.x never acts"], conflicts=[conflict])
    )
    by_type = {c.type: c for c in both.status.conditions}
    assert by_type[DEGRADED].status is ConditionStatus.TRUE
    assert by_type[DEGRADED].reason == CONFLICTING_SETTINGS
    assert by_type[DEGRADED].message == conflict
    assert by_type[READY].status is ConditionStatus.TRUE  # serving goes on
    (event,) = [e for e in both.events if e.reason == CONFLICTING_SETTINGS]
    assert event.type == "Warning" and conflict in event.message
    # Resolving the conflict leaves the ineffective setting, with an Event of its own.
    rest = compute_status(_input(previous=both.status, warnings=["spec.x never acts"]))
    assert {c.type: c for c in rest.status.conditions}[DEGRADED].reason == INEFFECTIVE_SETTING
    assert [e.reason for e in rest.events] == [INEFFECTIVE_SETTING]


def test_at_zero_is_healthy_only_after_a_replica_was_ready() -> None:
    at_zero = {"desired": {PRIMARY: 0}, "pods": [], "deployments": {PRIMARY: _steady(0)}}
    warming = compute_status(_input(pods=_pods(warming=1), desired={PRIMARY: 1}))
    never = compute_status(_input(previous=warming.status, **at_zero))
    ready = {c.type: c for c in never.status.conditions}[READY]
    assert (ready.status, ready.reason) == (ConditionStatus.FALSE, "NotYetServed")
    assert "no replica has been Ready yet" in ready.message
    # Once a replica has been Ready, zero is healthy, and stays so across passes at zero.
    served = compute_status(_input(previous=never.status))
    zero = compute_status(_input(previous=served.status, **at_zero))
    again = compute_status(_input(previous=zero.status, **at_zero))
    for result in (zero, again):
        ready = {c.type: c for c in result.status.conditions}[READY]
        assert (ready.status, ready.reason) == (ConditionStatus.TRUE, "ScaledToZero")


def test_conditions_owned_by_others_are_kept() -> None:
    previous = compute_status(_input()).status
    foreign = previous.conditions[0].model_copy(update={"type": "RolledBack"})
    previous = previous.model_copy(update={"conditions": [*previous.conditions, foreign]})
    status = compute_status(_input(previous=previous)).status
    assert "RolledBack" in [c.type for c in status.conditions]


def test_observed_generation_is_the_input_generation() -> None:
    status = compute_status(_input(generation=9)).status
    assert status.observed_generation == 9
    assert all(c.observed_generation == 9 for c in status.conditions)
