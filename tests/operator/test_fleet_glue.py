"""The fleet's children (gateway Deployment, Service selector), the runtime config under a
fleet, the too-large checks, and the pure glue of the fleet loop (reports, rates, sizes,
gateway documents, status)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from isvc_fixtures import minimal

from tidal.operator.core.api import FleetStatus, PoolName, parse_inference_service
from tidal.operator.core.fleet import (
    DEFAULT_MODEL_BYTES,
    RateState,
    ReplicaReport,
    fleet_status,
    gateway_push,
    model_demands,
    model_load_seconds,
    model_rates,
    model_sizes,
    parse_replica_report,
    placement_rates,
    smooth_rates,
)
from tidal.operator.core.resources import (
    LABEL_COMPONENT,
    Observed,
    desired_objects,
    engine_budget_bytes,
    find_spec_problems,
    gateway_config,
    placement_headroom,
)
from tidal.operator.core.rules import find_spec_warnings
from tidal.operator.core.status import StatusInput, compute_status

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def fleet_isvc(**spec: Any) -> Any:
    models = [
        {"name": f"m{i}", "engines": [{"uri": f"file:///models/m{i}.onnx"}]} for i in range(3)
    ]
    spec = {"models": models, "memory": {"engineCacheBudget": "1Gi"}, "fleet": {}, **spec}
    body = minimal(**spec)
    return parse_inference_service(body)


def by_kind(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objects}


def test_a_fleet_adds_a_gateway_deployment_and_the_service_selects_it() -> None:
    objects = by_kind(desired_objects(fleet_isvc(), Observed()))
    gateway = objects[("Deployment", "svc-gateway")]
    labels = gateway["spec"]["template"]["metadata"]["labels"]
    assert gateway["spec"]["selector"]["matchLabels"] == {
        "serving.tidal.dev/isvc": "svc",
        LABEL_COMPONENT: "gateway",
    }
    assert labels[LABEL_COMPONENT] == "gateway" and "serving.tidal.dev/pool" not in labels
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["tidal-gateway"]
    env = {e["name"]: e for e in container["env"]}
    assert env["TIDAL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    service = objects[("Service", "svc")]
    assert service["spec"]["selector"] == {
        "serving.tidal.dev/isvc": "svc",
        LABEL_COMPONENT: "gateway",
    }
    # The runtime pods keep their own Deployment; its selector cannot match gateway pods.
    runtime = objects[("Deployment", "svc-primary")]
    assert "serving.tidal.dev/pool" in runtime["spec"]["selector"]["matchLabels"]


def test_without_a_fleet_there_is_no_gateway() -> None:
    objects = by_kind(desired_objects(parse_inference_service(minimal()), Observed()))
    assert ("Deployment", "svc-gateway") not in objects
    assert objects[("Service", "svc")]["spec"]["selector"]["serving.tidal.dev/pool"] == "primary"


def test_under_a_fleet_no_model_is_preloaded() -> None:
    import json

    objects = by_kind(desired_objects(fleet_isvc(), Observed()))
    config = json.loads(objects[("ConfigMap", "svc-primary-config")]["data"]["runtime-config.json"])
    assert [m["preload"] for m in config["models"]] == [False, False, False]


def test_gateway_config_names_every_model_of_both_pools_and_the_limits() -> None:
    isvc = fleet_isvc(
        rollout={
            "baseline": {
                "models": [{"name": "old", "engines": [{"uri": "file:///models/old.onnx"}]}]
            }
        },
        fleet={"gateway": {"maxLoadsPerReplica": 2, "holdTimeoutSeconds": 5}},
    )
    config = gateway_config(isvc)
    assert config["models"] == ["m0", "m1", "m2", "old"]
    assert config["maxLoadsPerReplica"] == 2 and config["holdTimeoutSeconds"] == 5


def test_gateway_config_change_rolls_the_gateway() -> None:
    a = by_kind(desired_objects(fleet_isvc(), Observed()))[("Deployment", "svc-gateway")]
    b = by_kind(desired_objects(fleet_isvc(fleet={"gateway": {"maxLoadsTotal": 9}}), Observed()))[
        ("Deployment", "svc-gateway")
    ]
    assert a["spec"]["template"] != b["spec"]["template"]


@pytest.mark.parametrize(
    ("memory", "expected"),
    [
        ({"engineCacheBudget": "1Gi"}, 2**30),
        ({"engineCacheBudget": "1Gi", "reserve": "256Mi"}, 2**30 - 2**28),
        ({}, 8 * 2**30),
    ],
)
def test_engine_budget_is_cache_budget_less_reserve(memory: dict[str, str], expected: int) -> None:
    isvc = parse_inference_service(minimal(memory=memory))
    assert engine_budget_bytes(isvc.spec.memory) == expected


def test_headroom_is_a_fraction() -> None:
    assert placement_headroom(fleet_isvc(fleet={"placement": {"headroom": "25%"}})) == 0.25
    assert placement_headroom(parse_inference_service(minimal())) == 0.0


def test_a_declared_model_larger_than_the_budget_is_a_problem_naming_it_and_the_gap() -> None:
    models = [
        {"name": "big", "memory": "2Gi", "engines": [{"uri": "file:///models/big.onnx"}]},
        {"name": "ok", "memory": "512Mi", "engines": [{"uri": "file:///models/ok.onnx"}]},
    ]
    isvc = parse_inference_service(
        minimal(models=models, memory={"engineCacheBudget": "1Gi"}, fleet={})
    )
    problems = find_spec_problems(isvc)
    assert len(problems) == 1
    assert "'big'" in problems[0] and f"{2**30} bytes short" in problems[0]
    assert "spec.memory.engineCacheBudget" in problems[0]


def test_declared_memory_blocks_only_under_a_fleet_and_warns_without_one() -> None:
    models = [{"name": "big", "memory": "2Gi", "engines": [{"uri": "file:///models/b.onnx"}]}]
    isvc = parse_inference_service(minimal(models=models, memory={"engineCacheBudget": "1Gi"}))
    assert find_spec_problems(isvc) == []
    (warning,) = find_spec_warnings(isvc)
    assert "spec.models[big].memory" in warning and "load will be refused" in warning


# -- reports ---------------------------------------------------------------------------------


def report_body(**models: dict[str, Any]) -> dict[str, Any]:
    return {
        "replica": "pod",
        "generation": 3,
        "ready": True,
        "budgetBytes": 1000,
        "residentBytes": 300,
        "models": models,
    }


def test_parse_replica_report_reads_the_contract() -> None:
    body = report_body(
        a={"state": "READY", "sizeBytes": 200, "loadSeconds": 0.5, "requests": 7, "pinned": True},
        b={"state": "LOADING", "sizeBytes": 100},
        c={"state": "UNAVAILABLE", "lastSizeBytes": 50, "lastError": "boom"},
    )
    report = parse_replica_report("p1", "http://10.0.0.1:8080", body, at=5.0)
    assert report.hot == {"a"} and report.resident == {"a", "b"} and report.pinned == {"a"}
    assert report.models["c"].last_error == "boom" and report.budget_bytes == 1000


@pytest.mark.parametrize(
    "body",
    [
        None,
        [],
        {"models": []},
        {"models": {"a": 3}},
        {"models": {"a": {"sizeBytes": "big"}}},
        {"models": {"a": {"requests": float("nan")}}},
        {"models": {}, "budgetBytes": True},
    ],
)
def test_a_report_that_is_not_one_raises_value_error(body: Any) -> None:
    with pytest.raises(ValueError):
        parse_replica_report("p", "u", body, at=0.0)


def report(name: str, at: float, **requests: float) -> ReplicaReport:
    body = report_body(**{m: {"state": "READY", "requests": n} for m, n in requests.items()})
    return parse_replica_report(name, f"http://{name}", body, at)


def test_rates_from_counters_summed_over_replicas() -> None:
    rates, state = model_rates(RateState(), [report("a", 0, m=10), report("b", 0, m=5)], 0.0)
    assert rates == {}
    rates, state = model_rates(state, [report("a", 2, m=30), report("b", 2, m=9)], 2.0)
    assert rates == {"m": pytest.approx(12.0)}


def test_a_counter_reset_counts_as_new_traffic_and_a_new_replica_waits_a_round() -> None:
    _, state = model_rates(RateState(), [report("a", 0, m=100)], 0.0)
    rates, state = model_rates(state, [report("a", 1, m=4), report("new", 1, m=50)], 1.0)
    assert rates == {"m": pytest.approx(4.0)}


@given(
    st.lists(st.floats(min_value=0, max_value=1e6), min_size=2, max_size=6),
    st.floats(min_value=0.1, max_value=100),
)
def test_rates_are_never_negative(counters: list[float], step: float) -> None:
    state = RateState()
    for i, value in enumerate(counters):
        rates, state = model_rates(state, [report("a", i * step, m=value)], i * step)
        assert all(r >= 0 for r in rates.values())


def test_sizes_measured_then_declared_then_the_largest_known_marked_as_a_guess() -> None:
    isvc = parse_inference_service(
        minimal(
            models=[
                {"name": "a", "engines": [{"uri": "file:///a.onnx"}]},
                {"name": "b", "memory": "300", "engines": [{"uri": "file:///b.onnx"}]},
                {"name": "c", "engines": [{"uri": "file:///c.onnx"}]},
                {"name": "d", "memory": "999", "engines": [{"uri": "file:///d.onnx"}]},
            ],
            fleet={},
        )
    )
    body = report_body(
        a={"state": "READY", "sizeBytes": 100}, d={"state": "UNAVAILABLE", "lastSizeBytes": 500}
    )
    sizes = model_sizes(isvc.spec.models, [parse_replica_report("p", "u", body, 0)])
    # c was never measured nor declared: possibly the largest known (d's measured 500).
    assert sizes == {"a": 100, "b": 300, "c": 500, "d": 500}
    assert model_sizes(isvc.spec.models[2:3], [])["c"] == DEFAULT_MODEL_BYTES
    reports = [parse_replica_report("p", "u", body, 0)]
    demands = model_demands(isvc.spec.models, reports, {}, {})
    assert {d.name: d.size_known for d in demands} == {"a": True, "b": True, "c": False, "d": True}


def test_load_seconds_measured_or_estimated_from_bytes() -> None:
    body = report_body(a={"state": "READY", "sizeBytes": 100, "loadSeconds": 3.0})
    reports = [parse_replica_report("p", "u", body, 0)]
    loads = model_load_seconds({"a": 100, "b": 4 * 10**9}, reports)
    assert loads["a"] == 3.0 and loads["b"] == pytest.approx(3.0)


def test_demands_carry_rate_and_forecast() -> None:
    isvc = fleet_isvc()
    demands = model_demands(isvc.spec.models, [], {"m0": 4.0}, {"m1": 2.0})
    by_name = {d.name: d for d in demands}
    assert by_name["m0"].rate == 4.0 and by_name["m0"].forecast_rate == 0.0
    assert by_name["m1"].forecast_rate == 2.0


def test_gateway_document_lists_replicas_sorted_and_hints_only_known_ones() -> None:
    from tidal.operator.core.placement import PlacementPolicy, place

    reports = [report("b", 0, m0=1), report("a", 0, m0=1)]
    isvc = fleet_isvc()
    placement = place(
        PlacementPolicy(rate_per_copy=1.0, min_rate=0.0),
        model_demands(isvc.spec.models, reports, {"m0": 5.0, "m1": 0.5}, {}),
        [],
        0.0,
    )
    doc = gateway_push(reports, placement)
    assert [r["name"] for r in doc["replicas"]] == ["a", "b"]
    assert doc["replicas"][0]["url"] == "http://a"
    assert doc["placement"] == {}  # no replica in the placement: no hints
    assert gateway_push([], None) == {"replicas": [], "placement": {}}


def test_fleet_status_counts_hot_models_and_copies() -> None:
    isvc = fleet_isvc()
    a = report("a", 0, m0=1, m1=1)
    b = report("b", 0, m0=1)
    status = fleet_status(isvc.spec.models, [a, b], None, {"m0": 3.0}, 1, 0, NOW)
    assert (status.summary, status.models_hot, status.hot_copies) == ("2/3", 2, 3)
    assert status.hottest == ["m0:2@3.0/s"] and status.placed_at == "2026-12-03T12:00:00Z"


# -- status ----------------------------------------------------------------------------------


def status_input(**kw: Any) -> StatusInput:
    from tidal.operator.core.status import DeploymentState, PodState

    return StatusInput(
        generation=1,
        now=NOW,
        isvc_name="svc",
        active_pool=PoolName.PRIMARY,
        desired={PoolName.PRIMARY: 1},
        deployments={PoolName.PRIMARY: DeploymentState(1, 1, 1, 1, 1, 1, 1)},
        pods=[PodState("primary", "serving", True)],
        **kw,
    )


def test_ready_waits_for_a_gateway_under_a_fleet() -> None:
    conditions = {
        c.type: c
        for c in compute_status(
            status_input(fleet_enabled=True, fleet=FleetStatus(gateways_ready=0))
        ).status.conditions
    }
    assert conditions["Ready"].status == "False"
    assert conditions["Ready"].reason == "GatewayNotReady"
    result = compute_status(status_input(fleet_enabled=True, fleet=FleetStatus(gateways_ready=1)))
    assert {c.type: c for c in result.status.conditions}["Ready"].status == "True"
    assert result.status.fleet == FleetStatus(gateways_ready=1)


def test_a_measured_model_too_large_is_degraded_with_an_event_but_serving_goes_on() -> None:
    result = compute_status(
        status_input(
            fleet_enabled=True,
            fleet=FleetStatus(gateways_ready=1),
            fleet_problems=["model 'big' is 5 bytes larger than the largest replica's budget"],
        )
    )
    conditions = {c.type: c for c in result.status.conditions}
    assert conditions["Degraded"].status == "True"
    assert conditions["Degraded"].reason == "ModelTooLarge"
    assert "'big'" in conditions["Degraded"].message
    assert conditions["Ready"].status == "True"
    assert [e.reason for e in result.events] == ["ModelTooLarge"]


def test_status_fleet_goes_when_the_fleet_goes() -> None:
    from tidal.operator.core.api import InferenceServiceStatus

    previous = InferenceServiceStatus(fleet=FleetStatus(summary="1/2"))
    assert compute_status(status_input(previous=previous)).status.fleet is None
    kept = compute_status(status_input(previous=previous, fleet_enabled=True)).status.fleet
    assert kept is not None and kept.summary == "1/2"


def test_placement_rates_are_at_least_the_mean_over_a_learned_period() -> None:
    from tidal.operator.core.forecast import ForecastPolicy, observe

    policy = ForecastPolicy(period_seconds=960.0, slots=96, sample_interval_seconds=2.0)

    def learned(busy: float, quiet: float, until: float) -> Any:
        state = None
        for k in range(int(until / 2)):  # busy the first quarter of each period
            t = 2.0 * k
            state = observe(policy, state, busy if t % 960 < 240 else quiet, t)
        return state

    day = learned(8.0, 0.0, 960.0)  # a whole period: mean 2 req/s
    half = learned(8.0, 0.0, 480.0)  # half a period: no mean yet
    rates = placement_rates(
        {"low": 0.1, "busy-now": 9.0, "new": 0.5, "plain": 1.0},
        {"low": day, "busy-now": day, "new": half},
    )
    assert rates["low"] == pytest.approx(2.0, rel=0.05)  # at its low: the day's mean
    assert rates["busy-now"] == 9.0  # above the mean: the rate of the moment
    assert rates["new"] == 0.5 and rates["plain"] == 1.0  # no whole period, no forecast


def test_smoothed_rates_ignore_a_single_request_of_a_rare_model() -> None:
    rates: dict[str, float] = {"hot": 10.0, "tail": 0.0}
    smoothed = smooth_rates({}, rates, 2.0, 60.0)
    assert smoothed == rates  # a model's first rate is where it starts
    # One request of the tail model in a 2 s interval: 0.5 req/s raw, ~0.016 smoothed.
    smoothed = smooth_rates(smoothed, {"hot": 10.0, "tail": 0.5}, 2.0, 60.0)
    assert smoothed["hot"] == pytest.approx(10.0)
    assert smoothed["tail"] == pytest.approx(0.5 * (1 - math.exp(-2 / 60)))
    # A sustained rise is followed: after 60 s at 10 req/s it reads 63 % of it, after 300 s 99 %.
    for _ in range(30):
        smoothed = smooth_rates(smoothed, {"hot": 10.0, "tail": 10.0}, 2.0, 60.0)
    assert smoothed["tail"] == pytest.approx(10 * (1 - math.exp(-1)), rel=0.01)
    # Window 0: the interval's rate itself; a model with no report decays.
    assert smooth_rates({"a": 4.0}, {"a": 1.0}, 2.0, 0.0) == {"a": 1.0}
    assert smooth_rates({"a": 4.0}, {}, 60.0, 60.0)["a"] == pytest.approx(4 * math.exp(-1))


def test_the_fast_attack_takes_a_real_rise_but_not_a_single_request() -> None:
    # The hot rate as a share of all demand can be below one request per interval (0.24 req/s
    # of a 12 req/s fleet, 0.5 req/s = one request in 2 s): a tail model's lone request must
    # still move its smoothed rate only by the window's weight.
    start = {"tail": 0.01, "viral": 0.01}
    smoothed = smooth_rates(start, {"tail": 0.5, "viral": 0.5}, 2.0, 60.0, rise_to=0.24)
    keep = math.exp(-2 / 60)
    assert smoothed["tail"] == pytest.approx(0.01 * keep + 0.5 * (1 - keep))
    # Two requests (1 req/s) are still within what noise gives; three or more are a rise.
    assert smooth_rates(start, {"viral": 1.0}, 2.0, 60.0, rise_to=0.24)["viral"] < 0.1
    assert smooth_rates(start, {"viral": 1.5}, 2.0, 60.0, rise_to=0.24)["viral"] == 1.5
    # From a busy model's level, a rise must clear 3 sigma of its own Poisson noise: 10 req/s
    # over 2 s is 20 +- 4.5 requests, so 26 is noise and 40 a rise.
    busy = {"m": 10.0}
    assert smooth_rates(busy, {"m": 13.0}, 2.0, 60.0, rise_to=0.24)["m"] < 10.2
    assert smooth_rates(busy, {"m": 20.0}, 2.0, 60.0, rise_to=0.24)["m"] == 20.0


@given(
    st.lists(st.floats(min_value=0, max_value=1e4), min_size=1, max_size=50),
    st.floats(min_value=0.1, max_value=30),
    st.floats(min_value=0, max_value=600),
)
def test_smoothed_rates_stay_within_the_rates_seen(
    series: list[float], elapsed: float, window: float
) -> None:
    smoothed: dict[str, float] = {}
    for value in series:
        smoothed = smooth_rates(smoothed, {"m": value}, elapsed, window)
        assert min(series) - 1e-6 <= smoothed["m"] <= max(series) + 1e-6


def counted_replica(**requests: float) -> ReplicaReport:
    """One replica's report with each model READY (100 bytes) and its request counter."""
    from tidal.operator.core.fleet import ModelReport

    return ReplicaReport(
        name="r0",
        url="http://r0",
        at=0.0,
        generation=1,
        ready=True,
        budget_bytes=2**30,
        resident_bytes=0,
        models={
            m: ModelReport(state="READY", size_bytes=100, requests=n) for m, n in requests.items()
        },
    )


