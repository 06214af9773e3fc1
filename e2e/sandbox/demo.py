"""The foundation demo: a sandbox, a two-replica Deployment, traffic through its EndpointSlice."""

from __future__ import annotations

import collections
import json
import signal
import threading
import time
import urllib.request

from rich.console import Console
from rich.table import Table

from tidal.sandbox.cluster import Sandbox, SandboxConfig
from tidal.sandbox.endpoints import ready_endpoints
from tidal.sandbox.manifests import echo_deployment, service
from tidal.sandbox.wait import wait_for


def run_demo(keep: bool = False) -> int:
    console = Console()
    console.rule("[bold]tidal sandbox demo")
    with console.status(
        "starting etcd, kube-apiserver, controller-manager, scheduler, node agent, Prometheus…"
    ):
        sb = Sandbox(SandboxConfig(keep_state=keep)).start()
    try:
        console.print(
            f"sandbox up in [bold]{sb.started_seconds:.1f}s[/] — kubeconfig {sb.kubeconfig}"
        )
        console.print(sb.kubectl("get", "nodes", "-o", "wide").stdout)
        sb.kubectl("create", "namespace", "demo")
        wait_for(
            lambda: sb.kubectl("-n", "demo", "get", "sa", "default", check=False).returncode == 0,
            what="default service account",
        )
        manifests = [echo_deployment("echo", replicas=2), service("echo")]
        sb.kubectl(
            "-n", "demo", "apply", "-f", "-", input="\n---\n".join(json.dumps(m) for m in manifests)
        )
        t0 = time.monotonic()
        with console.status("waiting for both pods to be ready in the EndpointSlice…"):
            api = sb.api_client()

            def two_ready() -> list[tuple[str, int]]:
                eps = ready_endpoints(api, "demo", "echo")
                return eps if len(eps) == 2 else []

            endpoints = wait_for(
                two_ready,
                timeout=60,
                what="2 ready endpoints",
            )
        console.print(
            f"EndpointSlice lists 2 ready pods after {time.monotonic() - t0:.1f}s: {endpoints}"
        )
        console.print(sb.kubectl("-n", "demo", "get", "pods", "-o", "wide").stdout)
        answers: collections.Counter[str] = collections.Counter()
        latencies = []
        for i in range(40):
            ip, port = endpoints[i % len(endpoints)]
            t = time.perf_counter()
            with urllib.request.urlopen(f"http://{ip}:{port}/", timeout=5) as resp:
                answers[json.loads(resp.read())["pod"]] += 1
            latencies.append((time.perf_counter() - t) * 1000)
        table = Table(title="40 requests through the Service's EndpointSlice")
        table.add_column("pod")
        table.add_column("answers", justify="right")
        for pod, n in sorted(answers.items()):
            table.add_row(pod, str(n))
        console.print(table)
        latencies.sort()
        console.print(
            f"latency p50 {latencies[len(latencies) // 2]:.2f} ms, max {latencies[-1]:.2f} ms"
        )
        if keep:
            console.print(f"\nthe sandbox keeps running: export KUBECONFIG={sb.kubeconfig}")
            console.print("press Ctrl-C to stop it")
            stop = threading.Event()
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            stop.wait()
    finally:
        with console.status("stopping the sandbox…"):
            sb.stop()
    console.print("[green]demo finished[/]")
    return 0
