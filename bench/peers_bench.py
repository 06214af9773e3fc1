"""tidal against the real peers, side by side: KEDA and the Horizontal Pod Autoscaler on the
sandbox's real node, the same pods, the same traffic, in the same run.

The sandbox (real node, with the API server's aggregation layer) runs metrics-server and KEDA's
operator and adapter as host processes (tidal.sandbox.peers, built by build-peers.sh). Per
trace, five autoscalers scale five copies of one Deployment at once, each fed the identical
request schedule by its own load generator (tidal.sandbox.loadgen, to the ready endpoints of
its Service):

  tidal         an InferenceService (its operator makes the Deployment; every other copy is
                cloned from that Deployment: same image, model, runtime config, probes, resources);
                scaleDownDelaySeconds 30; on the day minReplicas 0, scaleToZeroAfterSeconds 20
  hpa-default   HPA on CPU through metrics-server: target 80 % (kubectl autoscale's default),
                default behaviour (scale-down stabilisation 300 s)
  hpa-tuned     HPA on CPU, target set from the CPU per request measured at the quiet rate
                (what a replica uses at 70 % of its capacity), no stabilisation either way,
                policies that allow any step
  keda-default  a ScaledObject with two triggers: the runtime's in-flight requests (Prometheus
                scaler, 1.5 a replica) and the requests/s its clients send (metrics-api scaler,
                3.5 a replica; the signal that exists at zero, as an ingress's count would);
                KEDA's defaults (pollingInterval 30 s, cooldownPeriod 300 s, minReplicaCount 0,
                HPA default behaviour)
  keda-tuned    the same triggers, pollingInterval 1 s, cooldownPeriod 20 s, HPA behaviour
                without stabilisation; minReplicaCount 0 on the day (activation wakes it),
                else 1

All target 70 % of a replica's capacity (tidal's targetUtilization default). The HPA controller
syncs every 15 s (kube-controller-manager's default; a cluster flag, not a per-object setting).
Each replica is an emulated device (the runtime's ``faults.serviceTimeMs`` with one execution
slot, batch 1): CAPACITY requests a second, whatever the 2 shared cores do, plus a warm-up.
Knative's KPA needs an Envoy-based networking layer that cannot be built here: it is not run
(its row in bench/autoscale_sim.py stays simulated).

Usage:  python bench/peers_bench.py [--traces step,herd,sawtooth,day] [--out DIR]  (root)
        python bench/peers_bench.py --from-raw DIR     (the tables again from a run's outputs)
Raw outputs (every answer and every replica observation per autoscaler) go to DIR as gzipped
JSON, one file a trace, with the printed table and the peers' and the operator's logs.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import copy
import datetime as dt
import gzip
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e"))
sys.path.insert(0, str(REPO / "bench"))

from peers_report import (  # noqa: E402
    Answer,
    Replicas,
    Row,
    Trace,
    measure,
    summary,
    table,
    traces,
)
from scenario import INFER_BODY, capacity_limited_service  # noqa: E402

from tidal.sandbox import Sandbox, SandboxConfig  # noqa: E402
from tidal.sandbox.loadgen import LoadGenerator, LoadReport  # noqa: E402
from tidal.sandbox.operatorproc import OperatorProcess  # noqa: E402
from tidal.sandbox.peers import Peers  # noqa: E402
from tidal.sandbox.wait import WaitTimeout, wait_for  # noqa: E402

SERVICE_MS = 200.0  # one request holds the replica's one slot this long
CAPACITY = 1000.0 / SERVICE_MS  # requests/s a replica serves
WARMUP_S = 3.0
BASE_RPS = 3.0
SLO_S = 1.0
MAX_REPLICAS = 8
# In-flight requests per replica at 70 % of CAPACITY (M/D/1: 0.7 + 0.7^2 / (2 x 0.3) = 1.5):
# the target KEDA's trigger and tidal's targetUtilization (0.7) both aim at.
TARGET_INFLIGHT = 1.5
# Until the calibration (below) measures what a replica uses at the target load: then every
# peer's CPU request is set to that, as a user sizing requests from `kubectl top` would.
CPU_REQUEST = "25m"
HPA_SYNC_S = 15.0  # the HPA controller's sync period (KEDA's HPA too): onsets at random phases
PEERS = ("hpa-default", "hpa-tuned", "keda-default", "keda-tuned")
ISVC_LABEL = "serving.tidal.dev/isvc"


def tuned(name: str) -> bool:
    return name.endswith("-tuned")


def no_stabilisation() -> dict[str, Any]:
    """HPA behaviour that acts on each recommendation at once, by any step (autoscaling/v2)."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [{"type": "Percent", "value": 1000, "periodSeconds": 1}],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}],
        },
    }


