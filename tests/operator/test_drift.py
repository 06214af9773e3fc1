"""Drift (``tidal.operator.core.drift``): which live children differ from the desired ones in
the fields the operator owns, and how the periodic resync is spread over its period."""

from __future__ import annotations

import copy
from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from isvc_fixtures import minimal

from tidal.operator.core.api import parse_inference_service
from tidal.operator.core.drift import find_drift, resync_due, resync_offset, trim_child
from tidal.operator.core.resources import Observed, desired_objects


def _desired() -> dict[str, dict[str, Any]]:
    isvc = parse_inference_service(
        minimal(runtime={"resources": {"requests": {"memory": "1024Mi", "cpu": "0.5"}}})
    )
    return {obj["kind"]: obj for obj in desired_objects(isvc, Observed())}


def _as_stored(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as the API server stores it: bookkeeping, status, defaults and canonical
    quantities added, none of which the operator sent."""
    live = copy.deepcopy(obj)
    meta = live["metadata"]
    meta.update(resourceVersion="42", uid="u-1", generation=3, managedFields=[{"manager": "x"}])
    meta["annotations"]["deployment.kubernetes.io/revision"] = "2"
    meta["labels"]["added-by-someone"] = "yes"
    if live["kind"] == "Deployment":
        pod = live["spec"]["template"]["spec"]
        pod.update(restartPolicy="Always", dnsPolicy="ClusterFirst", schedulerName="default")
        for c in pod["containers"]:
            c.update(imagePullPolicy="IfNotPresent", terminationMessagePath="/dev/termination-log")
            for env in c["env"]:
                if "valueFrom" in env and "fieldRef" in env["valueFrom"]:
                    env["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
            requests = c.get("resources", {}).get("requests", {})
            if requests.get("memory") == "1024Mi":
                requests.update(memory="1Gi", cpu="500m")
        live["status"] = {"replicas": 1, "readyReplicas": 1, "observedGeneration": 3}
    if live["kind"] == "Service":
        live["spec"].update(clusterIP="10.0.0.7", clusterIPs=["10.0.0.7"], sessionAffinity="None")
    return live


def _edit(obj: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    """A copy of ``obj`` with the field at ``path`` set, or removed when ``value`` is ``...``."""
    out = copy.deepcopy(obj)
    node: Any = out
    for part in path[:-1]:
        node = node[part]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return out


C: tuple[str | int, ...] = ("spec", "template", "spec", "containers", 0)
ROLE, POOL, ISVC = "serving.tidal.dev/role", "serving.tidal.dev/pool", "serving.tidal.dev/isvc"


@pytest.mark.parametrize("kind", ["ConfigMap", "Deployment", "Service"])
def test_an_unchanged_child_has_not_drifted(kind: str) -> None:
    obj = _desired()[kind]
    assert find_drift(obj, obj) is None


@pytest.mark.parametrize("kind", ["ConfigMap", "Deployment", "Service"])
def test_what_the_server_adds_or_normalises_is_no_drift(kind: str) -> None:
    obj = _desired()[kind]
    live = _as_stored(obj)
    assert find_drift(obj, live) is None
    assert find_drift(obj, trim_child(live)) is None


@pytest.mark.parametrize(
    ("kind", "path", "value", "reason"),
    [
        ("Deployment", (*C, "image"), "evil:latest", "containers[runtime].image"),
        ("Deployment", ("spec", "template", "metadata", "labels", ROLE), ..., "labels"),
        ("Deployment", ("spec", "selector", "matchLabels", POOL), "x", "matchLabels"),
        ("Deployment", (*C, "ports", 0, "containerPort"), 9999, "ports[http].containerPort"),
        ("Deployment", (*C, "env", 0), {"name": "OTHER", "value": "1"}, "env["),
        ("Deployment", (*C, "command"), ["sh", "-c", "sleep 1d"], "command"),
        ("Deployment", (*C, "resources", "requests", "memory"), "2Gi", "requests.memory"),
        ("Deployment", ("spec", "template", "spec", "volumes", 1), {"name": "x"}, "volumes"),
        ("Deployment", ("spec", "replicas"), 7, "spec.replicas"),
        ("Deployment", ("metadata", "ownerReferences"), [], "ownerReferences"),
        ("Service", ("spec", "ports", 0, "port"), 80, "ports[http].port"),
        ("Service", ("spec", "selector", POOL), "baseline", "selector"),
        ("Service", ("spec", "selector"), ..., "spec.selector"),
        ("ConfigMap", ("data", "runtime-config.json"), "{}", "data.runtime-config.json"),
        ("ConfigMap", ("metadata", "labels", ISVC), "other", "labels"),
    ],
)
def test_an_edited_owned_field_is_drift(
    kind: str, path: tuple[str | int, ...], value: Any, reason: str
) -> None:
    obj = _desired()[kind]
    found = find_drift(obj, trim_child(_edit(_as_stored(obj), path, value)))
    assert found is not None and reason in found, (path, found)


def test_replicas_are_owned_like_any_field() -> None:
    # The operator applies the control loop's count (or, before it has decided, the live
    # count): a count changed by someone else is applied again.
    obj = _desired()["Deployment"]
    assert find_drift(obj, _edit(obj, ("spec", "replicas"), obj["spec"]["replicas"])) is None
    assert find_drift(obj, _edit(obj, ("spec", "replicas"), 0)) == "spec.replicas"


@pytest.mark.parametrize(
    ("want", "have", "drifted"),
    [
        ("1Gi", "1024Mi", False),
        ("0.5", "500m", False),
        ("2", 2, False),
        ("1G", "1Gi", True),
        ("1Gi", "2Gi", True),
        ("1Gi", None, True),
    ],
)
def test_quantities_compare_by_value(want: str, have: Any, drifted: bool) -> None:
    obj = {"spec": {"c": {"resources": {"limits": {"memory": want}}}}}
    live = {"spec": {"c": {"resources": {"limits": {"memory": have}}}}}
    assert (find_drift(obj, live) is not None) is drifted


def test_empty_values_the_server_leaves_out_are_no_drift() -> None:
    want = {"spec": {"env": [{"name": "EMPTY", "value": ""}], "args": []}}
    assert find_drift(want, {"spec": {"env": [{"name": "EMPTY"}]}}) is None
    assert find_drift(want, {"spec": {"env": [{"name": "EMPTY", "value": "x"}]}}) is not None
    # An empty object is kept (emptyDir: {} says which volume source): its absence is drift.
    volume = {"spec": {"volumes": [{"name": "tmp", "emptyDir": {}}]}}
    hostpath = {"spec": {"volumes": [{"name": "tmp", "hostPath": {"path": "/"}}]}}
    assert find_drift(volume, hostpath) == "spec.volumes[tmp].emptyDir"


def test_a_quantity_outside_resources_compares_as_written() -> None:
    assert find_drift({"data": {"k": "1Gi"}}, {"data": {"k": "1024Mi"}}) == "data.k"


def test_lists_without_identity_compare_whole() -> None:
    want = {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}]}}
    extra = {"spec": {"tolerations": [{"key": "gpu", "operator": "Exists"}, {"key": "x"}]}}
    assert find_drift(want, want) is None
    assert find_drift(want, extra) == "spec.tolerations"


def test_list_elements_match_by_name_whatever_their_order() -> None:
    want = {"spec": {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]}}
    swapped = {"spec": {"env": [{"name": "C", "value": "3"}, *reversed(want["spec"]["env"])]}}
    assert find_drift(want, swapped) is None


def test_trim_keeps_no_status_or_bookkeeping() -> None:
    live = trim_child(_as_stored(_desired()["Deployment"]))
    assert set(live) == {"metadata", "spec"}
    assert set(live["metadata"]) == {"labels", "annotations", "ownerReferences"}


KEYS = st.lists(st.tuples(st.text(max_size=5), st.text(max_size=5)), unique=True, max_size=30)


@given(
    keys=KEYS,
    period=st.floats(1.0, 1000.0),
    start=st.floats(0.0, 1e6),
    steps=st.lists(st.floats(0.001, 0.999), min_size=1, max_size=60),
)
def test_resync_sees_every_key_once_per_period(
    keys: list[tuple[str, str]], period: float, start: float, steps: list[float]
) -> None:
    offsets = {k: resync_offset(k, period) for k in keys}
    seen: Counter[tuple[str, str]] = Counter()
    since = start
    for step in steps:
        now = since + step * period  # a timer ticking within the period
        seen.update(resync_due(offsets, period, since, now))
        since = now
    elapsed = since - start
    for key in keys:
        # Windows never overlap, so a key is seen once per period it spans (+ 1 at the ends).
        assert int(elapsed // period) <= seen[key] <= int(elapsed // period) + 1, (key, seen)


def test_resync_offsets_are_stable_and_spread() -> None:
    keys = [("ns", f"svc-{i}") for i in range(1000)]
    offsets = [resync_offset(k, 300.0) for k in keys]
    assert offsets == [resync_offset(k, 300.0) for k in keys]
    assert all(0.0 <= o < 300.0 for o in offsets)
    per_10s = Counter(int(o // 10) for o in offsets)
    # 1,000 keys over 30 slots of 10 s: about 33 a slot, none holding a burst.
    assert max(per_10s.values()) < 100, per_10s


def test_a_late_resync_window_holds_every_key_once() -> None:
    offsets = {"a": 1.0, "b": 299.0}
    assert sorted(resync_due(offsets, 300.0, 0.0, 900.0)) == ["a", "b"]
    assert resync_due(offsets, 300.0, 10.0, 10.0) == []
    assert resync_due(offsets, 300.0, 298.0, 302.0) == ["a", "b"]  # wraps around
