"""The runtime's fleet endpoints over HTTP: the hot-set long-poll and the placement pins."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as triton

from tidal.runtime.modelgen import write_mlp


def call(method: str, url: str, body: Any = None, timeout: float = 40.0) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://{url}", data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def fleet(url: str, since: int | None = None, wait: float = 10.0) -> dict[str, Any]:
    query = "" if since is None else f"?since={since}&wait={wait}"
    status, body = call("GET", f"{url}/v2/tidal/models{query}")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def wait_for(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def infer(url: str, model: str) -> None:
    tensor = triton.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    triton.InferenceServerClient(url).infer(model, [tensor])


@pytest.fixture
def three_models(tmp_path: Path, model_entry: Any) -> tuple[list[dict[str, Any]], int]:
    """Three equal models (not preloaded) and their size in bytes."""
    infos = [
        write_mlp(tmp_path / f"m{i}.onnx", inputs=16, hidden=128, outputs=4, seed=i)
        for i in range(3)
    ]
    entries = [model_entry(info, f"m{i}", preload=False) for i, info in enumerate(infos)]
    return entries, infos[0].size_bytes


def test_models_view_follows_the_contract(serve, models, model_entry) -> None:
    rt = serve(
        {
            "models": [
                model_entry(models["mlp"], "mlp"),
                model_entry(models["conv"], "conv", preload=False),
            ],
            "memory": {"engineCacheBudgetBytes": "1Mi"},
            "maxConcurrentLoads": 3,
        }
    )
    view = fleet(rt.url)
    assert view["replica"] == rt.url
    assert view["ready"] is True
    assert (view["budgetBytes"], view["maxConcurrentLoads"]) == (2**20, 3)
    size = models["mlp"].size_bytes
    assert view["residentBytes"] == size
    assert view["models"]["mlp"] == {
        "state": "READY",
        "sizeBytes": size,
        "lastSizeBytes": size,
        "loadSeconds": pytest.approx(view["models"]["mlp"]["loadSeconds"]),
        "outstanding": 0,
        "requests": 0,
        "pinned": False,
        "lastError": None,
        "concurrency": 8,  # one execution slot x maxBatchSize 8: what the burst buffer bounds
    }
    assert view["models"]["mlp"]["loadSeconds"] > 0
    assert view["models"]["conv"]["state"] == "UNAVAILABLE"
    assert view["models"]["conv"]["sizeBytes"] == 0


def test_long_poll_returns_as_soon_as_the_hot_set_changes(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp", preload=False)]})
    before = fleet(rt.url)
    answers: list[tuple[float, dict[str, Any]]] = []

    def poll() -> None:
        answers.append((time.monotonic(), fleet(rt.url, since=before["generation"], wait=20)))

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(0.3)
    assert not answers  # nothing changed: still waiting
    asked = time.monotonic()
    status, _ = call("POST", f"{rt.url}/v2/repository/models/mlp/load", {})
    assert status == 200
    poller.join(10)
    answered, view = answers[0]
    assert answered - asked < 2.0  # the load's first step (not its end) woke the poll
    assert view["generation"] > before["generation"]
    assert view["models"]["mlp"]["state"] in ("LOADING", "READY")
    # No change: the poll answers after its wait with the same generation.
    now = fleet(rt.url)
    started = time.monotonic()
    again = fleet(rt.url, since=now["generation"], wait=0.3)
    assert 0.25 <= time.monotonic() - started < 5
    assert again["generation"] == now["generation"]
    # A generation this process never had (a client from before a restart): answered at once.
    started = time.monotonic()
    fleet(rt.url, since=now["generation"] + 1000, wait=20)
    assert time.monotonic() - started < 2


def test_outstanding_counts_the_requests_in_flight_per_model(serve, models, model_entry) -> None:
    rt = serve(
        {
            "models": [model_entry(models["mlp"], "mlp"), model_entry(models["mlp_b"], "other")],
            "faults": {"addedLatencyMs": 400},
        }
    )
    threads = [threading.Thread(target=infer, args=(rt.url, "mlp")) for _ in range(3)]
    for thread in threads:
        thread.start()
    wait_for(lambda: fleet(rt.url)["models"]["mlp"]["outstanding"] == 3)
    assert fleet(rt.url)["models"]["other"]["outstanding"] == 0
    for thread in threads:
        thread.join(10)
    view = fleet(rt.url)["models"]["mlp"]
    assert (view["outstanding"], view["requests"]) == (0, 3)


def test_placement_refuses_unknown_names_and_malformed_bodies(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    status, body = call("PUT", f"{rt.url}/v2/tidal/placement", {"pinned": ["mlp", "nope", "zz"]})
    assert status == 400 and "['nope', 'zz']" in body["error"]
    for bad in ({"pinned": "mlp"}, {"pinned": [1]}, {"pin": []}, ["mlp"]):
        status, body = call("PUT", f"{rt.url}/v2/tidal/placement", bad)
        assert status == 400 and ("pinned" in body["error"] or "object" in body["error"]), bad
    assert fleet(rt.url)["models"]["mlp"]["pinned"] is False


def test_pinned_models_load_in_the_background_and_are_never_evicted(serve, three_models) -> None:
    entries, size = three_models
    rt = serve({"models": entries, "memory": {"engineCacheBudgetBytes": int(size * 2.5)}})
    generation = fleet(rt.url)["generation"]
    status, body = call("PUT", f"{rt.url}/v2/tidal/placement", {"pinned": ["m0", "m1"]})
    assert status == 200
    assert body == {"pinned": ["m0", "m1"], "loading": ["m0", "m1"], "rejected": {}}
    assert fleet(rt.url, since=generation)["generation"] > generation  # the pins are a change
    wait_for(lambda: all(fleet(rt.url)["models"][m]["state"] == "READY" for m in ("m0", "m1")))
    # m2 does not fit next to m0 and m1, and both are pinned: the on-demand load is refused.
    status, body = call("POST", f"{rt.url}/v2/repository/models/m2/load", {})
    assert status == 503 and "pinned: ['m0', 'm1']" in body["error"], body
    view = fleet(rt.url)["models"]
    assert [view[m]["state"] for m in ("m0", "m1", "m2")] == ["READY", "READY", "UNAVAILABLE"]
    # Unpinning is not unloading; but now m0 is an ordinary cache entry and may make room.
    status, body = call("PUT", f"{rt.url}/v2/tidal/placement", {"pinned": ["m1"]})
    assert body == {"pinned": ["m1"], "loading": [], "rejected": {}}
    assert fleet(rt.url)["models"]["m0"] == {**view["m0"], "pinned": False}
    infer(rt.url, "m2")
    view = fleet(rt.url)["models"]
    assert [view[m]["state"] for m in ("m0", "m1", "m2")] == ["UNAVAILABLE", "READY", "READY"]
    assert rt.metric("tidal_engine_cache_bytes", tier="gpu") <= size * 2.5


def test_pins_that_cannot_fit_together_are_rejected_with_the_reason(serve, three_models) -> None:
    entries, size = three_models
    rt = serve({"models": entries, "memory": {"engineCacheBudgetBytes": int(size * 2.5)}})
    for name in ("m0", "m1", "m2"):  # every size becomes known
        infer(rt.url, name)
    status, body = call("PUT", f"{rt.url}/v2/tidal/placement", {"pinned": ["m2", "m0", "m1"]})
    assert status == 200
    assert body["pinned"] == ["m2", "m0"]
    assert list(body["rejected"]) == ["m1"] and body["rejected"]["m1"].startswith("no-room")
    wait_for(lambda: fleet(rt.url)["models"]["m0"]["state"] == "READY")  # m1 made room for m0
    view = fleet(rt.url)["models"]
    assert [view[m]["pinned"] for m in ("m0", "m1", "m2")] == [True, False, True]
    assert view["m1"]["state"] == "UNAVAILABLE"


def test_a_model_larger_than_the_budget_reports_its_size(serve, three_models) -> None:
    # The operator reports a model too large only from a measured (or declared) size: a load
    # refused as larger than the whole budget still tells it.
    entries, size = three_models
    rt = serve({"models": entries[:1], "memory": {"engineCacheBudgetBytes": size // 2}})
    with pytest.raises(Exception, match="too-large"):
        infer(rt.url, "m0")
    view = fleet(rt.url)["models"]["m0"]
    assert view["state"] == "UNAVAILABLE" and view["sizeBytes"] == 0, view
    assert view["lastSizeBytes"] >= size // 2, view
    assert "too-large" in (view["lastError"] or ""), view


def test_a_failed_pinned_load_says_why_and_is_retried(serve, models, model_entry) -> None:
    broken = model_entry(models["mlp"], "broken", preload=False)
    broken["engines"][0]["sha256"] = "0" * 64
    rt = serve({"models": [model_entry(models["mlp"], "mlp"), broken]})
    status, body = call("PUT", f"{rt.url}/v2/tidal/placement", {"pinned": ["broken"]})
    assert (status, body["loading"]) == (200, ["broken"])
    wait_for(lambda: fleet(rt.url)["models"]["broken"]["lastError"] is not None)
    view = fleet(rt.url)["models"]["broken"]
    assert "sha256" in view["lastError"] and view["pinned"] is True
    assert rt.call(lambda: "broken" in rt.server.cache._pin_retry)  # a retry is scheduled
    call("PUT", f"{rt.url}/v2/tidal/placement", {"pinned": []})
    assert rt.call(lambda: "broken" not in rt.server.cache._pin_retry)  # unpinned: no retry


def activity(url: str, since: int | None = None, wait: float = 10.0) -> int:
    query = "" if since is None else f"?since={since}&wait={wait}"
    status, body = call("GET", f"{url}/v2/tidal/activity{query}", timeout=wait + 30)
    assert status == 200, body
    return int(body["arrivals"])


def test_activity_long_poll_answers_when_an_infer_request_arrives(
    serve, models, model_entry
) -> None:
    """The operator parks this long-poll on a quiet service's pods: the first request to
    arrive must answer it at once, not at the end of its wait."""
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    before = activity(rt.url)
    answers: list[int] = []
    poller = threading.Thread(target=lambda: answers.append(activity(rt.url, before, wait=100)))
    poller.start()
    infer(rt.url, "mlp")
    poller.join(60)  # well inside the poll's 100 s wait: only the arrival can have answered it
    assert answers, "the activity long-poll did not answer within 60 s of a request arriving"
    assert answers[0] > before, answers
    # No request: the poll answers after its wait with the same count.
    now = activity(rt.url)
    assert activity(rt.url, now, wait=0.2) == now
    status, body = call("GET", f"{rt.url}/v2/tidal/activity?since=x")
    assert status == 400 and "since" in body["error"], body


def test_the_view_reports_loads_queued_for_a_load_slot(serve, three_models) -> None:
    """Issue 30: loads accepted but not in residentBytes yet (queued for a load slot) are
    reported with their expected bytes (``pendingLoads``) and counted in ``loadQueue``, so that
    a gateway subtracts them from the free bytes; once loaded, neither names them."""
    entries, size = three_models
    rt = serve(
        {
            "models": entries,
            "memory": {"engineCacheBudgetBytes": str(4 * size)},
            "maxConcurrentLoads": 1,
            "faults": {"extraWarmupSeconds": 1.5},
        }
    )
    loads = [
        threading.Thread(target=call, args=("POST", f"{rt.url}/v2/repository/models/{m}/load", {}))
        for m in ("m0", "m1", "m2")
    ]
    for thread in loads:
        thread.start()
    seen: list[dict[str, Any]] = []

    def queued() -> bool:
        # Every load accepted (LOADING), one holds the load slot, two wait for it.
        seen.append(fleet(rt.url))
        states = {seen[-1]["models"][m]["state"] for m in ("m0", "m1", "m2")}
        return states == {"LOADING"} and seen[-1]["loadQueue"] == 2

    wait_for(queued, timeout=30)
    view = seen[-1]
    assert len(view["pendingLoads"]) >= 2, view  # the two queued (never loaded: 0 bytes)
    assert set(view["pendingLoads"]) <= {"m0", "m1", "m2"}
    for thread in loads:
        thread.join(60)
    done = fleet(rt.url)
    assert (done["loadQueue"], done["pendingLoads"]) == (0, {}), done
    assert done["residentBytes"] == 3 * size
