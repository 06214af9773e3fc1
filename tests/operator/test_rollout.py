"""Rollout/rollback state machine: scenarios on a simulated cluster, tables, properties."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tidal.operator.core.rollout import (
    Action,
    ActivePool,
    Phase,
    Pool,
    PoolCounts,
    PoolObservation,
    RolloutDecision,
    RolloutObservation,
    RolloutSpec,
    RolloutState,
    Traffic,
    plan_rollout,
    step_shares,
)
from tidal.operator.core.slo import BreachAction, PoolSignals, Signal, SloPolicy

GOOD = PoolSignals(p99_hot_ms=20.0, error_rate=0.0, requests=500)
SLOW = PoolSignals(p99_hot_ms=182.0, error_rate=0.0, requests=500)
NO_DATA = PoolSignals()
SLO = SloPolicy(p99_ms=80, error_rate=0.01, for_seconds=60)


def make_spec(**kw: object) -> RolloutSpec:
    base: dict[str, object] = {"slo": SLO, "primary_hash": "h1", "step_seconds": 30}
    base.update(kw)
    return RolloutSpec.model_validate(base)


@dataclass
class Sim:
    """A tiny cluster: scale-ups become ready `lag` replicas per tick, scale-downs at once,
    and a new primary template replaces the primary's pods (they start unready)."""

    spec: RolloutSpec
    primary_ready: int = 4
    baseline_ready: int = 1
    lag: int = 1
    dt: float = 5.0
    now: float = 0.0
    template: str = "h1"
    state: RolloutState | None = None
    log: list[tuple[float, RolloutObservation, RolloutDecision]] = field(default_factory=list)
    reserves: list[int | None] = field(default_factory=list)  # state.reserve before each tick

    def observe(self, primary: PoolSignals, baseline: PoolSignals, load: int) -> RolloutObservation:
        return RolloutObservation(
            primary=PoolObservation(
                ready_replicas=self.primary_ready, template_hash=self.template, signals=primary
            ),
            baseline=PoolObservation(ready_replicas=self.baseline_ready, signals=baseline),
            autoscaler_desired=load,
        )

    def tick(
        self, primary: PoolSignals = GOOD, baseline: PoolSignals = GOOD, load: int = 4
    ) -> RolloutDecision:
        obs = self.observe(primary, baseline, load)
        self.reserves.append(self.state.reserve if self.state else None)
        decision, self.state = plan_rollout(self.spec, obs, self.state, self.now)
        self.log.append((self.now, obs, decision))
        if decision.applied_primary_hash != self.template:
            self.template, self.primary_ready = decision.applied_primary_hash, 0
        want = decision.desired_replicas
        self.primary_ready = _approach(self.primary_ready, want.primary, self.lag)
        self.baseline_ready = _approach(self.baseline_ready, want.baseline, self.lag)
        self.now += self.dt
        return decision

    def run_for(self, seconds: float, **kw: object) -> list[RolloutDecision]:
        end = self.now + seconds
        out = []
        while self.now < end:
            out.append(self.tick(**kw))  # type: ignore[arg-type]
        return out

    def events(self) -> list[str]:
        return [e.reason for _, _, d in self.log for e in d.events]


def _approach(ready: int, desired: int, lag: int) -> int:
    return desired if desired <= ready else min(desired, ready + lag)


def first(decisions: list[RolloutDecision], action: Action) -> int:
    return next(i for i, d in enumerate(decisions) if d.action is action)


# --- rollback ------------------------------------------------------------------------------


def test_sustained_breach_prepares_baseline_then_flips_and_keeps_a_control_group() -> None:
    sim = Sim(make_spec())
    decisions = sim.run_for(120, primary=SLOW)
    i_prep = first(decisions, Action.PREPARE_BASELINE)
    i_flip = first(decisions, Action.FLIP_TO_BASELINE)
    assert sim.log[i_prep][0] == 60  # the breach began at 0 and lasted `for`
    assert all(d.traffic is Traffic.PRIMARY for d in decisions[:i_flip])
    prep = decisions[i_prep]
    assert prep.desired_replicas == PoolCounts(primary=4, baseline=4)
    assert prep.service_pools == (Pool.PRIMARY,) and prep.phase is Phase.PREPARING
    assert prep.reason.startswith("prepare-baseline: 1/4 ready; rollback: breach:p99 182ms")
    # The flip waits for four ready baseline replicas (one per tick here).
    flip_obs = sim.log[i_flip][1]
    assert flip_obs.baseline.ready_replicas >= 4
    assert all(sim.log[i][1].baseline.ready_replicas < 4 for i in range(i_prep, i_flip))
    flip = decisions[i_flip]
    assert flip.service_pools == (Pool.BASELINE,) and flip.phase is Phase.ROLLED_BACK
    assert flip.rollback is not None
    (breach,) = flip.rollback.breaches
    assert (breach.signal, breach.value, breach.threshold) == (Signal.P99, 182.0, 80.0)
    assert [e.reason for e in flip.events] == ["RolledBack"]
    assert "p99 182ms > 80ms" in flip.events[0].message
    # The primary drains at its size, then shrinks to the control group.
    assert flip.desired_replicas.primary == 4
    later = decisions[-1]
    assert later.desired_replicas == PoolCounts(primary=1, baseline=4)
    assert later.traffic is Traffic.BASELINE and later.action is Action.STEADY
    assert later.primary_slo.breached  # the control group is still judged
    assert sim.events() == ["SloBreach", "RollingBack", "Preparing", "RolledBack"]


