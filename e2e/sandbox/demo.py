"""``make demo``: tidal end to end on the local sandbox, no GPU needed.

1. start the sandbox (real control plane, node agent or, with ``--real-node``, the real node,
   Prometheus) and the tidal operator;
2. generate an ONNX model and apply an InferenceService with a primary and a baseline pool;
3. send steady traffic, then a 5x surge: the autoscaler scales the serving pool, new replicas
   get traffic only once warm;
4. roll out a bad primary (its runtime adds latency): the SLO is breached, traffic flips to the
   warm baseline, the flip is recorded (RolledBack condition, Event);
5. print a summary of the measured times and write a plot to ``out/demo.png``; among them the
   flip delay, from the end of the breach's ``for`` window to the Service leaving the primary,
   as the operator recorded it (``status.rollout``'s rollback record; goal: at most a second,
   because the baseline keeps its rollback reserve warm through the staged rollout).

A live table shows replicas per pool, queue depth, P99 and the active pool while it runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.table import Table

from .cluster import Sandbox, SandboxConfig
from .loadgen import LoadGenerator, LoadReport, percentile
from .operatorproc import OperatorProcess, condition, get_isvc
from .wait import wait_for

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "demo"
NAME = "classifier"

# The scenario's clock (seconds after the load starts).
BASE_RPS, SURGE_RPS = 30.0, 150.0
# The first seconds of load settle the pool (its first decision sees traffic appear from
# nothing); the surge comes once it is back to its steady size.
SURGE_AT, SURGE_END = 40.0, 80.0
BAD_ROLLOUT_AT = 90.0
MAX_DURATION = 240.0  # the run stops 10 s after the rollback; this only bounds a slow machine
ADDED_LATENCY_MS = 40  # every replica: a stand-in for a heavier model's compute time
BAD_LATENCY_MS = 800  # the bad rollout's primary: P99 above 800 ms, whatever the machine
# Healthy: ~60-105 ms on 2 idle cores, up to ~250 ms in the surge on a loaded one (a CI run
# beside a busy sandbox). The bound sits well clear of both, or the healthy primary breaches
# while the bad one is still warming and the rollback happens for the wrong reason.
SLO_P99_MS = 500
SLO_FOR_SECONDS = 5


def rate(t: float) -> float:
    return SURGE_RPS if SURGE_AT <= t < SURGE_END else BASE_RPS


def inference_service(model_uri: str, sha256: str) -> dict[str, Any]:
    model = {
        "name": NAME,
        "engines": [{"uri": model_uri, "sha256": sha256, "backend": "onnxruntime"}],
        "maxBatchSize": 16,
        "batching": {"maxQueueDelayMs": 2, "preferredBatchSizes": [8, 16]},
        "warmup": {"batchSizes": [1, 16], "iterations": 2},
    }

    def runtime(latency_ms: int) -> dict[str, Any]:
        return {
            "backend": "onnxruntime",
            "env": [
                {"name": "TIDAL_FAULT_ADDED_LATENCY_MS", "value": str(latency_ms)},
                # A few seconds of warm-up, as a real engine load would take.
                {"name": "TIDAL_FAULT_EXTRA_WARMUP_SECONDS", "value": "3"},
            ],
        }

    return {
        "apiVersion": "serving.tidal.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "runtime": runtime(ADDED_LATENCY_MS),
            "models": [model],
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 6,
                "targetQueueDepth": 2,
                # Well above the normal P99 (~70 ms here): the surge shows in the queue.
                "targetP99Ms": 300,
                "standbyReplicas": 1,
                "scaleDownDelaySeconds": 15,
            },
            "rollout": {
                "baseline": {
                    "runtime": runtime(ADDED_LATENCY_MS),
                    "models": [model],
                    "minReplicas": 1,
                },
                "slo": {"p99Ms": SLO_P99_MS, "errorRate": 0.05, "for": f"{SLO_FOR_SECONDS}s"},
                "onBreach": "rollback",
                "activePool": "auto",
                # Short steps so the demo's bad rollout reaches its first step quickly.
                "steps": [50, 100],
                "stepSeconds": 20,
                "drainSeconds": 5,
            },
        },
    }


@dataclass
class Frame:
    t: float
    rps: float
    p99_ms: float
    failures: int
    active: str
    pools: dict[str, dict[str, int]]
    queue: float | None
    decision: str
    rolled_back: bool


@dataclass
class Timeline:
    frames: list[Frame] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, what: str, t: float) -> None:
        self.marks.setdefault(what, t)


def _isvc(sb: Sandbox) -> dict[str, Any]:
    """The demo's InferenceService, or {} while the API server has none (or a blip)."""
    try:
        return get_isvc(sb, NAMESPACE, NAME)
    except subprocess.CalledProcessError:
        return {}


