"""The host-warm tier over HTTP: a standby replica keeps its engines staged off the device and is
promoted with one call that skips the fetch and the cold-load cost."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

INFER = {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}


def call(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://{url}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_a_replica_goes_host_warm_and_is_promoted_back(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    assert call("POST", f"{rt.url}/v2/models/mlp/infer", INFER)[0] == 200
    status, body = call("PUT", f"{rt.url}/v2/tidal/tier", {"tier": "host"})
    assert status == 200 and body["tier"] == "host" and body["staged"] == ["mlp"]
    assert rt.metric("tidal_model_ready", model="mlp") == 0  # nothing on the device
    status, refused = call("POST", f"{rt.url}/v2/models/mlp/infer", INFER)
    assert status == 503 and "host-warm standby" in refused["error"]
    assert call("GET", f"{rt.url}/v2/tidal/tier")[1]["tier"] == "host"
    assert call("GET", f"{rt.url}/v2/health/ready")[0] == 200  # a ready standby

    status, body = call("PUT", f"{rt.url}/v2/tidal/tier", {"tier": "device"})
    assert status == 200 and body["tier"] == "device" and set(body["models"]) == {"mlp"}
    assert call("POST", f"{rt.url}/v2/models/mlp/infer", INFER)[0] == 200
    assert rt.metric("tidal_model_ready", model="mlp") == 1
    # The promotion loaded from the staged file: one fetch in all, two deserializations.
    assert rt.metric("tidal_engine_load_seconds_count", model="mlp", phase="fetch") == 1
    assert rt.metric("tidal_engine_load_seconds_count", model="mlp", phase="deserialize") == 2
    # Promoting a serving replica is a no-op.
    assert call("PUT", f"{rt.url}/v2/tidal/tier", {"tier": "device"})[1]["seconds"] == 0.0


def test_started_host_warm_it_is_ready_at_once_and_promotion_skips_the_cold_cost(
    serve, models, model_entry, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIDAL_START_TIER", "host")
    config = {"models": [model_entry(models["mlp"], "mlp")], "faults": {"extraWarmupSeconds": 2.0}}
    started = time.monotonic()
    rt = serve(config)
    assert time.monotonic() - started < 2.0  # the cold-load fault was not paid: nothing loaded
    assert call("GET", f"{rt.url}/v2/tidal/tier")[1]["tier"] == "host"
    assert call("POST", f"{rt.url}/v2/models/mlp/infer", INFER)[0] == 503
    status, body = call("PUT", f"{rt.url}/v2/tidal/tier", {"tier": "device"})
    assert status == 200 and body["seconds"] < 2.0, body
    assert call("POST", f"{rt.url}/v2/models/mlp/infer", INFER)[0] == 200


@pytest.mark.parametrize("body", [{"tier": "gpu"}, {"tier": "host", "x": 1}, ["host"], {}])
def test_a_bad_tier_request_is_a_400(serve, models, model_entry, body: Any) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    status, answer = call("PUT", f"{rt.url}/v2/tidal/tier", body)
    assert status == 400 and "error" in answer


def _keep_sending(
    url: str, seconds: float, every: float, sent: list[float] | None = None
) -> tuple[threading.Thread, list[int]]:
    """Requests every ``every`` s for ``seconds`` from a thread: a client whose endpoints still
    list a replica just taken out of its Service (``sent``: when each was sent, monotonic)."""
    codes: list[int] = []

    def run() -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if sent is not None:
                sent.append(time.monotonic())
            codes.append(call("POST", f"{url}/v2/models/mlp/infer", INFER)[0])
            time.sleep(every)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, codes


def test_going_host_warm_serves_the_requests_that_still_arrive_then_moves(
    serve, models, model_entry
) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    sent: list[float] = []
    sender, codes = _keep_sending(rt.url, seconds=1.5, every=0.1, sent=sent)
    deadline = time.monotonic() + 5
    while not codes and time.monotonic() < deadline:  # the traffic is under way
        time.sleep(0.01)
    status, body = call("PUT", f"{rt.url}/v2/tidal/tier", {"tier": "host"})
    moved = time.monotonic()
    sender.join()
    assert status == 200 and body["tier"] == "host", body
    assert codes and set(codes) == {200}, codes  # nothing refused while traffic went on
    # It moved only once the requests had stopped for a second.
    assert moved - sent[-1] >= 0.9, (moved, sent[-3:])
    assert call("POST", f"{rt.url}/v2/models/mlp/infer", INFER)[0] == 503


def test_traffic_that_never_stops_calls_the_move_off_with_a_409(
    serve, models, model_entry, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidal.runtime import tiers

    monkeypatch.setattr(tiers, "HOST_DRAIN_SECONDS", 1.0)
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    sender, codes = _keep_sending(rt.url, seconds=2.5, every=0.1)
    # The traffic is under way before the ask (an idle replica would move at once).
    deadline = time.monotonic() + 5
    while not codes and time.monotonic() < deadline:
        time.sleep(0.01)
    status, body = call("PUT", f"{rt.url}/v2/tidal/tier", {"tier": "host"})
    sender.join()
    assert status == 409 and "still receiving requests" in body["error"], body
    assert set(codes) == {200}, codes
    assert call("GET", f"{rt.url}/v2/tidal/tier")[1]["tier"] == "device"
    assert rt.metric("tidal_model_ready", model="mlp") == 1


def test_a_promotion_while_draining_keeps_the_engines_on_the_device(
    serve, models, model_entry
) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    sender, codes = _keep_sending(rt.url, seconds=0.8, every=0.1)
    deadline = time.monotonic() + 5
    while not codes and time.monotonic() < deadline:  # the traffic is under way
        time.sleep(0.01)
    answers: list[tuple[int, Any]] = []
    mover = threading.Thread(
        target=lambda: answers.append(call("PUT", f"{rt.url}/v2/tidal/tier", {"tier": "host"}))
    )
    mover.start()
    time.sleep(0.3)  # the move waits for the traffic to stop: promote meanwhile
    promoted = call("PUT", f"{rt.url}/v2/tidal/tier", {"tier": "device"})
    mover.join(10)
    sender.join()
    assert promoted[0] == 200, promoted
    assert answers and answers[0][0] == 409 and "promoted while draining" in answers[0][1]["error"]
    assert call("GET", f"{rt.url}/v2/tidal/tier")[1]["tier"] == "device"
    assert call("POST", f"{rt.url}/v2/models/mlp/infer", INFER)[0] == 200