def test_baseline_is_sized_for_what_the_primary_serves_or_the_autoscaler_asks() -> None:
    sim = Sim(make_spec(), primary_ready=6, lag=10)
    sim.run_for(60, primary=SLOW, load=6)
    decision = sim.tick(primary=SLOW, load=3)  # the autoscaler wants fewer: 6 still serve
    assert decision.action is Action.PREPARE_BASELINE
    assert decision.desired_replicas.baseline == 6
    sim2 = Sim(make_spec(), primary_ready=2, lag=10)
    assert sim2.run_for(65, primary=SLOW, load=9)[-1].desired_replicas.baseline == 9
    sim3 = Sim(make_spec(max_replicas=5), primary_ready=2, lag=10)
    assert sim3.run_for(65, primary=SLOW, load=9)[-1].desired_replicas.baseline == 5


def test_no_flip_while_the_baseline_cannot_get_ready_and_a_stall_is_reported_once() -> None:
    sim = Sim(make_spec(prepare_timeout_seconds=120), lag=0)
    decisions = sim.run_for(600, primary=SLOW)
    assert all(d.traffic is Traffic.PRIMARY for d in decisions)
    assert sim.events().count("PrepareStalled") == 1
    stalled = next(d for d in decisions if any(e.reason == "PrepareStalled" for e in d.events))
    assert "1/4 ready" in stalled.events[0].message


def test_recovery_during_the_window_does_not_flip() -> None:
    sim = Sim(make_spec())
    sim.run_for(55, primary=SLOW)
    decisions = sim.run_for(10, primary=GOOD) + sim.run_for(55, primary=SLOW)
    assert all(d.traffic is Traffic.PRIMARY for d in decisions)
    assert not any(d.action is Action.PREPARE_BASELINE for d in decisions)


def test_rollback_is_latched_once_decided() -> None:
    sim = Sim(make_spec(), lag=0)
    sim.run_for(65, primary=SLOW)
    sim.lag = 1
    decisions = sim.run_for(60, primary=GOOD)  # the primary recovers while preparing
    assert decisions[-1].traffic is Traffic.BASELINE


def test_control_group_recovering_does_not_move_traffic_back() -> None:
    sim = Sim(make_spec())
    sim.run_for(120, primary=SLOW)
    decisions = sim.run_for(600, primary=GOOD)
    assert all(d.traffic is Traffic.BASELINE for d in decisions)
    assert decisions[-1].reason.startswith("rolled-back: breach:p99 182ms > 80ms")


def test_alert_mode_reports_and_never_moves_traffic() -> None:
    sim = Sim(make_spec(slo=SLO.model_copy(update={"on_breach": BreachAction.ALERT})))
    decisions = sim.run_for(600, primary=SLOW)
    assert all(d.service_pools == (Pool.PRIMARY,) for d in decisions)
    assert sim.events() == ["SloBreach"]
    assert decisions[-1].primary_slo.breached and decisions[-1].rollback is None


def test_missing_data_never_rolls_back() -> None:
    sim = Sim(make_spec())
    few = PoolSignals(p99_hot_ms=900.0, error_rate=0.5, requests=5)
    decisions = sim.run_for(300, primary=NO_DATA) + sim.run_for(300, primary=few)
    assert all(d.traffic is Traffic.PRIMARY for d in decisions)
    assert "no data" in decisions[-1].primary_slo.reason


# --- manual switch -------------------------------------------------------------------------


def test_manual_baseline_wins_over_a_healthy_primary_and_still_prepares_first() -> None:
    sim = Sim(make_spec(active_pool=ActivePool.BASELINE))
    sim.state = plan_rollout(make_spec(), sim.observe(GOOD, GOOD, 4), None, -5)[1]
    decisions = sim.run_for(60)
    assert decisions[0].action is Action.PREPARE_BASELINE
    assert decisions[-1].traffic is Traffic.BASELINE and decisions[-1].phase is Phase.PINNED
    assert decisions[-1].reason.startswith("pinned:baseline")


def test_manual_primary_moves_back_after_a_rollback_and_auto_guards_again() -> None:
    sim = Sim(make_spec())
    sim.run_for(120, primary=SLOW)
    assert sim.state is not None and sim.state.traffic is Traffic.BASELINE
    sim.spec = make_spec(active_pool=ActivePool.PRIMARY)
    decisions = sim.run_for(60, primary=SLOW)
    assert decisions[0].action is Action.PREPARE_PRIMARY  # control group is 1, load is 4
    assert decisions[-1].traffic is Traffic.PRIMARY and decisions[-1].phase is Phase.PINNED
    assert sim.state.rollback is None
    # Back on auto with a primary that is still slow: it rolls back again at once.
    sim.spec = make_spec()
    decisions = sim.run_for(60, primary=SLOW)
    assert decisions[0].action is Action.PREPARE_BASELINE
    assert decisions[-1].traffic is Traffic.BASELINE
    # Back on auto after the fix was confirmed by hand: stays on the primary.
    sim.spec = make_spec(active_pool=ActivePool.PRIMARY)
    sim.run_for(60, primary=GOOD)
    sim.spec = make_spec()
    assert all(d.traffic is Traffic.PRIMARY for d in sim.run_for(300, primary=GOOD))


