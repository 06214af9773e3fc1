"""End to end: an 8x herd onto one ready replica, with the burst buffer (issue 40).

The runtime pods have a real capacity limit (100 ms a batch of at most 2 rows on one slot: 20
requests/s a replica, concurrency 2) and a cold start that costs 3 s more. The service has one
replica and ``autoscaling.burstBuffer: true``, so its Service selects the gateway pod, which
keeps at most 4 requests in flight to each replica and holds the rest, oldest first. The load
steps from 5 to 40 requests/s for 20 s (twice what the one ready replica serves) and back.

Without the buffer (v0.4's herd trace) the requests queued on the first replica waited there
past the client's deadline while new replicas stood idle beside it. Asserted here: no request
fails; the generator sent its schedule; no replica ever had more than its slots in flight
(what did not fit waited at the gateway, where any replica can take it); every replica that
turned ready while requests were held took some within 2 s; the autoscaler saw the held
requests as demand (it asked for more than one replica).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from scenario import (
    apply,
    capacity_limited_service,
    install_crd,
    pods,
    run_surge,
    running_operator,
)

from tidal.sandbox.operatorproc import condition, get_isvc
from tidal.sandbox.wait import wait_for

pytestmark = [pytest.mark.sandbox, pytest.mark.timeout(300)]

BASE_RPS, HERD_RPS = 5.0, 40.0
HERD_AT, HERD_S, DURATION = 8.0, 20.0, 40.0
CLIENT_TIMEOUT_S = 30.0


def _gateway_ip(sandbox: Any, namespace: str, name: str) -> str | None:
    for pod in pods(sandbox, namespace):
        labels = pod["metadata"].get("labels") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )
        if labels.get("serving.tidal.dev/component") == "gateway" and ready:
            return str(pod["status"]["podIP"])
    return None


class GatewaySampler:
    """Reads the gateway's view of its replicas every 0.2 s: requests in flight and slots."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples: list[tuple[float, int, dict[str, dict[str, Any]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gateway-sampler")

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return json.loads(response.read())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                held = int(self._get("/v2/tidal/held")["held"])
                replicas = {r["name"]: r for r in self._get("/v2/tidal/replicas")["replicas"]}
                self.samples.append((time.time(), held, replicas))
            except OSError:
                pass
            self._stop.wait(0.2)

    def __enter__(self) -> GatewaySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


def test_a_herd_on_one_replica_waits_at_the_gateway_and_new_replicas_take_it(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    name = "herd"
    manifest = capacity_limited_service(
        name,
        tmp_path / "mlp.onnx",
        service_ms=100.0,
        batch_rows=2,
        warmup_seconds=3.0,
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": 6,
            "burstBuffer": True,
            "scaleDownDelaySeconds": 600,
        },
    )
    with running_operator(sandbox, namespace, tmp_path / "operator.log"):
        apply(sandbox, namespace, manifest)

        def one_ready_behind_the_gateway() -> str | None:
            body = get_isvc(sandbox, namespace, name)
            status = body.get("status") or {}
            if condition(body, "Ready").get("status") != "True":
                return None
            if status.get("readyReplicas") != 1:
                return None
            return _gateway_ip(sandbox, namespace, name)

        gateway_ip = wait_for(
            one_ready_behind_the_gateway, timeout=120, interval=0.5, what="1 replica + gateway"
        )
        url = f"http://{gateway_ip}:8080"

        def gateway_routes_one() -> bool:
            with urllib.request.urlopen(url + "/v2/tidal/replicas", timeout=5) as response:
                replicas = json.loads(response.read())["replicas"]
            return len([r for r in replicas if r["healthy"] and "mlp" in r["hot"]]) == 1

        wait_for(gateway_routes_one, timeout=60, interval=0.5, what="the gateway routes to it")
        with GatewaySampler(url) as sampler:
            surge = run_surge(
                sandbox,
                namespace,
                name,
                base_rps=BASE_RPS,
                surge_rps=HERD_RPS,
                surge_at=HERD_AT,
                duration=DURATION,
                timeout=CLIENT_TIMEOUT_S,
                rate=lambda t: HERD_RPS if HERD_AT <= t < HERD_AT + HERD_S else BASE_RPS,
            )
        report, surge_wall = surge.report, surge.surge_wall
        ups = surge.ups(above=1)

    # -- the load was what the schedule says ----------------------------------------------------
    scheduled = report.scheduled
    assert abs(len(report.samples) - scheduled) <= 0.01 * scheduled + 1, (
        len(report.samples),
        scheduled,
    )
    # -- nothing failed ---------------------------------------------------------------------------
    failures = report.failures()
    assert not failures, (len(failures), failures[:5])

    # -- no replica had more than its slots in flight; the rest waited at the gateway -------------
    samples = sampler.samples
    assert samples, "the gateway was never sampled"
    over = [
        (round(t - surge_wall, 1), n, r["outstanding"], r["requestSlots"])
        for t, _, replicas in samples
        for n, r in replicas.items()
        if r["requestSlots"] and r["outstanding"] > r["requestSlots"]
    ]
    assert not over, f"replicas over their slots (s after onset, name, in flight, slots): {over}"
    peak_held = max(held for _, held, _ in samples)
    assert peak_held > 0, "the herd never waited at the gateway: it was no herd"

    # -- the autoscaler saw the held requests as demand -------------------------------------------
    assert ups, f"no decision above one replica after the onset: {surge.recorder.decisions}"

    # -- every replica that joined while requests waited took them at once -----------------------
    # (A replica that joins once the backlog is gone has nothing to take: judged only where the
    # gateway held requests when it joined.)
    first_seen: dict[str, float] = {}
    for t, _, replicas in samples:
        for n, r in replicas.items():
            if r["healthy"] and "mlp" in r["hot"]:
                first_seen.setdefault(n, t)
    herd_end = surge_wall + HERD_S
    joined = {n: t for n, t in first_seen.items() if surge_wall < t < herd_end}
    assert joined, f"no replica joined during the herd: {first_seen} (onset {surge_wall})"

    def held_at(t: float) -> int:
        return next((held for ts, held, _ in samples if ts >= t), 0)

    def busy_within(name: str, start: float, seconds: float) -> float | None:
        for ts, _, replicas in samples:
            r = replicas.get(name)
            if start <= ts <= start + seconds and r is not None and r["outstanding"] > 0:
                return ts
        return None

    waited = {n: t for n, t in joined.items() if held_at(t) > 0}
    first_busy = {n: busy_within(n, t, 2.0) for n, t in waited.items()}
    idle = {n: round(waited[n] - surge_wall, 1) for n, b in first_busy.items() if b is None}
    assert not idle, (
        f"replicas that joined while requests were held and took none within 2 s (s after "
        f"onset): {idle}; joined {joined}"
    )
    lags = {n: round(b - waited[n], 2) for n, b in first_busy.items() if b is not None}
    print(
        f"\nherd: {len(report.samples)} requests (scheduled {scheduled:.0f}), 0 failed; peak "
        f"held at the gateway {peak_held}; replicas joined (s after onset) "
        f"{ {n: round(t - surge_wall, 1) for n, t in joined.items()} }; joined -> first "
        f"request in flight (s, sampled every 0.2 s) {lags}; P99 during the herd "
        f"{report.p99(HERD_AT, HERD_AT + HERD_S):.2f} s"
    )
