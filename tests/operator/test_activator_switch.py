"""A service edited between ``minReplicas: 0`` and more switches its Service between the
activator gateway and its pods without a moment where neither side takes requests, and a
gateway left over from zero goes to zero pods once the pods are selected (the reconciler
against the in-memory fake of the API of ``test_reconciler``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from isvc_fixtures import minimal
from test_reconciler import NOW, FakeKube

from tidal.operator.core.api import parse_inference_service
from tidal.operator.core.resources import (
    ANNOTATION_APPLIED_HASH,
    COMPONENT_GATEWAY,
    LABEL_COMPONENT,
    Observed,
    gateway_retired,
    service_selects_gateway,
)
from tidal.operator.shell.reconciler import Reconciler, Store

KEY = ("ns", "svc")
GATEWAY = {"serving.tidal.dev/isvc": "svc", LABEL_COMPONENT: COMPONENT_GATEWAY}


@pytest.mark.parametrize(
    ("spec", "gateway_ready", "serving_ready", "selects_gateway", "retired"),
    [
        # May reach zero: the gateway once it is ready, or while no pod is.
        ({"autoscaling": {"minReplicas": 0}}, False, False, True, False),
        ({"autoscaling": {"minReplicas": 0}}, True, False, True, False),
        ({"autoscaling": {"minReplicas": 0}}, True, True, True, False),
        ({"autoscaling": {"minReplicas": 0}}, False, True, False, False),  # entering: pods stay
        # Never reaches zero: the pods once one is ready, or while no gateway is.
        ({"autoscaling": {"minReplicas": 1}}, False, False, False, True),
        ({"autoscaling": {"minReplicas": 1}}, False, True, False, True),
        ({"autoscaling": {"minReplicas": 1}}, True, True, False, True),
        ({"autoscaling": {"minReplicas": 1}}, True, False, True, False),  # leaving: it holds
        # The burst buffer (minReplicas 1): the gateway once it is ready, like the activator.
        ({"autoscaling": {"minReplicas": 1, "burstBuffer": True}}, False, False, True, False),
        ({"autoscaling": {"minReplicas": 1, "burstBuffer": True}}, False, True, False, False),
        ({"autoscaling": {"minReplicas": 1, "burstBuffer": True}}, True, True, True, False),
        # A fleet: always its gateway, never retired.
        ({"fleet": {}, "memory": {"engineCacheBudget": "1Gi"}}, False, True, True, False),
    ],
)
def test_the_service_keeps_the_side_that_takes_requests_until_the_other_can(
    spec: dict[str, Any],
    gateway_ready: bool,
    serving_ready: bool,
    selects_gateway: bool,
    retired: bool,
) -> None:
    isvc = parse_inference_service(minimal(**spec))
    observed = Observed(gateway_ready=gateway_ready, serving_ready=serving_ready)
    assert service_selects_gateway(isvc, observed) is selects_gateway
    assert gateway_retired(isvc, observed) is retired


class SwitchKube(FakeKube):
    """The fake API, keeping what was applied last and scaling retired Deployments."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)
        self.last: dict[tuple[str, str], dict[str, Any]] = {}
        self.retired: list[str] = []

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        self.last[(obj["kind"], obj["metadata"]["name"])] = dict(obj)
        return await super().apply(obj)

    async def retire_deployment(self, namespace: str, name: str) -> None:
        self.retired.append(name)
        body = self.last[("Deployment", name)]
        meta = body["metadata"]
        stored = {
            **body,
            "metadata": {
                **meta,
                "generation": 2,
                "annotations": {**meta["annotations"], ANNOTATION_APPLIED_HASH: "retired"},
            },
            "spec": {**body["spec"], "replicas": 0},
            "status": {"observedGeneration": 2},
        }
        self.store.put_child(stored, deleted=False)

    def selector(self) -> dict[str, str]:
        return dict(self.last[("Service", "svc")]["spec"]["selector"])