def test_auto_after_a_baseline_pin_returns_to_the_promoted_primary() -> None:
    sim = Sim(make_spec(active_pool=ActivePool.BASELINE))
    sim.run_for(60)
    sim.spec = make_spec()
    decisions = sim.run_for(60)
    assert [d.action for d in decisions[:2]] == [Action.PREPARE_PRIMARY, Action.PREPARE_PRIMARY]
    assert decisions[-1].traffic is Traffic.PRIMARY and decisions[-1].phase is Phase.STABLE


def test_manual_primary_applies_a_new_template_directly() -> None:
    sim = Sim(make_spec(active_pool=ActivePool.PRIMARY))
    sim.run_for(10)
    sim.spec = make_spec(active_pool=ActivePool.PRIMARY, primary_hash="h2")
    d = sim.tick()
    assert d.applied_primary_hash == "h2" and not d.hold_primary_template
    assert d.traffic is Traffic.PRIMARY


# --- staged rollout ------------------------------------------------------------------------


def test_new_spec_moves_traffic_off_the_old_primary_then_steps_to_promotion() -> None:
    sim = Sim(make_spec())
    sim.run_for(20)
    sim.spec = make_spec(primary_hash="h2")
    decisions = sim.run_for(400)
    actions = [d.action for d in decisions]
    # 1. hold the new template, scale the baseline, switch, drain, then release it
    assert decisions[0].hold_primary_template and decisions[0].applied_primary_hash == "h1"
    assert actions[0] is Action.PREPARE_BASELINE
    i_flip = actions.index(Action.FLIP_TO_BASELINE)
    assert all(d.hold_primary_template for d in decisions[: i_flip + 1])
    i_release = next(i for i, d in enumerate(decisions) if d.applied_primary_hash == "h2")
    assert sim.log[i_release][0] - sim.log[i_flip][0] >= 10  # drainSeconds
    assert Action.DRAIN in actions[i_flip:i_release]
    # 2. warm beside the baseline with no traffic, 3. steps, 4. promotion
    assert decisions[i_release].action is Action.WARM_PRIMARY
    assert decisions[i_release].service_pools == (Pool.BASELINE,)
    steps = [(d.step_percent, d.serving_replicas) for d in decisions if d.step is not None]
    percents = [p for p, _ in steps if p is not None]
    assert percents == sorted(percents) and set(percents) == {25, 50, 100}
    shares = {p: s for p, s in steps}
    assert shares[25] == PoolCounts(primary=1, baseline=3)
    assert shares[50] == PoolCounts(primary=2, baseline=2)
    assert shares[100] == PoolCounts(primary=4, baseline=0)
    split = next(d for d in decisions if d.traffic is Traffic.SPLIT)
    assert split.service_pools == (Pool.PRIMARY, Pool.BASELINE)
    assert split.primary_traffic_percent == 25.0 and split.phase is Phase.PROGRESSING
    assert decisions[-1].phase is Phase.STABLE and decisions[-1].traffic is Traffic.PRIMARY
    assert decisions[-1].desired_replicas == PoolCounts(primary=4, baseline=1)
    events = sim.events()
    assert events == [
        "Preparing",
        "RolloutStarted",
        "RolloutStep",
        "RolloutStep",
        "Preparing",
        "RolloutStep",
        "Promoted",
    ]


def test_each_step_lasts_step_seconds_from_when_its_replicas_are_ready() -> None:
    sim = Sim(make_spec(), state=None)
    sim.run_for(200, primary=SLOW)  # rolled back
    sim.spec = make_spec(primary_hash="h2", step_seconds=60)
    decisions = sim.run_for(600)
    times = [t for t, _, d in sim.log[-len(decisions) :] if d.action is Action.ADVANCE_STEP]
    assert len(times) == 2 and times[1] - times[0] >= 60


def test_breach_during_a_step_aborts_back_to_the_baseline() -> None:
    sim = Sim(make_spec())
    sim.run_for(20)
    sim.spec = make_spec(primary_hash="h2")
    while not (sim.state and sim.state.step == 1):
        sim.tick()
    start = sim.now
    decisions = sim.run_for(200, primary=SLOW)
    # Rule 6e: the baseline kept its reserve warm, so the abort flips on the tick the breach
    # has lasted `for` -- nothing to prepare.
    assert not any(d.action is Action.PREPARE_BASELINE for d in decisions)
    i_flip = first(decisions, Action.FLIP_TO_BASELINE)
    assert sim.log[-len(decisions) + i_flip][0] == start + SLO.for_seconds
    assert sim.log[-len(decisions) + i_flip][1].baseline.ready_replicas >= 4
    assert decisions[-1].traffic is Traffic.BASELINE and decisions[-1].phase is Phase.ROLLED_BACK
    assert decisions[-1].rollback is not None and decisions[-1].rollback.during_rollout
    assert "RolloutAborted" in sim.events() and "Promoted" not in sim.events()
    # Staying rolled back for this spec; a newer spec starts a fresh rollout.
    assert all(d.traffic is Traffic.BASELINE for d in sim.run_for(300))
    sim.spec = make_spec(primary_hash="h3")
    decisions = sim.run_for(400)
    assert decisions[-1].phase is Phase.STABLE and decisions[-1].applied_primary_hash == "h3"


