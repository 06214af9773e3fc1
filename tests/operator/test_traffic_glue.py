"""The control loop's side of make-before-break traffic moves: the store keeps the Service's
selector and its EndpointSlices as the watches show them, and ``core.traffic.move_traffic`` turns
the decision's routing (one ``TrafficTick`` built from them) into what the reconciler writes this
tick (both pools selected while the
new one is not listed ready; a routed pool's scale-down and demotions held meanwhile)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from isvc_fixtures import minimal

from tidal.operator.core.api import (
    LABEL_ISVC,
    LABEL_POOL,
    LABEL_ROLE,
    PoolName,
    parse_inference_service,
)
from tidal.operator.core.resources import Observed
from tidal.operator.core.traffic import (
    TrafficMemory,
    TrafficPolicy,
    TrafficTick,
    move_traffic,
    route_pods,
)
from tidal.operator.shell.reconciler import Store

P, B = PoolName.PRIMARY, PoolName.BASELINE
KEY = ("ns", "svc")


def pod_body(
    name: str, pool: PoolName, role: str = "serving", ready: bool = True
) -> dict[str, Any]:
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {LABEL_ISVC: "svc", LABEL_POOL: pool.value, LABEL_ROLE: role},
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def slice_body(name: str, ready: dict[str, bool], service: str = "svc") -> dict[str, Any]:
    return {
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "ns",
            # The EndpointSlice controller copies the Service's labels onto its slices.
            "labels": {LABEL_ISVC: "svc", "kubernetes.io/service-name": service},
        },
        "endpoints": [
            {
                "addresses": [f"10.0.0.{i}"],
                "conditions": {"ready": r},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": "ns"},
            }
            for i, (pod, r) in enumerate(ready.items())
        ],
    }


def service_body(selector: dict[str, str]) -> dict[str, Any]:
    return {
        "kind": "Service",
        "metadata": {"name": "svc", "namespace": "ns", "labels": {LABEL_ISVC: "svc"}},
        "spec": {"selector": selector},
    }


def test_store_keeps_the_services_selector_and_the_pods_its_slices_list_ready() -> None:
    store = Store()
    store.put_child(service_body({LABEL_ISVC: "svc", LABEL_POOL: "primary"}), deleted=False)
    kids = store.children[KEY]
    assert kids.ready_endpoints() is None  # no slice seen yet
    store.put_child(slice_body("svc-a", {"p1": True, "p2": False}), deleted=False)
    store.put_child(slice_body("svc-b", {"b1": True}), deleted=False)
    # A slice of another Service carrying the same labels (none today) is not this one's.
    store.put_child(slice_body("other-x", {"x1": True}, service="other"), deleted=False)
    assert kids.ready_endpoints() == frozenset({"p1", "b1"})
    assert kids.service_selector == {LABEL_ISVC: "svc", LABEL_POOL: "primary"}
    store.put_child(slice_body("svc-b", {}), deleted=True)
    assert kids.ready_endpoints() == frozenset({"p1"})


def _world(spec: dict[str, Any], *pods: dict[str, Any]) -> tuple[Store, Any]:
    """A store holding the service, its Service selecting the primary, and ``pods``."""
    store = Store()
    store.services[KEY] = spec
    store.put_child(
        service_body({LABEL_ISVC: "svc", LABEL_POOL: "primary", LABEL_ROLE: "serving"}),
        deleted=False,
    )
    for body in pods:
        store.put_child(body, deleted=False)
    return store, parse_inference_service(spec)


def _flip_world() -> tuple[Store, Any]:
    pods = [pod_body(n, pool) for n, pool in (("p1", P), ("p2", P), ("b1", B), ("b2", B))]
    return _world(minimal(rollout={"baseline": {"minReplicas": 1}}), *pods)


def _tick(
    store: Store,
    isvc: Any,
    observed: Observed,
    current: dict[PoolName, int],
    now: float,
    memory: TrafficMemory,
    changes: tuple[tuple[str, str], ...] = (),
    policy: TrafficPolicy = TrafficPolicy(wait_seconds=60.0),
) -> TrafficTick:
    """The tick value the controller builds from the store's view of the Service, its slices
    and the pods (``Controller._plan``)."""
    kids = store.children[KEY]
    return TrafficTick(
        service="svc",
        routes_itself=False,
        has_baseline=isvc.spec.rollout.baseline is not None,
        selector=kids.service_selector,
        endpoints=kids.ready_endpoints(),
        pods=route_pods(_pods(store)),
        observed=observed,
        current=current,
        promote=frozenset(n for n, r in changes if r == "serving"),
        demote=frozenset(n for n, r in changes if r == "standby"),
        memory=memory,
        now=now,
        policy=policy,
    )


def _pods(store: Store) -> dict[PoolName, list[dict[str, Any]]]:
    bodies = store.children[KEY].pod_bodies.values()
    return {
        pool: [b for b in bodies if b["metadata"]["labels"][LABEL_POOL] == pool.value]
        for pool in (P, B)
    }


def test_a_flip_selects_both_pools_and_keeps_the_primary_until_the_baseline_is_listed() -> None:
    store, isvc = _flip_world()
    store.put_child(slice_body("svc-a", {"p1": True, "p2": True}), deleted=False)
    # The rollout flipped to the baseline and shrinks the primary (2 -> 1).
    flip = Observed(replicas={P: 1, B: 2}, active_pool=B, split=False)
    current = {P: 2, B: 2}
    move = move_traffic(_tick(store, isvc, flip, current, 0.0, TrafficMemory()))
    observed = move.observed
    assert observed.split and observed.active_pool is B  # both selected, the target reported
    assert observed.replicas[P] == 2  # the primary serves until the move is made
    assert move.memory.since == 0.0 and move.event is None, move
    # The slices list one baseline pod: still both.
    store.put_child(slice_body("svc-a", {"p1": True, "p2": True, "b1": True}), deleted=False)
    move = move_traffic(_tick(store, isvc, flip, current, 1.0, move.memory))
    assert move.observed.split, move
    # Both listed ready: the baseline alone, the primary may shrink.
    store.put_child(
        slice_body("svc-a", {"p1": True, "p2": True, "b1": True, "b2": True}), deleted=False
    )
    move = move_traffic(_tick(store, isvc, flip, current, 2.0, move.memory))
    assert move.observed == flip
    assert move.memory.since is None and move.event is None, move


def test_a_move_whose_endpoints_never_show_says_so_once_and_keeps_the_old_pods() -> None:
    store, isvc = _flip_world()
    store.put_child(slice_body("svc-a", {"p1": True, "p2": True}), deleted=False)
    flip = Observed(replicas={P: 2, B: 2}, active_pool=B)
    events = []
    memory = TrafficMemory()
    for now in (0.0, 30.0, 61.0, 62.0):
        move = move_traffic(_tick(store, isvc, flip, {P: 2, B: 2}, now, memory))
        memory = move.memory
        assert move.observed.split, (now, move)
        events += [move.event] if move.event is not None else []
    assert [e.reason for e in events] == ["EndpointsNotReady"]
    assert "b1, b2" in events[0].message


def test_a_demotion_waits_for_the_pod_that_stays_and_the_promotion_goes_at_once() -> None:
    store, isvc = _world(minimal(), pod_body("p1", P), pod_body("s1", P, role="standby"))
    store.put_child(slice_body("svc-a", {"p1": True}), deleted=False)
    swap = (("s1", "serving"), ("p1", "standby"))
    observed = Observed(replicas={P: 2})
    move = move_traffic(_tick(store, isvc, observed, {P: 2}, 0.0, TrafficMemory(), swap))
    assert move.demote == frozenset(), move
    store.put_child(pod_body("s1", P), deleted=False)  # the promotion written, watched back
    store.put_child(slice_body("svc-a", {"p1": True, "s1": True}), deleted=False)
    move = move_traffic(_tick(store, isvc, observed, {P: 2}, 1.0, move.memory, swap))
    assert move.demote == frozenset({"p1"}), move


def test_a_service_that_selects_its_gateway_moves_nothing() -> None:
    store, isvc = _flip_world()
    flip = Observed(replicas={P: 1, B: 2}, active_pool=B)
    tick = replace(_tick(store, isvc, flip, {P: 2, B: 2}, 0.0, TrafficMemory()), routes_itself=True)
    move = move_traffic(tick)
    assert move.observed == flip and move.step is None and move.event is None, move
