"""Zero -> first answer through the activator on the sandbox, per phase, for a burst at zero.

A `minReplicas: 0` service (the real runtime, onnxruntime, one small MLP; the sandbox's node
agent runs its pods as processes, or with `--real-node` kubelet and containerd from the
images) is left to reach zero; then `--burst` concurrent requests are sent at once to its
Service's endpoint (the gateway pod, the activator). Pollers (every 20 ms, through the API
server and the gateway's own `GET /v2/tidal/replicas`; a mark is the middle of the round trip
that saw it, so each is good to about +-50 ms on an idle machine)
timestamp each phase, from the burst's first byte (t = 0):

* `decided`: the Deployment asks for >= 1 replica (the operator learnt of the held requests
  through its long-poll and decided `wake:request`);
* `created` / `ready`: the first runtime pod exists / is Ready;
* `pushed`: the gateway knows a healthy replica (the operator's `PUT /v2/tidal/replicas`, and
  the gateway's first long-poll of that replica);
* `first` / `last`: the first / last answer of the burst.

The baseline, measured in the same round: the time-to-routable of one replica, `ready -
decided` (what waking costs without any activator). The activator's own cost is `first -
(ready - decided)`: reaching the operator, and from Ready to the answer. Goal (issue 21):
<= 0.5 s, 0 requests lost.

    .venv/bin/python bench/zero_first_answer.py [--burst 100] [--rounds 3] [--keep] [--real-node]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import aiohttp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "e2e"))

from scenario import INFER_BODY, model_service  # noqa: E402

from tidal.sandbox import Sandbox, SandboxConfig  # noqa: E402
from tidal.sandbox.endpoints import ready_endpoints  # noqa: E402
from tidal.sandbox.operatorproc import OperatorProcess  # noqa: E402
from tidal.sandbox.wait import wait_for  # noqa: E402

NAME = "zero"
PHASES = ("decided", "created", "ready", "pushed", "first", "last")


class PhasePoller:
    """Timestamps (seconds since ``t0``, monotonic) of each phase, first time seen: one thread
    per source (the Deployment, the pods, the gateway), each polling every 20 ms, so a slow
    answer of one source does not delay the others' marks."""

    def __init__(self, sb: Any, namespace: str, gateway_url: str, t0: float) -> None:
        from kubernetes import client

        self.apps = client.AppsV1Api(sb.api_client())
        self.core = client.CoreV1Api(sb.api_client())
        self.namespace, self.gateway_url, self.t0 = namespace, gateway_url, t0
        self.seen: dict[str, float] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(check, phases), daemon=True)
            for check, phases in (
                (self._deployment, ("decided",)),
                (self._pods, ("created", "ready")),
                (self._gateway, ("pushed",)),
            )
        ]

    def _loop(self, check: Any, phases: tuple[str, ...]) -> None:
        while not self._stop.is_set() and not all(p in self.seen for p in phases):
            sent = time.monotonic()
            try:
                for phase in check():
                    # The state was seen by an answer sent at `sent` (or later): mark the
                    # middle of the round trip.
                    self.seen.setdefault(phase, (sent + time.monotonic()) / 2 - self.t0)
            except Exception as exc:  # a bench: report and go on polling
                print(f"poller: {type(exc).__name__}: {exc}", flush=True)
            self._stop.wait(0.02)

    def _deployment(self) -> list[str]:
        dep = self.apps.read_namespaced_deployment(f"{NAME}-primary", self.namespace)
        return ["decided"] if (dep.spec.replicas or 0) >= 1 else []

    def _pods(self) -> list[str]:
        pods = self.core.list_namespaced_pod(
            self.namespace, label_selector="serving.tidal.dev/pool=primary"
        ).items
        found = ["created"] if pods else []
        if any(
            c.type == "Ready" and c.status == "True"
            for p in pods
            for c in (p.status.conditions or [])
        ):
            found.append("ready")
        return found

    def _gateway(self) -> list[str]:
        url = f"{self.gateway_url}/v2/tidal/replicas"
        with urllib.request.urlopen(url, timeout=5) as response:
            known = json.loads(response.read())["replicas"]
        return ["pushed"] if any(r["healthy"] for r in known) else []

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


