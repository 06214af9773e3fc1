"""Helpers of the operator's end-to-end scenarios: the operator as a process, a status recorder,
pod readiness times, and an InferenceService on the real runtime with a generated ONNX model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tidal.runtime.modelgen import write_mlp
from tidal.sandbox.loadgen import LoadGenerator, LoadReport, step_rate
from tidal.sandbox.operatorproc import REPO, OperatorProcess

INFER_BODY = {
    "inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]
}


def parse_time(text: str) -> float:
    """Epoch seconds of an RFC 3339 timestamp (``Z`` or offset, optional fraction)."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@contextlib.contextmanager
def running_operator(
    sandbox: Any, namespace: str, log_path: Path, *flags: str
) -> Iterator[OperatorProcess]:
    """``tidal-operator`` watching ``namespace`` with the sandbox's Prometheus (``flags``: more
    command-line flags)."""
    operator = OperatorProcess({**os.environ, **sandbox.env}, namespace, log_path, "plain")
    operator.start(*flags)
    with operator as proc:
        try:
            yield proc
        except BaseException:
            # A failure shows the operator's side of the story (pytest prints captured stderr).
            sys.stderr.write("--- tidal-operator log, last lines ---\n" + proc.log()[-6000:])
            raise
        finally:
            if os.environ.get("TIDAL_SHOW_OPERATOR_LOG") == "1":
                sys.stderr.write(proc.log()[-30000:])


def runtime_pids(pod: str) -> list[int]:
    """The processes of the runtime container the node agent started for ``pod`` (by its env):
    a launcher and the interpreter may both match, and killing only the launcher would leave
    the server running."""
    marker = f"POD_NAME={pod}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            environ = (entry / "environ").read_bytes().split(b"\0")
            if marker in environ and b"tidal-runtime" in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return sorted(pids)


def _millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def cpu_request_for(sandbox: Any, replicas: int) -> str:
    """A CPU request such that the cluster's schedulable nodes hold exactly ``replicas`` pods
    of it (CPU stands in for GPUs, which only the TensorRT backend may ask for): the middle of
    the range of requests for which that holds, from each node's allocatable CPU less what the
    pods that stay on it request. Two node-agent nodes of 16 CPUs:
    ~7 CPUs; the real node of this 2-core machine: ~0.4."""
    from kubernetes import client

    api = client.CoreV1Api(sandbox.api_client())
    free: dict[str, int] = {}
    for node in api.list_node().items:
        if any(t.effect == "NoSchedule" for t in (node.spec.taints or [])):
            continue  # the fake node (and any cordoned one)
        free[node.metadata.name] = _millicores(node.status.allocatable["cpu"])
    # Pods on their way out do not count: finished, deleted, or in a namespace being deleted
    # (an earlier test's, whose pods the namespace controller has not marked yet).
    leaving = {
        ns.metadata.name
        for ns in api.list_namespace().items
        if ns.metadata.deletion_timestamp or (ns.status and ns.status.phase == "Terminating")
    }
    for pod in api.list_pod_for_all_namespaces().items:
        done = (
            pod.status.phase in ("Succeeded", "Failed")
            or pod.metadata.deletion_timestamp
            or pod.metadata.namespace in leaving
        )
        if pod.spec.node_name in free and not done:
            for c in pod.spec.containers:
                want = ((c.resources and c.resources.requests) or {}).get("cpu")
                free[pod.spec.node_name] -= _millicores(want) if want else 0

    def fits(request: int) -> int:
        return sum(max(f, 0) // request for f in free.values())

    exact = [r for r in range(10, max(free.values(), default=0) + 1) if fits(r) == replicas]
    assert exact, f"no CPU request fits exactly {replicas} pods on nodes with free CPU {free}"
    return f"{(exact[0] + exact[-1]) // 2}m"


def apply(sandbox: Any, namespace: str, manifest: dict[str, Any]) -> None:
    """``kubectl apply`` of ``manifest`` as adapted to the sandbox's node (``Sandbox.adapt``)."""
    doc = sandbox.adapt(manifest)
    sandbox.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))


