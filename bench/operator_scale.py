"""How the operator copes with many InferenceServices and pods: Ready time, reconcile and
control-loop cost, API calls, memory and CPU.

Starts a sandbox with fake nodes (pods are reported Running/Ready without running anything, like
kwok), installs the CRD, starts ``tidal-operator`` for one namespace (no Prometheus: pod scrapes
only), creates N InferenceServices of R replicas each at once and measures

* the time from the first create until every InferenceService reports Ready and until every one
  has all R replicas ready; per service the time from its creation to its Ready condition
  (P50/P99, one-second resolution: the API server's timestamps); when the control plane created
  the last pod and the node agent reported the last pod Ready (where the time went);
* reconcile duration P50/P99 and Kubernetes API requests per reconcile (the operator's own
  requests; watches excluded) while converging, and API calls and reconciles in a quiet period
  afterwards (nothing changes, so a level-triggered operator should make none);
* control-loop tick lag (how late a tick started) and tick duration P50/P99, and ticks per loop
  per second, in two windows after convergence: *mixed* (``--busy-share`` of the services, 10 %
  by default, report traffic; the rest are idle) and *quiet* (nothing reports traffic: the bench
  waits until every control loop is quiet, ``tidal_operator_quiet_loops``, then measures), with
  the ticks of one-second loops and of quiet ones apart (``tidal_operator_ticks_total{loop}``);
* the operator's resident memory (current and peak) and CPU seconds (utime + stime from
  /proc/<pid>/stat) per phase, and the CPU of each sandbox component while converging;

then prints each goal of issues 14 and 21 as met or not. The figures come from the operator's own
histograms and counters (its ``--metrics-port``), scraped only at phase boundaries so the bench
does not load the operator's metrics thread in between.

Fake nodes: the sandbox node agent's fake mode, run by the bench as its own child process
(``--fake-agent``) so that fake pods can take addresses from as many sandbox pod subnets as they
need (the sandbox's own agent gives them its one /20: 4,093 addresses, fewer than 10,000 pods).
The pods answer the operator's scrapes (`PodResponder`: one server in a network namespace that
holds the fake subnets as local addresses) like an idle runtime, or a busy one for the busy
services; ``--silent-pods`` leaves nothing listening, as on kwok's nodes (every scrape times out
and no service is ever known to be quiet).

    .venv/bin/python bench/operator_scale.py [--services 200] [--replicas 1] [--quiet-seconds 60]
        [--busy-share 0.1] [--silent-pods]
        [--profile SECONDS]   # py-spy (PATH or TIDAL_PY_SPY) samples the operator afterwards
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tidal.operator.core.api import LABEL_ISVC
from tidal.operator.core.resources import RUNTIME_PORT
from tidal.sandbox import Sandbox, SandboxConfig
from tidal.sandbox.operatorproc import OperatorProcess
from tidal.sandbox.procs import free_port
from tidal.sandbox.wait import WaitTimeout, wait_for

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "bench"
GROUP, VERSION, PLURAL = "serving.tidal.dev", "v1alpha1", "inferenceservices"
PODS_PER_FAKE_NODE = 5000
SUBNET_ADDRESSES = 4093  # hosts of one sandbox pod subnet (/20) less its gateway

Metrics = dict[str, list[tuple[dict[str, str], float]]]


def service(name: str, replicas: int, namespace: str = NAMESPACE) -> dict[str, Any]:
    """An InferenceService whose pods land on fake nodes; the autoscaler runs, pinned at R."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runtime": {
                "backend": "onnxruntime",
                "nodeSelector": {"tidal.dev/sandbox-fake": "true"},
                "tolerations": [
                    {
                        "key": "tidal.dev/sandbox-fake",
                        "operator": "Equal",
                        "value": "true",
                        "effect": "NoSchedule",
                    }
                ],
            },
            "models": [{"name": "m", "engines": [{"uri": f"file:///models/{name}.onnx"}]}],
            "autoscaling": {"minReplicas": replicas, "maxReplicas": replicas},
        },
    }


# -- the operator's metrics ----------------------------------------------------------------------
def parse_exposition(text: str) -> Metrics:
    out: Metrics = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        out.setdefault(match.group(1), []).append((labels, float(match.group(3))))
    return out


def scrape(port: int) -> Metrics:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
        return parse_exposition(resp.read().decode())


def merge(scrapes: list[Metrics]) -> Metrics:
    """Several operators' metrics as one (same series summed: counters and buckets)."""
    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for metrics in scrapes:
        for name, rows in metrics.items():
            for labels, value in rows:
                key = (name, tuple(sorted(labels.items())))
                sums[key] = sums.get(key, 0.0) + value
    out: Metrics = {}
    for (name, pairs), value in sums.items():
        out.setdefault(name, []).append((dict(pairs), value))
    return out