def hpa(name: str, namespace: str, utilization: int, tuned_behaviour: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
        "minReplicas": 1,
        "maxReplicas": MAX_REPLICAS,
        "metrics": [
            {
                "type": "Resource",
                "resource": {
                    "name": "cpu",
                    "target": {"type": "Utilization", "averageUtilization": utilization},
                },
            }
        ],
    }
    if tuned_behaviour:
        spec["behavior"] = no_stabilisation()
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def scaled_object(
    name: str, namespace: str, prometheus: str, offered_url: str, tuned_: bool, idle: bool
) -> dict[str, Any]:
    """Two triggers: the runtime's in-flight requests (Prometheus) and the clients' offered
    rate (metrics-api), the demand signal that exists at zero, as an ingress's request rate
    would. minReplicaCount: KEDA's default (0) for the default; tuned, 0 on the trace with an
    idle night (``idle``: KEDA scales 0<->1 itself on activation), else 1."""
    spec: dict[str, Any] = {
        "scaleTargetRef": {"name": name},
        "maxReplicaCount": MAX_REPLICAS,
        "triggers": [
            {
                "type": "prometheus",
                "metadata": {
                    "serverAddress": prometheus,
                    "query": f'sum(tidal_inflight_requests{{namespace="{namespace}",'
                    f'isvc="{name}"}})',
                    "threshold": str(TARGET_INFLIGHT),
                },
            },
            {
                "type": "metrics-api",
                "metadata": {
                    "url": offered_url,
                    "valueLocation": "rate",
                    "targetValue": str(0.7 * CAPACITY),
                    "activationTargetValue": "0",
                },
            },
        ],
    }
    if tuned_:
        spec.update(
            minReplicaCount=0 if idle else 1,
            pollingInterval=1,
            cooldownPeriod=20,
            advanced={"horizontalPodAutoscalerConfig": {"behavior": no_stabilisation()}},
        )
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


class CountingLoad(LoadGenerator):
    """A load generator that also notes when it sends each request (sent or failed at once)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sends: collections.deque[float] = collections.deque(maxlen=10_000)

    async def _one(self, session: Any, t0: float) -> None:
        self.sends.append(time.monotonic())
        await super()._one(session, t0)


class OfferedRate:
    """An HTTP endpoint on the host: ``GET /<service>`` answers ``{"rate": r}``, the requests a
    second the service's clients sent over the last 2 s, answered or not: what an ingress in
    front of the service counts, at zero too. Before the trace it reports the trace's first
    rate, the steady state the trace begins in (a quiet rate, or the night's 0)."""

    def __init__(self, trace: Trace) -> None:
        import http.server

        self.trace = trace
        self.loads: dict[str, CountingLoad] = {}
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"rate": owner.rate(self.path.strip("/"))}).encode()
                self.send_response(200)
                for header, value in (
                    ("Content-Type", "application/json"),
                    ("Content-Length", len(body)),
                ):
                    self.send_header(header, str(value))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # quiet: KEDA asks every second
                return None

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def rate(self, service: str) -> float:
        load = self.loads.get(service)
        if load is None:
            return self.trace.rate(0.0)
        since = time.monotonic() - 2.0
        return sum(1 for t in list(load.sends) if t >= since) / 2.0

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def clone(deployment: Any, name: str, namespace: str) -> list[dict[str, Any]]:
    """A copy of tidal's Deployment (its pod template as is, relabelled) and a Service."""
    from kubernetes import client

    body = client.ApiClient().sanitize_for_serialization(deployment)
    template = copy.deepcopy(body["spec"]["template"])
    labels = {"app": name, ISVC_LABEL: name}
    template["metadata"] = {
        "labels": labels,
        "annotations": {
            k: v
            for k, v in (template["metadata"].get("annotations") or {}).items()
            if k.startswith("prometheus.io/")
        },
    }
    template["spec"].pop("readinessGates", None)
    ports = [
        {"name": p.get("name") or f"p{p['containerPort']}", "port": p["containerPort"]}
        for c in template["spec"]["containers"]
        for p in c.get("ports") or []
    ]
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template},
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": labels, "ports": ports},
        },
    ]


