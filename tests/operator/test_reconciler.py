"""The reconciler's shell logic against an in-memory fake of the API (no cluster needed):
what it writes, what it leaves alone, and that a second pass is a no-op."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from isvc_fixtures import minimal

from tidal.operator.core.api import PoolName
from tidal.operator.core.control import ControlStatus, ControlView
from tidal.operator.core.events import EventSpec
from tidal.operator.core.resources import ANNOTATION_APPLIED_HASH, Observed
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
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}  # as the API server stores them
        self.node_labels: dict[str, dict[str, str]] = {}
        self.node_lists = 0

    async def list_node_labels(self) -> dict[str, dict[str, str]] | None:
        self.node_lists += 1
        return copy.deepcopy(self.node_labels)

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        if self.fail_apply:
            raise KubeError("apply: HTTP 500: boom", status=500, retryable=True)
        self.applied.append((obj["kind"], obj["metadata"]["name"]))
        stored = _as_stored(obj)
        self.objects[(obj["kind"], obj["metadata"]["name"])] = stored
        self.store.put_child(stored, deleted=False)
        return copy.deepcopy(stored)

    async def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self.statuses.append(dict(status))
        body = self.store.services[(namespace, name)]
        body["status"] = {
            k: v for k, v in {**body.get("status", {}), **status}.items() if v is not None
        }

    async def post_event(self, isvc: Mapping[str, Any], event: EventSpec, now: datetime) -> None:
        self.events.append(event)


def _as_stored(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` as the API server stores it: with bookkeeping, status and defaults it fills in,
    none of which the operator sent (and none of which is drift)."""
    stored = copy.deepcopy(dict(obj))
    meta = stored["metadata"]
    meta.update(generation=1, resourceVersion="7", uid=f"uid-{meta['name']}")
    if stored["kind"] == "Deployment":
        meta["annotations"]["deployment.kubernetes.io/revision"] = "1"
        pod = stored["spec"]["template"]["spec"]
        pod.update(restartPolicy="Always", dnsPolicy="ClusterFirst")
        for container in pod["containers"]:
            container.update(imagePullPolicy="IfNotPresent", terminationMessagePolicy="File")
        stored["status"] = {"observedGeneration": 1}
    if stored["kind"] == "Service":
        stored["spec"].update(clusterIP="10.96.0.10", sessionAffinity="None")
    return stored


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


async def test_forced_pass_over_an_unchanged_service_writes_nothing() -> None:
    _store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    await rec.reconcile(("ns", "svc"), False)  # sees its children: status moves on once
    writes = (len(kube.applied), len(kube.statuses), len(kube.events))
    await rec.reconcile(("ns", "svc"), True)
    assert (len(kube.applied), len(kube.statuses), len(kube.events)) == writes, kube.applied


def _restarted(kube: FakeKube, body: dict[str, Any]) -> Reconciler:
    """A new operator: its store filled by the initial listing of the service and children."""
    store = Store()
    store.put_service(body)
    for obj in kube.objects.values():
        store.put_child(copy.deepcopy(obj), deleted=False)
    kube.store = store
    return Reconciler(kube=kube, store=store, clock=lambda: NOW)  # type: ignore[arg-type]


async def test_forced_pass_after_a_restart_writes_nothing_unchanged() -> None:
    store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    kube.applied.clear()
    rec = _restarted(kube, store.services[("ns", "svc")])
    await rec.reconcile(("ns", "svc"), True)
    assert kube.applied == []


def _edit_deployment_image(kube: FakeKube, image: str) -> dict[str, Any]:
    """Someone edits the Deployment's image (kubectl edit): our applied hash stays."""
    edited = copy.deepcopy(kube.objects[("Deployment", "svc-primary")])
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = image
    edited["metadata"]["generation"] = 2
    kube.objects[("Deployment", "svc-primary")] = edited
    return edited