def test_one_interval_learns_rates_and_the_forecast_and_forgets_models_gone() -> None:
    """`learn_demands`, the fleet loop's step the simulator runs too (issue 30): the first call
    only reads the counters; the next takes the rates over the interval, smooths them,
    teaches the forecast and predicts each model's peak; a model gone from the spec is
    forgotten."""
    from tidal.operator.core.fleet import DemandState, learn_demands
    from tidal.operator.core.forecast import ForecastPolicy

    models = fleet_isvc().spec.models

    def report(count: float) -> ReplicaReport:
        return counted_replica(m0=count)

    policy = ForecastPolicy(period_seconds=100.0, slots=10)
    knobs: dict[str, Any] = {"window_seconds": 60.0, "forecast": policy, "lead_seconds": 5.0}
    state, demands = learn_demands(DemandState(), models, [report(4)], 0.0, 1000.0, **knobs)
    assert [d.rate for d in demands] == [0.0, 0.0, 0.0] and not state.forecasts
    state, demands = learn_demands(state, models, [report(24)], 2.0, 1002.0, **knobs)
    assert state.last_rates == {"m0": 10.0}
    m0 = next(d for d in demands if d.name == "m0")
    assert m0.rate == 10.0 and m0.forecast_rate > 0 and m0.size_bytes == 100, m0
    assert set(state.forecasts) == {"m0", "m1", "m2"}
    state, _ = learn_demands(state, models[:1], [report(30)], 4.0, 1004.0, **knobs)
    assert set(state.forecasts) == {"m0"} and set(state.smoothed) <= {"m0"}