async def burst(url: str, count: int, t0: float) -> list[tuple[int, float]]:
    async def one(session: aiohttp.ClientSession) -> tuple[int, float]:
        try:
            async with session.post(f"{url}/v2/models/mlp/infer", json=INFER_BODY) as response:
                await response.read()
                return response.status, time.monotonic() - t0
        except (aiohttp.ClientError, TimeoutError):
            return 0, time.monotonic() - t0

    timeout = aiohttp.ClientTimeout(total=300)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        return list(await asyncio.gather(*(one(session) for _ in range(count))))


def at_zero(sb: Any, namespace: str) -> bool:
    from kubernetes import client

    apps = client.AppsV1Api(sb.api_client())
    core = client.CoreV1Api(sb.api_client())
    dep = apps.read_namespaced_deployment(f"{NAME}-primary", namespace)
    pods = core.list_namespaced_pod(namespace, label_selector="serving.tidal.dev/pool=primary")
    return dep.spec.replicas == 0 and not pods.items


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--burst", type=int, default=100)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--keep", action="store_true", help="keep the operator's and the pods' logs (a temp dir)"
    )
    p.add_argument(
        "--real-node",
        action="store_true",
        help="on the sandbox's real node (kubelet, containerd; root) instead of the node agent",
    )
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="zero-first-answer-"))
    t_up = time.monotonic()
    config = SandboxConfig(
        nodes=0 if args.real_node else 1,
        gpus_per_node=2,
        real_node=args.real_node,
        state_dir=tmp / "sandbox",
        keep_state=args.keep,
    )
    with Sandbox(config) as sb:
        print(f"sandbox up in {time.monotonic() - t_up:.1f} s", flush=True)
        namespace = f"zero-{uuid.uuid4().hex[:8]}"
        sb.kubectl("create", "namespace", namespace)
        sb.apply_crds(REPO / "crds")
        manifest = model_service(
            NAME,
            tmp / "mlp.onnx",
            env={},
            autoscaling={
                "minReplicas": 0,
                "maxReplicas": 4,
                "scaleToZeroAfterSeconds": 5,
                "scaleDownDelaySeconds": 0,
            },
        )
        env = {**os.environ, **sb.env}
        if args.keep:
            print(f"logs: {tmp}/operator.log, {tmp}/sandbox/logs", flush=True)
        with OperatorProcess(env, namespace, tmp / "operator.log", "full"):
            doc = sb.adapt(manifest)
            sb.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(doc))
            rows = []
            for round_no in range(1, args.rounds + 1):
                wait_for(lambda: at_zero(sb, namespace), timeout=300, interval=0.5, what="at zero")
                endpoints = ready_endpoints(sb.api_client(), namespace, NAME)
                assert len(endpoints) == 1, endpoints
                url = "http://{}:{}".format(*endpoints[0])
                t0 = time.monotonic()
                print(f"round {round_no}: burst sent at {time.strftime('%H:%M:%S')}", flush=True)
                poller = PhasePoller(sb, namespace, url, t0)
                poller.start()
                results = asyncio.run(burst(url, args.burst, t0))
                poller.stop()
                ok = [t for status, t in results if status == 200]
                row = dict(poller.seen)
                row["first"] = min(ok) if ok else float("nan")
                row["last"] = max(ok) if ok else float("nan")
                row["lost"] = len(results) - len(ok)
                row["routable"] = row.get("ready", float("nan")) - row.get("decided", float("nan"))
                row["overhead"] = row["first"] - row["routable"]
                rows.append(row)
                phases = "  ".join(f"{k} {row.get(k, float('nan')):6.2f}" for k in PHASES)
                print(
                    f"round {round_no}: burst {args.burst}: {phases}  | time-to-routable "
                    f"{row['routable']:.2f}  activator overhead {row['overhead']:+.2f} s  "
                    f"lost {row['lost']}",
                    flush=True,
                )
            median = {
                k: statistics.median(r[k] for r in rows) for k in (*PHASES, "routable", "overhead")
            }
            print(
                f"median of {len(rows)}: "
                + "  ".join(f"{k} {median[k]:.2f}" for k in PHASES)
                + f"  | time-to-routable {median['routable']:.2f}  overhead "
                f"{median['overhead']:+.2f} s (goal <= +0.50)  lost {sum(r['lost'] for r in rows)}"
                f" of {args.burst * len(rows)}",
                flush=True,
            )
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