def to_first_step(sim: Sim, load: int = 4) -> None:
    """Roll a new primary template out until its first step serves traffic (split)."""
    sim.run_for(20, load=load)
    sim.spec = sim.spec.model_copy(update={"primary_hash": "h2"})
    while not (sim.state and sim.state.traffic is Traffic.SPLIT):
        sim.tick(load=load)


def test_an_unproven_rollout_keeps_the_baseline_able_to_carry_the_load_as_standby() -> None:
    sim = Sim(make_spec(steps=(50, 100)))
    to_first_step(sim)
    assert sim.state is not None and sim.state.reserve == 4
    decision = sim.run_for(10)[-1]
    # Half the serving replicas on each side, as the step says; two more baseline replicas
    # stay ready out of the Service, so all four can take the traffic back at once.
    assert decision.serving_replicas == PoolCounts(primary=2, baseline=2)
    assert decision.desired_replicas == PoolCounts(primary=2, baseline=4)
    assert decision.baseline_standby == 2 and decision.primary_traffic_percent == 50.0
    # A real rise in load during the step grows the reserve with it.
    assert sim.tick(load=6).desired_replicas.baseline == 6
    # The 100 % step: the baseline serves nothing and still holds the load.
    rest = sim.run_for(300)
    hundred = next(d for d in rest if d.traffic is Traffic.PRIMARY)
    assert hundred.desired_replicas.baseline == 4 and hundred.baseline_standby == 0
    # Promoted: the reserve is given back (the baseline's minReplicas).
    assert any(d.action is Action.PROMOTE for d in rest)
    assert rest[-1].desired_replicas.baseline == 1 and sim.state.reserve is None


@pytest.mark.parametrize(
    ("before", "during", "ready_at_flip"),
    [
        (4, 4, 4),  # the load as it was: the reserve carries it
        (4, 9, 4),  # the breaching primary's queue asks for 9: no wait for them
        (4, 2, 2),  # the load fell: fewer are enough
        (1, 1, 1),  # a one-replica service (baseline minReplicas 1)
    ],
)
def test_an_abort_flips_when_its_window_ends_on_the_reserve(
    before: int, during: int, ready_at_flip: int
) -> None:
    sim = Sim(make_spec(steps=(50, 100)), primary_ready=before)
    to_first_step(sim, load=before)
    sim.run_for(5, load=before)
    start = sim.now
    decisions = sim.run_for(120, primary=SLOW, load=during)
    i_flip = first(decisions, Action.FLIP_TO_BASELINE)
    at, obs, flip = sim.log[-len(decisions) + i_flip]
    assert at == start + SLO.for_seconds, [d.reason for d in decisions[: i_flip + 1]]
    assert obs.baseline.ready_replicas >= ready_at_flip
    assert flip.phase is Phase.ROLLED_BACK and "RolledBack" in [e.reason for e in flip.events]
    assert sim.state is not None and sim.state.reserve is None
    # After the flip the baseline follows the autoscaler again (it may ask for more).
    assert decisions[-1].desired_replicas.baseline == max(during, 1)


def test_a_pending_breach_says_when_its_verdict_is_due() -> None:
    # The shell ticks again at that moment: the flip then waits for no period (rule 6e).
    sim = Sim(make_spec(), dt=1.0)
    assert sim.tick().verdict_due_at is None
    since = sim.now
    pending = sim.tick(primary=SLOW)
    assert pending.verdict_due_at == since + SLO.for_seconds
    assert sim.tick(primary=SLOW).verdict_due_at == since + SLO.for_seconds  # the same window
    assert sim.tick(primary=GOOD).verdict_due_at is None  # recovered: nothing due


def test_a_pinned_primary_gives_the_reserve_up() -> None:
    sim = Sim(make_spec(steps=(50, 100)))
    to_first_step(sim)
    sim.spec = sim.spec.model_copy(update={"active_pool": ActivePool.PRIMARY})
    sim.run_for(60)
    assert sim.state is not None and sim.state.reserve is None
    assert sim.state.promoted_hash == "h2"
    # Back on auto, a regression of the accepted template is a plain rollback: the baseline is
    # scaled to the whole load first (rule 1), no reserve shortcut.
    sim.spec = sim.spec.model_copy(update={"active_pool": ActivePool.AUTO})
    decisions = sim.run_for(120, primary=SLOW, load=6)
    assert any(d.action is Action.PREPARE_BASELINE for d in decisions)
    i_flip = first(decisions, Action.FLIP_TO_BASELINE)
    assert sim.log[-len(decisions) + i_flip][1].baseline.ready_replicas >= 6