def test_a_cold_burst_in_one_interval_does_not_outrank_the_busiest_model() -> None:
    """A batch job touching tail models once (a few requests each within one second) is not a
    viral rise: taken at once, the burst's models outranked the busiest one and placement's hot
    threshold, a share of all rates, rose above it (fleet simulator, cold bursts: the busiest
    models unpinned, then evicted by the burst's loads). A rise that holds over two intervals
    is still taken at once."""
    from tidal.operator.core.fleet import DemandState, learn_demands

    models = fleet_isvc().spec.models  # m0 busy at 1 req/s; m1, m2 the burst, then m1 viral

    def report(m0: float, m1: float, m2: float) -> ReplicaReport:
        return counted_replica(m0=m0, m1=m1, m2=m2)

    knobs: dict[str, Any] = {"window_seconds": 60.0, "forecast": None, "lead_seconds": 5.0}
    state, _ = learn_demands(DemandState(), models, [report(0, 0, 0)], 0.0, 0.0, **knobs)
    state, _ = learn_demands(state, models, [report(2, 0, 0)], 2.0, 2.0, **knobs)
    state, demands = learn_demands(state, models, [report(4, 4, 4)], 4.0, 4.0, **knobs)
    rank = {d.name: d.rate for d in demands}
    assert rank["m1"] < 0.2 and rank["m2"] < 0.2 and rank["m0"] == pytest.approx(1.0), rank
    # m1 keeps rising: the second interval of the rise takes its rate at once.
    state, demands = learn_demands(state, models, [report(6, 10, 4)], 6.0, 6.0, **knobs)
    rank = {d.name: d.rate for d in demands}
    assert rank["m1"] == pytest.approx(3.0) and rank["m2"] < 0.2, rank
