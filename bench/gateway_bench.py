"""Gateway benchmark: the same client and runtime, directly and through ``tidal.gateway``.

In one run, with one runtime process (``python -m tidal.runtime``, dynamic batching on with
``maxQueueDelayMs: 0``), one gateway process (``python -m tidal.gateway --replica …``) in front
of it, and the load generator of ``bench/runtime_bench.py`` (aiohttp, binary tensors, one row per
request), for each model:

* batch-1 latency, one client: P50/P99 directly and through the gateway (the overhead);
* saturation: ``--clients`` concurrent closed loops: throughput directly and through the
  gateway (the ratio).

Direct and gateway measurements alternate (``--rounds`` times) and the best round of each is
kept, so load drifting over the run favours neither.  Goals (issue 10): overhead at batch-1
P50 <= 1 ms, saturation throughput through the gateway >= 90 % of direct.

CPU pinning (``--pin``, on by default when the machine has at least 2 cores): the runtime gets
its own core; the client and the gateway share the others (the client's core in the direct
runs).  On 2 cores that means the gateway's CPU is taken from the client's core, the honest
setting for a machine this small; with 4 or more the gateway gets a core of its own.

    .venv/bin/python bench/gateway_bench.py [--seconds 4] [--clients 64] [--model all]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runtime_bench import (  # a sibling script, not a package
    INPUTS,
    LAYERS,
    MODELS,
    OUTPUTS,
    free_port,
    load,
    percentile,
    start_runtime,
)

from tidal.runtime.modelgen import write_mlp


@dataclass
class Sample:
    rate: float
    latencies: list[float]
    errors: int

    @property
    def p50_ms(self) -> float:
        return percentile(self.latencies, 50) * 1000

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies, 99) * 1000


@dataclass(frozen=True)
class Pinning:
    runtime: set[int]
    gateway: set[int]
    client: set[int]

    def describe(self) -> str:
        def cpus(s: set[int]) -> str:
            return ",".join(str(c) for c in sorted(s))

        return (
            f"runtime on CPU {cpus(self.runtime)}, gateway on CPU {cpus(self.gateway)}, "
            f"client on CPU {cpus(self.client)}"
        )


def plan_pinning(enabled: bool) -> Pinning | None:
    cpus = sorted(os.sched_getaffinity(0))
    if not enabled or len(cpus) < 2:
        return None
    if len(cpus) == 2:
        return Pinning({cpus[1]}, {cpus[0]}, {cpus[0]})
    if len(cpus) == 3:
        return Pinning({cpus[2]}, {cpus[1]}, {cpus[0]})
    return Pinning({cpus[-1]}, {cpus[-2]}, set(cpus[:-2]))


def start_gateway(runtime_port: int, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TIDAL_LOG_LEVEL": "WARNING"}
    command = [sys.executable, "-m", "tidal.gateway", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--replica", f"http://127.0.0.1:{runtime_port}"]
    process = subprocess.Popen(command, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1):
                return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("gateway did not become ready")


def stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGINT)  # a second signal: no drain, exit now
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()


def measure(url: str, clients: int, seconds: float) -> Sample:
    return Sample(*asyncio.run(load(url, clients, seconds)))


def run_model(
    name: str, workdir: Path, seconds: float, clients: int, rounds: int, pin: Pinning | None
) -> dict[str, float]:
    info = write_mlp(
        workdir / f"{name}.onnx", inputs=INPUTS, hidden=MODELS[name], outputs=OUTPUTS,
        layers=LAYERS, seed=0,
    )  # fmt: skip
    print(
        f"\n== {name} model: MLP {INPUTS}-{MODELS[name]}x{LAYERS}-{OUTPUTS}, "
        f"{info.size_bytes / 1e6:.1f} MB; {rounds} rounds of {seconds:g} s per measurement"
    )
    runtime_port, gateway_port = free_port(), free_port()
    runtime = start_runtime(info.path, runtime_port)
    gateway = start_gateway(runtime_port, gateway_port)
    if pin is not None:
        os.sched_setaffinity(runtime.pid, pin.runtime)
        os.sched_setaffinity(gateway.pid, pin.gateway)
    path = "/v2/models/batched/infer"
    direct_url = f"http://127.0.0.1:{runtime_port}{path}"
    gateway_url = f"http://127.0.0.1:{gateway_port}{path}"
    results: dict[str, list[Sample]] = {"d1": [], "g1": [], "ds": [], "gs": []}
    try:
        measure(gateway_url, 1, 0.5)  # the model becomes hot in the gateway's view
        for round_no in range(rounds):
            for key, url, n in (
                ("d1", direct_url, 1), ("g1", gateway_url, 1),
                ("ds", direct_url, clients), ("gs", gateway_url, clients),
            ):  # fmt: skip
                sample = measure(url, n, seconds)
                results[key].append(sample)
                label = {"d1": "direct, 1 client", "g1": "gateway, 1 client"}.get(
                    key, f"{'direct' if key == 'ds' else 'gateway'}, {clients} clients"
                )
                print(
                    f"  round {round_no + 1}  {label:<22} {sample.rate:8.0f} req/s  "
                    f"P50 {sample.p50_ms:7.3f} ms  P99 {sample.p99_ms:7.3f} ms  "
                    f"errors {sample.errors}"
                )
    finally:
        stop(gateway)
        stop(runtime)
    d1 = min(results["d1"], key=lambda s: s.p50_ms)
    g1 = min(results["g1"], key=lambda s: s.p50_ms)
    ds = max(results["ds"], key=lambda s: s.rate)
    gs = max(results["gs"], key=lambda s: s.rate)
    errors = sum(s.errors for samples in results.values() for s in samples)
    overhead_p50 = g1.p50_ms - d1.p50_ms
    overhead_p99 = g1.p99_ms - d1.p99_ms
    ratio = gs.rate / ds.rate
    rows = [
        ("batch-1 P50 latency", f"{d1.p50_ms:.3f} ms", f"{g1.p50_ms:.3f} ms",
         f"+{overhead_p50:.3f} ms", "<= 1 ms", overhead_p50 <= 1.0),
        ("batch-1 P99 latency", f"{d1.p99_ms:.3f} ms", f"{g1.p99_ms:.3f} ms",
         f"+{overhead_p99:.3f} ms", "", None),
        (f"saturation, {clients} clients", f"{ds.rate:.0f} req/s", f"{gs.rate:.0f} req/s",
         f"{ratio:.1%}", ">= 90 %", ratio >= 0.9),
        ("saturation P50 latency", f"{ds.p50_ms:.3f} ms", f"{gs.p50_ms:.3f} ms",
         f"{gs.p50_ms / ds.p50_ms:.2f}x", "", None),
        ("failed requests", "", "", str(errors), "0", errors == 0),
    ]  # fmt: skip
    print(f"  {'':<26} {'direct':>14} {'via gateway':>14} {'gateway/direct':>15}  goal")
    for label, direct, via, versus, goal, met in rows:
        verdict = "" if met is None else ("met" if met else "NOT met")
        print(f"  {label:<26} {direct:>14} {via:>14} {versus:>15}  {goal} {verdict}")
    return {"overhead_p50_ms": overhead_p50, "ratio": ratio, "errors": errors}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0, help="per measurement")
    parser.add_argument("--clients", type=int, default=64, help="concurrent clients")
    parser.add_argument("--rounds", type=int, default=2, help="alternations direct/gateway")
    parser.add_argument("--model", choices=[*MODELS, "all"], default="all")
    parser.add_argument("--no-pin", action="store_true", help="leave CPU placement to the OS")
    args = parser.parse_args()
    pin = plan_pinning(not args.no_pin)
    if pin is not None:
        os.sched_setaffinity(0, pin.client)
    print(
        f"{os.cpu_count()} cores; "
        f"{pin.describe() if pin is not None else 'no CPU pinning'}; "
        f"{args.clients} clients at saturation; best of {args.rounds} alternating rounds"
    )
    workdir = Path(tempfile.mkdtemp(prefix="tidal-gateway-bench-"))
    names = list(MODELS) if args.model == "all" else [args.model]
    summary = {
        name: run_model(name, workdir, args.seconds, args.clients, args.rounds, pin)
        for name in names
    }
    print("\nsummary (gateway vs direct, same run):")
    print(f"  {'model':<8} {'batch-1 P50 overhead':>22} {'saturation ratio':>18} {'failed':>8}")
    for name, s in summary.items():
        print(
            f"  {name:<8} {s['overhead_p50_ms']:>19.3f} ms {s['ratio']:>18.1%} "
            f"{int(s['errors']):>8}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
