"""Time-to-routable of a new replica on the sandbox's real node, per phase.

A real node (kubelet + containerd + kube-proxy + CoreDNS, tidal.sandbox.realnode) runs the CPU
example (onnxruntime, a generated MLP) from the runtime-cpu image, its engine served over HTTP by
a model store pod and kept in the node-local engine cache (``spec.runtime.engineCache``). The
operator runs as a local process. Each round raises ``minReplicas`` by one and times the new
pod from the scale request, by watching the API (pods, EndpointSlices) from this process and by
reading the runtime's own metrics; then the replica is removed again. The engine is in the node
cache from the first replica on, so every measured replica starts with a warm cache.

Phases (seconds since the scale request; each the first time this process saw it):
  decided     the operator raised the Deployment's replicas
  created     the pod object exists
  scheduled   spec.nodeName set
  started     the runtime container running (kubelet's report)
  ready       the pod's Ready condition True (kubelet's readiness probe passed)
  endpoint    the pod's address ready in the Service's EndpointSlice
  answered    the pod answered its first request sent to the Service's ClusterIP
and, from the runtime's /metrics: its own start to ready (tidal_startup_seconds) and the engine
load phases (fetch from the node cache, deserialize, warm-up).

Usage:  python bench/realnode_routable.py [--rounds 5]    (root; builds what it needs first)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e"))

from tidal.operator.core.api import LABEL_ISVC  # noqa: E402
from tidal.runtime.modelgen import write_mlp  # noqa: E402
from tidal.runtime.storage import sha256_file  # noqa: E402
from tidal.sandbox import Sandbox, SandboxConfig  # noqa: E402
from tidal.sandbox.incluster import model_store  # noqa: E402
from tidal.sandbox.operatorproc import OperatorProcess  # noqa: E402
from tidal.sandbox.realnode import STATE_DIR  # noqa: E402
from tidal.sandbox.wait import wait_for  # noqa: E402

NS = "bench"
NAME = "mlp-small"
INFER = json.dumps(
    {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
).encode()
PHASES = ("decided", "created", "scheduled", "started", "ready", "endpoint", "answered")


class Timeline:
    """First-seen times (monotonic) of each phase of each pod, fed by watch threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pods: dict[str, dict[str, float]] = {}
        self.ips: dict[str, str] = {}
        self.replicas_at: list[tuple[float, int]] = []

    def mark(self, pod: str, phase: str) -> None:
        with self.lock:
            self.pods.setdefault(pod, {}).setdefault(phase, time.monotonic())


def watch_pods(api: Any, timeline: Timeline, stop: threading.Event) -> None:
    from kubernetes import watch

    while not stop.is_set():
        for event in watch.Watch().stream(
            api.list_namespaced_pod,
            NS,
            label_selector=f"{LABEL_ISVC}={NAME}",
            timeout_seconds=5,
        ):
            pod = event["object"]
            name = pod.metadata.name
            timeline.mark(name, "created")
            if pod.spec.node_name:
                timeline.mark(name, "scheduled")
            for c in pod.status.container_statuses or []:
                if c.state and c.state.running:
                    timeline.mark(name, "started")
            for cond in pod.status.conditions or []:
                if cond.type == "Ready" and cond.status == "True":
                    timeline.mark(name, "ready")
            if pod.status.pod_ip:
                with timeline.lock:
                    timeline.ips[name] = pod.status.pod_ip
            if stop.is_set():
                return


def watch_slices(api: Any, timeline: Timeline, stop: threading.Event) -> None:
    from kubernetes import watch

    while not stop.is_set():
        for event in watch.Watch().stream(
            api.list_namespaced_endpoint_slice,
            NS,
            label_selector=f"kubernetes.io/service-name={NAME}",
            timeout_seconds=5,
        ):
            for ep in event["object"].endpoints or []:
                if ep.conditions and ep.conditions.ready and ep.target_ref is not None:
                    timeline.mark(ep.target_ref.name, "endpoint")
            if stop.is_set():
                return


def watch_deployment(api: Any, timeline: Timeline, stop: threading.Event) -> None:
    from kubernetes import watch

    while not stop.is_set():
        for event in watch.Watch().stream(
            api.list_namespaced_deployment,
            NS,
            field_selector=f"metadata.name={NAME}-primary",
            timeout_seconds=5,
        ):
            with timeline.lock:
                timeline.replicas_at.append((time.monotonic(), event["object"].spec.replicas))
            if stop.is_set():
                return


def scrape(ip: str) -> dict[str, float]:
    """The runtime's startup and load-phase figures from its /metrics."""
    text = urllib.request.urlopen(f"http://{ip}:8080/metrics", timeout=2).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tidal_startup_seconds "):
            out["runtime start to ready"] = float(line.split()[1])
        elif line.startswith("tidal_engine_load_seconds_sum{"):
            phase = line.split('phase="')[1].split('"')[0]
            out[f"engine {phase}"] = out.get(f"engine {phase}", 0.0) + float(line.split()[1])
        elif line.startswith("tidal_requests_total{"):
            out["requests"] = out.get("requests", 0.0) + float(line.split()[1])
    return out


def set_min_replicas(custom: Any, n: int) -> None:
    custom.patch_namespaced_custom_object(
        "serving.tidal.dev",
        "v1alpha1",
        NS,
        "inferenceservices",
        NAME,
        {"spec": {"autoscaling": {"minReplicas": n}}},
    )


