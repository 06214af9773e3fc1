"""The burst buffer (issue 40): ``spec.autoscaling.burstBuffer`` puts the gateway in front of a
single-model service, bounding each replica's requests in flight and holding the rest; what it
holds is queued demand for the autoscaler (pure: resources, rules, the observation)."""

from __future__ import annotations

import json

from isvc_fixtures import minimal

from tidal.operator.core.api import parse_inference_service
from tidal.operator.core.autoscaler import Observation, with_gateway_held
from tidal.operator.core.resources import (
    BURST_SLOTS_PER_CONCURRENCY,
    Observed,
    desired_objects,
    fronted_by_gateway,
    gateway_config,
    holds_requests,
)
from tidal.operator.core.rules import find_spec_warnings


def _isvc(**autoscaling: object):  # type: ignore[no-untyped-def]
    return parse_inference_service(minimal(autoscaling=autoscaling))


def test_burst_buffer_fronts_the_service_with_a_holding_gateway() -> None:
    isvc = _isvc(minReplicas=1, burstBuffer=True)
    assert holds_requests(isvc) and fronted_by_gateway(isvc)
    config = gateway_config(isvc)
    assert config["activator"] is True, config  # ready with no replica: it holds
    assert config["slotsPerConcurrency"] == BURST_SLOTS_PER_CONCURRENCY, config
    assert config["holdTimeoutSeconds"] == 120.0, config


def test_the_activator_is_a_burst_buffer_too_and_plain_services_have_none() -> None:
    assert gateway_config(_isvc(minReplicas=0))["slotsPerConcurrency"] > 0
    plain = _isvc(minReplicas=1)
    assert not holds_requests(plain) and not fronted_by_gateway(plain)


def test_the_gateway_deployment_carries_the_burst_config() -> None:
    isvc = _isvc(minReplicas=2, burstBuffer=True)
    deployments = [
        o
        for o in desired_objects(isvc, Observed())
        if o["kind"] == "Deployment" and "gateway" in str(o)
    ]
    env = {
        e["name"]: e.get("value")
        for d in deployments
        for c in d["spec"]["template"]["spec"]["containers"]
        for e in c["env"]
    }
    configs = [json.loads(v) for k, v in env.items() if k.endswith("CONFIG_JSON") and v]
    assert any(c.get("slotsPerConcurrency") for c in configs), env


def test_burst_buffer_in_a_fleet_is_reported_ineffective() -> None:
    manifest = minimal(autoscaling={"burstBuffer": True})
    manifest["spec"]["fleet"] = {}
    manifest["spec"]["memory"] = {"engineCacheBudget": "1Gi"}
    problems = find_spec_warnings(parse_inference_service(manifest))
    assert any("burstBuffer" in str(p) for p in problems), problems


def test_a_hold_timeout_acts_with_the_burst_buffer() -> None:
    problems = find_spec_warnings(_isvc(minReplicas=1, burstBuffer=True, holdTimeoutSeconds=30))
    assert not any("holdTimeoutSeconds" in str(p) for p in problems), problems
    problems = find_spec_warnings(_isvc(minReplicas=1, holdTimeoutSeconds=30))
    assert any("holdTimeoutSeconds" in str(p) for p in problems), problems


def test_held_requests_are_queued_demand_while_awake_and_a_wake_at_zero() -> None:
    awake = Observation(now=0.0, ready_serving=2, queue_depth=8.0)
    assert with_gateway_held(awake, 30).queue_depth == 38.0
    assert with_gateway_held(awake, 0) is awake
    at_zero = Observation(now=0.0, ready_serving=0, queue_depth=0.0)
    assert with_gateway_held(at_zero, 30) is at_zero  # core.idle.held_rate sizes the wake
    unknown = Observation(now=0.0, ready_serving=1, queue_depth=None)
    assert with_gateway_held(unknown, 5) is unknown  # a missing signal stays missing
