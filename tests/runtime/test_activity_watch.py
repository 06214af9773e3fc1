"""The operator's `ActivityWatch` against a real runtime: a quiet service's loop is poked at
the first request that reaches one of its pods (the runtime's ``GET /v2/tidal/activity``
long-poll), once; a pod that cannot answer leaves the service to its slow timer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp
import numpy as np
import tritonclient.http as triton

from tidal.operator.shell.activity import ActivityWatch
from tidal.sandbox.procs import free_port
from tidal.sandbox.wait import wait_for


def _infer(url: str) -> None:
    tensor = triton.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    triton.InferenceServerClient(url.removeprefix("http://")).infer("mlp", [tensor])


async def test_a_request_at_a_quiet_pod_pokes_the_loop_once(serve, models, model_entry) -> None:
    rt = serve({"models": [model_entry(models["mlp"], "mlp")]})
    url = rt.url if rt.url.startswith("http") else f"http://{rt.url}"
    pokes: list[float] = []
    poked = asyncio.Event()

    def poke() -> None:
        pokes.append(time.monotonic())
        poked.set()

    async with aiohttp.ClientSession() as session:
        watch = ActivityWatch("test", frozenset({url}), poke, lambda: session, 100)
        try:
            await asyncio.to_thread(
                wait_for, lambda: watch.parked or watch.done, timeout=30, what="a parked poll"
            )
            assert watch.parked, f"the long-poll was not parked within 30 s (done: {watch.done})"
            # Only an arrival can answer a poll that waits 100 s.
            await asyncio.to_thread(_infer, url)
            await asyncio.wait_for(poked.wait(), 60)
            await asyncio.wait_for(watch.task, 10)  # the watch ends with its poke
            assert not watch.parked and watch.woke
            await asyncio.to_thread(_infer, url)
            assert len(pokes) == 1, pokes
        finally:
            watch.cancel()


async def test_a_pod_that_cannot_answer_ends_the_watch_without_a_poke() -> None:
    pokes: list[Any] = []
    nobody = f"http://127.0.0.1:{free_port()}"
    async with aiohttp.ClientSession() as session:
        watch = ActivityWatch("test", frozenset({nobody}), lambda: pokes.append(1), lambda: session)
        await asyncio.wait_for(watch.task, 30)
    assert not pokes
