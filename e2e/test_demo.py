"""`make demo` as a test: the whole story on its own sandbox, with what it measures asserted."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidal.sandbox.demo import SLO_FOR_SECONDS, demo_scenario

pytestmark = [pytest.mark.sandbox, pytest.mark.slow, pytest.mark.timeout(420)]


def test_demo_scales_on_the_surge_and_rolls_back_the_bad_primary(tmp_path: Path) -> None:
    summary = demo_scenario(out_dir=tmp_path)
    print("\ndemo summary:", summary)
    assert summary["failed_requests"] == 0
    assert summary["surge_to_decision_s"] is not None
    assert summary["surge_to_decision_s"] <= 3.0
    assert summary["surge_to_warm_capacity_s"] is not None
    assert summary["rolled_back"]
    assert summary["breach_onset_to_flip_s"] is not None
    assert summary["breach_onset_to_flip_s"] <= SLO_FOR_SECONDS + 10
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert "RolledBack" in (tmp_path / "demo-events.log").read_text()