def test_pending_breach_or_missing_samples_hold_a_step() -> None:
    sim = Sim(make_spec())
    sim.run_for(200, primary=SLOW)
    sim.spec = make_spec(primary_hash="h2")
    held = sim.run_for(300, primary=NO_DATA)
    assert max(d.step or 0 for d in held) == 0 and held[-1].traffic is Traffic.SPLIT
    assert "waiting for samples" in held[-1].reason
    # The same with advanceWithoutSamples moves on.
    sim.spec = make_spec(primary_hash="h2", advance_without_samples=True)
    assert sim.run_for(400, primary=NO_DATA)[-1].phase is Phase.STABLE


def test_alert_mode_holds_a_breaching_step_instead_of_aborting() -> None:
    alert = SLO.model_copy(update={"on_breach": BreachAction.ALERT})
    sim = Sim(make_spec(slo=alert, active_pool=ActivePool.BASELINE))
    sim.run_for(60)
    sim.spec = make_spec(slo=alert, primary_hash="h2")
    while not (sim.state and sim.state.traffic is Traffic.SPLIT):
        sim.tick()
    decisions = sim.run_for(600, primary=SLOW)
    assert all(d.traffic is Traffic.SPLIT and d.step == 0 for d in decisions)
    assert "SloBreach" in sim.events() and "RolloutAborted" not in sim.events()


def test_reverting_the_spec_mid_rollout_returns_to_the_promoted_template() -> None:
    sim = Sim(make_spec())
    sim.run_for(20)
    sim.spec = make_spec(primary_hash="h2")
    while not (sim.state and sim.state.traffic is Traffic.SPLIT):
        sim.tick()
    sim.spec = make_spec()
    decisions = sim.run_for(300)
    assert decisions[0].hold_primary_template  # h2 pods serve: leave them first
    assert decisions[-1].phase is Phase.STABLE and decisions[-1].applied_primary_hash == "h1"
    assert "Promoted" not in sim.events()


def test_a_primary_count_of_another_template_is_not_ready() -> None:
    spec = make_spec(primary_hash="h2")
    state = RolloutState(traffic=Traffic.BASELINE, applied_hash="h2", promoted_hash="h1")
    obs = RolloutObservation(
        primary=PoolObservation(ready_replicas=4, template_hash="h1", signals=GOOD),
        baseline=PoolObservation(ready_replicas=4, signals=GOOD),
        autoscaler_desired=4,
    )
    decision, _ = plan_rollout(spec, obs, state, 100)
    assert decision.action is Action.WARM_PRIMARY and "0/1 ready" in decision.reason


@pytest.mark.parametrize(
    ("total", "percent", "primary", "baseline"),
    [
        (1, 25, 1, 1),
        (1, 50, 1, 1),
        (4, 25, 1, 3),
        (4, 50, 2, 2),
        (10, 25, 3, 7),
        (10, 75, 8, 2),
        (2, 75, 2, 1),
        (0, 25, 1, 1),
        (7, 100, 7, 0),
    ],
)
def test_step_shares(total: int, percent: int, primary: int, baseline: int) -> None:
    assert step_shares(total, percent) == PoolCounts(primary=primary, baseline=baseline)


@pytest.mark.parametrize("steps", [[], [25, 50], [50, 25, 100], [0, 100], [25, 25, 100]])
def test_steps_must_increase_to_100(steps: list[int]) -> None:
    with pytest.raises(ValidationError):
        make_spec(steps=steps)


def test_state_survives_a_json_round_trip() -> None:
    a, b = Sim(make_spec()), Sim(make_spec())
    for i in range(60):
        signals = SLOW if i < 30 else GOOD
        if i == 40:
            a.spec = b.spec = make_spec(primary_hash="h2")
        da = a.tick(primary=signals)
        if b.state is not None:
            b.state = RolloutState.model_validate_json(b.state.model_dump_json(by_alias=True))
        db = b.tick(primary=signals)
        assert da == db


# --- properties ----------------------------------------------------------------------------

SIGNALS = st.sampled_from([GOOD, SLOW, NO_DATA])


@st.composite
def traces(draw: st.DrawFn) -> list[tuple[PoolSignals, int]]:
    """Runs of primary signals with loads, as (signals, load) per tick."""
    runs = draw(st.lists(st.tuples(SIGNALS, st.integers(1, 30)), min_size=1, max_size=8))
    loads = st.integers(1, 6)
    return [(s, draw(loads)) for s, length in runs for _ in range(length)]


def _switches(decisions: list[RolloutDecision]) -> list[Traffic]:
    seen = [decisions[0].traffic]
    for d in decisions[1:]:
        if d.traffic is not seen[-1]:
            seen.append(d.traffic)
    return seen


def _check_flips(sim: Sim) -> None:
    """Never switch to a pool alone unless it has the load's replicas ready (back to the
    baseline during an unproven rollout: the load's, or the reserve kept for it, rule 6e)."""
    for (_, _, before), (_, obs, after), reserve in zip(
        sim.log, sim.log[1:], sim.reserves[1:], strict=False
    ):
        if after.traffic is before.traffic or after.traffic is Traffic.SPLIT:
            continue
        pool = Pool(after.traffic.value)
        ready = obs.pool(pool).ready_replicas
        need = max(obs.autoscaler_desired, 1)
        if pool is Pool.BASELINE and reserve is not None:
            assert ready >= max(min(need, reserve), 1)
            continue
        assert ready >= need
        if before.traffic is not Traffic.SPLIT:
            assert ready >= obs.pool(Pool(before.traffic.value)).ready_replicas