def _view(frame: Frame | None, events: list[str]) -> Group:
    table = Table(title="tidal demo — InferenceService demo/classifier", expand=True)
    for col in ("t (s)", "load rps", "P99 ms", "failed", "active pool", "queue"):
        table.add_column(col, justify="right")
    pools = Table(expand=True)
    for col in ("pool", "desired", "ready", "warming", "standby"):
        pools.add_column(col, justify="right")
    if frame is not None:
        p99 = "—" if math.isnan(frame.p99_ms) else f"{frame.p99_ms:.0f}"
        queue = "—" if frame.queue is None else f"{frame.queue:.1f}"
        table.add_row(
            f"{frame.t:.0f}",
            f"{frame.rps:.0f}",
            p99,
            str(frame.failures),
            frame.active + (" (rolled back)" if frame.rolled_back else ""),
            queue,
        )
        for pool, counts in sorted(frame.pools.items()):
            pools.add_row(
                pool, *(str(counts.get(k, 0)) for k in ("desired", "ready", "warming", "standby"))
            )
    decision = Panel(frame.decision if frame else "…", title="last decision")
    log = Panel("\n".join(events[-6:]) or "…", title="what happened")
    return Group(table, pools, decision, log)


def replica_lines(frames: list[Frame], pool: str) -> dict[str, list[int]]:
    """The replica panel's lines for ``pool``, one value per frame, all counting alike.

    ``status.pools.<pool>.desired`` is the pool's size, its standby included, while ``ready``
    counts only the serving pods: the ready line is ready + standby (every Ready pod), so it
    meets the desired line once the pool is warm, and ``serving`` shows the part that takes
    traffic. Plotting ``ready`` against ``desired`` showed a settled 3 serving + 1 standby as
    "3 of 4" (issue 40 item 5)."""
    counts = [f.pools.get(pool, {}) for f in frames]
    return {
        "warm": [c.get("ready", 0) + c.get("standby", 0) for c in counts],
        "serving": [c.get("ready", 0) for c in counts],
        "desired": [c.get("desired", 0) for c in counts],
    }


def _plot(timeline: Timeline, report: LoadReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_load, ax_lat, ax_rep) = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    ts = [f.t for f in timeline.frames]
    ax_load.plot(ts, [f.rps for f in timeline.frames], label="requests/s sent")
    ax_load.set_ylabel("requests/s")
    seconds = range(int(max(ts, default=0)) + 1)
    p99 = [
        percentile([s.latency * 1000 for s in report.window(t - 2, t) if s.ok], 0.99)
        for t in seconds
    ]
    ax_lat.plot(list(seconds), p99, label="P99 (2 s window), ms", color="tab:red")
    ax_lat.axhline(SLO_P99_MS, color="gray", linestyle="--", label="SLO P99")
    ax_lat.set_ylabel("ms")
    for pool, color in (("primary", "tab:blue"), ("baseline", "tab:green")):
        lines = replica_lines(timeline.frames, pool)
        ax_rep.step(ts, lines["warm"], where="post", color=color, label=f"{pool} ready")
        ax_rep.step(
            ts,
            lines["serving"],
            where="post",
            color=color,
            linestyle="-.",
            alpha=0.6,
            label=f"{pool} ready, serving",
        )
        ax_rep.step(
            ts, lines["desired"], where="post", color=color, linestyle=":", label=f"{pool} desired"
        )
    ax_rep.set_ylabel("replicas")
    ax_rep.set_xlabel("seconds since the load started")
    for what, t in timeline.marks.items():
        for ax in (ax_load, ax_lat, ax_rep):
            ax.axvline(t, color="black", alpha=0.25)
        ax_load.annotate(what, (t, ax_load.get_ylim()[1]), rotation=90, va="top", fontsize=8)
    for ax in (ax_load, ax_lat, ax_rep):
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle("tidal on the sandbox: surge, scale-up, bad rollout, rollback")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def run_demo(keep: bool = False, out_dir: Path | None = None, real_node: bool = False) -> int:
    """``tidal-sandbox demo``: exit 0 when the story played out as it should."""
    summary = demo_scenario(keep=keep, out_dir=out_dir or REPO / "out", real_node=real_node)
    ok = summary["failed_requests"] == 0 and summary["rolled_back"]
    return 0 if ok else 1


