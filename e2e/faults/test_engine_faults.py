"""Engines that cannot load: the pod stays up and not Ready, the InferenceService says why.

Four InferenceServices side by side, each with one runtime pod whose only engine cannot load:

* ``corrupt``: the ``.onnx`` file is random bytes;
* ``mismatch``: a good file whose ``sha256`` in the spec is not its own;
* ``unreachable``: the engine's store (``http://127.0.0.1:9/...``) refuses connections;

each must leave its pod Running and not Ready (no crash loop: 0 restarts) and the
InferenceService ``Degraded`` with reason ``EngineLoadFailed`` naming the pod and the runtime's
own reason, with a Warning Event. A fourth, ``mixed``, serves a good model (preloaded) and a
corrupt one loaded on demand: the request for the corrupt one gets a 5xx naming the engine and
the runtime's reason (the engine is broken, not the request), the good
one keeps being served hot from the cache (nothing evicted), the pod stays Ready.

Then a staged rollout of ``steady`` (primary and baseline healthy, under load) to a corrupt
engine: the baseline keeps serving every request while the new primary's pods stay not Ready,
and the InferenceService says why.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    INFER_BODY,
    apply,
    baseline_rollout,
    events,
    install_crd,
    model_service,
    pods,
    running_operator,
)

from tidal.runtime.modelgen import write_mlp
from tidal.sandbox.loadgen import LoadGenerator, LoadReport
from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(300)]


def _service(name: str, models: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "serving.tidal.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "runtime": {
                "backend": "onnxruntime",
                "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
            },
            "models": models,
            "autoscaling": {"minReplicas": 1, "maxReplicas": 1},
        },
    }


def _model(name: str, uri: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "engines": [{"uri": uri, **extra.pop("engine", {})}],
        "maxBatchSize": 8,
        "warmup": {"batchSizes": [1], "iterations": 1},
        **extra,
    }


def _degraded_by_engines(sandbox: Any, namespace: str, name: str) -> dict[str, Any] | None:
    body = get_isvc(sandbox, namespace, name)
    cond = condition(body, "Degraded")
    ok = cond.get("status") == "True" and cond.get("reason") == "EngineLoadFailed"
    return cond if ok else None


def _pods_of(sandbox: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    return [
        p
        for p in pods(sandbox, namespace)
        if p["metadata"]["labels"].get("serving.tidal.dev/isvc") == name
    ]


def _post(url: str, body: dict[str, Any]) -> tuple[int, str]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_engines_that_cannot_load_leave_pods_not_ready_with_the_reason(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    good = tmp_path / "good.onnx"
    write_mlp(good, seed=1)
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(os.urandom(4096))
    wrong = hashlib.sha256(b"another file").hexdigest()
    services = {
        "corrupt": ([_model("m", corrupt.as_uri())], "corrupt.onnx"),
        "mismatch": ([_model("m", good.as_uri(), engine={"sha256": wrong})], "sha256"),
        "unreachable": ([_model("m", "http://127.0.0.1:9/m.onnx")], "127.0.0.1:9"),
    }
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        for name, (models, _) in services.items():
            apply(sandbox, namespace, _service(name, models))
        mixed = [
            _model("good", good.as_uri()),
            _model("bad", corrupt.as_uri(), preload=False),
        ]
        apply(sandbox, namespace, _service("mixed", mixed))

        found = {
            name: wait_for(
                lambda name=name: _degraded_by_engines(sandbox, namespace, name),
                timeout=90,
                interval=1.0,
                what=f"{name}: Degraded EngineLoadFailed",
            )
            for name in services
        }
        wait_for(
            lambda: (
                condition(get_isvc(sandbox, namespace, "mixed"), "Ready").get("status") == "True"
            ),
            timeout=90,
            what="mixed Ready",
        )
        (mixed_pod,) = _pods_of(sandbox, namespace, "mixed")
        base = f"http://{mixed_pod['status']['podIP']}:8080"
        good_answers = [_post(f"{base}/v2/models/good/infer", INFER_BODY) for _ in range(3)]
        bad_status, bad_body = _post(f"{base}/v2/models/bad/infer", INFER_BODY)
        after_bad = _post(f"{base}/v2/models/good/infer", INFER_BODY)
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
            exposition = response.read().decode()
        reasons = {name: [e["reason"] for e in events(sandbox, namespace, name)] for name in found}
        pod_states = {name: _pods_of(sandbox, namespace, name) for name in services}
        mixed_ready = condition(get_isvc(sandbox, namespace, "mixed"), "Degraded")

    for name, cond in found.items():
        print(f"\n{name}: {cond['message'][:240]}")
    print(f"mixed: bad model -> {bad_status} {bad_body[:160]}; good after it -> {after_bad[0]}")
    for name, (_, needle) in services.items():
        (pod,) = pod_states[name]
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert not any(
            c["type"] == "Ready" and c["status"] == "True" for c in pod["status"]["conditions"]
        )
        restarts = sum(c.get("restartCount", 0) for c in pod["status"]["containerStatuses"])
        assert restarts == 0, f"{name}: the runtime crash-looped"
        message = found[name]["message"]
        assert pod["metadata"]["name"] in message and needle in message, message
        assert "EngineLoadFailed" in reasons[name], reasons[name]
    assert [s for s, _ in good_answers] == [200, 200, 200]
    assert 500 <= bad_status < 600 and "corrupt.onnx" in bad_body, bad_body
    assert after_bad[0] == 200
    assert 'tidal_model_ready{model="good"} 1.0' in exposition
    assert "tidal_engine_cache_evictions_total{" not in exposition or (
        'tidal_engine_cache_evictions_total{model="good"} 0.0' in exposition
    )
    # A model that fails on demand is the request's problem, not the pod's: still not Degraded.
    assert mixed_ready.get("reason") != "EngineLoadFailed", mixed_ready


def test_a_rollout_to_a_corrupt_engine_leaves_the_baseline_serving(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "steady"
    manifest = model_service(
        name,
        tmp_path / "mlp.onnx",
        env={},
        autoscaling={"minReplicas": 1, "maxReplicas": 2, "targetQueueDepth": 8},
        rollout=baseline_rollout(
            drain_seconds=3, slo={"p99Ms": 2000, "for": "5s", "minRequests": 10}
        ),
    )
    # The baseline keeps its own (validated) models; the primary's change to a corrupt engine.
    manifest["spec"]["rollout"]["baseline"]["models"] = json.loads(
        json.dumps(manifest["spec"]["models"])
    )
    corrupt = tmp_path / "corrupt.onnx"
    corrupt.write_bytes(os.urandom(4096))
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        apply(sandbox, namespace, manifest)

        def ready() -> bool:
            body = get_isvc(sandbox, namespace, name)
            pools = (body.get("status") or {}).get("pools") or {}
            rollout = (body.get("status") or {}).get("rollout") or {}
            both = all(pools.get(p, {}).get("ready", 0) >= 1 for p in ("primary", "baseline"))
            return both and rollout.get("phase") == "Stable"

        wait_for(ready, timeout=120, interval=1.0, what="both pools ready, Stable")
        load = LoadGenerator(
            sandbox.api_client(), namespace, name, "mlp", INFER_BODY, lambda t: 10.0, refresh=0.1
        )
        result: dict[str, LoadReport] = {}
        runner = threading.Thread(
            target=lambda: result.update(report=asyncio.run(load.run(40.0))), daemon=True
        )
        runner.start()
        manifest["spec"]["models"][0]["engines"] = [{"uri": corrupt.as_uri()}]
        apply(sandbox, namespace, manifest)
        cond = wait_for(
            lambda: _degraded_by_engines(sandbox, namespace, name),
            timeout=60,
            interval=1.0,
            what="Degraded EngineLoadFailed for the new primary",
        )
        runner.join(timeout=60)
        body = get_isvc(sandbox, namespace, name)
    report = result["report"]
    rollout = body["status"]["rollout"]
    print(
        f"\nrollout {rollout['phase']} traffic {rollout['traffic']}: {cond['message'][:200]}; "
        f"requests {len(report.samples)}, failed {len(report.failures())}"
    )
    assert "pool primary" in cond["message"]
    assert rollout["traffic"] == "baseline"
    assert len(report.samples) > 300
    assert not report.failures(), report.failures()[:5]
