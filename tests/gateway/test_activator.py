"""The gateway as activator: in front of a service at zero replicas it is ready, holds requests
(bounded, counted), tells a long-poll how many it holds, and answers every one of them once the
operator pushes a replica: none lost, none answered twice."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from typing import Any

from gatewaytest import INFER_BODY, http, wait_for

HEADER = "Inference-Header-Content-Length"

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


def test_the_long_poll_answers_within_every_of_an_arrival_not_at_its_wait(
    gateway, runtimes, runtime_config
) -> None:
    """The operator's forecast learns a serving pool's arrivals from this long-poll: with
    `arrivals` (the count it last read) it answers `every` seconds into the poll once a request
    arrived, not at the end of `wait` (up to 25 s late: a pool could reach zero first)."""
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",), models=("m0",))))
    gw = gateway([a], activator=True, models=["m0"])
    assert gw.infer("m0")[0] == 200
    status, _, body = http("GET", f"{gw.url}/v2/tidal/held")
    assert status == 200, body
    known = int(body["arrivals"])
    poll: dict[str, Any] = {}

    def long_poll() -> None:
        started = time.monotonic()
        query = f"seen=0&wait=25&arrivals={known}&every=1.5"
        poll["answer"] = http("GET", f"{gw.url}/v2/tidal/held?{query}")
        poll["seconds"] = time.monotonic() - started

    poller = threading.Thread(target=long_poll, daemon=True)
    poller.start()
    assert gw.infer("m0")[0] == 200
    poller.join(60)
    assert "answer" in poll, "the long-poll did not return"
    status, _, body = poll["answer"]
    assert status == 200 and body["held"] == 0 and body["arrivals"] == known + 1, poll
    # Not before `every` (a busy service costs an answer per `every`, not one per request),
    # and well before `wait`.
    assert 1.4 <= poll["seconds"] < 20, poll
    # Bad values are refused with what to fix.
    for query, word in (("arrivals=x", "arrivals"), ("arrivals=1&every=31", "every")):
        status, _, body = http("GET", f"{gw.url}/v2/tidal/held?seen=0&wait=1&{query}")
        assert status == 400 and word in body["error"], (query, status, body)


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


def _outcomes(gw: Any) -> dict[str, float]:
    names = ("forwarded", "expired", "full", "gone", "drained", "other")
    return {o: gw.metric("tidal_gateway_hold_outcomes_total", outcome=o) for o in names}


def test_a_request_no_model_could_serve_is_refused_at_once_and_wakes_nothing(
    gateway, caplog
) -> None:
    caplog.set_level("INFO")
    gw = gateway([], activator=True, models=["m0"], holdTimeoutSeconds=120, maxJsonValues=2500)
    header = b'{"inputs": [{"name": "input", "datatype": "FP32", "shape": [1], "data": [1]}]}'
    cases = {
        "empty body": (b"", {}),
        "bad JSON": (b'{"inputs": [', {}),
        "not UTF-8": (b'{"inputs": "\xff\xfe\xfa"}', {}),
        "nested 1,000 deep": (b"[" * 1000 + b"]" * 1000, {}),
        "nested 1,000 deep inside": (b'{"inputs": [' + b"[" * 1000 + b"]" * 1000 + b"]}", {}),
        "no inputs": (b'{"outputs": []}', {}),
        "header length past the body": (header, {HEADER: str(len(header) + 10)}),
        "header length not a number": (header, {HEADER: "twelve"}),
        "timeout not an integer": (b'{"inputs": [{}], "parameters": {"timeout": "1"}}', {}),
        "gzip cut short": (gzip.compress(INFER_BODY)[:30], {"Content-Encoding": "gzip"}),
        "gzip of bad JSON": (gzip.compress(b"{"), {"Content-Encoding": "gzip"}),
        "more values than maxJsonValues": (
            b'{"inputs": [{"data": [%s]}]}' % b",".join([b"0"] * 2500),
            {},
        ),
    }
    for case, (body, headers) in cases.items():
        started = time.monotonic()
        status, _, answer = http("POST", f"{gw.url}/v2/models/m0/infer", body, headers)
        took = time.monotonic() - started
        assert status == (413 if "maxJsonValues" in case else 400), (case, status, answer)
        assert took < 30, f"{case}: answered after {took:.1f} s (held, not refused)"
    # None of them was held: no hold began, nothing was counted as demand.
    assert _outcomes(gw) == dict.fromkeys(_outcomes(gw), 0.0), _outcomes(gw)
    assert gw.metric("tidal_gateway_load_wait_seconds_count") == 0
    assert _held(gw) == 0
    # Refused before the hold: counted as neither hot nor cold, and not an arrival (the
    # operator's forecast learns from arrivals).
    refused = gw.metric("tidal_gateway_requests_total", model="m0", code="400", cache="none")
    refused += gw.metric("tidal_gateway_requests_total", model="m0", code="413", cache="none")
    assert refused == len(cases), http("GET", f"{gw.url}/metrics")[2]
    assert gw.metric("tidal_gateway_requests_total", model="m0", code="400", cache="hot") == 0
    _, _, held = http("GET", f"{gw.url}/v2/tidal/held")
    assert held["arrivals"] == 0, held
    loud = [r for r in caplog.records if r.levelno >= 40 or r.exc_info]
    assert not loud, [(r.levelname, r.getMessage()) for r in loud[:3]]


def test_a_timeout_of_any_size_is_held_for_the_hold_timeout_not_a_500(gateway, caplog) -> None:
    caplog.set_level("INFO")
    gw = gateway([], activator=True, models=["m0"], holdTimeoutSeconds=1)
    body = b'{"inputs": [{}], "parameters": {"timeout": 1' + b"0" * 400 + b"}}"
    status, headers, answer = gw.infer("m0", body)
    assert status == 503 and "held" in answer["error"], (status, answer)
    assert int(headers["Retry-After"]) >= 1, headers
    assert _outcomes(gw)["expired"] == 1, _outcomes(gw)
    # A compressed request is judged as the replica will read it: held, not refused.
    encoded = {"Content-Encoding": "gzip"}
    status, headers, answer = gw.infer("m0", gzip.compress(INFER_BODY), **encoded)
    assert status == 503 and "held" in answer["error"], (status, answer)
    assert _outcomes(gw)["expired"] == 2, _outcomes(gw)
    loud = [r for r in caplog.records if r.levelno >= 40 or r.exc_info]
    assert not loud, [(r.levelname, r.getMessage()) for r in loud[:3]]


def _held_over_socket(url: str, body: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    head = (
        f"POST /v2/models/m0/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def test_a_client_that_hangs_up_while_held_frees_its_slot_and_is_never_forwarded(
    runtimes, runtime_config, gateway, caplog
) -> None:
    caplog.set_level("INFO")
    gw = gateway([], activator=True, models=["m0"], holdTimeoutSeconds=120)
    count = 20
    sockets = [_held_over_socket(gw.url, INFER_BODY) for _ in range(count)]
    wait_for(lambda: _held(gw) == count, 30, f"{count} requests held")
    for sock in sockets:
        sock.close()
    wait_for(
        lambda: _held(gw) == 0,
        30,
        "every hold released once its client hung up (the hold is 120 s)",
    )
    assert _outcomes(gw)["gone"] == count, _outcomes(gw)
    assert gw.metric("tidal_gateway_requests_total", model="m0", code="499", cache="cold") == count
    # Clients that hang up as soon as they have sent (before or while the gateway holds them).
    for _ in range(count):
        _held_over_socket(gw.url, INFER_BODY).close()
    wait_for(
        lambda: (
            gw.metric("tidal_gateway_requests_total", model="m0", code="499", cache="cold")
            + gw.metric("tidal_gateway_requests_total", model="m0", code="499", cache="hot")
            == 2 * count
        ),
        30,
        "every client that sent and hung up at once answered 499 (the hold is 120 s)",
    )
    assert _held(gw) == 0
    # A replica arrives: none of the gone requests reaches it; a live one does, once.
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",), models=("m0",))))
    status, _, body = http("PUT", f"{gw.url}/v2/tidal/replicas", {"replicas": [a.ref.model_dump()]})
    assert status == 200, body
    wait_for(lambda: gw.hot_on("m0") == ["rt-a"], 30, "the replica routable")
    assert gw.infer("m0")[0] == 200
    assert a.answered("m0") == 1, f"{a.answered('m0')} answered: gone clients were forwarded"
    assert _outcomes(gw)["forwarded"] == 0, _outcomes(gw)
    loud = [r for r in caplog.records if r.levelno >= 40 or r.exc_info]
    assert not loud, [(r.levelname, r.getMessage()) for r in loud[:3]]


def test_held_bytes_are_bounded_and_a_refusal_says_when_to_come_back(gateway) -> None:
    body = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
    ).encode()
    body += b" " * (1000 - len(body))  # 1,000 bytes each
    gw = gateway([], activator=True, models=["m0"], holdTimeoutSeconds=120, maxHeldBytes=2500)
    _, results = _in_threads(2, lambda i: gw.infer("m0", body))
    wait_for(lambda: _held(gw) == 2, 30, "2 requests held")
    held_since = time.monotonic()
    assert gw.metric("tidal_gateway_held_bytes") == 2000
    # A third would take the held bodies past maxHeldBytes: refused at once, naming the budget.
    status, headers, answer = gw.infer("m0", body)
    assert status == 503 and "maxHeldBytes" in answer["error"], (status, answer)
    assert _held(gw) == 2
    # Retry-After is the wait still expected: with no wake measured yet, as long as the hold
    # has already waited (a client is not invited back every second to a hold still waiting).
    wait_for(lambda: time.monotonic() - held_since > 4, 30, "the hold 4 s old")
    status, headers, answer = gw.infer("m0", body)
    assert status == 503, (status, answer)
    assert 4 <= int(headers["Retry-After"]) <= 30, (headers, answer)
    assert _outcomes(gw)["full"] == 2, _outcomes(gw)
    # A body larger than the whole budget could never be held.
    status, headers, answer = gw.infer("m0", body + b" " * 2000)
    assert status == 503 and "larger than maxHeldBytes" in answer["error"], (status, answer)
    assert int(headers["Retry-After"]) >= 1, headers
    assert all(r is None for r in results), "a held request was answered while still held"


def test_only_servable_requests_are_arrivals_and_statistics_come_from_a_replica(
    gateway, runtimes, runtime_config
) -> None:
    """What a replica refuses as the client's mistake (bad JSON, a wrong shape, an unknown
    model) is no demand for the forecast; what it serves is. The statistics endpoint is
    routed to a replica that has the model, like its metadata."""
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",), models=("m0",))))
    gw = gateway([a], activator=True, models=["m0"])
    wait_for(lambda: gw.hot_on("m0") == ["rt-a"], what="m0 hot on rt-a")

    def arrivals() -> int:
        status, _, body = http("GET", f"{gw.url}/v2/tidal/held")
        assert status == 200, body
        return int(body["arrivals"])

    before = arrivals()
    wrong_shape = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}]}
    ).encode()
    for body, want in ((b'{"inputs": [', 400), (wrong_shape, 400), (None, 200)):
        status, _, answer = gw.infer("m0", body)
        assert status == want, (body, status, answer)
    status, _, answer = gw.infer("nope")
    assert status == 404, answer
    assert arrivals() == before + 1, "only the served request is an arrival"
    for path in ("/v2/models/m0/stats", "/v2/models/m0/versions/1/stats"):
        status, _, stats = http("GET", gw.url + path)
        assert status == 200, (path, status, stats)
        (entry,) = stats["model_stats"]
        assert entry["name"] == "m0" and entry["inference_count"] >= 1, (path, stats)