def referenced_config_maps(template: dict[str, Any]) -> set[str]:
    names = {
        v["configMap"]["name"] for v in template["spec"].get("volumes") or [] if "configMap" in v
    }
    for c in template["spec"]["containers"]:
        for e in c.get("env") or []:
            ref = (e.get("valueFrom") or {}).get("configMapKeyRef")
            if ref:
                names.add(ref["name"])
    return names


class ReplicaRecorder:
    """Polls the Deployments of the namespaces every 0.5 s: (wall time, desired, existing,
    ready) per Deployment."""

    def __init__(self, api_client: Any, namespaces: dict[str, str]) -> None:
        from kubernetes import client

        self.apps = client.AppsV1Api(api_client)
        self.namespaces = namespaces  # deployment name -> namespace
        self.series: dict[str, list[tuple[float, int, int, int]]] = {n: [] for n in namespaces}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="replicas")

    def _run(self) -> None:
        while not self._stop.is_set():
            for ns in set(self.namespaces.values()):
                with contextlib.suppress(Exception):
                    now = time.time()
                    for d in self.apps.list_namespaced_deployment(ns).items:
                        name = d.metadata.name
                        if name in self.series and self.namespaces[name] == ns:
                            self.series[name].append(
                                (
                                    now,
                                    d.spec.replicas or 0,
                                    d.status.replicas or 0,
                                    d.status.ready_replicas or 0,
                                )
                            )
            self._stop.wait(0.5)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def set_cpu_request(sb: Sandbox, namespace: str, names: Sequence[str], cpu: str) -> None:
    """Every container of the Deployments asks for ``cpu``; waits until they are Ready again."""
    from kubernetes import client

    apps = client.AppsV1Api(sb.api_client())
    for name in names:
        dep = apps.read_namespaced_deployment(name, namespace)
        containers = [
            {"name": c.name, "resources": {"requests": {"cpu": cpu}}}
            for c in dep.spec.template.spec.containers
        ]
        apps.patch_namespaced_deployment(
            name, namespace, {"spec": {"template": {"spec": {"containers": containers}}}}
        )

    def rolled(name: str) -> bool:
        d = apps.read_namespaced_deployment(name, namespace)
        st = d.status
        return bool(st.updated_replicas == st.ready_replicas == st.replicas == d.spec.replicas)

    for name in names:
        wait_for(
            lambda n=name: rolled(n),
            timeout=300,
            interval=1,
            what=f"{name} Ready with the measured CPU request",
        )
    print(f"peers' CPU request set to {cpu} (the CPU of a replica at the target load)", flush=True)


def cpu_millis(sb: Sandbox, namespace: str, name: str) -> float | None:
    """The pods' mean CPU (millicores) from metrics.k8s.io, as `kubectl top` reads it."""
    out = sb.kubectl(
        "get", "--raw", f"/apis/metrics.k8s.io/v1beta1/namespaces/{namespace}/pods", check=False
    )
    if out.returncode != 0:
        return None
    values = []
    for item in json.loads(out.stdout).get("items", []):
        if not item["metadata"]["name"].startswith(name + "-"):
            continue
        for c in item["containers"]:
            cpu = c["usage"]["cpu"]
            values.append(
                float(cpu[:-1]) / 1e6
                if cpu.endswith("n")
                else float(cpu[:-1])
                if cpu.endswith("m")
                else float(cpu) * 1000
            )
    return statistics.mean(values) if values else None


def calibrate_cpu(sb: Sandbox, namespace: str, name: str, seconds: float = 40.0) -> float | None:
    """Millicores per request/s of one replica: BASE_RPS for ``seconds``, then metrics.k8s.io
    (None when it has no figure: under the node agent, which has no kubelet)."""
    gen = LoadGenerator(sb.api_client(), namespace, name, "mlp", INFER_BODY, lambda t: BASE_RPS)
    asyncio.run(gen.run(seconds))
    try:
        m = wait_for(
            lambda: cpu_millis(sb, namespace, name), timeout=60, interval=2, what="CPU of " + name
        )
    except WaitTimeout:
        print("calibration: no CPU figure from metrics.k8s.io; hpa-tuned keeps 80 %", flush=True)
        return None
    print(f"calibration: {m:.1f} millicores at {BASE_RPS:g} req/s on one replica", flush=True)
    return m / BASE_RPS


