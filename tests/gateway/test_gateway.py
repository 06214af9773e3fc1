"""The gateway in front of real runtime processes, driven by real clients over loopback."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton
from gatewaytest import INFER_BODY, http, wait_for
from tritonclient.utils import InferenceServerException

SLOW = {"faults": {"addedLatencyMs": 400}}  # keeps requests in flight long enough to count


def concurrently(count: int, func: Any) -> list[Any]:
    """Run ``func(i)`` in ``count`` threads at once; their results in order."""
    results: list[Any] = [None] * count

    def run(i: int) -> None:
        results[i] = func(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_hot_requests_go_to_the_copy_with_the_fewest_in_flight(
    runtimes, runtime_config, gateway
) -> None:
    a, b, c = runtimes(
        ("rt-a", runtime_config(preload=("m0",), **SLOW)),
        ("rt-b", runtime_config(preload=("m0", "m1"), **SLOW)),
        ("rt-c", runtime_config()),
    )
    gw = gateway([a, b, c])
    codes = concurrently(6, lambda i: gw.infer("m0")[0])
    assert codes == [200] * 6
    # Six at once over two hot copies: three each (c has m0 cold and gets none, no load).
    assert (a.answered("m0"), b.answered("m0"), c.answered("m0")) == (3, 3, 0)
    assert c.state("m0") == "UNAVAILABLE"
    # A model hot on one replica only goes there, however busy it is.
    assert concurrently(3, lambda i: gw.infer("m1")[0]) == [200] * 3
    assert b.answered("m1") == 3
    assert gw.metric("tidal_gateway_route_decisions_total", reason="hot:least-outstanding") == 9
    assert gw.metric("tidal_gateway_requests_total", model="m0", code="200", cache="hot") == 6


def test_a_cold_model_is_loaded_once_and_every_held_request_is_answered(
    runtimes, runtime_config, gateway
) -> None:
    (a,) = runtimes(("rt-a", runtime_config(faults={"extraWarmupSeconds": 1.0})))
    gw = gateway([a])
    started = time.monotonic()
    answers = concurrently(5, lambda i: gw.infer("m2"))
    assert [status for status, _, _ in answers] == [200] * 5
    assert time.monotonic() - started >= 1.0  # they were held through the load
    assert answers[0][2]["outputs"][0]["shape"] == [1, 4]
    assert gw.metric("tidal_gateway_loads_total", result="ok") == 1
    assert gw.metric("tidal_gateway_requests_total", model="m2", code="200", cache="cold") == 5
    assert gw.metric("tidal_gateway_load_wait_seconds_count") == 5
    assert gw.metric("tidal_gateway_held_requests") == 0
    assert a.state("m2") == "READY" and gw.hot_on("m2") == ["rt-a"]
    status, _, _ = gw.infer("m2")
    assert status == 200
    assert gw.metric("tidal_gateway_requests_total", model="m2", code="200", cache="hot") == 1


def test_a_request_held_past_its_deadline_gets_503_with_retry_after(
    runtimes, runtime_config, gateway
) -> None:
    (a,) = runtimes(("rt-a", runtime_config(faults={"extraWarmupSeconds": 2.5})))
    gw = gateway([a], holdTimeoutSeconds=0.5)
    started = time.monotonic()
    status, headers, body = gw.infer("m1")
    assert 0.5 <= time.monotonic() - started < 2.0  # not the load's 2.5 s, never a hang
    assert status == 503 and int(headers["Retry-After"]) >= 1
    assert "'m1' is not ready on any replica (cold:wait-loading); held " in body["error"]
    # The request's own timeout parameter (µs, as tritonclient sends it) bounds the hold too.
    gw2 = gateway([a], holdTimeoutSeconds=30)
    client = triton.InferenceServerClient(gw2.address)
    tensor = triton.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    started = time.monotonic()
    with pytest.raises(InferenceServerException, match="not ready"):
        client.infer("m1", [tensor], timeout=200_000)
    assert time.monotonic() - started < 1.5
    # The load went on meanwhile: the model becomes hot and is then served.
    wait_for(lambda: gw.hot_on("m1") == ["rt-a"], what="m1 hot after its load")
    assert gw.infer("m1")[0] == 200
    assert gw.metric("tidal_gateway_loads_total", result="ok") == 1


def test_an_unknown_model_is_404_naming_it(runtimes, runtime_config, gateway) -> None:
    (a,) = runtimes(("rt-a", runtime_config(models=("m0", "m1"))))
    reported = gateway([a])  # no configured list: whatever the replicas serve
    configured = gateway([a], models=["m0"])  # a configured list bounds it
    for gw, model in ((reported, "nope"), (configured, "nope"), (configured, "m1")):
        status, _, body = gw.infer(model)
        assert (status, body) == (404, {"error": f"unknown model {model!r}"})
        status, _, body = http("GET", f"{gw.url}/v2/models/{model}")
        assert status == 404 and model in body["error"]
    assert reported.infer("m1")[0] == 200
    # Every client mistake is counted: the infer and the metadata request for "nope".
    assert reported.metric("tidal_gateway_requests_total", model="(unknown)", code="404") == 2
    assert http("GET", f"{reported.url}/v2/no/such/route")[0:3:2] == (
        404,
        {"error": "no endpoint GET /v2/no/such/route"},
    )
    assert reported.metric("tidal_gateway_requests_total", model="(none)", code="404") == 1


def test_a_replica_killed_mid_request_is_retried_elsewhere_and_nothing_fails(
    runtimes, runtime_config, gateway
) -> None:
    a, b = runtimes(
        ("rt-a", runtime_config(preload=("m0",), **SLOW)),
        ("rt-b", runtime_config(preload=("m0",), **SLOW)),
    )
    gw = gateway([a, b], holdTimeoutSeconds=2)
    results: list[Any] = []
    thread = threading.Thread(
        target=lambda: results.extend(concurrently(8, lambda i: gw.infer("m0")))
    )
    thread.start()
    wait_for(lambda: a.fleet()["models"]["m0"]["outstanding"] == 4, what="4 in flight on rt-a")
    a.kill()
    thread.join(30)
    assert [status for status, _, _ in results] == [200] * 8
    assert gw.metric("tidal_gateway_upstream_errors_total", kind="disconnect") == 4
    assert b.answered("m0") == 8  # its own four, and rt-a's four retried
    replicas = gw.replicas()
    assert not replicas["rt-a"]["healthy"] and replicas["rt-b"]["healthy"]
    assert gw.infer("m0")[0] == 200
    # The last replica gone too: a clear 503 after the hold, never a hang.
    b.kill()
    status, headers, body = gw.infer("m0")
    assert status == 503 and "unavailable:no-replica" in body["error"] and "Retry-After" in headers
    assert http("GET", f"{gw.url}/v2/health/ready")[0] == 503


def test_the_replica_list_is_pushed_and_replaced(runtimes, runtime_config, gateway) -> None:
    a, b = runtimes(("rt-a", runtime_config()), ("rt-b", runtime_config()))
    gw = gateway([])
    status, _, body = http("GET", f"{gw.url}/v2/health/ready")
    assert status == 503 and "no healthy replica" in body["error"]
    assert http("GET", f"{gw.url}/v2/health/live")[0] == 200
    bad = {"replicas": [{"name": "x", "url": "ftp://nowhere"}]}
    status, _, body = http("PUT", f"{gw.url}/v2/tidal/replicas", bad)
    assert status == 400 and "replicas.0.url" in body["error"]
    push = {
        "replicas": [{"name": "rt-a", "url": a.url}, {"name": "rt-b", "url": b.url}],
        "placement": {"m3": ["rt-b"]},
    }
    status, _, body = http("PUT", f"{gw.url}/v2/tidal/replicas", push)
    assert (status, body) == (200, {"replicas": ["rt-a", "rt-b"], "placement": {"m3": ["rt-b"]}})
    wait_for(lambda: http("GET", f"{gw.url}/v2/health/ready")[0] == 200, 5, "ready")
    wait_for(lambda: all(r["healthy"] for r in gw.replicas().values()), 5, "both healthy")
    assert gw.infer("m3")[0] == 200  # cold: loaded where the placement says
    assert (a.state("m3"), b.state("m3")) == ("UNAVAILABLE", "READY")
    assert gw.metric("tidal_gateway_route_decisions_total", reason="cold:load-placed") == 1
    # Level-triggered: the next list is the whole list.
    push = {"replicas": [{"name": "rt-a", "url": a.url}]}
    assert http("PUT", f"{gw.url}/v2/tidal/replicas", push)[0] == 200
    assert list(gw.replicas()) == ["rt-a"]
    assert gw.infer("m3")[0] == 200
    assert a.state("m3") == "READY"


def test_a_hot_set_change_reaches_the_gateway_in_milliseconds(
    runtimes, runtime_config, gateway
) -> None:
    (a,) = runtimes(("rt-a", runtime_config()))
    gw = gateway([a])
    assert gw.hot_on("m1") == []
    assert (
        http("POST", f"{a.url}/v2/repository/models/m1/load", {})[0] == 200
    )  # not via the gateway
    started = time.monotonic()
    wait_for(lambda: gw.hot_on("m1") == ["rt-a"], 5, "m1 hot in the gateway")
    assert time.monotonic() - started < 0.5
    assert http("POST", f"{a.url}/v2/repository/models/m1/unload", {})[0] == 200
    wait_for(lambda: gw.hot_on("m1") == [], 5, "m1 cold in the gateway")


def test_tritonclient_unmodified_works_through_the_gateway(
    runtimes, runtime_config, gateway, model_files
) -> None:
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",))))
    gw = gateway([a])
    client = triton.InferenceServerClient(gw.address)
    assert client.is_server_live() and client.is_server_ready()
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    assert client.get_model_metadata("m0")["inputs"] == [
        {"name": "input", "datatype": "FP32", "shape": [-1, 16]}
    ]
    assert client.get_model_config("m0")["max_batch_size"] == 8
    assert client.is_model_ready("m0") and not client.is_model_ready("m1")
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    session = ort.InferenceSession(str(model_files["m1"].path), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input": x})[0]
    for binary in (True, False):
        tensor = triton.InferInput("input", [3, 16], "FP32")
        tensor.set_data_from_numpy(x, binary_data=binary)
        output = triton.InferRequestedOutput("output", binary_data=binary)
        result = client.infer("m1", [tensor], outputs=[output])  # cold the first time
        np.testing.assert_allclose(result.as_numpy("output"), expected, rtol=1e-5)
    assert client.is_model_ready("m1")
    assert client.get_model_metadata("m1", model_version="1")["name"] == "m1"
    index = {e["name"]: e["state"] for e in client.get_model_repository_index()}
    assert index == {"m0": "READY", "m1": "READY", "m2": "UNAVAILABLE", "m3": "UNAVAILABLE"}


def test_answers_and_errors_pass_through_byte_for_byte(runtimes, runtime_config, gateway) -> None:
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",))))
    gw = gateway([a])
    x = np.ones((1, 16), np.float32)
    header = json.dumps(
        {
            "inputs": [
                {"name": "input", "datatype": "FP32", "shape": [1, 16],
                 "parameters": {"binary_data_size": x.nbytes}},
            ],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}],
        }
    ).encode()  # fmt: skip
    headers = {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }
    answers = [
        http("POST", f"{base}/v2/models/m0/infer", header + x.tobytes(), headers)
        for base in (a.url, gw.url)
    ]
    (s1, h1, b1), (s2, h2, b2) = answers
    assert (s1, s2) == (200, 200) and b1 == b2  # the same bytes
    for name in ("Inference-Header-Content-Length", "Content-Type"):
        assert h1[name] == h2[name]
    bad = json.dumps(
        {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 15], "data": [0] * 15}]}
    ).encode()
    direct = http("POST", f"{a.url}/v2/models/m0/infer", bad)
    via = http("POST", f"{gw.url}/v2/models/m0/infer", bad)
    assert direct[0] == via[0] == 400 and direct[2] == via[2]
    assert "expected shape" in via[2]["error"]
    assert http("POST", f"{gw.url}/v2/models/m0/infer", INFER_BODY)[0] == 200


def test_every_hot_copy_busy_starts_one_more_copy(runtimes, runtime_config, gateway) -> None:
    a, b = runtimes(
        ("rt-a", runtime_config(preload=("m0",), **SLOW)),
        ("rt-b", runtime_config(**SLOW)),
    )
    gw = gateway([a, b], busyOutstanding=1)
    assert concurrently(4, lambda i: gw.infer("m0")[0]) == [200] * 4
    wait_for(lambda: gw.hot_on("m0") == ["rt-a", "rt-b"], 10, "a second copy on rt-b")
    assert gw.metric("tidal_gateway_route_decisions_total", reason="busy:extra-copy") == 1
    assert gw.metric("tidal_gateway_loads_total", result="ok") == 1
    # The busy requests were forwarded at once, none held for the new copy (one that comes late
    # on a loaded machine may already find the second copy hot).
    assert gw.metric("tidal_gateway_requests_total", model="m0", code="200", cache="hot") == 4
    assert a.answered("m0") + b.answered("m0") == 4 and a.answered("m0") >= 2


def test_loads_are_bounded_fleet_wide_and_waiting_requests_follow(
    runtimes, runtime_config, gateway
) -> None:
    a, b = runtimes(
        ("rt-a", runtime_config(faults={"extraWarmupSeconds": 0.7})),
        ("rt-b", runtime_config(faults={"extraWarmupSeconds": 0.7})),
    )
    gw = gateway([a, b], maxLoadsTotal=1)
    loading: list[int] = []

    def watch() -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            loading.append(sum(len(r["loading"]) for r in gw.replicas().values()))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    codes = concurrently(2, lambda i: gw.infer(f"m{i + 1}")[0])
    watcher.join()
    assert codes == [200, 200]
    assert max(loading) == 1  # never two loads at once
    assert gw.metric("tidal_gateway_route_decisions_total", reason="unavailable:load-limit") >= 1
    assert gw.metric("tidal_gateway_loads_total", result="ok") == 2


def test_a_replica_without_room_refuses_and_the_load_goes_elsewhere(
    runtimes, runtime_config, gateway, model_files
) -> None:
    size = model_files["m0"].size_bytes
    small = runtime_config(memory={"engineCacheBudgetBytes": int(size * 1.5)})
    a, b = runtimes(("rt-a", small), ("rt-b", runtime_config()))
    assert http("PUT", f"{a.url}/v2/tidal/placement", {"pinned": ["m0"]})[0] == 200
    wait_for(lambda: a.state("m0") == "READY", what="m0 pinned on rt-a")
    gw = gateway([])
    push = {
        "replicas": [{"name": "rt-a", "url": a.url}, {"name": "rt-b", "url": b.url}],
        "placement": {"m1": ["rt-a"]},  # stale hints: rt-a has no room next to its pin
    }
    assert http("PUT", f"{gw.url}/v2/tidal/replicas", push)[0] == 200
    wait_for(lambda: all(r["healthy"] for r in gw.replicas().values()), 5, "both healthy")
    assert gw.infer("m1")[0] == 200
    assert gw.metric("tidal_gateway_loads_total", result="refused") == 1
    assert gw.metric("tidal_gateway_loads_total", result="ok") == 1
    assert (a.state("m0"), a.state("m1"), b.state("m1")) == ("READY", "UNAVAILABLE", "READY")
    assert "m1" in gw.replicas()["rt-a"]["refused"]


def test_a_refusal_for_room_held_by_requests_is_retried_as_soon_as_they_end(
    runtimes, runtime_config, gateway, model_files
) -> None:
    """Issue 45: a replica refuses a load because another model's request still holds the
    room; it says so ("waitingOn"), and the gateway asks it again as soon as that request
    ends (the replica's long-poll moves), not after refusedCooldownSeconds (set here longer
    than the hold timeout: before, the held request got a 503)."""
    size = max(model_files[m].size_bytes for m in ("m0", "m1"))
    slow = runtime_config(
        memory={"engineCacheBudgetBytes": int(size * 1.5)}, faults={"serviceTimeMs": 6000}
    )
    (a,) = runtimes(("rt-a", slow))
    assert http("POST", f"{a.url}/v2/repository/models/m0/load", {})[0] == 200
    gw = gateway([a], refusedCooldownSeconds=300, holdTimeoutSeconds=60)
    wait_for(lambda: gw.replicas()["rt-a"]["healthy"], 20, "rt-a healthy at the gateway")
    in_flight = threading.Thread(
        target=lambda: http("POST", f"{a.url}/v2/models/m0/infer", INFER_BODY, {})
    )
    in_flight.start()
    wait_for(lambda: a.fleet()["models"]["m0"]["outstanding"] == 1, 20, "m0's request in flight")
    direct = http("POST", f"{a.url}/v2/repository/models/m1/load", {})
    assert direct[0] == 503 and direct[2].get("waitingOn") == ["m0"], direct
    started = time.monotonic()
    code, _, body = gw.infer("m1")
    waited = time.monotonic() - started
    in_flight.join(30)
    assert code == 200, (code, body, gw.replicas())
    refused = gw.metric("tidal_gateway_loads_total", result="refused")
    assert refused >= 1, (refused, waited, gw.replicas())
    assert waited < 60, (waited, gw.replicas())  # well before the 300 s cooldown
    assert a.state("m1") == "READY", a.fleet()


def test_two_replicas_answering_503_send_the_held_request_to_a_third_that_loads_it(
    runtimes, runtime_config, gateway
) -> None:
    """A replica's 503 on a forwarded request (queue full here; on the real node a copy the
    gateway saw hot but the replica had evicted and could not reload) marks it refusing the
    model, and a request that may be held gets a third replica: the gateway loads the model
    there instead of passing the second 503 to the client (e2e/test_fleet.py lost one request
    that way when a replica was killed mid-request beside a stale copy)."""

    def saturable() -> dict[str, Any]:
        config = runtime_config(preload=("m1",), faults={"serviceTimeMs": 4000})
        for entry in config["models"]:
            entry["batching"] = {"maxQueueSize": 1}
        return config

    a, c, b = runtimes(("rt-a", saturable()), ("rt-c", saturable()), ("rt-b", runtime_config()))
    gw = gateway([a, c, b], holdTimeoutSeconds=30)
    wait_for(lambda: set(gw.hot_on("m1")) == {"rt-a", "rt-c"}, what="m1 hot on rt-a and rt-c")
    # One batch executing and one request queued on each: a third is refused at once (503).
    direct = [
        threading.Thread(target=http, args=("POST", f"{r.url}/v2/models/m1/infer", INFER_BODY))
        for r in (a, a, c, c)
    ]
    for thread in direct:
        thread.start()
        time.sleep(0.05)  # executing first, then queued
    for r in (a, c):
        wait_for(
            lambda r=r: r.fleet()["models"]["m1"]["outstanding"] == 2,
            what=f"{r.name}: one executing and one queued ({r.fleet()['models']['m1']})",
        )
        status, _, body = http("POST", f"{r.url}/v2/models/m1/infer", INFER_BODY)
        assert status == 503, (r.name, status, body)

    status, _, body = gw.infer("m1")
    assert status == 200, (status, body, gw.replicas())
    assert b.answered("m1") == 1 and b.state("m1") == "READY", b.fleet()
    assert gw.metric("tidal_gateway_upstream_errors_total", kind="unavailable") == 2
    assert {"m1"} <= set(gw.replicas()["rt-a"]["refused"]) | set(gw.replicas()["rt-c"]["refused"])
    for thread in direct:
        thread.join(30)


def raw_exchange(port: int, data: bytes, patience: float = 10.0) -> tuple[int, bytes, float]:
    """Send raw bytes, read until the server closes or the answer is complete: (status, head
    and body, seconds it took)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=patience) as sock:
        sock.sendall(data)
        answer = b""
        while True:
            head, sep, body = answer.partition(b"\r\n\r\n")
            length = [
                int(x.split(b":")[1])
                for x in head.split(b"\r\n")
                if x.lower().startswith(b"content-length:")
            ]
            if sep and length and len(body) >= length[0]:
                break
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                raise AssertionError(f"no answer within {patience} s to {data[:200]!r}") from None
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1."), answer[:300]
    return int(answer.split(b" ", 2)[1]), answer, time.monotonic() - started