def demo_scenario(
    keep: bool = False,
    out_dir: Path | None = None,
    console: Console | None = None,
    *,
    real_node: bool = False,
    sandbox: Sandbox | None = None,
) -> dict[str, Any]:
    """Run the whole demo and return its measured summary: on a fresh sandbox (the node
    agent's, or the real node's with ``real_node``), or in namespace ``demo`` of ``sandbox``,
    which is left running."""
    console = console or Console()
    out_dir = out_dir or REPO / "out"
    console.rule("[bold]tidal demo")
    if sandbox is not None:
        sb = sandbox
    else:
        node = "the real node (kubelet, containerd)" if real_node else "node agent"
        with console.status(
            f"starting the sandbox: etcd, kube-apiserver, controller-manager, scheduler, "
            f"{node}, Prometheus…"
        ):
            config = SandboxConfig(
                nodes=0 if real_node else 2,
                gpus_per_node=2,
                real_node=real_node,
                real_node_gpus=4,
                keep_state=keep,
            )
            sb = Sandbox(config).start()
    operator: OperatorProcess | None = None
    try:
        console.print(
            f"sandbox up in [bold]{sb.started_seconds or 0.0:.1f}s[/] — "
            f"export KUBECONFIG={sb.kubeconfig}"
        )
        from tidal.runtime.modelgen import write_mlp

        info = write_mlp(sb.state_dir / "models" / "classifier.onnx", hidden=256, seed=1)
        console.print(
            f"generated ONNX model {info.path} "
            f"({info.size_bytes} bytes, sha256 {info.sha256[:12]}…)"
        )
        sb.apply_crds(REPO / "crds")
        sb.kubectl("create", "namespace", NAMESPACE)
        log_path = sb.state_dir / "logs" / "tidal-operator.log"
        operator = OperatorProcess(
            {**sb.env, "PYTHONUNBUFFERED": "1"}, NAMESPACE, log_path, "plain"
        ).start()
        console.print(f"tidal-operator started (log: {log_path})")
        wait_for(
            lambda: (
                sb.kubectl("-n", NAMESPACE, "get", "sa", "default", check=False).returncode == 0
            ),
            what="namespace ready",
        )
        isvc = sb.adapt(inference_service(info.uri, info.sha256))
        sb.kubectl("apply", "-f", "-", input=json.dumps(isvc))
        t_apply = time.monotonic()
        with console.status(
            "waiting for the InferenceService to be Ready (models loaded and warmed)…"
        ):
            wait_for(
                lambda: condition(_isvc(sb), "Ready").get("status") == "True",
                timeout=180,
                interval=0.5,
                what="InferenceService Ready",
            )
        console.print(f"InferenceService Ready after {time.monotonic() - t_apply:.1f}s")
        console.print(sb.kubectl("-n", NAMESPACE, "get", "inferenceservice", NAME).stdout)
        summary = _drive(sb, console, isvc, out_dir)
        if keep:
            console.print(
                f"\nthe sandbox keeps running: export KUBECONFIG={sb.kubeconfig}; Ctrl-C stops it"
            )
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(1)
        return summary
    finally:
        if operator is not None:
            operator.stop()
            # Kept beside the plot: the sandbox's state (and its logs) goes with it.
            with contextlib.suppress(OSError):
                out_dir.mkdir(parents=True, exist_ok=True)
                shutil.copy(operator.log_path, out_dir / "tidal-operator.log")
        if sandbox is None:
            with console.status("stopping the sandbox…"):
                sb.stop()
        else:
            sb.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def _drive(sb: Sandbox, console: Console, isvc: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    timeline = Timeline()
    events: list[str] = []
    t0 = time.monotonic()
    api = sb.api_client()
    loadgen = LoadGenerator(
        api,
        NAMESPACE,
        NAME,
        NAME,
        {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]},
        rate,
        timeout=10.0,
        max_in_flight=400,
    )
    stop_at = [MAX_DURATION]
    result: dict[str, LoadReport] = {}

    def run_load() -> None:
        result["report"] = asyncio.run(loadgen.run_until(lambda t: t >= stop_at[0]))

    thread = threading.Thread(target=run_load, daemon=True)
    thread.start()
    bad_applied = False
    flip: dict[str, Any] = {}
    last_decision = ""
    last_rollout = ""
    with Live(_view(None, events), console=console, refresh_per_second=2) as live:
        while thread.is_alive():
            t = time.monotonic() - t0
            body = _isvc(sb)
            status = body.get("status") or {}
            report = loadgen.report
            window = report.window(t - 2, t)
            decision = (status.get("lastDecision") or {}).get("reason", "")
            rolled = condition(body, "RolledBack").get("status") == "True"
            metrics = status.get("metrics") or {}
            frame = Frame(
                t=t,
                rps=rate(t),
                p99_ms=percentile([s.latency * 1000 for s in window if s.ok], 0.99),
                failures=len(report.failures()),
                active=str(status.get("activePool", "?")),
                pools={k: dict(v) for k, v in (status.get("pools") or {}).items()},
                queue=metrics.get("queueDepth"),
                decision=decision or "…",
                rolled_back=rolled,
            )
            timeline.frames.append(frame)
            if decision and decision != last_decision:
                events.append(f"{t:5.1f}s  decision: {decision}")
                last_decision = decision
                if t >= SURGE_AT and (
                    "surge" in decision or "scale-up" in decision or "p99" in decision
                ):
                    timeline.mark("scale-up decided", t)
            rollout = status.get("rollout") or {}
            rollout_now = f"{rollout.get('phase', '')}: {rollout.get('reason', '')}"
            if rollout and rollout_now != last_rollout:
                events.append(f"{t:5.1f}s  rollout {rollout_now}")
                last_rollout = rollout_now
                if (
                    bad_applied
                    and "rolled back" not in timeline.marks
                    and ("pending:" in rollout_now or "breach:" in rollout_now)
                ):
                    timeline.mark("SLO breach begins", t)
                elif "slo ok" in rollout_now and "rolled back" not in timeline.marks:
                    timeline.marks.pop("SLO breach begins", None)  # it recovered: not sustained
            primary = frame.pools.get("primary", {})
            if t >= SURGE_AT:
                timeline.mark("surge", SURGE_AT)
                warm = primary.get("ready", 0) + primary.get("standby", 0)
                if "scale-up decided" in timeline.marks and warm >= max(
                    2, primary.get("desired", 0)
                ):
                    timeline.mark("warm capacity", t)
            if t >= BAD_ROLLOUT_AT and not bad_applied:
                bad = json.loads(json.dumps(isvc))
                bad["spec"]["runtime"]["env"][0]["value"] = str(BAD_LATENCY_MS)
                sb.kubectl("apply", "-f", "-", input=json.dumps(bad))
                bad_applied = True
                timeline.mark("bad rollout", t)
                events.append(
                    f"{t:5.1f}s  applied a bad primary (+{BAD_LATENCY_MS} ms per request)"
                )
            if rolled and not flip:
                flip = flip_record(status)
            if rolled and "rolled back" not in timeline.marks:
                timeline.mark("rolled back", t)
                events.append(
                    f"{t:5.1f}s  RolledBack: {condition(body, 'RolledBack').get('message', '')}"
                )
                stop_at[0] = min(stop_at[0], t + 10)
            live.update(_view(frame, events))
            time.sleep(0.5)
    thread.join()
    report = result["report"]
    (out_dir / "demo-events.log").parent.mkdir(parents=True, exist_ok=True)
    (out_dir / "demo-events.log").write_text("\n".join(events) + "\n")
    for sample in report.failures()[:5]:
        console.print(f"failed request at {sample.sent:.1f}s to {sample.endpoint}: {sample.error}")
    png = out_dir / "demo.png"
    _plot(timeline, report, png)
    marks = timeline.marks
    summary = {
        "requests": len(report.samples),
        "failed_requests": len(report.failures()),
        "surge_to_decision_s": _diff(marks, "surge", "scale-up decided"),
        "surge_to_warm_capacity_s": _diff(marks, "surge", "warm capacity"),
        "bad_rollout_to_flip_s": _diff(marks, "bad rollout", "rolled back"),
        "breach_onset_to_flip_s": _diff(marks, "SLO breach begins", "rolled back"),
        "slo_window_s": SLO_FOR_SECONDS,
        # The operator's own record (its clock, ms): window end -> the Service left the primary.
        "window_end_to_flip_s": flip.get("window_end_to_flip_s"),
        "rollback_signal": flip.get("signal"),
        "rolled_back": "rolled back" in marks,
        "p99_before_surge_ms": report.p99(5, SURGE_AT) * 1000,
        "p99_during_surge_ms": report.p99(SURGE_AT, SURGE_END) * 1000,
        "plot": str(png),
    }
    (out_dir / "demo-summary.json").write_text(json.dumps(summary, indent=2))
    table = Table(title="demo summary (measured in this run)")
    table.add_column("what")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, f"{value:.2f}" if isinstance(value, float) else str(value))
    console.print(table)
    console.print(f"plot written to [bold]{png}[/]")
    return summary


def flip_record(status: dict[str, Any]) -> dict[str, Any]:
    """From ``status.rollout.state``'s rollback record: the breached signal and how long after
    its ``for`` window ended the Service stopped selecting the primary ({} until it has)."""
    try:
        state = json.loads((status.get("rollout") or {}).get("state") or "{}")
    except ValueError:
        return {}
    record = state.get("rollback") or {}
    switched = record.get("switchedAt")
    breaches = [b for b in record.get("breaches") or [] if b.get("breachingSince") is not None]
    if switched is None or not breaches:
        return {}
    first = min(breaches, key=lambda b: b["breachingSince"])
    window_end = first["breachingSince"] + SLO_FOR_SECONDS
    return {"window_end_to_flip_s": round(switched - window_end, 3), "signal": first["signal"]}


def _diff(marks: dict[str, float], start: str, end: str) -> float | None:
    if start in marks and end in marks:
        return round(marks[end] - marks[start], 2)
    return None