def run_trace(
    sb: Sandbox, trace: Trace, out: Path, cpu_per_rps: list[float | None], run: int = 1
) -> list[Row]:
    from kubernetes import client

    t_ns, p_ns = f"t-{trace.name}-{run}", f"p-{trace.name}-{run}"
    for ns in (t_ns, p_ns):
        sb.kubectl("create", "namespace", ns)
    zero = trace.name == "day"
    autoscaling: dict[str, Any] = {
        "minReplicas": 0 if zero else 1,
        "maxReplicas": MAX_REPLICAS,
        "scaleDownDelaySeconds": 30,
        # the gateway in front as the burst buffer (at minReplicas 0 the activator is one)
        "burstBuffer": not zero,
    }
    if zero:
        autoscaling["scaleToZeroAfterSeconds"] = 20
    manifest = capacity_limited_service(
        "tidal",
        Path(tempfile.mkdtemp()) / "mlp.onnx",
        service_ms=SERVICE_MS,
        batch_rows=1,
        warmup_seconds=WARMUP_S,
        autoscaling=autoscaling,
    )
    manifest["spec"]["runtime"]["resources"] = {"requests": {"cpu": CPU_REQUEST, "memory": "200Mi"}}
    apps = client.AppsV1Api(sb.api_client())
    core = client.CoreV1Api(sb.api_client())
    log = Path(tempfile.mkdtemp()) / f"operator-{trace.name}.log"
    rows: list[Row] = []
    with OperatorProcess({**os.environ, **sb.env}, t_ns, log, "plain"):
        sb.kubectl("apply", "-n", t_ns, "-f", "-", input=yaml.safe_dump(sb.adapt(manifest)))
        dep = wait_for(
            lambda: (
                (d := apps.read_namespaced_deployment("tidal-primary", t_ns))
                and (d.status.ready_replicas or 0) >= 1
                and d
            ),
            timeout=300,
            interval=1,
            what="tidal's first replica Ready",
        )
        body = client.ApiClient().sanitize_for_serialization(dep)
        for cm in referenced_config_maps(body["spec"]["template"]):
            src = core.read_namespaced_config_map(cm, t_ns)
            core.create_namespaced_config_map(p_ns, {"metadata": {"name": cm}, "data": src.data})
        sa = body["spec"]["template"]["spec"].get("serviceAccountName")
        if sa and sa != "default":
            sb.kubectl("create", "serviceaccount", sa, "-n", p_ns)
        docs = [doc for name in PEERS for doc in clone(dep, name, p_ns)]
        sb.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))
        for name in PEERS:
            wait_for(
                lambda n=name: (
                    (apps.read_namespaced_deployment(n, p_ns).status.ready_replicas or 0) >= 1
                ),
                timeout=300,
                interval=1,
                what=f"{name} Ready",
            )
        if not cpu_per_rps:
            cpu_per_rps.append(calibrate_cpu(sb, p_ns, "hpa-tuned"))
        # The CPU request a user would set: what a replica uses at the target load (70 % of its
        # capacity), from the CPU per request measured at a known rate (`kubectl top`). With it
        # the default HPA's 80 % fires at 56 % of capacity and the tuned HPA targets 100 %: a
        # replica at the target load. (v0.4's bench kept 25m, where 80 % could never fire.)
        per_rps = cpu_per_rps[0]
        tuned_target = 80
        if per_rps is not None:
            request_m = max(5, round(per_rps * 0.7 * CAPACITY))
            set_cpu_request(sb, p_ns, PEERS, f"{request_m}m")
            tuned_target = 100
        prometheus = sb.prometheus_url
        offered = OfferedRate(trace)
        url = f"http://127.0.0.1:{offered.port}"
        scalers = [
            hpa("hpa-default", p_ns, 80, False),
            hpa("hpa-tuned", p_ns, tuned_target, True),
            scaled_object("keda-default", p_ns, prometheus, f"{url}/keda-default", False, zero),
            scaled_object("keda-tuned", p_ns, prometheus, f"{url}/keda-tuned", True, zero),
        ]
        sb.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(scalers))
        if zero:
            # Those that scale to zero (tidal after scaleToZeroAfterSeconds, keda-tuned after
            # its cooldown) are at zero when the day begins, as after a quiet night.
            for name, ns in (("tidal-primary", t_ns), ("keda-tuned", p_ns)):
                wait_for(
                    lambda n=name, s=ns: apps.read_namespaced_deployment(n, s).spec.replicas == 0,
                    timeout=180,
                    interval=1,
                    what=f"{name} at zero",
                )
        # Scalers settled on their first reading, then a random phase of the HPA's sync: a
        # fixed wait put every onset at the same point of it (v0.4: KEDA "decided" 10.7 s after
        # every surge, a phase artefact; a random phase averages ~7.5 s).
        phase = random.uniform(0.0, HPA_SYNC_S)
        time.sleep(5 + phase)
        recorder = ReplicaRecorder(
            sb.api_client(),
            {"tidal-primary": t_ns, "tidal-gateway": t_ns, **dict.fromkeys(PEERS, p_ns)},
        )
        recorder.start()
        gens = {
            name: CountingLoad(
                sb.api_client(),
                ns,
                svc,
                "mlp",
                INFER_BODY,
                trace.rate,
                timeout=15.0,
                refresh=0.2,
            )
            for name, ns, svc in [("tidal", t_ns, "tidal")] + [(p, p_ns, p) for p in PEERS]
        }

        async def drive() -> list[LoadReport]:
            return list(await asyncio.gather(*(g.run(trace.duration) for g in gens.values())))

        offered.loads = {name: gens[name] for name in ("keda-default", "keda-tuned")}
        reports = dict(zip(gens, asyncio.run(drive()), strict=True))
        recorder.stop()
        offered.close()
        raw: dict[str, Any] = {
            "trace": asdict(trace),
            "slo_s": SLO_S,
            "capacity_rps": CAPACITY,
            "hpa_tuned_target_pct": tuned_target,
            "onset_phase_s": phase,
            "cpu_millis_per_rps": cpu_per_rps[0],
            "autoscalers": {},
        }
        for name, report in reports.items():
            t0_wall = statistics.median(s.wall - s.sent for s in report.samples)
            series_key = "tidal-primary" if name == "tidal" else name
            series = [Replicas(t - t0_wall, d, e, r) for t, d, e, r in recorder.series[series_key]]
            gateway = (
                [Replicas(t - t0_wall, d, e, r) for t, d, e, r in recorder.series["tidal-gateway"]]
                if name == "tidal"
                else []
            )
            answers = [Answer(s.sent, s.latency, s.ok) for s in report.samples]
            rows.append(
                measure(
                    name, trace, answers, series, slo=SLO_S, capacity_rps=CAPACITY, gateway=gateway
                )
            )
            raw["autoscalers"][name] = {
                "samples": [asdict(s) for s in report.samples],
                "dropped": report.dropped,
                "replicas": [asdict(s) for s in series],
                "gateway": [asdict(s) for s in gateway],
                "endpoint_changes": report.endpoint_changes,
                "row": asdict(rows[-1]),
            }
        with gzip.open(out / f"{trace.name}-{run}.json.gz", "wt") as f:
            json.dump(raw, f)
        (out / f"operator-{trace.name}-{run}.log").write_text(log.read_text(errors="replace"))
        sb.kubectl("delete", "inferenceservice", "tidal", "-n", t_ns, "--wait=true", check=False)
    for ns in (t_ns, p_ns):
        sb.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    return rows