def test_client_mistakes_get_a_counted_json_4xx_and_never_hang(
    runtimes, runtime_config, gateway
) -> None:
    (a,) = runtimes(("rt-a", runtime_config(preload=("m0",))))
    gw = gateway([a], maxRequestBytes=4096, requestReadTimeoutSeconds=0.5)
    deep = b"[" * 100_000 + b"]" * 100_000
    head = "POST /v2/models/m0/infer HTTP/1.1\r\nHost: x\r\n"
    cases = [  # (what, raw request, status, words of the error)
        (
            "a deeply nested index body",
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s"
            % (4000, deep[:2000] + deep[-2000:]),
            400,
            "nested too deeply",
        ),
        (
            "an index body the runtime would refuse",
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 15\r\n\r\n"
            b'{"ready": "no"}',
            400,
            "'ready' must be true or false",
        ),
        (
            "an unknown index field",
            b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n"
            b'{"x": true}',
            400,
            "unknown fields ['x']",
        ),
        (
            "a header past latin-1, forwarded byte for byte",
            (
                head + "Content-Type: application/json; x=\u2192\r\nContent-Length: 2\r\n\r\n{}"
            ).encode(),
            400,
            "",
        ),
        (
            "a declared length over maxRequestBytes",
            (head + "Content-Length: 1000000\r\n\r\n").encode(),
            413,
            "exceeds maxRequestBytes 4096",
        ),
        (
            "a stalled upload",
            (head + "Content-Length: 100\r\n\r\n{").encode(),
            408,
            "did not arrive within 0.5 s",
        ),
        (
            "a wrong method",
            b"DELETE /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
            405,
            "not allowed",
        ),
        (
            "malformed HTTP (aiohttp's own 400)",
            (head + "Transfer-Encoding: chunked\r\n\r\nzz\r\n").encode(),
            400,
            "malformed HTTP request",
        ),
    ]
    for what, data, status, words in cases:
        got, answer, seconds = raw_exchange(gw.port, data)
        head_text, _, body = answer.partition(b"\r\n\r\n")
        assert got == status, (what, answer[:400])
        assert b"application/json" in head_text.lower(), (what, answer[:400])
        assert words in json.loads(body)["error"], (what, answer[:400])
        if status == 405:
            assert b"\r\nAllow: POST" in head_text, (what, head_text)
        assert seconds < 8, (what, seconds)
    for code in ("400", "405", "408", "413"):
        counted = sum(
            gw.metric("tidal_gateway_requests_total", model=model, code=code)
            for model in ("m0", "(none)")
        )
        assert counted >= 1, (code, "not counted in tidal_gateway_requests_total")
    assert gw.metric("tidal_gateway_requests_total", model="m0", code="500") == 0
    assert gw.infer("m0")[0] == 200  # and the gateway still serves