async def test_a_drifted_image_is_applied_again_on_its_watch_event() -> None:
    store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    wanted = kube.objects[("Deployment", "svc-primary")]["spec"]["template"]["spec"]
    kube.applied.clear()
    store.put_child(_edit_deployment_image(kube, "evil:latest"), deleted=False)
    await rec.reconcile(("ns", "svc"), False)
    assert kube.applied == [("Deployment", "svc-primary")]
    live = kube.objects[("Deployment", "svc-primary")]["spec"]["template"]["spec"]
    assert live["containers"][0]["image"] == wanted["containers"][0]["image"]
    # Put right: neither the next pass nor a forced one writes again.
    await rec.reconcile(("ns", "svc"), False)
    await rec.reconcile(("ns", "svc"), True)
    assert kube.applied == [("Deployment", "svc-primary")]
    # A drift correction is no spec change: no Created/Updated Event for it.
    assert [e for e in kube.events if e.reason == "Updated"] == []


async def test_a_drifted_image_is_applied_again_on_the_forced_pass() -> None:
    # Edited while no operator watched: the forced pass of the initial listing sees it.
    store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    kube.applied.clear()
    _edit_deployment_image(kube, "evil:latest")
    rec = _restarted(kube, store.services[("ns", "svc")])
    await rec.reconcile(("ns", "svc"), True)
    assert kube.applied == [("Deployment", "svc-primary")]


async def test_a_replica_count_changed_by_hand_is_put_back() -> None:
    # The operator owns spec.replicas: once the control loop has decided, its count holds.
    store, kube, rec = _setup(minimal())
    view = ControlView(Observed(replicas={PoolName.PRIMARY: 2}), ControlStatus())
    rec.control = lambda key: view
    await rec.reconcile(("ns", "svc"), False)
    kube.applied.clear()
    scaled = copy.deepcopy(kube.objects[("Deployment", "svc-primary")])
    want = scaled["spec"]["replicas"]
    assert want == 2
    scaled["spec"]["replicas"] = 5
    store.put_child(scaled, deleted=False)
    await rec.reconcile(("ns", "svc"), False)
    assert kube.applied == [("Deployment", "svc-primary")]
    assert kube.objects[("Deployment", "svc-primary")]["spec"]["replicas"] == want


async def test_status_updates_of_a_child_write_nothing() -> None:
    store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    kube.applied.clear()
    dep = copy.deepcopy(kube.objects[("Deployment", "svc-primary")])
    dep["status"] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1}
    dep["metadata"]["resourceVersion"] = "8"
    store.put_child(dep, deleted=False)
    await rec.reconcile(("ns", "svc"), False)
    await rec.reconcile(("ns", "svc"), True)
    assert kube.applied == []


async def test_a_child_whose_live_state_is_unknown_is_applied() -> None:
    store, kube, rec = _setup(minimal())
    await rec.reconcile(("ns", "svc"), False)
    kube.applied.clear()
    store.children[("ns", "svc")].live.pop(("Service", "svc"))
    await rec.reconcile(("ns", "svc"), True)
    assert kube.applied == [("Service", "svc")]


async def test_a_form_the_server_stores_differently_costs_one_apply_not_one_per_pass() -> None:
    # A value the API server rewrites in a way the comparison does not know: the answer to
    # our own apply is what we want, so it is not applied again and again.
    store, kube, rec = _setup(minimal())
    rewrite = kube.apply

    async def rewriting_apply(obj: Mapping[str, Any]) -> dict[str, Any]:
        stored = await rewrite(obj)
        if obj["kind"] == "Service":
            stored["spec"]["type"] = "clusterip"
            kube.objects[("Service", "svc")] = stored
            store.put_child(copy.deepcopy(stored), deleted=False)
        return stored

    kube.apply = rewriting_apply  # type: ignore[method-assign]
    await rec.reconcile(("ns", "svc"), False)
    kube.applied.clear()
    for force in (False, True, False, True):
        await rec.reconcile(("ns", "svc"), force)
    assert kube.applied == []


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


