"""End to end: after a short real run, every panel of the Grafana dashboard and every alert
rule of the chart finds its data in the sandbox's Prometheus, and the alerts the run provokes
fire.

One namespace, five InferenceServices on the real runtime and operator, each there to make some
series exist for real:

* ``canary``: a primary 150 ms slow against ``slo.p99Ms: 100`` beside a healthy baseline, two
  models (one loaded only by its first request on each pod), a standby, steady
  load then a step up — SLO breach, rollback, scale decisions, cold starts;
* ``fleet``: ``spec.fleet`` with 8 models on 2 replicas whose budgets hold about 3 each, one of
  them a corrupt engine — the gateway, placement, evictions (thrash) and failed loads;
* ``lru``: two models and room for one, asked in turn — cold requests, cold starts and (a 50 ms
  emulated host->device transfer on each load) transfer waits all along, and a seeded 10 % of
  500s (non-200 series);
* ``crowded``: asks for 64 CPUs a pod — unschedulable replicas;
* ``ghost``: runs on the sandbox's fake node, whose pods are Ready but serve nothing — metrics
  stale (the autoscaler holds; Prometheus cannot scrape it).

The operator is scraped too (its metrics port added to Prometheus' configuration, with
``honor_labels`` as the chart's monitors must have). Then, over the run's time range:

* each dashboard query (panels, annotations, variables), with the variables set to the test's
  namespace and All, returns at least one number;
* each vector selector of the dashboard and of the rules — every alternative of a regex
  matcher separately — returns data in the test's namespace (a typo'd metric, label or label
  value finds nothing), except ``kind="used"`` of ``tidal_gpu_memory_bytes``: GPU backends only;
* the expressions of TidalSloBreach (p99), TidalRolledBack, TidalMetricsStale (both sources),
  TidalUnschedulableReplicas, TidalEngineCacheThrash and TidalEngineLoadFailures (gateway)
  return series of this namespace, and TidalOperatorAbsent none;
* ``kubectl get tisvc -o wide`` shows the last decision and the rollout phase, and ``kubectl
  describe`` lists the breach before the rollback.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from scenario import INFER_BODY, install_crd, pods

from tidal.runtime.modelgen import mlp_hidden_for_bytes, write_mlp
from tidal.sandbox.binaries import cache_root
from tidal.sandbox.loadgen import LoadGenerator
from tidal.sandbox.operatorproc import REPO, OperatorProcess, condition, get_isvc
from tidal.sandbox.procs import free_port
from tidal.sandbox.wait import wait_for

sys.path.insert(0, str(REPO / "tests" / "charts"))
from dashboard_helpers import (
    Selector,
    alternatives,
    dashboard_queries,
    fill,
    load_dashboard,
    selectors,
)

pytestmark = [pytest.mark.sandbox, pytest.mark.slow, pytest.mark.timeout(480)]

LOAD_SECONDS = 45.0
FLEET_MODELS = 8
# Series this run cannot produce, by (metric, label, value): why.
CANNOT = {("tidal_gpu_memory_bytes", "kind", "used"): "whole-device memory: GPU backends only"}
# Rules the run must make fire (alert, distinguishing label or None).
PROVOKED = [
    ("TidalSloBreach", ("signal", "p99")),
    ("TidalRolledBack", None),
    ("TidalMetricsStale", ("source", "autoscaler")),
    ("TidalMetricsStale", ("source", "prometheus")),
    ("TidalUnschedulableReplicas", None),
    ("TidalEngineCacheThrash", None),
    ("TidalEngineLoadFailures", ("source", "gateway")),
]


# -- Prometheus --------------------------------------------------------------------------------


class Prom:
    def __init__(self, url: str) -> None:
        self.url = url

    def _post(self, path: str, form: dict[str, str]) -> dict[str, Any]:
        data = urllib.parse.urlencode(form).encode()
        with urllib.request.urlopen(f"{self.url}{path}", data=data, timeout=30) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return dict(body["data"])

    def range(self, expr: str, start: float, end: float, step: float = 2.0) -> list[Any]:
        """The result of a range query (matrix), or raises with Prometheus' error."""
        try:
            data = self._post(
                "/api/v1/query_range",
                {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"},
            )
        except urllib.error.HTTPError as exc:
            raise AssertionError(f"{expr}: {exc.read().decode()[:500]}") from exc
        return list(data["result"])

    def reload(self) -> None:
        req = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        urllib.request.urlopen(req, timeout=30).close()


def has_number(result: list[Any]) -> bool:
    return any(not math.isnan(float(v)) for series in result for _, v in series["values"])


def lacks_data(prom: Prom, expr: str, start: float, end: float) -> str | None:
    """None when ``expr`` has a number somewhere in the range, else what is wrong."""
    try:
        return None if has_number(prom.range(expr, start, end)) else f"no data: {expr}"
    except AssertionError as exc:
        return f"error: {exc}"


def scrape_operator(sandbox: Any, port: int) -> tuple[Path, str]:
    """Add the operator's metrics port to the sandbox's Prometheus; returns the config path
    and its previous text (to put back)."""
    path = sandbox.state_dir / "prometheus.yml"
    before = path.read_text()
    doc = yaml.safe_load(before)
    doc["scrape_configs"].append(
        {
            "job_name": "tidal-operator",
            "honor_labels": True,  # the InferenceServices' namespace label, as in the chart
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
        }
    )
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    Prom(sandbox.prometheus_url).reload()
    return path, before


# -- the InferenceServices ---------------------------------------------------------------------


def model(name: str, path: Path, *, preload: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "engines": [{"uri": path.resolve().as_uri()}],
        "maxBatchSize": 8,
        "batching": {"maxQueueDelayMs": 1},
        "warmup": {"batchSizes": [1], "iterations": 1},
        "preload": preload,
    }


def runtime(**env: str) -> dict[str, Any]:
    values = {"OMP_NUM_THREADS": "1", **env}
    return {"backend": "onnxruntime", "env": [{"name": k, "value": v} for k, v in values.items()]}


def services(root: Path) -> list[dict[str, Any]]:
    root.mkdir(parents=True, exist_ok=True)
    write_mlp(root / "mlp.onnx", seed=1)
    write_mlp(root / "rare.onnx", seed=2)
    models = [model("mlp", root / "mlp.onnx"), model("rare", root / "rare.onnx", preload=False)]
    canary = {
        # Slow, and 2 % errors (under the error-rate SLO): non-200 series exist.
        "runtime": runtime(TIDAL_FAULT_ADDED_LATENCY_MS="150", TIDAL_FAULT_ERROR_RATE="0.02"),
        "models": models,
        "autoscaling": {
            "minReplicas": 1,
            "maxReplicas": 3,
            "targetQueueDepth": 4,
            "targetP99Ms": 300,
            "standbyReplicas": 1,
            "scaleDownDelaySeconds": 600,
        },
        "rollout": {
            "baseline": {"runtime": runtime(), "minReplicas": 1},
            "slo": {
                "p99Ms": 100,
                "errorRate": 0.05,
                "coldStartMs": 5000,
                "transferWaitMs": 5000,  # the SLO line of the transfer wait panel
                "for": "5s",
            },
            "drainSeconds": 5,
        },
    }
    sizes = []
    fleet_models = []
    for i in range(FLEET_MODELS - 1):
        path = root / f"f{i}.onnx"
        write_mlp(path, hidden=mlp_hidden_for_bytes(60_000 + 10_000 * i), seed=10 + i)
        sizes.append(path.stat().st_size)
        fleet_models.append(model(f"f{i}", path, preload=False))
    broken = root / "broken.onnx"
    broken.write_bytes(random.Random(7).randbytes(50_000))  # not an ONNX model: its load fails
    fleet_models.append(model("broken", broken, preload=False))
    fleet = {
        "runtime": runtime(TIDAL_FAULT_ADDED_LATENCY_MS="20"),
        "models": fleet_models,
        "memory": {"engineCacheBudget": str(int(sum(sizes) / len(sizes) * 3))},
        "autoscaling": {"minReplicas": 2, "maxReplicas": 2},
        "fleet": {
            "gateway": {"holdTimeoutSeconds": 10},
            "placement": {"ratePerCopy": 5, "intervalSeconds": 1, "minRate": 0.05},
        },
    }
    crowded = {
        "runtime": {**runtime(), "resources": {"requests": {"cpu": "64"}}},
        "models": [model("mlp", root / "mlp.onnx")],
        "autoscaling": {"minReplicas": 1, "maxReplicas": 2},
    }
    ghost = {
        "runtime": {
            **runtime(),
            "nodeSelector": {"tidal.dev/sandbox-fake": "true"},
            "tolerations": [
                {"key": "tidal.dev/sandbox-fake", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
        "models": [model("mlp", root / "mlp.onnx")],
        "autoscaling": {"minReplicas": 1, "maxReplicas": 2},
    }
    # Two models, room for one: every other request loads its engine (cold requests and cold
    # starts keep coming; one per pod would not show in a rate).
    size = (root / "mlp.onnx").stat().st_size
    lru = {
        # 10 % answered 500, from a fixed seed: non-200 series exist whatever the canary's
        # share of errors was before its rollback (on a fast machine it rolls back after a
        # handful of requests, and 2 % of them may be none).
        # Each load also moves its weights over an (emulated) slow host->device path: requests
        # that wait for a load record their transfer wait.
        "runtime": runtime(
            TIDAL_FAULT_ERROR_RATE="0.1",
            TIDAL_FAULT_SEED="1",
            TIDAL_FAULT_EXTRA_TRANSFER_SECONDS="0.05",
        ),
        "models": [
            model("lru-a", root / "mlp.onnx", preload=False),
            model("lru-b", root / "rare.onnx", preload=False),
        ],
        "memory": {"engineCacheBudget": str(int(size * 1.5))},
        "autoscaling": {"minReplicas": 1, "maxReplicas": 1},
    }
    specs = {"canary": canary, "fleet": fleet, "lru": lru, "crowded": crowded, "ghost": ghost}
    return [
        {
            "apiVersion": "serving.tidal.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": name},
            "spec": spec,
        }
        for name, spec in specs.items()
    ]


def rendered_rules() -> list[dict[str, Any]]:
    """The chart's alert rules, rendered by helm, with a thrash threshold this short run
    reaches (the default is for production traffic)."""
    helm = cache_root() / "helm-v4.3.2" / "bin" / "helm"
    if not helm.exists():
        pytest.skip("helm is not built (tests/charts builds it)")
    out = subprocess.run(
        [
            str(helm), "template", "t", str(REPO / "charts" / "tidal"),
            "--set", "prometheusRule.enabled=true",
            "--set-json", "prometheusRule.rules.cacheThrash.evictionsPerMinute=0.5",
        ],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    docs = [d for d in yaml.safe_load_all(out) if d and d["kind"] == "PrometheusRule"]
    return [r for g in docs[0]["spec"]["groups"] for r in g["rules"]]


# -- checks --------------------------------------------------------------------------------------


def selector_checks(sel: Selector, namespace: str) -> list[tuple[str, str]]:
    """(description, PromQL) queries that must each return data: the selector scoped to the
    namespace, and each alternative of its regex matchers on its own."""
    scoped = Selector(
        sel.name,
        (*(m for m in sel.matchers if m[0] != "namespace"), ("namespace", "=", namespace)),
    )
    if sel.name.startswith("tidal_operator_") and sel.name not in {
        "tidal_operator_scale_decisions_total",
        "tidal_operator_rollbacks_total",
        "tidal_operator_placement_changes_total",
    }:
        scoped = sel  # the operator's own process metrics carry no namespace
    checks = [(scoped.promql(), f"count({scoped.promql()})")]
    for label, op, value in sel.matchers:
        if op != "=~" or label == "namespace":
            continue
        for alt in alternatives(value) or []:
            if label == "__name__":
                name, query = alt, Selector(alt, scoped.matchers).promql(drop="__name__")
            else:
                name, query = sel.name, scoped.promql(drop=label, value=alt)
            if (name, label, alt) not in CANNOT:
                checks.append((f"{query} ({label}={alt})", f"count({query})"))
    return checks


def column(table: str, name: str, heading: str) -> str:
    """A cell of kubectl's table output, by the heading's position (cells may be empty)."""
    lines = table.splitlines()
    start = lines[0].index(heading)
    rest = lines[0][start + len(heading) :]
    end = start + len(heading) + (len(rest) - len(rest.lstrip())) if rest.strip() else None
    row = next(line for line in lines if line.startswith(f"{name} "))
    return row[start:end].strip()


def test_dashboard_and_alerts_find_their_data_after_a_real_run(
    sandbox: Any, namespace: str, tmp_path: Path
) -> None:
    install_crd(sandbox)
    prom = Prom(sandbox.prometheus_url)
    port = free_port()
    log_path = tmp_path / "operator.log"
    operator = OperatorProcess({**os.environ, **sandbox.env}, namespace, log_path, "plain")
    config_path, config_before = scrape_operator(sandbox, port)
    try:
        operator.start("--metrics-port", str(port))
        manifests = services(tmp_path / "models")
        for manifest in manifests:
            done = sandbox.kubectl(
                "apply",
                "-n",
                namespace,
                "-f",
                "-",
                input=yaml.safe_dump(sandbox.adapt(manifest)),
                check=False,
            )
            assert done.returncode == 0, done.stderr

        def ready() -> bool:
            canary = get_isvc(sandbox, namespace, "canary").get("status") or {}
            fleet = get_isvc(sandbox, namespace, "fleet").get("status") or {}
            pools = canary.get("pools") or {}
            lru = get_isvc(sandbox, namespace, "lru").get("status") or {}
            return (
                all(pools.get(p, {}).get("ready", 0) >= 1 for p in ("primary", "baseline"))
                and lru.get("readyReplicas") == 1
                and fleet.get("readyReplicas") == 2
                and (fleet.get("fleet") or {}).get("gatewaysReady", 0) >= 1
            )

        wait_for(ready, timeout=150, interval=1.0, what="canary's pools and the fleet ready")
        started = time.time()
        canary_load = LoadGenerator(
            sandbox.api_client(),
            namespace,
            "canary",
            lambda t: "rare" if random.random() < 0.05 else "mlp",
            INFER_BODY,
            lambda t: 12.0 if t < 20 else 30.0,
            refresh=0.2,
        )
        names = [f"f{i}" for i in range(FLEET_MODELS - 1)] + ["broken"]
        fleet_load = LoadGenerator(
            sandbox.api_client(),
            namespace,
            "fleet",
            lambda t: random.choice(names),
            INFER_BODY,
            lambda t: 8.0,
            timeout=15.0,
        )

        lru_load = LoadGenerator(
            sandbox.api_client(),
            namespace,
            "lru",
            lambda t: "lru-a" if int(t * 2) % 2 else "lru-b",
            INFER_BODY,
            lambda t: 2.0,
        )

        async def both() -> None:
            await asyncio.gather(
                canary_load.run(LOAD_SECONDS),
                fleet_load.run(LOAD_SECONDS),
                lru_load.run(LOAD_SECONDS),
            )

        asyncio.run(both())
        time.sleep(6)  # the last scrapes and decisions
        ended = time.time()
        wide = sandbox.kubectl("get", "tisvc", "-n", namespace, "-o", "wide").stdout
        described = sandbox.kubectl("describe", "tisvc", "canary", "-n", namespace).stdout
        canary = get_isvc(sandbox, namespace, "canary")
        ghost = get_isvc(sandbox, namespace, "ghost")
        pod_list = pods(sandbox, namespace)
    finally:
        operator.stop()
        config_path.write_text(config_before)
        prom.reload()
    print(f"\n{wide}")
    print(
        f"canary: {len(canary_load.report.samples)} requests, "
        f"{len(canary_load.report.failures())} failed; fleet: "
        f"{len(fleet_load.report.samples)} requests, {len(fleet_load.report.failures())} failed"
    )
    assert condition(canary, "RolledBack").get("status") == "True", canary["status"]
    assert condition(ghost, "MetricsStale").get("status") == "True", ghost["status"]
    assert any(
        c.get("reason") == "Unschedulable"
        for p in pod_list
        for c in (p.get("status") or {}).get("conditions") or []
    )

    # -- kubectl ---------------------------------------------------------------------------------
    assert column(wide, "canary", "ROLLOUT") == "RolledBack", wide
    assert column(wide, "canary", "DECISION") == canary["status"]["lastDecision"]["reason"], wide
    assert column(wide, "ghost", "DECISION") == "hold:metrics-missing", wide
    events = described.split("Events:", 1)[1]
    assert events.index("SloBreach") < events.index("RolledBack"), events

    # -- every dashboard query ------------------------------------------------------------------
    start, end = started - 30, ended
    variables = {"namespace": namespace, "service": ".*", "pool": ".*"}
    dashboard = load_dashboard()
    empty = []
    for query in dashboard_queries(dashboard):
        expr = fill(query.expr, variables)
        if query.where.startswith("variable"):
            expr = f"count({expr})"
        if problem := lacks_data(prom, expr, start, end):
            empty.append(f"{query.where}: {problem}")
    assert not empty, "queries without data:\n" + "\n".join(empty)

    # -- every selector of the dashboard and the rules -----------------------------------------
    rules = rendered_rules()
    exprs = [fill(q.expr, variables) for q in dashboard_queries(dashboard)]
    exprs += [r["expr"] for r in rules]
    checks: dict[str, str] = {}
    for expr in exprs:
        for sel in selectors(expr):
            checks.update(selector_checks(sel, namespace))
    missing = [
        f"{w}: {p}" for w, q in sorted(checks.items()) if (p := lacks_data(prom, q, start, end))
    ]
    print(f"{len(checks)} selectors checked")
    assert not missing, "selectors without data:\n" + "\n".join(missing)

    # -- the alerts this run provokes -------------------------------------------------------------
    quiet = []
    for alert, label in PROVOKED:
        rule = next(
            r
            for r in rules
            if r["alert"] == alert and (label is None or r["labels"].get(label[0]) == label[1])
        )
        result = prom.range(rule["expr"], start, end)
        mine = [s for s in result if s["metric"].get("namespace") == namespace]
        if not mine:
            quiet.append(f"{alert} {label or ''}: {rule['expr']}")
    assert not quiet, "alerts the run should provoke did not fire:\n" + "\n".join(quiet)
    absent = next(r for r in rules if r["alert"] == "TidalOperatorAbsent")
    recent = prom.range(absent["expr"], started, end)
    assert not recent, "TidalOperatorAbsent fired while the operator was scraped"
