"""The load generator measured against its own schedule (issue 40: measure the instrument first).

Runs ``tidal.sandbox.loadgen.LoadGenerator`` against a local OIP stub server in its own process,
quiet and beside CPU hogs, and prints what it sent against the schedule's integral; beside it,
in the same run, the v0.4 arithmetic (``due += rate(now) x 5 ms`` per pass, an asyncio loop with
no HTTP at all), which sent 75-93 % of its schedule.

    .venv/bin/python bench/loadgen_check.py [--seconds 10] [--hogs 0,2]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "sandbox"))

from test_loadgen import HOG, SERVER

from tidal.sandbox.loadgen import LoadGenerator, Schedule, step_rate

RATE = step_rate(20.0, 120.0, 3.0)


async def v04_loop(seconds: float) -> int:
    """The v0.4 generator's arithmetic alone: a fixed 5 ms step added per pass."""
    sent, due, step, t0 = 0, 0.0, 0.005, time.monotonic()
    now = 0.0
    while now < seconds:
        due += RATE(now) * step
        while due >= 1.0:
            due -= 1.0
            sent += 1
        await asyncio.sleep(max(0.0, (now + step) - (time.monotonic() - t0)))
        now = time.monotonic() - t0
    return sent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--hogs", default="0,2", help="CPU hogs beside the generator, per round")
    args = p.parse_args()
    schedule = Schedule(RATE, max_step=1e-4)
    schedule.advance(args.seconds)
    owed = schedule.total
    print(f"schedule: 20 req/s, 120 req/s from 3 s, {args.seconds:g} s: {owed:.0f} arrivals owed")
    for hogs in (int(h) for h in args.hogs.split(",")):
        procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
        server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            old = asyncio.run(v04_loop(args.seconds))
            gen = LoadGenerator(
                None, "ns", "svc", "m", {"inputs": []}, RATE, endpoints=(f"127.0.0.1:{port}",)
            )
            report = asyncio.run(gen.run(args.seconds))
        finally:
            for proc in (*procs, server):
                proc.kill()
                proc.wait()
        sent = sum(1 for s in report.samples if s.endpoint)
        print(
            f"{hogs} CPU hog(s): generator sent {sent} = {sent / owed:.3f} of the schedule "
            f"({report.dropped} over the in-flight cap, failed {len(report.failures())}); "
            f"v0.4 arithmetic (no HTTP) {old} = {old / owed:.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