def minus(after: Metrics, before: Metrics) -> Metrics:
    """Counters and histogram buckets accumulated between two scrapes."""
    earlier = {(n, tuple(sorted(lab.items()))): v for n, rows in before.items() for lab, v in rows}
    return {
        name: [(lab, v - earlier.get((name, tuple(sorted(lab.items()))), 0.0)) for lab, v in rows]
        for name, rows in after.items()
    }


def total(metrics: Metrics, name: str) -> float:
    return sum(v for _, v in metrics.get(name, []))


def quantile(metrics: Metrics, name: str, q: float) -> float | None:
    """Quantile from a Prometheus histogram (linear within the bucket, like histogram_quantile);
    None without observations, ``inf`` when it lies beyond the last finite bucket."""
    buckets = sorted(
        (float("inf") if lab["le"] == "+Inf" else float(lab["le"]), v)
        for lab, v in metrics.get(f"{name}_bucket", [])
    )
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if le == float("inf"):
                return float("inf")
            width = cum - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / width if width else 0.0)
        prev_le, prev_count = le, cum
    return float("inf")


def ticks_of(metrics: Metrics, loop: str) -> float:
    return sum(v for lab, v in metrics.get("tidal_operator_ticks_total", []) if lab["loop"] == loop)


def _key(item: dict[str, Any]) -> str:
    return f"{item['metadata']['namespace']}/{item['metadata']['name']}"


