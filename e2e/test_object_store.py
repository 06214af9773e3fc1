"""End to end: engines from an object store (issue 32's cold tier) on the real node.

The sandbox runs versitygw, a real S3-compatible server built from the Go module proxy, on the
node's bridge, with an in-cluster name (``Sandbox.objects_url``) as a user's store has. A user
puts an engine in a bucket, keeps the store's keys in a Secret, and names both in the
InferenceService: the runtime streams the object into the node-local engine cache, verifies its
sha256, and the service answers. A missing Secret, or a key that is not in the bucket, is
``Degraded`` naming what to fix — never a crash loop.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest
from scenario import INFER_BODY, apply, events, install_crd, running_operator

from tidal.runtime.modelgen import write_mlp
from tidal.sandbox.loadgen import LoadGenerator
from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.realnode, pytest.mark.timeout(420)]

BUCKET = "engines"
SECRET = "engine-store"


def s3_service(
    name: str, uri: str, endpoint: str, secret: str, sha256: str | None
) -> dict[str, Any]:
    engine: dict[str, Any] = {"uri": uri}
    if sha256 is not None:
        engine["sha256"] = sha256
    return {
        "apiVersion": "serving.tidal.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "runtime": {
                "backend": "onnxruntime",
                "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
                "storage": {"s3": {"endpoint": endpoint, "credentialsSecret": secret}},
            },
            "models": [
                {
                    "name": "mlp",
                    "engines": [engine],
                    "maxBatchSize": 8,
                    "warmup": {"batchSizes": [1], "iterations": 1},
                }
            ],
            "autoscaling": {"minReplicas": 1, "maxReplicas": 1, "standbyReplicas": 0},
        },
    }


def degraded_with(sandbox: Any, namespace: str, name: str, *needles: str) -> Any:
    def check() -> dict[str, Any] | None:
        cond = condition(get_isvc(sandbox, namespace, name), "Degraded")
        message = cond.get("message", "")
        if cond.get("status") == "True" and all(n in message for n in needles):
            return cond
        return None

    def describe() -> str:
        body = get_isvc(sandbox, namespace, name)
        return f"conditions: {(body.get('status') or {}).get('conditions')}"

    return wait_for(
        check,
        timeout=180,
        interval=1.0,
        what=f"{name} Degraded naming {needles}",
        describe=describe,
    )


def test_engines_from_the_object_store_and_what_a_user_sees_when_it_fails(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    store, endpoint = sandbox.objects, sandbox.objects_url
    assert store is not None and endpoint, "the real node's sandbox runs an object store"
    install_crd(sandbox)
    store.create_bucket(BUCKET)
    model = tmp_path / "mlp.onnx"
    write_mlp(model, seed=3)
    data = model.read_bytes()
    key = f"{namespace}/mlp/v1/model.onnx"
    store.put(BUCKET, key, data)
    sha = hashlib.sha256(data).hexdigest()
    sandbox.kubectl(
        "create",
        "secret",
        "generic",
        SECRET,
        "-n",
        namespace,
        f"--from-literal=AWS_ACCESS_KEY_ID={store.access_key}",
        f"--from-literal=AWS_SECRET_ACCESS_KEY={store.secret_key}",
    )
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        # 1. the engine from the store: Ready, answers
        apply(
            sandbox, namespace, s3_service("stored", f"s3://{BUCKET}/{key}", endpoint, SECRET, sha)
        )
        # 2. a Secret that does not exist: Degraded naming the field (the pod cannot start)
        apply(
            sandbox,
            namespace,
            s3_service("nosecret", f"s3://{BUCKET}/{key}", endpoint, "no-such-secret", sha),
        )
        # 3. a key that is not in the bucket: Degraded naming the URI and the store's answer
        missing = f"s3://{BUCKET}/{namespace}/mlp/v9/model.onnx"
        apply(sandbox, namespace, s3_service("nokey", missing, endpoint, SECRET, None))

        wait_for(
            lambda: (
                condition(get_isvc(sandbox, namespace, "stored"), "Ready").get("status") == "True"
            ),
            timeout=240,
            interval=1.0,
            what="the service whose engine is in the object store to be Ready",
            describe=lambda: str(get_isvc(sandbox, namespace, "stored").get("status")),
        )
        load = LoadGenerator(
            sandbox.api_client(), namespace, "stored", "mlp", INFER_BODY, lambda t: 10.0
        )
        report = asyncio.run(load.run(5.0))
        failures = report.failures()
        assert report.samples and not failures, f"{len(failures)} failed: {failures[:3]}"

        no_secret = degraded_with(
            sandbox, namespace, "nosecret", "spec.runtime.storage.s3.credentialsSecret"
        )
        no_key = degraded_with(sandbox, namespace, "nokey", missing, "no such bucket or key")
        stored = get_isvc(sandbox, namespace, "stored")
        nokey_events = events(sandbox, namespace, "nokey")

    print(
        f"\nstored: {stored['status'].get('pools', {}).get('primary', {})}"
        f"\nnosecret Degraded: {no_secret['message']}\nnokey Degraded: {no_key['message']}"
    )
    assert condition(stored, "Degraded").get("status") != "True", condition(stored, "Degraded")
    assert no_key["reason"] == "EngineLoadFailed", (no_key, nokey_events)
