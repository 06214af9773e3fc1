"""The demo's replica panel (pure: frames in, lines out): issue 40 item 5, where a settled
3 serving + 1 standby was drawn as 3 ready of 4 desired, a replica seemingly dropped."""

from __future__ import annotations

import math

from tidal.sandbox.demo import Frame, replica_lines


def _frame(t: float, **primary: int) -> Frame:
    return Frame(
        t=t,
        rps=30.0,
        p99_ms=math.nan,
        failures=0,
        active="primary",
        pools={"primary": dict(primary)},
        queue=None,
        decision="steady",
        rolled_back=False,
    )


def test_a_settled_pool_with_a_standby_is_drawn_at_its_desired_size() -> None:
    # The surge's sequence as the status reported it: 4 serving a moment (the standby
    # promoted, the new pods Ready), then one relabelled standby: still 4 Ready pods.
    frames = [
        _frame(0.0, desired=4, ready=2, standby=0, warming=2),
        _frame(1.0, desired=4, ready=4, standby=0, warming=0),
        _frame(2.0, desired=4, ready=3, standby=1, warming=0),
    ]
    lines = replica_lines(frames, "primary")
    assert lines["desired"] == [4, 4, 4], lines
    assert lines["warm"] == [2, 4, 4], f"a standby pod is Ready and counts: {lines}"
    assert lines["serving"] == [2, 4, 3], f"the serving line shows the relabel: {lines}"


def test_a_pool_absent_from_a_frame_is_zero() -> None:
    lines = replica_lines([_frame(0.0, desired=1, ready=1)], "baseline")
    assert lines == {"warm": [0], "serving": [0], "desired": [0]}, lines