def _flatten(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{path}.{k}" if path else str(k)))
        return out
    if (
        isinstance(value, list)
        and value
        and all(isinstance(v, dict) and "type" in v for v in value)
    ):
        out = {}
        for v in value:  # conditions, by type
            out.update(_flatten(v, f"{path}[{v['type']}]"))
        return out
    return {path: value}


def status_changes(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Status fields that changed between two listings: how many services each, one example."""
    counts: Counter[str] = Counter()
    example: dict[str, str] = {}
    for key, status in after.items():
        old, new = _flatten(before.get(key, {})), _flatten(status)
        for path in sorted(set(old) | set(new)):
            if old.get(path) != new.get(path):
                counts[path] += 1
                example.setdefault(path, f"{key}: {old.get(path)!r:.80} -> {new.get(path)!r:.80}")
    return {p: f"{n} services, e.g. {example[p]}" for p, n in counts.most_common(20)}


def by_call(metrics: Metrics) -> dict[str, int]:
    calls: Counter[str] = Counter()
    for labels, value in metrics.get("tidal_operator_api_requests_total", []):
        if value:
            calls[f"{labels['verb']} {labels['resource']}"] += int(value)
    return dict(sorted(calls.items()))


# -- processes -----------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds (fields 14 and 15 of /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> tuple[float, float]:
    """(current, peak) resident set size in MiB (VmRSS, VmHWM)."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


# -- objects -------------------------------------------------------------------------------------
def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _condition(item: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in (item.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


def seconds_to_ready(item: dict[str, Any]) -> float | None:
    """creationTimestamp -> Ready's lastTransitionTime (both with one-second resolution)."""
    ready = _condition(item, "Ready")
    if ready is None:
        return None
    return _time(ready["lastTransitionTime"]) - _time(item["metadata"]["creationTimestamp"])


def nearest_rank(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def list_json(api_client: Any, kind: str, namespace: str) -> list[dict[str, Any]]:
    """A namespace's InferenceServices ("isvc") or pods ("pods") as plain JSON."""
    from kubernetes import client

    resp: Any
    if kind == "pods":
        resp = client.CoreV1Api(api_client).list_namespaced_pod(namespace, _preload_content=False)
    else:
        resp = client.CustomObjectsApi(api_client).list_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, _preload_content=False
        )
    return list(json.loads(resp.data)["items"])


# -- fake nodes ----------------------------------------------------------------------------------
class SubnetChain:
    """Addresses for fake pods from as many sandbox pod subnets as needed.

    One `PodNetwork` holds a /20 (4,093 addresses), fewer than 10,000 pods need; each link of
    the chain claims the next free /20 the way the node agent claims its own (lock file,
    bridge; removed at teardown). Nothing listens on these addresses, as on kwok's nodes."""

    def __init__(self, subnets: int, responder: PodResponder | None = None) -> None:
        from tidal.sandbox.podnet import PodNetwork

        self.links = [PodNetwork() for _ in range(subnets)]
        self.subnet = "(none yet)"
        self.index = -1
        self.responder = responder
        self.torn_down = False

    def setup(self) -> None:
        for link in self.links:
            link.setup()
        self.subnet = ", ".join(str(link.subnet) for link in self.links)
        self.index = self.links[0].index
        if self.responder is not None:
            self.responder.setup([link.subnet for link in self.links if link.subnet is not None])

    def address_only(self) -> str:
        from tidal.sandbox.podnet import PodNetworkError

        for link in self.links:
            try:
                return link.address_only()
            except PodNetworkError:
                continue
        raise PodNetworkError(f"all {len(self.links)} fake-pod subnets are exhausted")

    def release_address(self, ip: str) -> None:
        import ipaddress

        for link in self.links:
            if link.subnet is not None and ipaddress.ip_address(ip) in link.subnet:
                link.release_address(ip)

    def teardown(self) -> None:
        if self.torn_down:
            return
        self.torn_down = True
        if self.responder is not None:
            self.responder.teardown()
        for link in self.links:
            link.teardown()


# -- fake pods that answer -----------------------------------------------------------------------
BUSY_RATE = 4.0  # requests a second a busy fake pod reports answering


def exposition(in_flight: int, answered: int) -> str:
    """A fake pod's `/metrics`: the families the operator reads from a one-model runtime."""
    return (
        "# TYPE tidal_inflight_requests gauge\n"
        f"tidal_inflight_requests {in_flight}\n"
        "# TYPE tidal_queue_depth gauge\n"
        'tidal_queue_depth{model="m"} 0\n'
        "# TYPE tidal_requests counter\n"
        f'tidal_requests_total{{model="m",code="200"}} {answered}\n'
        "# TYPE tidal_model_ready gauge\n"
        'tidal_model_ready{model="m"} 1\n'
    )


class PodResponder:
    """Makes every fake pod's address answer `/metrics` like an idle runtime, or a busy one
    for the addresses listed in ``busy_file`` (a JSON list the bench rewrites).

    A network namespace of its own holds the fake-pod subnets as local addresses (AnyIP:
    ``ip route add local <subnet> dev lo``); the host routes them there over a veth pair
    (two /21 routes per /20, more specific than the bridge's), and one aiohttp server in the
    namespace answers on every address of them. Nothing leaves the machine."""

    def __init__(self, busy_file: Path, log_path: Path, port: int) -> None:
        tag = os.getpid() % 100_000
        self.ns, self.host_if = f"tidalbench{tag}", f"tbh{tag}"
        # A /30 of the link-local range for the veth pair, chosen by pid.
        base = 4 * (os.getpid() % (256 * 64))
        self.host_ip = f"169.254.{base // 256}.{base % 256 + 1}"
        self.peer_ip = f"169.254.{base // 256}.{base % 256 + 2}"
        self.busy_file, self.log_path, self.port = busy_file, log_path, port
        self.routes: list[str] = []
        self.server: subprocess.Popen[bytes] | None = None

    @staticmethod
    def remove_stale() -> list[str]:
        """Delete the namespaces of responders whose server is gone (a bench killed before its
        teardown): their host routes, more specific than any sandbox bridge's, would otherwise
        send a later sandbox's pod traffic into a dead namespace. Deleting the namespace takes
        its veth pair, and the routes through it, along. Returns the names deleted."""
        from tidal.sandbox.podnet import _ip

        stale = []
        for line in _ip("netns", "list", check=False).stdout.splitlines():
            name = line.split()[0] if line.split() else ""
            if not name.startswith("tidalbench"):
                continue
            if not _ip("netns", "pids", name, check=False).stdout.strip():
                _ip("netns", "del", name, check=False)
                stale.append(name)
        return stale

    def setup(self, subnets: list[Any]) -> None:
        from tidal.sandbox.podnet import _ip

        for name in self.remove_stale():
            print(f"removed the stale fake-pod namespace {name}", file=sys.stderr)
        _ip("netns", "del", self.ns, check=False)
        _ip("netns", "add", self.ns)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("-n", self.ns, "addr", "add", f"{self.peer_ip}/30", "dev", "eth0")
        _ip("-n", self.ns, "link", "set", "eth0", "up")
        _ip("-n", self.ns, "link", "set", "lo", "up")
        _ip("-n", self.ns, "route", "add", "default", "via", self.host_ip)
        for subnet in subnets:
            _ip("-n", self.ns, "route", "add", "local", str(subnet), "dev", "lo")
            for half in subnet.subnets(prefixlen_diff=1):
                _ip("route", "add", str(half), "via", self.peer_ip)
                self.routes.append(str(half))
        argv = ["ip", "netns", "exec", self.ns, sys.executable, str(Path(__file__).resolve())]
        argv += ["--responder", str(self.busy_file), "--responder-port", str(self.port)]
        with self.log_path.open("ab") as log:
            self.server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

    def teardown(self) -> None:
        from tidal.sandbox.podnet import _ip

        if self.server is not None:
            self.server.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.server.wait(timeout=10)
            if self.server.poll() is None:
                self.server.kill()
        for route in self.routes:
            _ip("route", "del", route, check=False)
        _ip("netns", "del", self.ns, check=False)  # takes the veth pair with it


def run_responder(busy_file: Path, port: int) -> int:
    """The fake pods' server (in the responder's namespace). ``/metrics``: idle pods answer the
    same text always; busy ones a request counter growing at ``BUSY_RATE`` a second.
    ``/v2/tidal/activity``: the runtime's arrivals long-poll (idle pods park it until they
    turn busy or its wait ends)."""
    from aiohttp import web

    started = time.time()
    busy: set[str] = set()
    changed = asyncio.Event()  # set (and replaced) whenever the busy list changes
    idle = exposition(0, 0)

    seen = {"mtime": -1.0}

    def reload_if_changed() -> None:
        nonlocal changed
        try:
            mtime = busy_file.stat().st_mtime
        except FileNotFoundError:
            mtime = 0.0
        if mtime == seen["mtime"]:
            return
        seen["mtime"] = mtime
        busy.clear()
        with contextlib.suppress(FileNotFoundError, ValueError):
            busy.update(json.loads(busy_file.read_text()))
        changed.set()
        changed = asyncio.Event()

    async def follow_busy_file(app: web.Application) -> None:
        async def follow() -> None:
            while True:
                reload_if_changed()
                await asyncio.sleep(1.0)

        app["follow"] = asyncio.create_task(follow())

    def arrivals(ip: str) -> int:
        return int(BUSY_RATE * (time.time() - started)) if ip in busy else 0

    def local_ip(request: web.Request) -> str:
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        return str(sockname[0]) if sockname else ""

    async def metrics(request: web.Request) -> web.Response:
        ip = local_ip(request)
        body = exposition(1, arrivals(ip)) if ip in busy else idle
        return web.Response(text=body, content_type="text/plain")

    async def activity(request: web.Request) -> web.Response:
        ip = local_ip(request)
        since = request.query.get("since")
        if since is not None and int(since) == arrivals(ip):
            deadline = time.monotonic() + min(float(request.query.get("wait", "30")), 120.0)
            while ip not in busy and (left := deadline - time.monotonic()) > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), left)
        return web.json_response({"arrivals": arrivals(ip)})

    async def anything(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.on_startup.append(follow_busy_file)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v2/tidal/activity", activity)
    app.router.add_route("*", "/{tail:.*}", anything)
    web.run_app(app, host="0.0.0.0", port=port, access_log=None, print=None)
    return 0


def run_fake_agent(
    kubeconfig: str, nodes: int, pods_per_node: int, state_dir: Path, answer: bool
) -> int:
    """The sandbox node agent for `nodes` fake nodes only, addresses from enough subnets."""
    import logging

    from kubernetes import client, config

    from tidal.sandbox.nodeagent import NodeAgent, NodeSpec

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    configuration = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, client_configuration=configuration
    )
    configuration.connection_pool_maxsize = 64
    capacity = {
        "cpu": "64",
        "memory": "1Ti",
        "pods": str(pods_per_node),
        "nvidia.com/gpu": "0",
        "ephemeral-storage": "1Ti",
    }
    specs = [NodeSpec(f"bench-fake-node-{i + 1}", capacity, fake=True) for i in range(nodes)]
    agent = NodeAgent(client.ApiClient(configuration), specs, state_dir, "")
    responder = (
        PodResponder(busy_file(state_dir), state_dir / "bench-responder.log", RUNTIME_PORT)
        if answer
        else None
    )
    subnets = math.ceil(nodes * pods_per_node / SUBNET_ADDRESSES)
    network = SubnetChain(subnets, responder)
    agent.network = network  # type: ignore[assignment]

    def stop(*_: object) -> None:
        # The network first: stopping 10,000 fake pods can outlast the sandbox's grace period,
        # and a SIGKILL then would leave the responder's host routes behind.
        if network.index >= 0:
            network.teardown()
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        agent.run()
    finally:
        network.teardown()
    return 0


def busy_file(state_dir: Path) -> Path:
    return state_dir / "bench-busy-pods.json"


def start_fake_nodes(sb: Sandbox, pods: int, answer: bool) -> int:
    """Register enough fake nodes for `pods` (an agent process the sandbox stops); their count.
    ``answer``: the pods answer `/metrics` (`PodResponder`), else nothing listens."""
    from tidal.sandbox.procs import ManagedProcess

    nodes = max(1, math.ceil(pods / PODS_PER_FAKE_NODE))
    argv = [sys.executable, str(Path(__file__).resolve()), "--fake-agent", str(sb.kubeconfig)]
    argv += ["--fake-nodes", str(nodes), "--state-dir", str(sb.state_dir)]
    argv += [] if answer else ["--silent-pods"]
    proc = ManagedProcess(
        "bench-fake-agent", argv, sb.log_dir / "bench-fake-agent.log", env=sb.env, cwd=REPO
    )
    sb.processes.append(proc)  # stopped (SIGTERM, grace) with the sandbox

    def ready() -> bool:
        out = sb.kubectl("get", "nodes", "-l", "tidal.dev/sandbox-fake=true", "-o", "json")
        return sum(1 for n in json.loads(out.stdout)["items"] if _condition(n, "Ready")) == nodes

    wait_for(ready, timeout=60, what=f"{nodes} fake nodes Ready")
    return nodes


class BusyFeeder(threading.Thread):
    """Keeps ``busy_file`` listing the addresses of the busy services' pods (while
    ``busy_on``; an empty list after), for `PodResponder`'s server."""

    def __init__(self, list_pods: Any, busy: set[str], path: Path) -> None:
        super().__init__(daemon=True, name="busy-feeder")
        self.list_pods, self.busy, self.path = list_pods, busy, path
        self.busy_on = True
        self.stopping = threading.Event()
        self.written: list[str] | None = None

    def run(self) -> None:
        while not self.stopping.wait(2.0):
            try:
                ips = (
                    sorted(
                        ip
                        for pod in self.list_pods()
                        if (pod["metadata"].get("labels") or {}).get(LABEL_ISVC) in self.busy
                        and (ip := (pod.get("status") or {}).get("podIP"))
                    )
                    if self.busy_on
                    else []
                )
            except Exception as exc:  # the next round tries again
                print(f"busy feeder: {exc}", file=sys.stderr)
                continue
            if ips != self.written:
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(ips))
                tmp.replace(self.path)
                self.written = ips

    def stop(self) -> None:
        self.stopping.set()


# -- goals ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Goal:
    name: str
    target: str
    measured: str
    met: bool | None  # None: not measured


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return "> 10 s" if math.isinf(seconds) else f"{1000 * seconds:,.0f} ms"


def goals(figures: dict[str, Any]) -> list[Goal]:
    """Issue 14's and issue 21's scale goals against the figures of one run."""
    rec = figures["converge"]["reconcile_p99_s"]
    mixed, quiet = figures["mixed"], figures["quiet"]
    lag = mixed["tick_lag_p99_s"]
    peak = figures["operator_rss_peak_mib"]
    done = figures.get("converged", True)  # still converging: no window is quiet
    ready_s = figures.get("all_replicas_ready_s")
    busy_rate = mixed.get("busy_ticks_per_busy_loop_hz")
    rate = busy_rate if busy_rate is not None else mixed.get("tick_rate_per_loop_hz")
    cores = quiet.get("operator_cpu_cores")
    quiet_ok = done and figures.get("pods_answer", False)
    return [
        Goal(
            "all replicas Ready",
            "≤ 300 s",
            "—" if ready_s is None else f"{ready_s:,.0f} s",
            ready_s is not None and ready_s <= 300,
        ),
        Goal("reconcile P99 (converging)", "≤ 1 s", _ms(rec), None if rec is None else rec <= 1),
        Goal(
            f"tick lag P99 ({mixed['active_loops']:,} loops)",
            "≤ 1 s",
            _ms(lag),
            None if lag is None else lag <= 1,
        ),
        Goal(
            "busy loops' ticks a second" if busy_rate is not None else "ticks per loop a second",
            "1 Hz",
            "—" if rate is None else f"{rate:.2f} Hz",
            None if rate is None else rate >= 0.95,
        ),
        Goal(
            "operator RSS peak (largest shard)",
            "≤ 300 MB",
            f"{peak * 1.048576:,.0f} MB",
            peak * 1024 * 1024 <= 300e6,
        ),
        Goal(
            "operator CPU, all quiet",
            "≤ 0.1 core",
            "—" if cores is None or not quiet_ok else f"{cores:.3f} core",
            None if cores is None or not quiet_ok else cores <= 0.1,
        ),
        Goal(
            f"API calls in {quiet['seconds']:g} s quiet",
            "0",
            f"{quiet['api_calls']:,}" if quiet_ok else "not quiet",
            quiet["api_calls"] == 0 if quiet_ok else None,
        ),
    ]


def goal_table(rows: list[Goal]) -> str:
    verdict = {True: "met", False: "NOT MET", None: "not measured"}
    width = max(len(g.name) for g in rows)
    lines = [f"  {'goal':<{width}}  {'target':<9}  {'measured':>10}  verdict"]
    lines += [
        f"  {g.name:<{width}}  {g.target:<9}  {g.measured:>10}  {verdict[g.met]}" for g in rows
    ]
    return "\n".join(lines)


# -- the run -------------------------------------------------------------------------------------
def phase(delta: Metrics, seconds: float, cpu: float) -> dict[str, Any]:
    reconciles = total(delta, "tidal_operator_reconciles_total")
    calls = total(delta, "tidal_operator_api_requests_total")

    def q(name: str, p: float) -> float | None:
        v = quantile(delta, name, p)
        return None if v is None else (v if math.isinf(v) else round(v, 4))

    return {
        "seconds": round(seconds, 1),
        "reconciles": int(reconciles),
        "reconcile_p50_s": q("tidal_operator_reconcile_duration_seconds", 0.5),
        "reconcile_p99_s": q("tidal_operator_reconcile_duration_seconds", 0.99),
        "api_calls": int(calls),
        "api_calls_per_reconcile": round(calls / reconciles, 2) if reconciles else None,
        "api_calls_by_kind": by_call(delta),
        "ticks": int(total(delta, "tidal_operator_tick_lag_seconds_count")),
        "tick_lag_p50_s": q("tidal_operator_tick_lag_seconds", 0.5),
        "tick_lag_p99_s": q("tidal_operator_tick_lag_seconds", 0.99),
        "tick_duration_p50_s": q("tidal_operator_tick_duration_seconds", 0.5),
        "tick_duration_p99_s": q("tidal_operator_tick_duration_seconds", 0.99),
        "errors": int(total(delta, "tidal_operator_reconcile_errors_total")),
        "operator_cpu_s": round(cpu, 1),
        "operator_cpu_cores": round(cpu / seconds, 2) if seconds else None,
    }


def profile(pid: int, seconds: float, out: Path) -> str:
    """The operator's hottest frames over ``seconds`` (py-spy, own time and total time)."""
    spy = os.environ.get("TIDAL_PY_SPY") or shutil.which("py-spy")
    if spy is None:
        return "py-spy not found (PATH or TIDAL_PY_SPY)"
    raw = out.with_suffix(".folded")
    argv = [spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "50", "-f", "raw"]
    subprocess.run(
        [*argv, "-o", str(raw), "--nonblocking"],
        capture_output=True,
        check=False,
        timeout=seconds + 60,
    )
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    samples = 0
    for line in raw.read_text().splitlines() if raw.exists() else []:
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        n = int(count)
        samples += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    if not samples:
        return "py-spy recorded nothing"
    lines = [f"py-spy: {samples} samples over {seconds:g} s (raw stacks: {raw})", "  own time:"]
    lines += [f"    {100 * n / samples:5.1f}%  {f}" for f, n in own.most_common(15)]
    lines.append("  total time (frame on the stack):")
    lines += [f"    {100 * n / samples:5.1f}%  {f}" for f, n in inclusive.most_common(25)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--services", type=int, default=200)
    p.add_argument("--replicas", type=int, default=1, help="pods per InferenceService")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument(
        "--shards", type=int, default=1, help="operators, one per namespace (services spread)"
    )
    p.add_argument("--create-threads", type=int, default=16)
    p.add_argument("--settle-seconds", type=float, default=10.0)
    p.add_argument(
        "--quiet-seconds", type=float, default=60.0, help="length of each measured window"
    )
    p.add_argument("--timeout", type=float, default=900.0, help="give up converging after this")
    p.add_argument("--profile", type=float, default=0.0, help="py-spy seconds after the quiet")
    p.add_argument("--profile-out", type=Path, default=Path("/tmp/operator_scale-profile"))
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    p.add_argument(
        "--busy-share",
        type=float,
        default=0.1,
        help="share of services whose pods report traffic (the rest idle)",
    )
    p.add_argument(
        "--silent-pods",
        action="store_true",
        help="fake pods answer nothing (as on kwok): no service is ever known to be quiet",
    )
    p.add_argument("--fake-agent", metavar="KUBECONFIG", help=argparse.SUPPRESS)
    p.add_argument("--fake-nodes", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--state-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--responder", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--responder-port", type=int, default=RUNTIME_PORT, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.responder:  # the fake pods' server, in its network namespace
        return run_responder(args.responder, args.responder_port)
    if args.fake_agent:  # the bench's own child process
        return run_fake_agent(
            args.fake_agent,
            args.fake_nodes,
            PODS_PER_FAKE_NODE,
            args.state_dir,
            answer=not args.silent_pods,
        )

    shards = max(1, args.shards)
    namespaces = [NAMESPACE] if shards == 1 else [f"{NAMESPACE}-{k}" for k in range(shards)]
    pods = (args.services + shards) * args.replicas  # and a warm-up service per shard
    # SIGTERM (a timeout, a kill) unwinds through the finally blocks: operator and sandbox stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # No nodes of the sandbox's own: the bench registers its fake nodes (more addresses).
    config = SandboxConfig(nodes=0, fake_nodes=0, prometheus=False)
    with Sandbox(config) as sb:
        fake_nodes = start_fake_nodes(sb, pods, answer=not args.silent_pods)
        sb.apply_crds(REPO / "crds")
        for ns in namespaces:
            sb.kubectl("create", "namespace", ns)
        api = sb.api_client()
        from kubernetes import client

        custom = client.CustomObjectsApi(api)
        env = {**os.environ, **sb.env}
        env.pop("TIDAL_PROMETHEUS_URL", None)  # no Prometheus here: pod scrapes only
        ports = [free_port() for _ in namespaces]
        # One operator per shard (namespace): each watches and reconciles only its own.
        operators = [
            OperatorProcess(env, ns, sb.state_dir / f"operator-{ns}.log").start(
                "--workers",
                str(args.workers),
                "--metrics-port",
                str(port),
                "--bind-address",
                "127.0.0.1",
            )
            for ns, port in zip(namespaces, ports, strict=True)
        ]

        def scrape_all() -> Metrics:
            return merge([scrape(port) for port in ports])

        def cpu_all() -> float:
            return sum(cpu_seconds(op.pid) for op in operators)

        def list_all(kind: str) -> list[dict[str, Any]]:
            return [i for ns in namespaces for i in list_json(api, kind, ns)]

        def isvcs() -> list[dict[str, Any]]:
            return [i for i in list_all("isvc") if i["metadata"]["name"] != "warmup"]

        try:
            wait_for(scrape_all, timeout=30, what="operator metrics")
            # Warm-up: one service through to Ready per shard, so the measurement starts with
            # the operators' watches running (kopf needs a few seconds to start them).
            for ns in namespaces:
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, service("warmup", args.replicas, ns)
                )
            wait_for(
                lambda: sum(1 for i in list_all("isvc") if _condition(i, "Ready")) == shards,
                timeout=120,
                what="warm-up services Ready",
            )
            time.sleep(1.0)
            components = {proc.name: proc.pid for proc in sb.processes}
            cpu_before = {n: cpu_seconds(pid) for n, pid in components.items()}
            baseline = scrape_all()
            op_cpu0 = cpu_all()
            idle_rss = max(rss_mib(op.pid)[0] for op in operators)

            names = [f"svc-{i:04d}" for i in range(args.services)]
            step = max(1, round(1 / args.busy_share)) if args.busy_share > 0 else 0
            busy = {n for i, n in enumerate(names) if step and i % step == 0}
            selector = f"{LABEL_ISVC} in ({','.join(sorted(busy))})"

            def busy_pods() -> list[dict[str, Any]]:
                # The busy services' pods only (a tenth of them): a list of every pod each
                # round would load the API server the bench measures beside.
                core = client.CoreV1Api(api)
                items: list[dict[str, Any]] = []
                for ns in namespaces:
                    resp: Any = core.list_namespaced_pod(
                        ns, label_selector=selector, _preload_content=False
                    )
                    items += json.loads(resp.data)["items"]
                return items

            feeder = BusyFeeder(busy_pods, busy, busy_file(sb.state_dir))
            if not args.silent_pods:
                feeder.start()
            started_wall, started = time.time(), time.monotonic()

            def create(index: int) -> None:
                ns = namespaces[index % shards]
                custom.create_namespaced_custom_object(
                    GROUP, VERSION, ns, PLURAL, service(names[index], args.replicas, ns)
                )

            with ThreadPoolExecutor(args.create_threads) as pool:
                list(pool.map(create, range(args.services)))
            created = time.monotonic() - started
            first_ready: float | None = None
            timeline: list[tuple[float, int, int]] = []

            def converged() -> bool:
                nonlocal first_ready
                ready = [i for i in isvcs() if _condition(i, "Ready")]
                want = args.replicas
                full = [i for i in ready if (i.get("status") or {}).get("readyReplicas") == want]
                timeline.append((time.monotonic() - started, len(ready), len(full)))
                if first_ready is None and len(ready) == args.services:
                    first_ready = time.monotonic() - started
                return bool(len(full) == args.services)

            try:
                wait_for(converged, timeout=args.timeout, interval=2.0, what="all replicas ready")
                done = True
            except WaitTimeout:  # report how far it got, and measure the loops regardless
                done = False
            all_ready = time.monotonic() - started
            converge = minus(scrape_all(), baseline)
            op_cpu1 = cpu_all()
            cpu_converge = {
                n: round(cpu_seconds(pid) - cpu_before[n], 1) for n, pid in components.items()
            }
            rss_ready = max(rss_mib(op.pid)[0] for op in operators)
            items = isvcs()
            to_ready = [t for i in items if (t := seconds_to_ready(i)) is not None]
            pod_items = list_all("pods")
            pod_created = [_time(i["metadata"]["creationTimestamp"]) for i in pod_items]
            pod_ready = [
                _time(c["lastTransitionTime"])
                for i in pod_items
                if (c := _condition(i, "Ready")) is not None
            ]

            loops = len(items) + shards

            def window() -> tuple[Metrics, float, float]:
                start, cpu0, t0 = scrape_all(), cpu_all(), time.monotonic()
                time.sleep(args.quiet_seconds)
                return minus(scrape_all(), start), cpu_all() - cpu0, time.monotonic() - t0

            # 1. The busy share reporting traffic, the rest idle.
            time.sleep(args.settle_seconds)
            mixed, mixed_cpu, mixed_seconds = window()
            # 2. Nothing reporting traffic: every loop should turn quiet (the busy ones once
            # their rate window has emptied), then a window where nothing at all changes.
            feeder.busy_on = False
            went_quiet: float | None = None
            if not args.silent_pods:
                q_started = time.monotonic()
                try:
                    wait_for(
                        lambda: total(scrape_all(), "tidal_operator_quiet_loops") >= loops,
                        timeout=300,
                        interval=5.0,
                        what=f"all {loops} control loops quiet",
                    )
                    went_quiet = time.monotonic() - q_started
                except WaitTimeout:
                    went_quiet = None
            time.sleep(args.settle_seconds)
            statuses_before = {_key(i): i.get("status") or {} for i in isvcs()}
            quiet, quiet_cpu, quiet_seconds = window()
            # What the quiet window's status writes changed, by field (the writes should be 0).
            quiet_changes = status_changes(
                statuses_before, {_key(i): i.get("status") or {} for i in isvcs()}
            )
            quiet_loops_end = int(total(scrape_all(), "tidal_operator_quiet_loops"))
            feeder.stop()
            rss_now = max(rss_mib(op.pid)[0] for op in operators)
            rss_peak = max(rss_mib(op.pid)[1] for op in operators)
            profile_text = (
                profile(operators[0].pid, args.profile, args.profile_out) if args.profile else ""
            )
        finally:
            for op in operators:
                op.stop()

    figures: dict[str, Any] = {
        "services": args.services,
        "replicas": args.replicas,
        "pods": args.services * args.replicas,
        "workers": args.workers,
        "operators": shards,
        "create_seconds": round(created, 1),
        "all_services_ready_s": round(first_ready, 1) if first_ready is not None else None,
        "converged": done,
        "all_replicas_ready_s": round(all_ready, 1) if done else None,
        "gave_up_after_s": None if done else round(all_ready, 1),
        "services_ready_at_end": timeline[-1][1] if timeline else 0,
        "services_all_replicas_at_end": timeline[-1][2] if timeline else 0,
        "pods_at_end": len(pod_items),
        "pods_ready_at_end": len(pod_ready),
        "deployments_written": int(
            sum(
                v
                for lab, v in converge.get("tidal_operator_children_applied_total", [])
                if lab.get("kind") == "Deployment"
            )
        ),
        "last_pod_created_s": round(max(pod_created) - started_wall, 1) if pod_created else None,
        "last_pod_ready_s": round(max(pod_ready) - started_wall, 1) if pod_ready else None,
        "services_timed": len(to_ready),  # create -> Ready of those that turned Ready
        "create_to_ready_p50_s": nearest_rank(to_ready, 0.5),
        "create_to_ready_p99_s": nearest_rank(to_ready, 0.99),
        "reconciles_per_service": round(
            total(converge, "tidal_operator_reconciles_total") / args.services, 2
        ),
        "api_calls_per_service": round(
            total(converge, "tidal_operator_api_requests_total") / args.services, 2
        ),
        "converge": phase(converge, all_ready, op_cpu1 - op_cpu0),
        "busy_services": len(busy),
        "pods_answer": not args.silent_pods,
        "mixed": {
            **phase(mixed, mixed_seconds, mixed_cpu),
            "active_loops": loops,
            "busy_loops": len(busy),
            # Ticks per loop per second: a slow tick skips the ticks it missed (not counted as
            # lag), so the lag histogram alone cannot show loops running below 1 Hz. Busy
            # ticks are those of one-second loops (`tidal_operator_ticks_total{loop="busy"}`).
            "tick_rate_per_loop_hz": round(
                total(mixed, "tidal_operator_tick_lag_seconds_count") / mixed_seconds / loops, 2
            ),
            "busy_ticks_per_busy_loop_hz": (
                round(ticks_of(mixed, "busy") / mixed_seconds / len(busy), 2) if busy else None
            ),
            "quiet_ticks_per_s": round(ticks_of(mixed, "quiet") / mixed_seconds, 1),
        },
        "all_quiet_after_s": None if went_quiet is None else round(went_quiet, 1),
        "quiet": {
            **phase(quiet, quiet_seconds, quiet_cpu),
            "status_changes": quiet_changes,
            "active_loops": loops,
            "quiet_loops_at_end": quiet_loops_end,
            "tick_rate_per_loop_hz": round(
                total(quiet, "tidal_operator_tick_lag_seconds_count") / quiet_seconds / loops, 2
            ),
            "busy_ticks": int(ticks_of(quiet, "busy")),
        },
        "component_cpu_s_converging": cpu_converge,
        "operator_rss_idle_mib": round(idle_rss, 1),
        "operator_rss_all_ready_mib": round(rss_ready, 1),
        "operator_rss_after_quiet_mib": round(rss_now, 1),
        "operator_rss_peak_mib": round(rss_peak, 1),
        "progress": [
            {"t_s": round(t, 1), "ready": r, "all_replicas": f}
            for t, r, f in timeline[:: max(1, len(timeline) // 20)]
        ],
    }
    print(
        f"operator scale benchmark: {args.services} InferenceServices x {args.replicas} "
        f"replicas = {args.services * args.replicas} pods on {fake_nodes} fake node(s), "
        f"{shards} operator(s)"
    )
    width = max(len(k) for k in figures)
    for key, value in figures.items():
        if isinstance(value, dict) and key in ("converge", "mixed", "quiet"):
            print(f"  {key}:")
            for k, v in value.items():
                print(f"    {k:<{width}}  {v}")
        else:
            print(f"  {key:<{width}}  {value}")
    print(goal_table(goals(figures)))
    if profile_text:
        print(profile_text)
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
