"""The reconciler's shell logic against an in-memory fake of the API (no cluster needed):
what it writes, what it leaves alone, and that a second pass is a no-op."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from isvc_fixtures import minimal

from tidal.operator.core.resources import ANNOTATION_APPLIED_HASH
from tidal.operator.core.status import EventSpec
from tidal.operator.shell.kube import KubeError
from tidal.operator.shell.reconciler import Reconciler, Store

NOW = datetime(2026, 1, 1, tzinfo=UTC)


class FakeKube:
    """Records writes; applied objects come back through ``store`` as a watch would."""

    def __init__(self, store: Store, fail_apply: bool = False) -> None:
        self.store = store
        self.fail_apply = fail_apply
        self.applied: list[tuple[str, str]] = []
        self.statuses: list[dict[str, Any]] = []
        self.events: list[EventSpec] = []

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        if self.fail_apply:
            raise KubeError("apply: HTTP 500: boom", status=500, retryable=True)
        self.applied.append((obj["kind"], obj["metadata"]["name"]))
        stored = {**obj, "metadata": {**obj["metadata"], "generation": 1}}
        if obj["kind"] == "Deployment":
            stored["status"] = {"observedGeneration": 1}
        self.store.put_child(stored, deleted=False)
        return dict(stored)

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.statuses.append(dict(status))
        body = self.store.services[(namespace, name)]
        body["status"] = {
            k: v for k, v in {**body.get("status", {}), **status}.items() if v is not None
        }

    async def post_event(self, isvc: Mapping[str, Any], event: EventSpec, now: datetime) -> None:
        self.events.append(event)


def _setup(body: dict[str, Any], **kw: Any) -> tuple[Store, FakeKube, Reconciler]:
    store = Store()
    store.put_service(body)
    kube = FakeKube(store, **kw)
    return store, kube, Reconciler(kube=kube, store=store, clock=lambda: NOW)  # type: ignore[arg-type]


async def test_first_pass_applies_every_child_and_writes_status() -> None:
    _store, kube, rec = _setup(minimal())
    assert await rec.reconcile(("ns", "svc"), False) is None
    assert set(kube.applied) == {
        ("ConfigMap", "svc-primary-config"),
        ("Deployment", "svc-primary"),
        ("Service", "svc"),
    }
    # The pods read the ConfigMap: it must exist before the Deployment.
    assert kube.applied.index(("ConfigMap", "svc-primary-config")) < kube.applied.index(
        ("Deployment", "svc-primary")
    )
    assert kube.statuses[-1]["observedGeneration"] == 1
    assert {e.reason for e in kube.events} == {"Created"}


async def test_a_pass_without_news_writes_nothing() -> None:
    _store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    await rec.reconcile(("ns", "svc"), False)  # sees its children: status moves on once
    writes = (len(kube.applied), len(kube.statuses), len(kube.events))
    await rec.reconcile(("ns", "svc"), False)
    assert (len(kube.applied), len(kube.statuses), len(kube.events)) == writes


async def test_forced_pass_reapplies_without_events() -> None:
    _store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    events = len(kube.events)
    await rec.reconcile(("ns", "svc"), True)
    assert len(kube.applied) == 6
    assert len(kube.events) == events


async def test_spec_edit_updates_only_changed_children() -> None:
    store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    kube.applied.clear()
    edited = minimal(autoscaling={"minReplicas": 2})
    edited["metadata"]["generation"] = 2
    store.put_service(edited)
    await rec.reconcile(("ns", "svc"), False)
    assert kube.applied == [("Deployment", "svc-primary")]
    assert [e.message for e in kube.events if e.reason == "Updated"] == [
        "Updated Deployment svc-primary"
    ]


async def test_a_child_changed_by_someone_else_is_reapplied() -> None:
    store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    kube.applied.clear()
    store.put_child(
        {
            "kind": "Service",
            "metadata": {
                "name": "svc",
                "namespace": "ns",
                "labels": {"serving.tidal.dev/isvc": "svc"},
                "annotations": {ANNOTATION_APPLIED_HASH: "other"},
            },
        },
        deleted=False,
    )
    await rec.reconcile(("ns", "svc"), False)
    assert kube.applied == [("Service", "svc")]


async def test_unworkable_spec_touches_nothing_but_status() -> None:
    _store, kube, rec = _setup(minimal(runtime={"backend": "tensorrt"}))
    await rec.reconcile(("ns", "svc"), False)
    assert kube.applied == []
    degraded = next(c for c in kube.statuses[-1]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True"
    assert degraded["reason"] == "InvalidSpec"
    assert [e.type for e in kube.events] == ["Warning"]


async def test_api_failure_is_degraded_and_retried_with_backoff() -> None:
    _store, kube, rec = _setup(minimal(), fail_apply=True)
    first = await rec.reconcile(("ns", "svc"), False)
    second = await rec.reconcile(("ns", "svc"), False)
    assert first is not None and second is not None and second > first
    degraded = next(c for c in kube.statuses[-1]["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ReconcileError"
    assert "HTTP 500" in degraded["message"]
    kube.fail_apply = False
    assert await rec.reconcile(("ns", "svc"), False) is None


async def test_deleted_service_is_not_reconciled() -> None:
    store, kube, rec = _setup(minimal())
    store.drop_service(("ns", "svc"))
    assert await rec.reconcile(("ns", "svc"), False) is None
    assert kube.applied == [] and kube.statuses == []


async def test_pods_feed_the_status_counts() -> None:
    store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    labels = {
        "serving.tidal.dev/isvc": "svc",
        "serving.tidal.dev/pool": "primary",
        "serving.tidal.dev/role": "serving",
    }
    store.put_child(
        {
            "kind": "Pod",
            "metadata": {"name": "p1", "namespace": "ns", "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
        deleted=False,
    )
    await rec.reconcile(("ns", "svc"), False)
    status = kube.statuses[-1]
    assert status["readyReplicas"] == 1
    assert next(c for c in status["conditions"] if c["type"] == "Ready")["status"] == "True"
