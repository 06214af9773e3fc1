"""The control loop's schedule: a quiet service is ticked on a slow timer and at once when
poked (a watch event of it or its children); a busy one every tick. Real asyncio, short
periods, bounds loose enough for a loaded machine."""

from __future__ import annotations

import asyncio

from tidal.operator.shell.controller import Controller, ControllerSettings, ServiceState
from tidal.operator.shell.reconciler import Key, Store
from tidal.sandbox.wait import wait_for

KEY: Key = ("ns", "svc")


class NoCollector:
    def forget(self, key: object) -> None:
        return None


class Recording(Controller):
    """The real loop (`_run`) around a tick that only records when it ran; `quiet` says what
    the tick finds."""

    def __init__(self, settings: ControllerSettings) -> None:
        store = Store()
        store.services[KEY] = {"metadata": {"namespace": "ns", "name": "svc"}}

        async def enqueue(key: Key) -> None:
            return None

        super().__init__(None, store, enqueue, NoCollector(), settings)  # type: ignore[arg-type]
        self.ticks: list[float] = []
        self.quiet = False

    async def tick(self, key: Key) -> None:
        st = self.states.setdefault(key, ServiceState())
        body = self.store.services.pop(key)
        await super().tick(key)  # clears the wake-up and the quiet flag, finds no body
        self.store.services[key] = body
        self.ticks.append(self.clock.monotonic())
        st.quiet = self.quiet


async def _ticks_during(ctl: Recording, seconds: float) -> int:
    before = len(ctl.ticks)
    await asyncio.sleep(seconds)
    return len(ctl.ticks) - before


async def test_quiet_service_ticks_slowly_and_at_once_when_poked() -> None:
    ctl = Recording(ControllerSettings(tick_seconds=0.05, quiet_tick_seconds=3.0))
    ctl.ensure(KEY)
    try:
        busy = await _ticks_during(ctl, 1.0)
        assert busy >= 5, f"a busy service ticks every 50 ms: {busy} ticks in 1 s"
        ctl.quiet = True
        await asyncio.sleep(0.2)  # the tick that finds it quiet
        quiet = await _ticks_during(ctl, 1.0)
        assert quiet <= 1, f"a quiet service waits for the 3 s timer: {quiet} ticks in 1 s"
        # An event: the next tick comes at once, not at the slow timer.
        n = len(ctl.ticks)
        ctl.poke(KEY)
        await asyncio.to_thread(
            wait_for, lambda: len(ctl.ticks) > n, timeout=2.0, what="a tick after the poke"
        )
        # Busy again (traffic seen): every tick again.
        ctl.quiet = False
        ctl.poke(KEY)
        await asyncio.sleep(0.2)
        again = await _ticks_during(ctl, 1.0)
        assert again >= 5, f"busy again: {again} ticks in 1 s"
    finally:
        await ctl.stop(KEY)


async def test_slow_timer_ticks_a_quiet_service_without_events() -> None:
    ctl = Recording(ControllerSettings(tick_seconds=0.05, quiet_tick_seconds=0.3))
    ctl.quiet = True
    ctl.ensure(KEY)
    try:
        await asyncio.to_thread(
            wait_for, lambda: len(ctl.ticks) >= 4, timeout=10.0, what="four slow ticks"
        )
        gaps = [b - a for a, b in zip(ctl.ticks, ctl.ticks[1:], strict=False)]
        assert min(gaps) >= 0.25, gaps
    finally:
        await ctl.stop(KEY)


class Parked:
    """Stands for an `ActivityWatch` whose every long-poll is parked (or not)."""

    def __init__(self, parked: bool) -> None:
        self.parked, self.done, self.woke, self.urls = parked, False, False, frozenset({"x"})

    def cancel(self) -> None:
        self.done = True


def test_quiet_period_is_long_only_when_every_pod_wakes_the_loop_and_no_timer_runs() -> None:
    settings = ControllerSettings(quiet_tick_seconds=5.0, watched_quiet_tick_seconds=60.0)
    ctl = Recording(settings)
    st = ServiceState()
    assert ctl._quiet_period(st) == 5.0  # no watch
    st.activity = Parked(True)  # type: ignore[assignment]
    assert ctl._quiet_period(st) == 5.0  # minReplicas 0: the idle timer runs
    st.timerless = True
    assert ctl._quiet_period(st) == 60.0
    st.activity = Parked(False)  # type: ignore[assignment]  # a pod not (yet) watched
    assert ctl._quiet_period(st) == 5.0
    # A watched period shorter than the slow timer never shortens it.
    short = Recording(ControllerSettings(quiet_tick_seconds=5.0, watched_quiet_tick_seconds=1.0))
    st.activity = Parked(True)  # type: ignore[assignment]
    assert short._quiet_period(st) == 5.0


def test_a_service_at_zero_ticks_every_tick_once_its_forecast_wake_is_due_before_the_slow_one() -> (
    None
):
    """At zero, a quiet loop would see a forecast wake up to one slow tick late: within the
    wake lead plus that tick of the forecast rise, the loop stops being quiet (`wake_soon`)."""
    from dataclasses import replace

    from isvc_fixtures import minimal

    from tidal.operator.core.api import PoolName, parse_inference_service
    from tidal.operator.core.autoscaler import Observation, ScalerState
    from tidal.operator.core.control import scaling_policy_of, zero_policy_of
    from tidal.operator.core.idle import IdleState, ZeroMemory, learn_demand
    from tidal.operator.core.loop import ScaleTick, ZeroInputs, scale_step
    from tidal.operator.shell.controller import zero_forecast_policy

    forecast = zero_forecast_policy(90.0)  # --forecast-period-seconds 90
    isvc = parse_inference_service(
        minimal(autoscaling={"minReplicas": 0, "scaleToZeroAfterSeconds": 8})
    )
    policy = scaling_policy_of(isvc, 1.0)
    rise = 1_000_080.0
    memory = ZeroMemory()
    for t in range(int(rise) - 90, int(rise) + 80, 5):  # one "day": a rise of 12 s at `rise`
        count = 5.0 if 0 <= t - 5 - rise < 12 else 0.0  # the arrivals of the last 5 s
        memory = learn_demand(forecast, memory, count, t)
    kept = [replace(memory, idle=IdleState(zero_since=0.0))]
    routable_seconds, margin = 2.0, 10.0  # measured time-to-routable; --wake-margin-seconds
    lead = routable_seconds + margin
    next_rise = rise + 90.0

    def at(wall: float) -> tuple[int, bool]:
        observation = Observation(now=wall, ready_serving=0, queue_depth=0.0, arrival_rate=0.0)
        zero = ZeroInputs(
            zero_policy_of(isvc, margin), forecast, kept[0], None, routable_seconds, 5.0
        )
        step = scale_step(
            ScaleTick(
                policy, (PoolName.PRIMARY,), observation, 0, ScalerState(desired_serving=0),
                wall, wall, zero=zero,
            )
        )  # fmt: skip
        assert step.zero is not None
        kept[0] = step.zero
        return step.decision.desired_serving, step.wake_soon

    # Long before: at zero and quiet (the slow tick); within lead + 5 s: at zero, not quiet;
    # within the lead: woken.
    assert at(next_rise - lead - 20.0) == (0, False)
    assert at(next_rise - lead - 3.0) == (0, True)
    assert at(next_rise - lead + 1.0)[0] == 1
