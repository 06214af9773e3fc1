"""What the dashboard and alert tests share: the dashboard's queries with Grafana's variables
filled in, the vector selectors of a PromQL expression (promql-parser), the metric names tidal
exports (read from the metric definitions themselves), and the dashboard schema checker.

The checker is ``tests/charts/dashboardcheck``: a small Go program around the Grafana
Foundation SDK's strict decoders (generated from Grafana's dashboard schema), built once from
the Go module proxy into ``$TIDAL_CACHE/dashboardcheck-<hash>/`` like the sandbox's binaries.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "charts" / "tidal" / "dashboards" / "tidal.json"
CHECKER_SRC = Path(__file__).resolve().parent / "dashboardcheck"

# Grafana's built-in interval variables, as a 1-second-scrape Prometheus would get them.
INTERVALS = {"$__rate_interval": "1m", "$__interval": "30s", "$__range": "5m"}


def cache_root() -> Path:
    return Path(os.environ.get("TIDAL_CACHE", Path.home() / ".cache" / "tidal"))


def ensure_dashboardcheck() -> Path:
    """The checker binary, built first when missing (about a minute on 2 cores, once)."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((CHECKER_SRC / name).read_bytes())
    out = cache_root() / f"dashboardcheck-{digest.hexdigest()[:12]}" / "dashboardcheck"
    if not os.access(out, os.X_OK):
        out.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "GOFLAGS": "-buildvcs=false", "CGO_ENABLED": "0"}
        subprocess.run(
            ["go", "build", "-trimpath", "-o", str(out), "."],
            cwd=CHECKER_SRC,
            env=env,
            check=True,
            timeout=900,
        )
    return out


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


@dataclass(frozen=True)
class Query:
    """One PromQL expression of the dashboard or the rules, and where it comes from."""

    where: str
    expr: str


def dashboard_queries(dashboard: dict[str, Any]) -> list[Query]:
    """Panel targets, annotations and variable queries (``label_values(sel, label)``: the
    selector, which is what Grafana sends to the series API)."""
    out = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            out.append(Query(f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for note in dashboard["annotations"]["list"]:
        if "expr" in note:
            out.append(Query(f"annotation {note['name']!r}", note["expr"]))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            text = var["query"]["query"]
            assert text.startswith("label_values(") and text.endswith(")"), text
            selector = text[len("label_values(") : -1].rsplit(",", 1)[0]
            out.append(Query(f"variable {var['name']!r}", selector))
    return out


def fill(expr: str, variables: dict[str, str]) -> str:
    """``expr`` with Grafana's variables replaced (longest names first)."""
    values = {**INTERVALS, **{f"${k}": v for k, v in variables.items()}}
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(name, values[name])
    return expr


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value); op is =, !=, =~, !~

    def promql(self, drop: str | None = None, value: str | None = None) -> str:
        """The selector as PromQL; ``drop``: leave that label's matchers out, or with ``value``
        match that label to exactly it."""
        parts = []
        for label, op, val in self.matchers:
            if label == drop:
                if value is not None:
                    parts.append(f"{label}={json.dumps(value)}")
                continue
            parts.append(f"{label}{op}{json.dumps(val)}")
        inner = ", ".join(parts)
        return f"{self.name}{{{inner}}}" if self.name else f"{{{inner}}}"


_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}


def selectors(expr: str) -> list[Selector]:
    """Every vector selector in ``expr`` (inside range selectors, functions and binary ops)."""
    found: list[Selector] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = tuple(
                (m.name, _OPS[str(m.op).rsplit(".", 1)[-1]], m.value)
                for m in node.matchers.matchers
            )
            found.append(Selector(node.name or "", matchers))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def metric_names(selector: Selector) -> list[str]:
    """The metric names a selector can match: its name, or the alternatives of a
    ``__name__=~"a|b"`` matcher."""
    if selector.name:
        return [selector.name]
    for label, op, value in selector.matchers:
        if label == "__name__" and op == "=~":
            return alternatives(value) or []
        if label == "__name__" and op == "=":
            return [value]
    return []


def alternatives(regex: str) -> list[str] | None:
    """``a|b|c`` -> [a, b, c] when the regex is a plain alternation of literals (``x_(a|b)_y``
    expanded too); None for anything else (``.*``, variables)."""
    if "(" in regex:
        head, rest = regex.split("(", 1)
        middle, tail = rest.split(")", 1)
        inner = alternatives(middle)
        if inner is None or "(" in tail:
            return None
        return [head + alt + tail for alt in inner]
    parts = regex.split("|")
    if all(p and all(c.isalnum() or c in "_-:." for c in p) for p in parts):
        return parts
    return None


def exported_metric_names() -> set[str]:
    """Every series name tidal's processes can export, read from their metric definitions:
    the runtime's and the gateway's registries, the operator's own metrics and its
    tidal_inferenceservice_* collector, plus Prometheus' ``up``."""
    from prometheus_client import REGISTRY

    from tidal.gateway.metrics import GatewayMetrics
    from tidal.operator.shell import metrics as operator_metrics
    from tidal.runtime.metrics import RuntimeMetrics

    names = {"up"}
    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gauge": ("",),
        "summary": ("_sum", "_count", ""),
    }
    for registry in (RuntimeMetrics().registry, GatewayMetrics().registry, REGISTRY):
        for family in registry.collect():
            if not family.name.startswith("tidal_"):
                continue
            names.update(family.name + s for s in suffixes.get(family.type, ("",)))
    names.update(operator_metrics.PREFIX + name for name in operator_metrics.HELP)
    return names
