"""A service that may scale to zero is fronted by the gateway as an activator: its children
(gateway Deployment, a Service that keeps its name and HTTP port), and which services get one."""

from __future__ import annotations

import json
from typing import Any

import pytest
from isvc_fixtures import minimal

from tidal.gateway.config import load_config
from tidal.operator.core.api import parse_inference_service
from tidal.operator.core.resources import (
    LABEL_COMPONENT,
    Observed,
    desired_objects,
    fronted_by_gateway,
    gateway_config,
)
from tidal.operator.shell.fleet import fronted


def by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


@pytest.mark.parametrize(
    ("spec", "gateway"),
    [
        ({"autoscaling": {"minReplicas": 0}}, True),  # may reach zero: the activator
        ({"autoscaling": {"minReplicas": 1}}, False),
        ({}, False),
        # Manual replicas: the autoscaler (and so zero) is off, whatever minReplicas says.
        ({"replicas": 2, "autoscaling": {"minReplicas": 0}}, False),
        ({"fleet": {}, "memory": {"engineCacheBudget": "1Gi"}}, True),
    ],
)
def test_which_services_are_fronted_by_the_gateway(spec: dict[str, Any], gateway: bool) -> None:
    body = minimal(**spec)
    isvc = parse_inference_service(body)
    assert fronted_by_gateway(isvc) is gateway
    assert fronted(body) is gateway  # the gateway loop's check on the raw body agrees
    objects = by_kind(desired_objects(isvc, Observed()))
    assert (("Deployment", "svc-gateway") in objects) is gateway, sorted(objects)


def test_at_zero_the_service_keeps_its_name_and_ports_and_selects_the_activator() -> None:
    plain = by_kind(desired_objects(parse_inference_service(minimal()), Observed()))
    isvc = parse_inference_service(minimal(autoscaling={"minReplicas": 0}))
    objects = by_kind(desired_objects(isvc, Observed(replicas={})))
    service = objects[("Service", "svc")]
    assert service["spec"]["selector"] == {
        "serving.tidal.dev/isvc": "svc",
        LABEL_COMPONENT: "gateway",
    }
    # The same names, ports and targets (HTTP and gRPC): clients unchanged across a switch.
    assert service["spec"]["ports"] == plain[("Service", "svc")]["spec"]["ports"]
    assert {p["name"] for p in service["spec"]["ports"]} == {"http", "grpc"}
    gateway = objects[("Deployment", "svc-gateway")]
    assert gateway["spec"]["replicas"] == 1
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    # The gateway's container ports carry the names the Service targets.
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 8080,
        "grpc": 8081,
    }
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TIDAL_GRPC_PORT"] == "8081"
    config = json.loads(env["TIDAL_GATEWAY_CONFIG_JSON"])
    assert config == gateway_config(isvc)
    assert config["activator"] is True and config["models"] == ["m"], config
    assert config["replicaGrpcPort"] == 8081  # the runtime pods' gRPC port
    # Every replica preloads its models: the gateway never asks one for another copy.
    assert config["busyOutstanding"] >= 1_000_000
    assert config["holdTimeoutSeconds"] == 120.0  # a GPU replica's wake, twice over


@pytest.mark.parametrize(("hold", "seconds"), [(None, 120.0), (5, 5.0), (600, 600.0)])
def test_the_activator_holds_for_spec_autoscaling_hold_timeout_seconds(
    hold: float | None, seconds: float
) -> None:
    scaling: dict[str, Any] = {"minReplicas": 0}
    if hold is not None:
        scaling["holdTimeoutSeconds"] = hold
    isvc = parse_inference_service(minimal(autoscaling=scaling))
    assert gateway_config(isvc)["holdTimeoutSeconds"] == seconds
    container = by_kind(desired_objects(isvc, Observed()))[("Deployment", "svc-gateway")]
    env = {
        e["name"]: e.get("value")
        for e in container["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    # What the gateway process reads back: the same hold, validated by its own config model.
    assert (
        load_config(
            env={"TIDAL_GATEWAY_CONFIG_JSON": env["TIDAL_GATEWAY_CONFIG_JSON"]}
        ).hold_timeout_seconds
        == seconds
    )


def test_a_fleet_keeps_its_own_gateway_hold() -> None:
    isvc = parse_inference_service(
        minimal(
            fleet={"gateway": {"holdTimeoutSeconds": 7}},
            memory={"engineCacheBudget": "1Gi"},
            autoscaling={"minReplicas": 0},
        )
    )
    assert gateway_config(isvc)["holdTimeoutSeconds"] == 7.0


def test_a_fleet_that_never_reaches_zero_is_no_activator() -> None:
    isvc = parse_inference_service(minimal(fleet={}, memory={"engineCacheBudget": "1Gi"}))
    assert "activator" not in gateway_config(isvc)


def _quantity_bytes(value: str) -> int:
    assert value.endswith("Mi"), value
    return int(value[:-2]) * 2**20


def test_the_activator_pod_asks_for_memory_sized_from_its_byte_budget() -> None:
    isvc = parse_inference_service(minimal(autoscaling={"minReplicas": 0}))
    gateway = by_kind(desired_objects(isvc, Observed()))[("Deployment", "svc-gateway")]
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    budget = load_config(
        env={"TIDAL_GATEWAY_CONFIG_JSON": env["TIDAL_GATEWAY_CONFIG_JSON"]}
    ).max_held_bytes
    resources = container["resources"]
    request = _quantity_bytes(resources["requests"]["memory"])
    limit = _quantity_bytes(resources["limits"]["memory"])
    # The hold full (its budget, ~1.2 bytes of RSS per held byte measured) and the idle process
    # fit in the request; the limit leaves room for bodies in flight; no CPU limit (it would
    # throttle every request through the activator).
    assert request >= 1.2 * budget + 60 * 2**20, (request, budget)
    assert limit > request, resources
    assert "cpu" in resources["requests"] and "cpu" not in resources["limits"], resources
    # Resources the user set for a fleet's gateway stay the user's.
    fleet = parse_inference_service(
        minimal(
            fleet={"gateway": {"resources": {"limits": {"memory": "2Gi"}}}},
            memory={"engineCacheBudget": "1Gi"},
            autoscaling={"minReplicas": 0},
        )
    )
    own = by_kind(desired_objects(fleet, Observed()))[("Deployment", "svc-gateway")]
    assert own["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"memory": "2Gi"}
    }
