"""Which not-Ready pods the control loop asks for a reason, and how the answers are kept."""

from __future__ import annotations

from typing import Any

from tidal.operator.core.podfaults import (
    NO_ANSWER,
    PROBE_EVERY_SECONDS,
    PodFaults,
    ProbeTarget,
    due,
    not_ready_pods,
    unstartable_pods,
)

STARTED = "2026-12-03T12:00:00Z"
T0 = 1796299200.0  # STARTED as epoch seconds


def pod(name: str, *, ready: bool = False, phase: str = "Running", **extra: Any) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase,
        "podIP": extra.pop("ip", "10.244.0.7"),
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"state": {"running": {"startedAt": STARTED}}}],
    }
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"serving.tidal.dev/pool": "primary"},
        "annotations": {"prometheus.io/port": "8080"},
        **extra,
    }
    return {"metadata": meta, "status": status}


def test_only_running_not_ready_pods_past_the_grace_are_asked() -> None:
    pods = [
        pod("loading"),
        pod("ready", ready=True),
        pod("pending", phase="Pending"),
        pod("leaving", deletionTimestamp=STARTED),
        pod("no-ip", ip=None),
    ]
    assert not_ready_pods(pods, T0 + 1.0) == []  # still inside the grace: it is loading
    targets = not_ready_pods(pods, T0 + 10.0)
    assert targets == [ProbeTarget("loading", "primary", "http://10.244.0.7:8080/v2/health/ready")]


def test_answers_are_kept_per_pod_and_asked_again_only_after_a_while() -> None:
    faults = PodFaults()
    a, b = ProbeTarget("a", "primary", "u"), ProbeTarget("b", "baseline", "u")
    faults.record(a, "m: engine file is corrupt", now=100.0)
    faults.record(b, None, now=100.0)  # not ready, no reason given: nothing to report
    assert faults.problems() == ("pool primary: pod a not ready: m: engine file is corrupt",)
    assert due([a, b], faults, 100.0 + PROBE_EVERY_SECONDS / 2) == []
    assert due([a, b], faults, 100.0 + PROBE_EVERY_SECONDS) == [a, b]
    faults.keep_only(["b"])  # a turned Ready or went away
    assert faults.problems() == () and "a" not in faults.probed_at
    faults.record(b, "x" * 1000, now=200.0)
    assert len(faults.problems()[0]) < 400  # long runtime messages are cut


def test_a_probe_that_gets_no_answer_keeps_the_last_reason() -> None:
    faults = PodFaults()
    a = ProbeTarget("a", "primary", "u")
    faults.record(a, "m: engine file is corrupt", now=100.0)
    # A runtime busy retrying its loads on a loaded node may not answer in time: that says
    # nothing about it, so the Degraded reason stands (CI saw it cleared for 90 s before).
    faults.record(a, NO_ANSWER, now=103.0)
    assert faults.problems() == ("pool primary: pod a not ready: m: engine file is corrupt",)
    assert faults.probed_at["a"] == 103.0  # asked: the next probe waits its turn
    faults.record(a, None, now=106.0)  # an answer without a reason clears it
    assert faults.problems() == ()


def _config_error(name: str, message: str) -> dict[str, Any]:
    p = pod(name, phase="Pending")
    p["status"]["containerStatuses"] = [
        {"state": {"waiting": {"reason": "CreateContainerConfigError", "message": message}}}
    ]
    return p


def test_a_pod_that_cannot_start_names_the_spec_field_of_its_secret() -> None:
    """A missing credentials Secret keeps the container from being created (no probe reaches
    it): the problem names the spec field to fix and kubelet's own message."""
    pods = [
        _config_error("a", 'secret "engine-store" not found'),
        _config_error("b", 'couldn\'t find key AWS_ACCESS_KEY_ID in Secret ns/"other"'),
        pod("c", ready=True),
    ]
    fields = {"engine-store": "spec.runtime.storage.s3.credentialsSecret"}
    found = unstartable_pods(pods, fields)
    assert sorted(found) == ["a", "b"]
    assert found["a"] == (
        "primary",
        'cannot start: spec.runtime.storage.s3.credentialsSecret: secret "engine-store" not found',
    )
    assert found["b"][1].startswith("cannot start: couldn't find key")
    faults = PodFaults()
    faults.unstartable = found
    assert faults.problems()[0].startswith("pool primary: pod a not ready: cannot start: spec.")
    # a terminating pod says nothing
    gone = _config_error("d", 'secret "engine-store" not found')
    gone["metadata"]["deletionTimestamp"] = STARTED
    assert unstartable_pods([gone], fields) == {}
