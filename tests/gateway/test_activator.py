"""The gateway as activator: in front of a service at zero replicas it is ready, holds requests
(bounded, counted), tells a long-poll how many it holds, and answers every one of them once the
operator pushes a replica: none lost, none answered twice."""

from __future__ import annotations

import threading
import time
from typing import Any

from gatewaytest import http, wait_for

BURST = 30


def _held(gw: Any) -> int:
    status, _, body = http("GET", f"{gw.url}/v2/tidal/held")
    assert status == 200, body
    return int(body["held"])


def _in_threads(count: int, func: Any) -> tuple[list[threading.Thread], list[Any]]:
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        results[i] = func(i)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


def _join(threads: list[threading.Thread]) -> None:
    for thread in threads:
        thread.join(90)
    alive = [t.name for t in threads if t.is_alive()]
    assert not alive, f"requests still unanswered after 90 s: {alive}"


def test_a_burst_at_zero_is_held_pushed_to_the_long_poll_and_answered_once_each(
    runtimes, runtime_config, gateway
) -> None:
    gw = gateway([], activator=True, models=["m0"], holdTimeoutSeconds=120)
    status, _, body = http("GET", f"{gw.url}/v2/health/ready")
    assert status == 200 and body["healthyReplicas"] == 0, body  # takes requests at zero
    # The operator's long-poll: parked while nothing is held, answers at the first hold.
    poll: dict[str, Any] = {}

    def long_poll() -> None:
        started = time.monotonic()
        poll["answer"] = http("GET", f"{gw.url}/v2/tidal/held?seen=0&wait=25")
        poll["seconds"] = time.monotonic() - started

    poller = threading.Thread(target=long_poll, daemon=True)
    poller.start()
    threads, results = _in_threads(BURST, lambda i: gw.infer("m0"))
    poller.join(30)
    assert "answer" in poll, "the long-poll did not return when requests were held"
    status, _, body = poll["answer"]
    assert status == 200 and body["held"] >= 1, poll
    assert poll["seconds"] < 20, f"the long-poll waited for its timeout, not the hold: {poll}"
    wait_for(lambda: _held(gw) == BURST, what=f"all {BURST} requests held")
    assert gw.metric("tidal_gateway_held_requests") == BURST
    # A replica comes up (the operator pushes it): every held request is forwarded to it.
    slow = {"faults": {"addedLatencyMs": 2000}}  # answers come well after the forwards
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",), models=("m0",), **slow)))
    status, _, body = http("PUT", f"{gw.url}/v2/tidal/replicas", {"replicas": [a.ref.model_dump()]})
    assert status == 200, body
    # A forwarded request is the replica's, no longer held: the count the operator sees drops
    # when the requests leave for the replica, not when their answers come back.
    wait_for(lambda: _held(gw) == 0, what="no request held once the replica is pushed")
    unanswered = sum(1 for r in results if r is None)
    assert unanswered > 0, "every answer was back before the held count dropped"
    _join(threads)
    codes = [r[0] for r in results]
    assert codes == [200] * BURST, [(r[0], r[2]) for r in results if r[0] != 200]
    assert a.answered("m0") == BURST  # each once: none lost, none duplicated
    assert _held(gw) == 0
    assert gw.metric("tidal_gateway_hold_outcomes_total", outcome="forwarded") == BURST
    assert gw.metric("tidal_gateway_requests_total", model="m0", code="200", cache="cold") == BURST
    # With the replica up, requests go straight through (not held, not counted as held).
    assert gw.infer("m0")[0] == 200
    assert gw.metric("tidal_gateway_requests_total", model="m0", code="200", cache="hot") == 1
    # Every arrival is counted once for the operator's forecast: held or forwarded at once.
    status, _, body = http("GET", f"{gw.url}/v2/tidal/held")
    assert status == 200 and body["arrivals"] == BURST + 1, body


def test_held_requests_are_bounded_and_expire_with_retry_after(gateway) -> None:
    gw = gateway([], activator=True, models=["m0"], holdTimeoutSeconds=3, maxHeldRequests=3)
    # Nothing held: the long-poll waits its whole `wait`, then says 0.
    started = time.monotonic()
    status, _, body = http("GET", f"{gw.url}/v2/tidal/held?seen=0&wait=0.5")
    assert status == 200 and body["held"] == 0, body
    assert time.monotonic() - started >= 0.45
    threads, results = _in_threads(3, lambda i: gw.infer("m0"))
    wait_for(lambda: _held(gw) == 3, what="3 requests held")
    # One more than maxHeldRequests: refused at once, not held.
    started = time.monotonic()
    status, headers, body = gw.infer("m0")
    assert time.monotonic() - started < 2.0
    assert status == 503 and int(headers["Retry-After"]) >= 1, (status, headers, body)
    assert "maxHeldRequests" in body["error"], body
    _join(threads)
    for status, headers, body in results:
        assert status == 503 and int(headers["Retry-After"]) >= 1, (status, headers, body)
        assert "'m0' is not ready on any replica (unavailable:no-replica); held" in body["error"]
    assert _held(gw) == 0
    assert gw.metric("tidal_gateway_hold_outcomes_total", outcome="expired") == 3
    assert gw.metric("tidal_gateway_hold_outcomes_total", outcome="full") == 1
    # The long-poll's own mistakes are 400s that say what is wrong.
    status, _, body = http("GET", f"{gw.url}/v2/tidal/held?wait=100")
    assert status == 400 and "'wait'" in body["error"], body
    status, _, body = http("GET", f"{gw.url}/v2/tidal/held?seen=x")
    assert status == 400 and "'seen'" in body["error"], body


def test_a_gateway_that_is_not_an_activator_is_not_ready_without_replicas(gateway) -> None:
    gw = gateway([], models=["m0"])
    status, _, body = http("GET", f"{gw.url}/v2/health/ready")
    assert status == 503 and "no healthy replica" in body["error"], body