def _gateway_ready(store: Store, kube: SwitchKube) -> None:
    body = kube.last[("Deployment", "svc-gateway")]
    status = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1, "availableReplicas": 1}
    store.put_child(
        {**body, "metadata": {**body["metadata"], "generation": 1}, "status": status}, deleted=False
    )


def _serving_pod(store: Store, ready: bool) -> None:
    labels = {
        "serving.tidal.dev/isvc": "svc",
        "serving.tidal.dev/pool": "primary",
        "serving.tidal.dev/role": "serving",
    }
    store.put_child(
        {
            "kind": "Pod",
            "metadata": {"name": "svc-primary-a", "namespace": "ns", "labels": labels},
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.9",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        },
        deleted=False,
    )


def _edit(store: Store, min_replicas: int, generation: int) -> None:
    body = minimal(autoscaling={"minReplicas": min_replicas})
    body["metadata"]["generation"] = generation
    store.put_service(body)


def _setup(min_replicas: int) -> tuple[Store, SwitchKube, Reconciler]:
    store = Store()
    _edit(store, min_replicas, 1)
    kube = SwitchKube(store)
    return store, kube, Reconciler(kube=kube, store=store, clock=lambda: NOW)  # type: ignore[arg-type]


async def test_leaving_zero_keeps_the_gateway_until_a_pod_is_ready_then_retires_it() -> None:
    store, kube, rec = _setup(0)
    await rec.reconcile(KEY, False)
    _gateway_ready(store, kube)
    await rec.reconcile(KEY, False)
    assert kube.selector() == GATEWAY, kube.selector()
    _edit(store, 1, 2)  # at zero, edited to minReplicas 1
    await rec.reconcile(KEY, False)
    # No pod is ready yet: the gateway still holds what arrives, and its loop goes on.
    assert kube.selector() == GATEWAY, kube.selector()
    assert kube.retired == []
    assert store.children[KEY].gateway_live()
    _serving_pod(store, ready=False)
    await rec.reconcile(KEY, False)
    assert kube.selector() == GATEWAY, kube.selector()
    _serving_pod(store, ready=True)
    await rec.reconcile(KEY, False)
    assert kube.selector() == {
        "serving.tidal.dev/isvc": "svc",
        "serving.tidal.dev/pool": "primary",
        "serving.tidal.dev/role": "serving",
    }, kube.selector()
    assert kube.retired == ["svc-gateway"]
    assert not store.children[KEY].gateway_live()
    await rec.reconcile(KEY, False)
    assert kube.retired == ["svc-gateway"], "retired once"
    # Back to minReplicas 0: the retired gateway is applied whole again (one pod), and the
    # Service stays on the ready pod until that gateway pod is ready.
    _edit(store, 0, 3)
    await rec.reconcile(KEY, False)
    assert kube.last[("Deployment", "svc-gateway")]["spec"]["replicas"] == 1
    assert "serving.tidal.dev/pool" in kube.selector(), kube.selector()
    _gateway_ready(store, kube)
    await rec.reconcile(KEY, False)
    assert kube.selector() == GATEWAY, kube.selector()


async def test_entering_zero_keeps_the_pods_selected_until_the_gateway_is_ready() -> None:
    store, kube, rec = _setup(1)
    _serving_pod(store, ready=True)
    await rec.reconcile(KEY, False)
    assert ("Deployment", "svc-gateway") not in kube.last
    _edit(store, 0, 2)
    await rec.reconcile(KEY, False)
    assert ("Deployment", "svc-gateway") in kube.last
    assert "serving.tidal.dev/pool" in kube.selector(), kube.selector()
    _gateway_ready(store, kube)
    await rec.reconcile(KEY, False)
    assert kube.selector() == GATEWAY, kube.selector()
    assert kube.retired == []


async def test_a_service_that_never_had_a_gateway_retires_nothing() -> None:
    store, kube, rec = _setup(1)
    _serving_pod(store, ready=True)
    await rec.reconcile(KEY, False)
    await rec.reconcile(KEY, True)
    assert kube.retired == []
