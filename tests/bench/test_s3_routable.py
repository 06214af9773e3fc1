"""bench/s3_routable.py: its sizes, its reading of /metrics and its table, on given inputs (the
bench itself starts versitygw and the runtime; see bench/RESULTS.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import s3_routable as bench

METRICS = """\
# HELP tidal_engine_load_seconds Duration of each engine load phase: fetch, deserialize, warmup.
# TYPE tidal_engine_load_seconds histogram
tidal_engine_load_seconds_bucket{le="+Inf",model="mlp",phase="fetch"} 1.0
tidal_engine_load_seconds_count{model="mlp",phase="fetch"} 1.0
tidal_engine_load_seconds_sum{model="mlp",phase="fetch"} 0.75
tidal_engine_load_seconds_sum{model="mlp",phase="deserialize"} 1.5
tidal_engine_load_seconds_sum{model="mlp",phase="warmup"} 0.25
tidal_engine_load_seconds_sum{model="other",phase="fetch"} 9.0
# HELP tidal_startup_seconds Seconds from process start until /v2/health/ready turned true.
# TYPE tidal_startup_seconds gauge
tidal_startup_seconds 2.5
"""


def test_sizes_are_positive_mib_separated_by_commas() -> None:
    assert bench.parse_sizes("16,384") == [16, 384]
    with pytest.raises(argparse.ArgumentTypeError):
        bench.parse_sizes("16,0")


def test_load_phases_are_the_models_histogram_sums_and_the_startup_gauge() -> None:
    assert bench.load_phases(METRICS) == {
        "fetch": 0.75,
        "deserialize": 1.5,
        "warmup": 0.25,
        "startup": 2.5,
    }


def test_table_pairs_each_rounds_cold_start_with_its_warm_start() -> None:
    starts = [
        bench.Start("cold", {"fetch": 2.0, "ready": 4.0}),
        bench.Start("warm", {"fetch": 0.5, "ready": 2.0}),
        bench.Start("cold", {"fetch": 3.0, "ready": 6.0}),
        bench.Start("warm", {"fetch": 1.0, "ready": 2.0}),
    ]
    lines = bench.format_table("title", starts)
    fetch = next(line for line in lines if "fetch (metrics)" in line)
    assert "2.500 (2.000-3.000)" in fetch and "0.750 (0.500-1.000)" in fetch
    assert "3.50 (3.00-4.00)" in fetch  # ratios 4.0 and 3.0
    ready = next(line for line in lines if "ready (wall)" in line)
    assert "2.50 (2.00-3.00)" in ready
    warmup = next(line for line in lines if "warmup (metrics)" in line)
    assert warmup.split()[-3:] == ["-", "-", "-"]
