"""tidal.common.offload: parses in a worker process; a worker that dies is a 503, not a hang."""

from __future__ import annotations

import asyncio
import os

import pytest

from tidal.common.body import BodyError, parse_json
from tidal.common.offload import Offload


def test_a_call_runs_in_a_worker_its_errors_come_back_and_a_dead_worker_is_replaced() -> None:
    async def scenario() -> None:
        offload = Offload(workers=1)
        try:
            assert await offload.run(os.getpid) != os.getpid(), "ran in this process"
            assert await offload.run(parse_json, b'{"a": [1]}', "the body") == {"a": [1]}
            with pytest.raises(BodyError) as caught:
                await offload.run(parse_json, b"[[]]", "the body", 2)
            assert caught.value.status == 413, caught.value.message
            with pytest.raises(BodyError) as caught:  # as the OOM killer would leave it
                await offload.run(os._exit, 1)
            assert caught.value.status == 503, caught.value.message
            assert await offload.run(len, b"abc") == 3, "no fresh worker after one died"
        finally:
            offload.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))