# What the API server says when the engine cache's hostPath is refused: Pod Security (the
# ReplicaSet's FailedCreate, which the Deployment reports as ReplicaFailure) and the Deployment's
# own validation (a 422 naming the volume's index).
POD_SECURITY_REFUSAL = (
    'pods "svc-primary-6c9f7b-x2k4q" is forbidden: violates PodSecurity "baseline:latest": '
    'hostPath volumes (volume "engine-cache")'
)
VOLUME_REFUSAL = (
    'apply Deployment ns/svc-primary: HTTP 422: Deployment.apps "svc-primary" is invalid: '
    'spec.template.spec.volumes[1].hostPath.path: Invalid value: "/var/../x": must not '
    "contain '..'"
)


async def test_a_hostpath_forbidden_by_pod_security_is_degraded_naming_the_field() -> None:
    body = minimal(runtime={"backend": "onnxruntime", "engineCache": {"hostPath": "/var/c"}})
    store, kube, rec = _setup(body)
    await rec.reconcile(("ns", "svc"), False)
    failed = copy.deepcopy(kube.objects[("Deployment", "svc-primary")])
    failed["status"]["conditions"] = [
        {
            "type": "ReplicaFailure",
            "status": "True",
            "reason": "FailedCreate",
            "message": POD_SECURITY_REFUSAL,
        }
    ]
    store.put_child(failed, deleted=False)
    await rec.reconcile(("ns", "svc"), False)
    degraded = next(c for c in kube.statuses[-1]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "DeploymentFailed"
    assert "spec.runtime.engineCache.hostPath /var/c" in degraded["message"]
    assert "Pod Security level forbids hostPath" in degraded["message"]
    (event,) = [e for e in kube.events if e.reason == "DeploymentFailed"]
    assert event.type == "Warning" and "spec.runtime.engineCache.hostPath" in event.message


async def test_a_hostpath_the_api_server_refuses_is_degraded_naming_the_field() -> None:
    body = minimal(runtime={"backend": "onnxruntime", "engineCache": {"hostPath": "/var/c"}})
    _store, kube, rec = _setup(body)

    async def refuse(obj: Mapping[str, Any]) -> dict[str, Any]:
        raise KubeError(VOLUME_REFUSAL, status=422, retryable=False)

    kube.apply = refuse  # type: ignore[method-assign]
    await rec.reconcile(("ns", "svc"), False)
    degraded = next(c for c in kube.statuses[-1]["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "ReconcileError"
    assert degraded["message"].startswith("spec.runtime.engineCache.hostPath /var/c: ")
    assert "volumes[1].hostPath.path" in degraded["message"]  # the server's words are kept
    (event,) = [e for e in kube.events if e.reason == "ReconcileError"]
    assert "spec.runtime.engineCache.hostPath" in event.message


L4 = "NVIDIA-L4"


def _per_gpu_build(built: list[str]) -> dict[str, Any]:
    """A ModelBuild for cpu and L4 with an fp32 engine published for ``built``."""
    artifact = {"precision": "fp32", "published": True, "sha256": "a" * 64, "reason": "passed"}
    return {
        "apiVersion": "serving.tidal.dev/v1alpha1",
        "kind": "ModelBuild",
        "metadata": {"name": "digits-2", "namespace": "ns", "uid": "u-2", "generation": 1},
        "spec": {
            "model": "digits",
            "version": "2",
            "backend": "torch",
            "targets": ["cpu", L4],
            "source": {"uri": "s3://models/digits/2/digits.onnx"},
            "precisions": ["fp32"],
            "validation": {"uri": "s3://models/digits/validation.npz"},
            "output": "s3://engines/ns",
        },
        "status": {
            "targets": [
                {
                    "target": t,
                    "phase": "Built",
                    "artifacts": [{**artifact, "uri": f"s3://engines/ns/digits/2/{t}/fp32"}],
                }
                for t in built
            ]
        },
    }


def _pod_on(store: Store, name: str, node: str) -> None:
    labels = {
        "serving.tidal.dev/isvc": "svc",
        "serving.tidal.dev/pool": "primary",
        "serving.tidal.dev/role": "serving",
    }
    store.put_child(
        {
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "labels": labels},
            "spec": {"nodeName": node},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
        deleted=False,
    )


def _degraded(kube: FakeKube) -> dict[str, Any]:
    return dict(next(c for c in kube.statuses[-1]["conditions"] if c["type"] == "Degraded"))


async def test_a_torch_build_named_by_an_onnxruntime_pool_is_degraded_and_makes_no_child() -> None:
    """Issue 41: a torch build's engines (AOTInductor packages) named by an onnxruntime pool
    were served to it, to fail in every pod. Since onnxruntime pools serve only onnxruntime
    builds (cpu engines, any node), a pod on a node with no engine for its target
    (EngineMissingForTarget, ``find_missing_engines``, tested in test_builds.py) cannot arise
    through an InferenceService of this release: GPU pools cannot name builds yet."""
    body = minimal(models=[{"name": "digits", "build": {"name": "digits-2", "precision": "fp32"}}])
    store, kube, rec = _setup(body)
    store.builds = {("ns", "digits-2"): _per_gpu_build(["cpu", L4])}
    kube.node_labels = {"gpu-l4": {"nvidia.com/gpu.product": L4}, "cpu-1": {}}
    _pod_on(store, "p1", "gpu-l4")
    await rec.reconcile(("ns", "svc"), False)
    degraded = _degraded(kube)
    assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec"), degraded
    assert degraded["message"].startswith(
        "spec.models[digits].build: ModelBuild digits-2: is a torch build and the pool's "
        "backend is onnxruntime"
    ), degraded
    assert any(
        e.type == "Warning" and "spec.models[digits].build" in e.message for e in kube.events
    ), kube.events
    assert kube.applied == [], "no child of a pool whose engine cannot load"


async def test_a_service_whose_build_still_runs_waits_without_a_child_and_is_not_degraded() -> None:
    """Issue 41: it read Degraded=InvalidSpec '... no build for target' while the build ran."""
    body = minimal(models=[{"name": "digits", "build": {"name": "digits-2", "precision": "fp32"}}])
    store, kube, rec = _setup(body)
    running = _per_gpu_build([])
    running["spec"].update(backend="onnxruntime", targets=["cpu"])
    running["status"] = {"targets": [{"target": "cpu", "phase": "Running", "job": "digits-2-1"}]}
    store.builds = {("ns", "digits-2"): running}
    await rec.reconcile(("ns", "svc"), False)
    conditions = {c["type"]: c for c in kube.statuses[-1]["conditions"]}
    assert conditions["Degraded"]["status"] == "False", conditions
    assert (conditions["Progressing"]["status"], conditions["Progressing"]["reason"]) == (
        "True",
        "BuildPending",
    ), conditions
    assert "not built yet (Running)" in conditions["Progressing"]["message"], conditions
    assert conditions["Ready"]["reason"] == "BuildPending", conditions
    assert kube.applied == [], "no child before the build passed its gate"
    assert not [e for e in kube.events if e.type == "Warning"], kube.events


async def test_a_cpu_only_build_lists_no_nodes() -> None:
    body = minimal(models=[{"name": "digits", "build": {"name": "digits-2", "precision": "fp32"}}])
    store, kube, rec = _setup(body)
    cpu_only = _per_gpu_build(["cpu"])
    cpu_only["spec"].update(backend="onnxruntime", targets=["cpu"])
    store.builds = {("ns", "digits-2"): cpu_only}
    kube.node_labels = {"gpu-l4": {"nvidia.com/gpu.product": L4}}
    _pod_on(store, "p1", "gpu-l4")
    await rec.reconcile(("ns", "svc"), False)
    assert _degraded(kube)["status"] == "False", _degraded(kube)
    assert kube.node_lists == 0


def test_retry_delays_double_to_the_cap_and_stay_there_however_long_a_key_fails() -> None:
    """2 s, 4 s, ... 60 s; 2 ** failures once overflowed a float after ~1,000 failures in a
    row (17 hours of a key that keeps failing), crashing the reconcile instead."""
    reconciler = Reconciler(kube=None, store=Store(), clock=lambda: NOW)  # type: ignore[arg-type]
    key = ("ns", "svc")
    delays = [reconciler._backoff(key) for _ in range(1100)]
    assert delays[:6] == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0]
    assert set(delays[5:]) == {60.0}