def measure_round(timeline: Timeline, custom: Any, core: Any, svc_ip: str) -> dict[str, float]:
    """One replica added and timed (see the module docstring), then removed again."""
    before = set(timeline.pods)
    t0 = time.monotonic()
    set_min_replicas(custom, 2)
    new = wait_for(
        lambda: (set(timeline.pods) - before) or None, timeout=60, interval=0.01, what="the new pod"
    )
    pod = sorted(new)[0]
    ip = wait_for(lambda: timeline.ips.get(pod), timeout=60, interval=0.01, what="its IP")
    wait_for(lambda: "ready" in timeline.pods[pod], timeout=120, interval=0.01, what="ready")

    def answered() -> bool:
        # Requests to the ClusterIP until the new pod has answered one (its own counter).
        req = urllib.request.Request(
            f"http://{svc_ip}:8080/v2/models/{NAME}/infer",
            data=INFER,
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(req, timeout=5).read()
        return scrape(ip).get("requests", 0) > 0

    wait_for(answered, timeout=60, interval=0.02, what="its first answer")
    timeline.mark(pod, "answered")
    wait_for(lambda: "endpoint" in timeline.pods[pod], timeout=30, interval=0.01, what="endpoint")
    with timeline.lock:
        decided = next((t for t, n in timeline.replicas_at if t >= t0 and n >= 2), None)
        marks = dict(timeline.pods[pod])
    row = {ph: round(marks[ph] - t0, 3) for ph in PHASES if ph in marks}
    if decided is not None:
        row["decided"] = round(decided - t0, 3)
    row.update({k: round(v, 3) for k, v in scrape(ip).items() if k != "requests"})
    set_min_replicas(custom, 1)
    selector = f"{LABEL_ISVC}={NAME}"
    wait_for(
        lambda: len(core.list_namespaced_pod(NS, label_selector=selector).items) == 1,
        timeout=120,
        what="back to one pod",
    )
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    from kubernetes import client

    t_up = time.monotonic()
    with Sandbox(SandboxConfig(nodes=0, fake_nodes=0, real_node=True)) as sb:
        print(
            f"sandbox with a real node up in {time.monotonic() - t_up:.1f} s "
            f"(images: {sb.images.timings()})",
            flush=True,
        )
        sb.kubectl("create", "namespace", NS)
        sb.apply_crds(REPO / "crds")
        models = STATE_DIR / "bench-models"
        models.mkdir(parents=True, exist_ok=True)
        models.chmod(0o755)
        write_mlp(models / "mlp-small.onnx", seed=1)
        (models / "mlp-small.onnx").chmod(0o644)
        cache = STATE_DIR / "engine-cache"
        cache.mkdir(parents=True, exist_ok=True)
        os.chown(cache, 65532, 65532)
        image = sb.images.runtime_cpu.name
        sb.kubectl(
            "apply", "-n", NS, "-f", "-", input=yaml.safe_dump_all(model_store(image, str(models)))
        )
        doc = yaml.safe_load((REPO / "examples/onnx-cpu.yaml").read_text())
        spec = doc["spec"]
        spec["runtime"].pop("storage", None)  # the example's S3 store: served over HTTP here
        spec["runtime"].update(
            image=image,
            engineCache={"hostPath": str(cache)},
            resources={"requests": {"cpu": "100m", "memory": "256Mi"}},
            env=[{"name": "OMP_NUM_THREADS", "value": "1"}],
        )
        spec["models"][0]["engines"] = [
            {
                "uri": f"http://models.{NS}.svc.cluster.local:8000/mlp-small.onnx",
                "sha256": sha256_file(models / "mlp-small.onnx"),
            }
        ]
        spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": 8, "scaleDownDelaySeconds": 5}
        log = Path(tempfile.mkdtemp()) / "operator.log"
        with OperatorProcess({**os.environ, **sb.env}, NS, log, "plain") as _op:
            sb.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(doc))
            core = client.CoreV1Api(sb.api_client())
            apps = client.AppsV1Api(sb.api_client())
            disc = client.DiscoveryV1Api(sb.api_client())
            custom = client.CustomObjectsApi(sb.api_client())
            wait_for(
                lambda: any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in (
                        custom.get_namespaced_custom_object(
                            "serving.tidal.dev", "v1alpha1", NS, "inferenceservices", NAME
                        ).get("status")
                        or {}
                    ).get("conditions")
                    or []
                ),
                timeout=300,
                what=f"{NAME} Ready",
            )
            svc_ip = core.read_namespaced_service(NAME, NS).spec.cluster_ip
            timeline, stop = Timeline(), threading.Event()
            threads = [
                threading.Thread(target=f, args=(a, timeline, stop), daemon=True)
                for f, a in ((watch_pods, core), (watch_slices, disc), (watch_deployment, apps))
            ]
            for t in threads:
                t.start()
            time.sleep(2)  # watches established
            rows: list[dict[str, float]] = []
            for r in range(args.rounds):
                row = measure_round(timeline, custom, core, svc_ip)
                rows.append(row)
                print(f"round {r + 1}: {json.dumps(row)}", flush=True)
            stop.set()
        keys = [*PHASES, *sorted({k for r in rows for k in r} - set(PHASES))]
        print(
            f"\nnew replica on the real node, warm node cache, {len(rows)} rounds "
            "(seconds from the scale request; medians, then worst):"
        )
        for k in keys:
            vals = [r[k] for r in rows if k in r]
            if vals:
                print(f"  {k:26} {statistics.median(vals):7.3f}  {max(vals):7.3f}")
        answered = [r["answered"] for r in rows if "answered" in r]
        print(
            f"\ngoal: routable (first answer through the Service) <= 3 s with a warm cache: "
            f"median {statistics.median(answered):.2f} s -> "
            f"{'met' if statistics.median(answered) <= 3 else 'NOT met'}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
