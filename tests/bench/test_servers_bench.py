"""bench/servers_bench.py runs end to end against tidal (``--smoke``: light model, HTTP JSON,
HTTP binary and gRPC, closed and open loop) and summarises what it measured."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "servers_bench.py"


@pytest.mark.skipif(
    not {0, 1} <= os.sched_getaffinity(0) or shutil.which("taskset") is None,
    reason="the bench pins the server (taskset) and the client to CPUs 0 and 1",
)
def test_smoke_run_measures_every_tidal_transport(tmp_path: Path) -> None:
    out = tmp_path / "points.json"
    result = subprocess.run(
        [sys.executable, str(BENCH), "--smoke", "--seconds", "0.3", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    points = json.loads(out.read_text())
    measured = {(p["server"], p["transport"]) for p in points if p["throughput"] > 0}
    assert {("tidal", "http-json"), ("tidal", "http-binary"), ("tidal", "grpc")} <= measured
    assert ("direct", "in-process") in measured
    assert not any(p["errors"] for p in points), points
    assert "batch-1 P50 overhead over direct, grpc" in result.stdout