def read_raw(directory: Path) -> list[dict[str, Any]]:
    """A run's raw outputs, ``<trace>.json.gz``, in the order the traces ran."""
    runs = [json.loads(gzip.decompress(p.read_bytes())) for p in directory.glob("*.json.gz")]
    order = list(traces(BASE_RPS))
    return sorted(runs, key=lambda r: order.index(r["trace"]["name"]))


def tables_from_raw(directory: Path) -> list[str]:
    """The tables again from a run's raw outputs, without running anything: each trace's
    runs one by one, then (with several) their medians and ranges, as a run prints them. The
    traces may come from separate invocations with the same ``--out`` (one trace each)."""
    out = []
    by_trace: dict[str, tuple[Trace, list[list[Row]]]] = {}
    for raw in read_raw(directory):
        t = raw["trace"]
        trace = Trace(t["name"], tuple(tuple(p) for p in t["points"]), t["onset"], t["what"])
        rows = []
        for name, data in raw["autoscalers"].items():
            answers = [
                Answer(s["sent"], s["latency"], 200 <= s["status"] < 300) for s in data["samples"]
            ]
            series = [Replicas(**r) for r in data["replicas"]]
            gateway = [Replicas(**r) for r in data.get("gateway", [])]
            rows.append(
                measure(
                    name,
                    trace,
                    answers,
                    series,
                    slo=raw["slo_s"],
                    capacity_rps=raw["capacity_rps"],
                    gateway=gateway,
                )
            )
        out.append(table(trace, rows, tuned))
        by_trace.setdefault(trace.name, (trace, []))[1].append(rows)
    out += [summary(trace, runs, tuned) for trace, runs in by_trace.values() if len(runs) > 1]
    return out