@settings(max_examples=150, deadline=None)
@given(traces(), st.integers(0, 3))
def test_auto_rollback_never_early_never_cold_never_back(
    trace: list[tuple[PoolSignals, int]], lag: int
) -> None:
    sim = Sim(make_spec(), lag=lag)
    decisions = [sim.tick(primary=s, load=n) for s, n in trace]
    assert _switches(decisions) in ([Traffic.PRIMARY], [Traffic.PRIMARY, Traffic.BASELINE])
    _check_flips(sim)
    # The rollback is decided only after `for` seconds of slowness without a good sample.
    for i, (now, _, d) in enumerate(sim.log):
        if any(e.reason == "RollingBack" for e in d.events):
            window = [s for s, _ in trace[: i + 1]][-13:]  # 60 s at 5 s per tick
            # Gaps (no data) neither break nor make a breach; a good observation resets it.
            assert now >= 60 and window[-1] is SLOW and GOOD not in window


@settings(max_examples=100, deadline=None)
@given(traces(), st.sampled_from([ActivePool.PRIMARY, ActivePool.BASELINE]))
def test_manual_pin_wins_and_holds(trace: list[tuple[PoolSignals, int]], pin: ActivePool) -> None:
    sim = Sim(make_spec())
    sim.run_for(30)
    sim.spec = make_spec(active_pool=pin)
    decisions = [sim.tick(primary=s, load=n) for s, n in trace]
    decisions += sim.run_for(60)  # with replicas arriving, the pin takes effect
    target = Traffic(pin.value)
    assert decisions[-1].traffic is target
    reached = next(i for i, d in enumerate(decisions) if d.traffic is target)
    assert all(d.traffic is target for d in decisions[reached:])
    _check_flips(sim)


@settings(max_examples=100, deadline=None)
@given(traces())
def test_alert_mode_never_changes_traffic(trace: list[tuple[PoolSignals, int]]) -> None:
    sim = Sim(make_spec(slo=SLO.model_copy(update={"on_breach": BreachAction.ALERT})))
    for s, n in trace:
        assert sim.tick(primary=s, load=n).service_pools == (Pool.PRIMARY,)


@settings(max_examples=150, deadline=None)
@given(traces(), st.integers(0, 3), st.sampled_from([(25, 50, 100), (100,), (10, 100)]))
def test_staged_rollout_moves_forward_unless_aborted(
    trace: list[tuple[PoolSignals, int]], lag: int, steps: tuple[int, ...]
) -> None:
    sim = Sim(make_spec(steps=steps), lag=lag)
    sim.run_for(10)
    sim.spec = make_spec(primary_hash="h2", steps=steps)
    decisions = [sim.tick(primary=s, load=n) for s, n in trace]
    if steps[0] < 100:
        expected = [Traffic.PRIMARY, Traffic.BASELINE, Traffic.SPLIT, Traffic.PRIMARY]
    else:
        expected = [Traffic.PRIMARY, Traffic.BASELINE, Traffic.PRIMARY]

    def has(d: RolloutDecision, reason: str) -> bool:
        return any(e.reason == reason for e in d.events)

    # The rollout ends in an abort, or in a promotion that a later regression may roll back.
    promoted = [i for i, d in enumerate(decisions) if has(d, "Promoted")]
    aborts = [
        i
        for i, d in enumerate(decisions)
        if has(d, "RolloutAborted") or (promoted and i > promoted[0] and has(d, "RollingBack"))
    ]
    end = aborts[0] if aborts else len(decisions)
    before = _switches(decisions[:end])
    assert before == expected[: len(before)]
    progress = [d.step for d in decisions[:end] if d.step is not None]
    assert progress == sorted(progress)
    if aborts:
        assert len(aborts) == 1
        after = _switches(decisions[aborts[0] :])
        assert after[1:] in ([], [Traffic.BASELINE])
        assert all(d.step is None for d in decisions[end:] if d.traffic is Traffic.BASELINE)
    _check_flips(sim)


@settings(max_examples=100, deadline=None)
@given(traces(), st.integers(0, 3))
def test_replanning_with_the_returned_state_repeats_no_event(
    trace: list[tuple[PoolSignals, int]], lag: int
) -> None:
    sim = Sim(make_spec(), lag=lag)
    for i, (s, n) in enumerate(trace):
        if i == len(trace) // 2:
            sim.spec = make_spec(primary_hash="h2")
        obs = sim.observe(s, GOOD, n)
        first_decision, state = plan_rollout(sim.spec, obs, sim.state, sim.now)
        again, _ = plan_rollout(sim.spec, obs, state, sim.now)
        assert not set(again.events) & set(first_decision.events)
        assert again.desired_replicas.primary >= 0 and again.service_pools
        sim.tick(primary=s, load=n)


# --- more edges ----------------------------------------------------------------------------


