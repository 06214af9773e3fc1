"""The periodic resync's glue (``handlers._resync_forever``): every InferenceService is
enqueued with ``force`` once a period, each at its own offset (the spreading itself is the
pure ``drift.resync_due``, tested in test_drift.py)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tidal.operator.shell import handlers
from tidal.operator.shell.handlers import OperatorSettings, Runtime
from tidal.operator.shell.reconciler import Key, Store


class RecordingQueue:
    def __init__(self, keys: set[Key]) -> None:
        self.keys = keys
        self.added: list[tuple[Key, bool]] = []
        self.all_seen = asyncio.Event()

    async def add(self, key: Key, *, force: bool = False) -> None:
        self.added.append((key, force))
        if {k for k, _ in self.added} >= self.keys:
            self.all_seen.set()


async def test_resync_enqueues_every_service_with_force(monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store()
    keys = {("ns", f"svc-{i}") for i in range(20)}
    for ns, name in keys:
        store.put_service({"metadata": {"namespace": ns, "name": name}})
    queue = RecordingQueue(keys)
    runtime = Runtime(settings=OperatorSettings(resync_seconds=0.5), store=store)
    runtime.queue = queue  # type: ignore[assignment]
    monkeypatch.setattr(handlers, "RUNTIME", runtime)
    task = asyncio.create_task(handlers._resync_forever())
    try:
        # Generous: a loaded machine starves the loop (the period is 0.5 s).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(queue.all_seen.wait(), 60.0)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    seen = {key for key, _ in queue.added}
    assert seen == keys, f"never enqueued: {sorted(keys - seen)}"
    assert all(force for _, force in queue.added), queue.added