def main() -> int:
    # SIGTERM stops the run as Ctrl-C does: the sandbox and the peers are stopped cleanly.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--traces", default="step,herd,sawtooth,day")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--time-scale", type=float, default=1.0, help="stretch (or shrink) the traces")
    p.add_argument("--runs", type=int, default=3, help="runs of each trace (medians and ranges)")
    p.add_argument(
        "--node-agent",
        metavar="HOST_IP",
        help="a dry run under the node agent (no real node, no lock; no CPU metrics, so no "
        "HPA figures): the peers listen on HOST_IP, a non-loopback address of this machine",
    )
    p.add_argument("--from-raw", type=Path, help="print the tables of a run's raw outputs")
    args = p.parse_args()
    if args.from_raw is not None:
        print("\n\n".join(tables_from_raw(args.from_raw)))
        return 0
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H%M")
    out: Path = args.out or REPO / "bench" / "results" / f"peers-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    chosen = [traces(BASE_RPS, args.time_scale)[t] for t in args.traces.split(",")]
    t_up = time.monotonic()
    tables: list[str] = []
    real = args.node_agent is None
    config = SandboxConfig(nodes=0 if real else 1, real_node=real, aggregation=True)
    with Sandbox(config) as sb:
        node = "a real node" if real else "the node agent (dry run)"
        print(f"sandbox with {node} up in {time.monotonic() - t_up:.0f} s", flush=True)
        sb.apply_crds(REPO / "crds")
        peers = Peers.start(sb, host=args.node_agent)
        try:
            print("metrics-server and KEDA up; both metrics APIs Available", flush=True)
            cpu_per_rps: list[float | None] = []
            for trace in chosen:
                runs: list[list[Row]] = []
                for run in range(1, args.runs + 1):
                    t0 = time.monotonic()
                    try:
                        rows = run_trace(sb, trace, out, cpu_per_rps, run)
                    except Exception:  # one run's failure is reported; the others still run
                        text = f"trace {trace.name} run {run}: FAILED\n{traceback.format_exc()}"
                    else:
                        runs.append(rows)
                        text = table(trace, rows, tuned).replace(
                            f"trace {trace.name}:", f"trace {trace.name} run {run}:", 1
                        )
                    print(f"\n{text}\n({time.monotonic() - t0:.0f} s)", flush=True)
                if runs:
                    text = summary(trace, runs, tuned)
                    tables.append(text)
                    print(f"\n{text}", flush=True)
        finally:
            for proc in peers.processes:
                with contextlib.suppress(OSError):
                    (out / f"{proc.name}.log").write_text(proc.tail(400))
            peers.stop()
    header = (
        f"peers bench {stamp}: SLO {SLO_S:g} s, a replica serves {CAPACITY:g} req/s "
        f"(service time {SERVICE_MS:g} ms, one slot) after a {WARMUP_S:g} s warm-up; "
        f"quiet rate {BASE_RPS:g} req/s\n\n" + "\n\n".join(tables)
    )
    (out / "table.txt").write_text(header + "\n")
    print("\n" + header)
    print(f"\nraw outputs: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
