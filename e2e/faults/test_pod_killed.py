"""A runtime pod SIGKILLed mid-request behind a plain Service (no gateway), under steady load.

Three replicas answer 200 ms late (``TIDAL_FAULT_ADDED_LATENCY_MS``), so each holds a few
requests at any time; the load generator balances over the Service's ready endpoints as a
client-side balancer does and, like one (Envoy's ``connect-failure``, gRPC's transparent
retry), sends a request whose connection was refused once more to another endpoint: such a
request never reached a server. The busiest replica's runtime is SIGKILLed while requests are
in flight on it.

Asserted: the requests that fail are at most those in flight on the killed pod at the kill
(they were delivered and their server died); every request after it succeeds, the ones sent to
the dead address before its endpoint was withdrawn included (refused, then sent elsewhere); the
other replicas lose nothing; the killed container is restarted by the node agent
(``restartCount`` 1) and its pod serves again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    INFER_BODY,
    apply,
    install_crd,
    model_service,
    pods,
    running_operator,
    runtime_pids,
)

from tidal.sandbox.loadgen import LoadGenerator
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(240)]

RPS, DURATION, KILL_AT = 15.0, 30.0, 8.0


def _ready_pods(sandbox: Any, namespace: str) -> dict[str, str]:
    """pod IP -> name of the Ready runtime pods."""
    out = {}
    for p in pods(sandbox, namespace):
        conditions = {c["type"]: c["status"] for c in p["status"].get("conditions") or []}
        if conditions.get("Ready") == "True" and p["status"].get("podIP"):
            out[p["status"]["podIP"]] = p["metadata"]["name"]
    return out


def test_a_pod_killed_mid_request_fails_at_most_its_requests_in_flight(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "podkill"
    manifest = model_service(
        name,
        tmp_path / "mlp.onnx",
        env={"TIDAL_FAULT_ADDED_LATENCY_MS": "200"},
        autoscaling={"minReplicas": 1, "maxReplicas": 3},
    )
    manifest["spec"]["replicas"] = 3
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        apply(sandbox, namespace, manifest)

        def three_ready() -> dict[str, str] | None:
            ready = _ready_pods(sandbox, namespace)
            return ready if len(ready) == 3 else None

        by_ip = wait_for(three_ready, timeout=150, what="3 ready replicas")
        pids = {pod: runtime_pids(pod) for pod in by_ip.values()}
        load = LoadGenerator(
            sandbox.api_client(),
            namespace,
            name,
            "mlp",
            INFER_BODY,
            lambda t: RPS,
            timeout=10.0,
            refresh=0.1,
            retry_connect_errors=True,
        )
        killed: dict[str, Any] = {}
        stop = threading.Event()
        started = time.monotonic()

        def killer() -> None:
            while not stop.wait(0.02):
                if time.monotonic() - started < KILL_AT:
                    continue
                busy = {ep: n for ep, n in load.in_flight.items() if n > 0}
                if not busy:
                    continue
                endpoint = max(busy, key=lambda ep: busy[ep])
                pod = by_ip.get(endpoint.split(":")[0])
                if pod is None or not pids.get(pod):
                    continue
                for pid in pids[pod]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                killed.update(
                    endpoint=endpoint,
                    pod=pod,
                    in_flight=busy[endpoint],
                    wall=time.time(),
                )
                return

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        try:
            report = asyncio.run(load.run(DURATION))
        finally:
            stop.set()
            thread.join(5)
        assert killed, "no replica had requests in flight to kill"

        def restarted() -> int | None:
            for p in pods(sandbox, namespace):
                if p["metadata"]["name"] != killed["pod"]:
                    continue
                statuses = p["status"].get("containerStatuses") or []
                count = sum(int(c.get("restartCount") or 0) for c in statuses)
                ready = _ready_pods(sandbox, namespace)
                return count if count >= 1 and killed["pod"] in ready.values() else None
            return None

        restarts = wait_for(restarted, timeout=90, what="the killed pod serving again")

    # The kill on the run's clock (samples carry both their run time and their wall time).
    first = min(report.samples, key=lambda s: s.sent)
    kill_at = killed["wall"] - (first.wall - first.sent)
    failures = report.failures()
    on_killed = [f for f in failures if f.endpoint == killed["endpoint"]]
    elsewhere = [f for f in failures if f.endpoint != killed["endpoint"]]
    retried = [s for s in report.samples if s.retried_from == killed["endpoint"]]
    withdrawn = next(
        (t for t, eps in report.endpoint_changes if t > kill_at and killed["endpoint"] not in eps),
        None,
    )
    print(
        f"\nkilled {killed['pod']} at {kill_at:.1f}s with {killed['in_flight']} in flight; "
        f"requests {len(report.samples)}, failed {len(failures)} (on the killed pod "
        f"{len(on_killed)}, elsewhere {len(elsewhere)}); refused and sent elsewhere "
        f"{len(retried)}; endpoint withdrawn at the client "
        f"{(withdrawn - kill_at) if withdrawn is not None else float('nan'):.2f}s after; "
        f"restarts {restarts}"
    )
    assert not elsewhere, elsewhere[:3]
    assert len(on_killed) <= killed["in_flight"], on_killed
    # Every failed request had been sent before the kill (it was in flight then).
    assert all(f.wall <= killed["wall"] for f in on_killed), on_killed
    assert all(s.ok for s in retried), [s for s in retried if not s.ok][:3]