def test_a_warm_enough_baseline_takes_traffic_in_the_reconcile_that_sees_the_breach() -> None:
    sim = Sim(make_spec(baseline_min_replicas=4), baseline_ready=4)
    decisions = sim.run_for(65, primary=SLOW)
    flip = decisions[-1]
    assert sim.log[-1][0] == 60 and flip.action is Action.FLIP_TO_BASELINE
    assert [e.reason for e in flip.events] == ["SloBreach", "RollingBack", "RolledBack"]


def test_gpu_memory_breach_while_warming_aborts_before_any_traffic() -> None:
    slo = SLO.model_copy(update={"gpu_memory_headroom": 0.1})
    full = GOOD.model_copy(update={"gpu_memory_used_bytes": 99, "gpu_memory_total_bytes": 100})
    sim = Sim(make_spec(slo=slo))
    sim.run_for(120, primary=SLOW)  # rolled back
    sim.spec = make_spec(slo=slo, primary_hash="h2")
    decisions = sim.run_for(300, primary=full)
    assert all(d.service_pools == (Pool.BASELINE,) for d in decisions)
    assert "RolloutAborted" in sim.events()
    assert decisions[-1].phase is Phase.ROLLED_BACK
    assert decisions[-1].rollback is not None
    assert decisions[-1].rollback.breaches[0].signal is Signal.GPU_MEMORY_HEADROOM


def test_a_newer_spec_mid_rollout_starts_over_from_the_baseline() -> None:
    sim = Sim(make_spec())
    sim.run_for(20)
    sim.spec = make_spec(primary_hash="h2")
    while not (sim.state and sim.state.step == 1):
        sim.tick()
    sim.spec = make_spec(primary_hash="h3")
    decisions = sim.run_for(400)
    assert decisions[0].hold_primary_template and decisions[0].applied_primary_hash == "h2"
    # The baseline held its reserve through the unproven rollout: it takes the traffic back on
    # the first tick, without being scaled up first (rule 6e).
    assert decisions[0].action is Action.FLIP_TO_BASELINE
    traffic = _switches(decisions)
    assert traffic == [Traffic.BASELINE, Traffic.SPLIT, Traffic.PRIMARY]
    assert decisions[-1].phase is Phase.STABLE and decisions[-1].applied_primary_hash == "h3"


def test_decision_dumps_to_json_for_status() -> None:
    sim = Sim(make_spec())
    decision = sim.run_for(90, primary=SLOW)[-1]
    doc = decision.model_dump(by_alias=True, mode="json")
    assert doc["servicePools"] == ["baseline"] and doc["phase"] == "RolledBack"
    assert doc["rollback"]["breaches"][0]["signal"] == "p99"
    assert doc["primarySlo"]["readings"][0]["value"] == 182.0
    assert RolloutDecision.model_validate(doc) == decision


def test_first_sight_accepts_the_template_without_a_staged_rollout() -> None:
    obs = RolloutObservation(autoscaler_desired=3)
    decision, state = plan_rollout(make_spec(), obs, None, 0)
    assert decision.traffic is Traffic.PRIMARY and decision.phase is Phase.STABLE
    assert decision.desired_replicas == PoolCounts(primary=3, baseline=1)
    assert state.promoted_hash == "h1" and not decision.events


# --- overflow: the baseline shares a surge while the primary warms (rule 8) ------------------


def overflow_sim(**kw: object) -> Sim:
    """A primary of 4 serving at load 4, two warm baseline replicas, one replica a second."""
    spec = make_spec(overflow=True, drain_seconds=10, baseline_min_replicas=2, **kw)
    sim = Sim(spec, primary_ready=4, baseline_ready=2, dt=1.0)
    sim.run_for(5)
    return sim


def test_a_surge_is_shared_with_the_warm_baseline_until_the_primary_is_ready() -> None:
    sim = overflow_sim()
    decisions = sim.run_for(20, load=8)
    onset = decisions[0]
    assert onset.action is Action.OVERFLOW and onset.phase is Phase.OVERFLOW
    assert onset.service_pools == (Pool.PRIMARY, Pool.BASELINE)
    assert onset.desired_replicas == PoolCounts(primary=8, baseline=2)
    assert onset.primary_traffic_percent == pytest.approx(100 * 4 / 6)
    assert [e.reason for e in onset.events] == ["Overflow"]
    assert "primary short of 4 replicas (4/8 ready)" in onset.events[0].message
    end = next(i for i, d in enumerate(decisions) if d.traffic is Traffic.PRIMARY)
    # The primary grows one replica a tick: 4 ticks to 8 ready, then it serves alone again.
    assert end == 4 and sim.log[-20 + end][1].primary.ready_replicas == 8
    assert [e.reason for e in decisions[end].events] == ["OverflowEnded"]
    assert decisions[end].phase is Phase.STABLE
    # The baseline drains (keeps its replicas) for drainSeconds, then returns to its minimum.
    assert all(d.desired_replicas.baseline == 2 for d in decisions)
    assert _switches(decisions) == [Traffic.OVERFLOW, Traffic.PRIMARY]


