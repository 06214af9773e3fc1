"""The coalescing work queue: no concurrent reconciles of a key, no lost updates."""

from __future__ import annotations

import asyncio

from tidal.operator.shell.workqueue import WorkQueue


async def test_adds_of_a_waiting_key_coalesce() -> None:
    seen: list[tuple[str, bool]] = []
    gate = asyncio.Event()

    async def handle(key: str, force: bool) -> None:
        await gate.wait()
        seen.append((key, force))

    queue: WorkQueue[str] = WorkQueue(handle, workers=1)
    await queue.add("a")
    await queue.add("b")
    await queue.add("b", force=True)
    await queue.add("b")
    queue.start()
    gate.set()
    await asyncio.sleep(0.05)
    await queue.stop()
    assert seen == [("a", False), ("b", True)]


async def test_a_key_added_while_running_runs_again_but_never_concurrently() -> None:
    running: set[str] = set()
    overlaps = 0
    runs = 0
    release = asyncio.Event()

    async def handle(key: str, force: bool) -> None:
        nonlocal overlaps, runs
        if key in running:
            overlaps += 1
        running.add(key)
        runs += 1
        if runs == 1:
            await release.wait()
        running.discard(key)

    queue: WorkQueue[str] = WorkQueue(handle, workers=4)
    queue.start()
    await queue.add("a")
    await asyncio.sleep(0.01)
    await queue.add("a")  # arrives during the first run
    await queue.add("a")
    release.set()
    await asyncio.sleep(0.05)
    await queue.stop()
    assert overlaps == 0
    assert runs == 2


async def test_failed_key_is_retried_after_the_delay() -> None:
    attempts = 0

    async def handle(key: str, force: bool) -> float | None:
        nonlocal attempts
        attempts += 1
        return 0.01 if attempts < 3 else None

    queue: WorkQueue[str] = WorkQueue(handle, workers=1)
    queue.start()
    await queue.add("a")
    await asyncio.sleep(0.2)
    await queue.stop()
    assert attempts == 3


async def test_a_crashing_handler_does_not_kill_the_worker() -> None:
    seen: list[str] = []

    async def handle(key: str, force: bool) -> None:
        if key == "bad":
            raise RuntimeError("bug")
        seen.append(key)

    queue: WorkQueue[str] = WorkQueue(handle, workers=1)
    queue.start()
    await queue.add("bad")
    await queue.add("good")
    await asyncio.sleep(0.05)
    queue.forget("bad")
    await queue.stop()
    assert seen == ["good"]


async def test_depth_is_reported() -> None:
    depths: list[int] = []

    async def handle(key: str, force: bool) -> None:
        return None

    queue: WorkQueue[str] = WorkQueue(handle, workers=1, on_depth=depths.append)
    await queue.add("a")
    await queue.add("b")
    assert len(queue) == 2
    queue.start()
    await asyncio.sleep(0.02)
    await queue.stop()
    assert depths[:2] == [1, 2]
    assert depths[-1] == 0