def events(sandbox: Any, namespace: str, name: str) -> list[dict[str, Any]]:
    out = sandbox.kubectl(
        "get",
        "events",
        "-n",
        namespace,
        "--field-selector",
        f"involvedObject.name={name}",
        "-o",
        "json",
    )
    return list(json.loads(out.stdout)["items"])


def pods(sandbox: Any, namespace: str) -> list[dict[str, Any]]:
    out = sandbox.kubectl("get", "pods", "-n", namespace, "-o", "json")
    return list(json.loads(out.stdout)["items"])


def ready_since_by_ip(pod_list: list[dict[str, Any]]) -> dict[str, float]:
    """Pod IP -> wall time its Ready condition last became True (second precision, floored)."""
    out: dict[str, float] = {}
    for pod in pod_list:
        ip = (pod.get("status") or {}).get("podIP")
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if ip and cond.get("type") == "Ready" and cond.get("status") == "True":
                out[ip] = parse_time(cond["lastTransitionTime"])
    return out


def model_service(
    name: str,
    model_path: Path,
    *,
    env: dict[str, str],
    autoscaling: dict[str, Any],
    rollout: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An InferenceService on the real runtime (onnxruntime) serving one generated MLP."""
    write_mlp(model_path, seed=1)
    spec: dict[str, Any] = {
        "runtime": onnx_runtime(env),
        "models": [
            {
                "name": "mlp",
                "engines": [{"uri": model_path.resolve().as_uri()}],
                "maxBatchSize": 8,
                "batching": {"maxQueueDelayMs": 1},
                "warmup": {"batchSizes": [1], "iterations": 1},
            }
        ],
        "autoscaling": autoscaling,
    }
    if rollout is not None:
        spec["rollout"] = rollout
    return inference_service(name, spec)


def onnx_runtime(env: dict[str, str]) -> dict[str, Any]:
    """``spec.runtime``: the real runtime on onnxruntime, one thread, with ``env`` added."""
    return {
        "backend": "onnxruntime",
        "env": [{"name": k, "value": v} for k, v in {"OMP_NUM_THREADS": "1", **env}.items()],
    }


def baseline_rollout(*, drain_seconds: float, slo: dict[str, Any] | None = None) -> dict[str, Any]:
    """``spec.rollout``: a one-replica baseline on the real runtime (``onnx_runtime``), the SLO
    that rolls back to it (None: none, moves are asked for), and the drain."""
    rollout: dict[str, Any] = {"baseline": {"runtime": onnx_runtime({}), "minReplicas": 1}}
    if slo is not None:
        rollout["slo"] = slo
    rollout["drainSeconds"] = drain_seconds
    return rollout


def inference_service(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "serving.tidal.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": spec,
    }


def capacity_limited_service(
    name: str,
    model_path: Path,
    *,
    service_ms: float,
    batch_rows: int,
    warmup_seconds: float,
    autoscaling: dict[str, Any],
) -> dict[str, Any]:
    """A service whose replicas have a real capacity limit, as on a GPU: every batch holds the
    model's one execution slot for ``service_ms`` (at most ``batch_rows`` rows a batch:
    batch_rows / service_ms requests a second a replica), and a cold start that costs
    ``warmup_seconds`` more (what deserializing a large engine and its first runs cost)."""
    manifest = model_service(
        name,
        model_path,
        env={
            "TIDAL_FAULT_SERVICE_TIME_MS": str(service_ms),
            "TIDAL_FAULT_MAX_CONCURRENT_BATCHES": "1",
            "TIDAL_FAULT_EXTRA_WARMUP_SECONDS": str(warmup_seconds),
        },
        autoscaling=autoscaling,
    )
    model = manifest["spec"]["models"][0]
    model["maxBatchSize"] = batch_rows
    model["batching"] = {"maxQueueDelayMs": 5}
    return manifest


@dataclass
class StatusRecorder:
    """Polls the InferenceService in a thread: every distinct lastDecision and rollout status,
    with the wall time it was first seen."""

    sandbox: Any
    namespace: str
    name: str
    interval: float = 0.25
    decisions: list[dict[str, Any]] = field(default_factory=list)
    rollouts: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    bodies: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _run(self) -> None:
        from kubernetes import client

        api = client.CustomObjectsApi(self.sandbox.api_client())
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                body = api.get_namespaced_custom_object(
                    "serving.tidal.dev", "v1alpha1", self.namespace, "inferenceservices", self.name
                )
                seen = time.time()
                status = body.get("status") or {}
                decision = status.get("lastDecision")
                if decision and (not self.decisions or self.decisions[-1] != decision):
                    self.decisions.append(dict(decision))
                rollout = status.get("rollout")
                if rollout and (
                    not self.rollouts
                    or self.rollouts[-1][1].get("traffic") != rollout.get("traffic")
                ):
                    self.rollouts.append((seen, dict(rollout)))
                self.bodies.append((seen, body))
                if len(self.bodies) > 2000:
                    del self.bodies[:1000]
            self._stop.wait(self.interval)

    def __enter__(self) -> StatusRecorder:
        self._thread = threading.Thread(target=self._run, daemon=True, name="status-recorder")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


# Decisions stamped up to this long before the surge's onset belong to it (the status's times
# are the operator's, the onset the load generator's: clocks of one machine, stamps to the ms).
SURGE_SKEW_S = 0.5


@dataclass
class SurgeRun:
    """One step surge against a service (:func:`run_surge`): the load's report, the service's
    status as it was recorded, and when the surge began."""

    report: LoadReport
    recorder: StatusRecorder
    started: float  # wall time the load began
    surge_at: float  # seconds after ``started`` the rate stepped up

    @property
    def surge_wall(self) -> float:
        return self.started + self.surge_at

    def decisions_before(self) -> list[dict[str, Any]]:
        """The scaling decisions recorded before the surge."""
        cut = self.surge_wall - SURGE_SKEW_S
        return [d for d in self.recorder.decisions if parse_time(d["at"]) < cut]

    def ups(self, above: int) -> list[dict[str, Any]]:
        """The decisions from the surge on that ask for more than ``above`` replicas."""
        return ups_after(self.recorder.decisions, self.surge_wall, above)


def ups_after(
    decisions: list[dict[str, Any]], surge_wall: float, above: int
) -> list[dict[str, Any]]:
    """Of recorded ``decisions``, those from the surge at ``surge_wall`` on that ask for more
    than ``above`` replicas."""
    cut = surge_wall - SURGE_SKEW_S
    return [
        d for d in decisions if parse_time(d["at"]) >= cut and d.get("desiredReplicas", 0) > above
    ]


def run_surge(
    sandbox: Any,
    namespace: str,
    name: str,
    *,
    base_rps: float,
    surge_rps: float,
    surge_at: float,
    duration: float,
    timeout: float,
    during: Callable[[StatusRecorder, float], None] | None = None,
    settle: float = 0.0,
    rate: Callable[[float], float] | None = None,
) -> SurgeRun:
    """The end-to-end tests' surge: ``base_rps`` to model ``mlp`` of service ``name`` through
    its EndpointSlices, stepping to ``surge_rps`` at ``surge_at`` s, for ``duration`` s, while a
    :class:`StatusRecorder` keeps every decision. ``during(recorder, surge_wall)`` runs in a
    thread beside the load (a fault to inject); ``settle`` s more are recorded after it.
    ``rate``: another schedule than the step (a herd that ends), its onset still ``surge_at``."""
    load = LoadGenerator(
        sandbox.api_client(),
        namespace,
        name,
        "mlp",
        INFER_BODY,
        rate or step_rate(base_rps, surge_rps, surge_at),
        timeout=timeout,
        refresh=0.1,
    )
    with StatusRecorder(sandbox, namespace, name) as recorder:
        started = time.time()
        beside = None
        if during is not None:
            beside = threading.Thread(
                target=during, args=(recorder, started + surge_at), daemon=True, name="surge-fault"
            )
            beside.start()
        report = asyncio.run(load.run(duration))
        if beside is not None:
            beside.join(timeout=30)
        if settle:
            time.sleep(settle)
    return SurgeRun(report, recorder, started, surge_at)


def install_crd(sandbox: Any) -> None:
    """The InferenceService CRD (idempotent), waited for until the API server serves it."""
    sandbox.apply_crds(REPO / "crds")