def test_without_overflow_a_surge_stays_on_the_primary() -> None:
    sim = Sim(make_spec(drain_seconds=10), primary_ready=4, baseline_ready=2, dt=1.0)
    decisions = sim.run_for(20, load=8)
    assert all(d.traffic is Traffic.PRIMARY for d in decisions)


@pytest.mark.parametrize(
    ("baseline_signals", "baseline_ready"),
    [(SLOW, 2), (GOOD, 0)],
    ids=["baseline-over-its-objective", "no-ready-baseline"],
)
def test_no_overflow_to_a_baseline_that_breaches_or_has_nothing_ready(
    baseline_signals: PoolSignals, baseline_ready: int
) -> None:
    sim = Sim(
        make_spec(overflow=True, baseline_min_replicas=baseline_ready),
        primary_ready=4,
        baseline_ready=baseline_ready,
        dt=1.0,
    )
    decisions = sim.run_for(20, load=8, baseline=baseline_signals)
    assert all(d.traffic is Traffic.PRIMARY for d in decisions)


def test_a_baseline_that_starts_to_breach_ends_the_overflow_at_once() -> None:
    sim = overflow_sim()
    sim.lag = 0  # the primary's new replicas never get ready
    sim.run_for(3, load=8)
    assert sim.state is not None and sim.state.traffic is Traffic.OVERFLOW
    ended = sim.tick(load=8, baseline=SLOW)
    assert ended.traffic is Traffic.PRIMARY and ended.action is Action.FLIP_TO_PRIMARY
    assert "baseline pending:p99" in ended.reason and ended.events[-1].reason == "OverflowEnded"


def test_no_overflow_again_within_drain_seconds_of_the_last_switch() -> None:
    sim = overflow_sim()
    sim.run_for(6, load=8)  # overflow, then the primary serves alone at 8
    assert sim.state is not None and sim.state.traffic is Traffic.PRIMARY
    sim.lag = 0  # the next surge's replicas stay unready: the primary is short throughout
    again = sim.run_for(15, load=12)
    entered = next(i for i, d in enumerate(again) if d.traffic is Traffic.OVERFLOW)
    assert entered > 0  # the primary was short at once, and still had to wait
    ended_at = next(t for t, _, d in sim.log if any(e.reason == "OverflowEnded" for e in d.events))
    assert sim.log[-15 + entered][0] - ended_at == 10


@pytest.mark.parametrize("change", ["rollout", "pinned-primary", "rolled-back"])
def test_no_overflow_during_a_rollout_a_rollback_or_a_pin(change: str) -> None:
    sim = overflow_sim()
    if change == "rollout":
        sim.spec = make_spec(overflow=True, primary_hash="h2", baseline_min_replicas=2)
    elif change == "pinned-primary":
        sim.spec = make_spec(overflow=True, active_pool=ActivePool.PRIMARY)
    else:
        sim.run_for(70, primary=SLOW)  # rolled back: the baseline serves alone
    decisions = sim.run_for(30, load=8)
    assert Traffic.OVERFLOW not in {d.traffic for d in decisions}


def test_a_breach_of_the_primary_during_an_overflow_still_rolls_back() -> None:
    sim = overflow_sim()
    sim.lag = 0
    decisions = sim.run_for(90, load=8, primary=SLOW)
    assert decisions[0].traffic is Traffic.OVERFLOW
    sim.lag = 1
    decisions += sim.run_for(30, load=8, primary=SLOW)
    assert decisions[-1].phase is Phase.ROLLED_BACK and decisions[-1].traffic is Traffic.BASELINE
    assert "RolledBack" in sim.events()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([GOOD, SLOW, NO_DATA]), st.integers(1, 12), st.integers(1, 8)),
        min_size=1,
        max_size=10,
    ),
    st.integers(0, 3),
)
def test_property_overflow_only_helps_a_short_primary_with_a_clean_baseline(
    runs: list[tuple[PoolSignals, int, int]], lag: int
) -> None:
    sim = overflow_sim()
    sim.lag = lag
    for baseline, load, length in runs:
        for _ in range(length):
            sim.tick(load=load, baseline=baseline)
    entries = []
    for (_, _, before), (now, obs, after) in zip(sim.log, sim.log[1:], strict=False):
        if after.traffic is Traffic.OVERFLOW:
            assert after.service_pools == (Pool.PRIMARY, Pool.BASELINE)
            # Overflow only while the primary is short and the baseline is clean and ready.
            assert obs.primary.ready_replicas < obs.autoscaler_desired
            assert obs.baseline.ready_replicas >= 1
            assert not after.baseline_slo.breaching
            # The baseline keeps (at least) what serves: it is never shrunk mid-overflow.
            assert after.desired_replicas.baseline >= obs.baseline.ready_replicas
            if before.traffic is not Traffic.OVERFLOW:
                entries.append(now)
        elif before.traffic is Traffic.OVERFLOW:
            assert after.traffic is Traffic.PRIMARY
    # No flapping: a new overflow starts at least drainSeconds after the last switch.
    ends = [t for t, _, d in sim.log if any(e.reason == "OverflowEnded" for e in d.events)]
    for start in entries:
        earlier = [t for t in ends if t < start]
        assert not earlier or start - earlier[-1] >= sim.spec.drain_seconds
