"""The demo's figures on the real node beside the node agent's, measured in the same run.

`make demo`'s story (tidal.sandbox.demo: steady traffic, a 5x surge, a bad rollout rolled back
to the warm baseline) played on a fresh sandbox of each kind, one after the other: the node
agent (pods as local processes of this checkout) and the real node (kubelet, containerd,
kube-proxy, CoreDNS, the runtime-cpu image). Printed: each figure of the demo's summary for both,
and real / agent. The load generator runs on the host in both (through the EndpointSlices to the
pods' addresses), so the difference is the node: container start, kubelet's probes and status
reports, kube-proxy.

Usage:  python bench/realnode_demo.py [--rounds 1]    (root; the real node's needs first:
`make node-binaries images`)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from tidal.sandbox.demo import demo_scenario

FIGURES = (
    ("surge_to_decision_s", "surge -> scale-up decided (s)"),
    ("surge_to_warm_capacity_s", "surge -> warm capacity (s)"),
    ("breach_onset_to_flip_s", "breach onset -> flip (s)"),
    ("window_end_to_flip_s", "SLO window end -> flip (s, operator's record)"),
    ("bad_rollout_to_flip_s", "bad rollout applied -> flip (s)"),
    ("p99_before_surge_ms", "P99 before the surge (ms)"),
    ("p99_during_surge_ms", "P99 during the surge (ms)"),
    ("failed_requests", "failed requests"),
    ("requests", "requests sent"),
)


def run(real_node: bool, rounds: int) -> list[dict[str, Any]]:
    out = []
    for i in range(rounds):
        with tempfile.TemporaryDirectory(prefix="demo-bench-") as tmp:
            quiet = Console(file=open(Path(tmp) / "console.txt", "w"), width=120)  # noqa: SIM115
            summary = demo_scenario(out_dir=Path(tmp), console=quiet, real_node=real_node)
            quiet.file.close()
        kind = "real node" if real_node else "node agent"
        print(f"{kind} round {i + 1}: {json.dumps(summary)}", flush=True)
        out.append(summary)
    return out


def median(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return statistics.median(known) if known else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=1)
    args = p.parse_args(argv)
    agent = run(False, args.rounds)
    real = run(True, args.rounds)
    print(f"\nthe demo on each node kind, median of {args.rounds} round(s) each, same run")
    print(f"{'figure':48} {'node agent':>11} {'real node':>11} {'real/agent':>11}")
    for key, label in FIGURES:
        a = median([s.get(key) for s in agent])
        r = median([s.get(key) for s in real])
        ratio = f"{r / a:.2f}x" if a and r is not None else "-"
        fa = "-" if a is None else f"{a:.3f}" if a < 100 else f"{a:.0f}"
        fr = "-" if r is None else f"{r:.3f}" if r < 100 else f"{r:.0f}"
        print(f"{label:48} {fa:>11} {fr:>11} {ratio:>11}")
    ok = all(s["rolled_back"] and s["failed_requests"] == 0 for s in agent + real)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
