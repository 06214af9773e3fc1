"""The burst buffer (issue 40): a herd is held at the gateway, not queued on the one ready
replica, and a replica that joins takes the held work at once.

Real runtime processes with an emulated device (100 ms a batch of at most 2 rows on one slot:
20 requests/s each, concurrency 2) behind a real gateway whose ``slotsPerConcurrency`` is 2:
at most 4 requests in flight to a replica, the rest wait in the gateway's line, oldest first.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gatewaytest import http, wait_for

HERD = 48
SLOTS = 4  # slotsPerConcurrency 2 x (1 batch slot x maxBatchSize 2)


def _paced(runtime_config: Any) -> dict[str, Any]:
    config = runtime_config(preload=("m0",), models=("m0",))
    config["models"][0]["maxBatchSize"] = 2
    config["faults"] = {"serviceTimeMs": 100, "maxConcurrentBatches": 1}
    return config


def test_a_herd_waits_in_the_gateway_and_a_new_replica_takes_it_at_once(
    gateway, runtimes, runtime_config
) -> None:
    first, second = runtimes(("pod-a", _paced(runtime_config)), ("pod-b", _paced(runtime_config)))
    served = gateway([first], slotsPerConcurrency=2.0, holdTimeoutSeconds=120)
    wait_for(lambda: served.hot_on("m0") == ["pod-a"], what="m0 hot on pod-a")

    # Sample each replica's requests in flight from the gateway while the herd runs.
    peak: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for name, replica in served.replicas().items():
                peak[name] = max(peak.get(name, 0), int(replica["outstanding"]))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with ThreadPoolExecutor(HERD) as pool:
        answers = [pool.submit(served.infer, "m0") for _ in range(HERD)]
        # The herd is in: pod-a serves 4 at a time, the gateway holds the rest.
        wait_for(
            lambda: served.metric("tidal_gateway_held_requests") >= HERD // 2,
            timeout=60,
            what="half the herd held at the gateway",
        )
        status, _, body = http(
            "PUT",
            f"{served.url}/v2/tidal/replicas",
            {"replicas": [{"name": r.name, "url": r.url} for r in (first, second)]},
        )
        assert status == 200, body
        results = [a.result(timeout=120) for a in answers]
    stop.set()
    sampler.join(5)

    codes = [status for status, _, _ in results]
    assert codes == [200] * HERD, f"answers {codes}"
    # No replica ever had more than its slots in flight: what did not fit waited here.
    assert max(peak.values()) <= SLOTS, f"peak in flight per replica {peak} (slots {SLOTS})"
    assert served.metric("tidal_gateway_slot_waits_total") >= HERD // 2, "slot waits counted"
    # The replica that joined took held work: its share of the herd is far from nothing.
    served_by_second = second.answered("m0")
    assert served_by_second >= HERD // 4, (
        f"pod-b answered {served_by_second} of {HERD} (pod-a {first.answered('m0')}), peak {peak}"
    )


def test_without_the_buffer_every_request_is_forwarded_at_once(gateway, runtimes, runtime_config):
    # slotsPerConcurrency 0 (the default outside the operator's burst buffer): no bound, no line.
    (only,) = runtimes(("pod-a", _paced(runtime_config)))
    served = gateway([only], holdTimeoutSeconds=60)
    wait_for(lambda: served.hot_on("m0") == ["pod-a"], what="m0 hot on pod-a")
    with ThreadPoolExecutor(12) as pool:
        codes = [s for s, _, _ in pool.map(lambda _: served.infer("m0"), range(12))]
    assert codes == [200] * 12, codes
    assert served.metric("tidal_gateway_slot_waits_total") == 0
