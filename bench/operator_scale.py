"""How the operator copes with many InferenceServices: time to Ready, reconcile cost, memory.

Starts a sandbox with one fake node (pods are reported Running/Ready without running anything),
installs the CRD, starts ``tidal-operator`` for one namespace, creates N InferenceServices at
once and measures

* the time from the first create until every InferenceService reports Ready (and the time
  until the operator had written every child, which does not wait for the pods), and per
  service the time from its creation to its Ready condition (P50/P99, one-second resolution:
  the API server's timestamps);
* reconcile duration P50/P99 (from the operator's histogram, interpolated within buckets);
* Kubernetes API requests per reconcile (the operator's own requests; watches excluded), both
  while converging and in a quiet period afterwards (a level-triggered operator that re-applies
  everything on every event would show up here);
* the operator's resident memory (current and peak) from /proc.

    .venv/bin/python bench/operator_scale.py [--services 200] [--workers 4] [--quiet-seconds 10]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from tidal.sandbox import Sandbox, SandboxConfig
from tidal.sandbox.operatorproc import OperatorProcess
from tidal.sandbox.procs import free_port
from tidal.sandbox.wait import wait_for

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "bench"


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "serving.tidal.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": NAMESPACE},
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
            "autoscaling": {"minReplicas": 1, "maxReplicas": 4},
        },
    }


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$", line)
        if match is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        out.setdefault(match.group(1), []).append((labels, float(match.group(3))))
    return out


Metrics = dict[str, list[tuple[dict[str, str], float]]]


def minus(after: Metrics, before: Metrics) -> Metrics:
    """Counters and histogram buckets accumulated between two scrapes."""
    earlier = {(n, tuple(sorted(lab.items()))): v for n, rows in before.items() for lab, v in rows}
    return {
        name: [(lab, v - earlier.get((name, tuple(sorted(lab.items()))), 0.0)) for lab, v in rows]
        for name, rows in after.items()
    }


def total(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    return sum(v for _, v in metrics.get(name, []))


def quantile(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str, q: float) -> float:
    """Quantile from a Prometheus histogram (linear within the bucket, like histogram_quantile)."""
    buckets = sorted(
        (float("inf") if lab["le"] == "+Inf" else float(lab["le"]), v)
        for lab, v in metrics.get(f"{name}_bucket", [])
    )
    count = buckets[-1][1]
    rank = q * count
    prev_le, prev_count = 0.0, 0.0
    for le, cum in buckets:
        if cum >= rank:
            if le == float("inf"):
                return prev_le
            width = cum - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / width if width else 0.0)
        prev_le, prev_count = le, cum
    return prev_le


def _seconds_to_ready(item: dict[str, Any]) -> float | None:
    """creationTimestamp -> Ready's lastTransitionTime (both with one-second resolution)."""
    created = datetime.fromisoformat(item["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    for cond in (item.get("status") or {}).get("conditions", []):
        if cond["type"] == "Ready" and cond["status"] == "True":
            ready = datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00"))
            return (ready - created).total_seconds()
    return None


def rss_kib(pid: int) -> tuple[int, int]:
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--services", type=int, default=200)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--quiet-seconds", type=float, default=10.0)
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")
    args = p.parse_args(argv)

    config = SandboxConfig(
        nodes=0, fake_nodes=1, fake_node_pods=max(1000, 2 * args.services), prometheus=False
    )
    with Sandbox(config) as sb:
        sb.apply_crds(REPO / "crds")
        sb.kubectl("create", "namespace", NAMESPACE)
        metrics_port = free_port()
        operator = OperatorProcess(
            {**os.environ, **sb.env}, NAMESPACE, sb.state_dir / "operator.log"
        ).start(
            "--workers",
            str(args.workers),
            "--metrics-port",
            str(metrics_port),
            "--bind-address",
            "127.0.0.1",
        )
        try:
            wait_for(lambda: scrape(metrics_port), timeout=30, what="operator metrics")
            # Warm-up: one service through to Ready, so the measurement starts with the
            # operator's watches running (kopf needs a few seconds to start them).
            sb.kubectl("apply", "-f", "-", input=yaml.safe_dump(service("warmup")))
            wait_for(
                lambda: (
                    "True"
                    in sb.kubectl(
                        "get",
                        "inferenceservice",
                        "warmup",
                        "-n",
                        NAMESPACE,
                        "-o",
                        'jsonpath={.status.conditions[?(@.type=="Ready")].status}',
                    ).stdout
                ),
                timeout=120,
                what="warm-up service Ready",
            )
            time.sleep(1.0)
            baseline = scrape(metrics_port)
            idle_rss, _ = rss_kib(operator.pid)
            names = [f"svc-{i:04d}" for i in range(args.services)]
            manifest = yaml.safe_dump_all([service(n) for n in names])
            started = time.monotonic()
            sb.kubectl("apply", "-f", "-", input=manifest, timeout=300)
            created = time.monotonic() - started

            children_done = None
            expected_children = 3 * args.services

            def progress() -> bool:
                nonlocal children_done
                m = scrape(metrics_port)
                if (
                    children_done is None
                    and total(m, "tidal_operator_children_applied_total") >= expected_children
                ):
                    children_done = time.monotonic() - started
                out = sb.kubectl("get", "inferenceservices", "-n", NAMESPACE, "-o", "json")
                items = json.loads(out.stdout)["items"]
                ready = [
                    i
                    for i in items
                    if any(
                        c["type"] == "Ready" and c["status"] == "True"
                        for c in (i.get("status") or {}).get("conditions", [])
                    )
                ]
                return len(ready) == args.services + 1  # and the warm-up service

            wait_for(progress, timeout=900, interval=0.5, what="all InferenceServices Ready")
            all_ready = time.monotonic() - started
            items = json.loads(
                sb.kubectl("get", "inferenceservices", "-n", NAMESPACE, "-o", "json").stdout
            )["items"]
            to_ready = sorted(
                t
                for i in items
                if i["metadata"]["name"] != "warmup" and (t := _seconds_to_ready(i)) is not None
            )
            converge = minus(scrape(metrics_port), baseline)
            rss_ready, _ = rss_kib(operator.pid)
            time.sleep(args.quiet_seconds)
            quiet = minus(scrape(metrics_port), baseline)
            rss_now, rss_peak = rss_kib(operator.pid)
        finally:
            operator.stop()

    def per_reconcile(m: dict[str, list[tuple[dict[str, str], float]]]) -> float:
        reconciles = total(m, "tidal_operator_reconciles_total")
        return total(m, "tidal_operator_api_requests_total") / reconciles if reconciles else 0.0

    by_verb: dict[str, float] = {}
    for labels, value in converge.get("tidal_operator_api_requests_total", []):
        key = f"{labels['verb']} {labels['resource']}"
        by_verb[key] = by_verb.get(key, 0.0) + value
    quiet_calls = total(quiet, "tidal_operator_api_requests_total") - total(
        converge, "tidal_operator_api_requests_total"
    )
    quiet_reconciles = total(quiet, "tidal_operator_reconciles_total") - total(
        converge, "tidal_operator_reconciles_total"
    )
    figures = {
        "services": args.services,
        "workers": args.workers,
        "create_seconds": round(created, 2),
        "children_written_seconds": round(children_done, 2) if children_done else None,
        "all_ready_seconds": round(all_ready, 2),
        "create_to_ready_p50_s": to_ready[len(to_ready) // 2] if to_ready else None,
        "create_to_ready_p99_s": to_ready[min(len(to_ready) - 1, int(0.99 * len(to_ready)))]
        if to_ready
        else None,
        "reconciles": int(total(converge, "tidal_operator_reconciles_total")),
        "reconciles_per_service": round(
            total(converge, "tidal_operator_reconciles_total") / args.services, 2
        ),
        "reconcile_p50_ms": round(
            1000 * quantile(converge, "tidal_operator_reconcile_duration_seconds", 0.5), 2
        ),
        "reconcile_p99_ms": round(
            1000 * quantile(converge, "tidal_operator_reconcile_duration_seconds", 0.99), 2
        ),
        "api_calls": int(total(converge, "tidal_operator_api_requests_total")),
        "api_calls_per_reconcile": round(per_reconcile(converge), 2),
        "api_calls_per_service": round(
            total(converge, "tidal_operator_api_requests_total") / args.services, 2
        ),
        "api_calls_by_kind": {k: int(v) for k, v in sorted(by_verb.items())},
        "quiet_seconds": args.quiet_seconds,
        "quiet_reconciles": int(quiet_reconciles),
        "quiet_api_calls": int(quiet_calls),
        "errors": int(total(quiet, "tidal_operator_reconcile_errors_total")),
        "rss_idle_mib": round(idle_rss / 1024, 1),
        "rss_all_ready_mib": round(rss_ready / 1024, 1),
        "rss_after_quiet_mib": round(rss_now / 1024, 1),
        "rss_peak_mib": round(rss_peak / 1024, 1),
    }
    width = max(len(k) for k in figures)
    print(f"operator scale benchmark: {args.services} InferenceServices on a fake node")
    for key, value in figures.items():
        print(f"  {key:<{width}}  {value}")
    if args.json:
        print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
