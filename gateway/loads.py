"""The loads the gateway asks replicas for (``POST /v2/repository/models/{m}/load``).

A load's expected bytes count on its replica from the ask to the answer
(:class:`~tidal.gateway.core.views.OwnLoads`). A 200 makes the model routable there before the
long-poll confirms it; a 503 (no room now) keeps loads of the model off that replica for
``refusedCooldownSeconds``, or until its next snapshot when it said which requests hold the
room; a 404 takes the model off the replica's list; any other answer is a load failure that the
requests held for the model get as their answer (a broken engine is not worth waiting for).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from .core.views import waiting_on, with_hot, without_model
from .replicas import Fleet, Replica

log = logging.getLogger("tidal.gateway")


@dataclass(frozen=True)
class LoadFailure:
    """A load that failed for a reason other than room (a broken engine): held requests get it."""

    at: float
    status: int
    body: bytes
    content_type: str


class Loads:
    """Starts loads on replicas and books their answers."""

    def __init__(self, fleet: Fleet, clock: Callable[[], float]) -> None:
        self.fleet = fleet
        self.config = fleet.config
        self.metrics = fleet.metrics
        self.clock = clock
        self._failures: dict[str, LoadFailure] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def failure(self, model: str, since: float) -> LoadFailure | None:
        """The last load failure of ``model`` at or after ``since`` (a hold's beginning)."""
        failure = self._failures.get(model)
        return failure if failure is not None and failure.at >= since else None

    def start(self, replica_name: str, model: str) -> None:
        replica = self.fleet.replicas.get(replica_name)
        if replica is None or model in replica.own_loads:
            return
        replica.own_loads = replica.own_loads.reserve(model, self.fleet.model_bytes(model))
        replica.invalidate()
        task = asyncio.create_task(self._load(replica, model), name=f"load-{model}@{replica_name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _load(self, replica: Replica, model: str) -> None:
        result = "error"
        timeout = max(self.config.upstream_timeout_seconds, self.config.hold_timeout_seconds)
        try:
            async with replica.session().post(
                f"{replica.url}/v2/repository/models/{model}/load",
                data=b"{}",
                headers={"Content-Type": "application/json"},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:
                data = await response.read()
                result = self._answered(replica, model, response, data)
        except (aiohttp.ClientError, OSError) as exc:
            self.fleet.mark_unhealthy(replica, f"load of {model}: {type(exc).__name__}: {exc}")
        except TimeoutError:
            log.warning("loading %s on %s: no answer within %.0f s", model, replica.name, timeout)
        finally:
            replica.own_loads = replica.own_loads.release(model)
            replica.invalidate()
            self.metrics.load_result[result].inc()
            self.fleet.changes.notify()

    def _answered(
        self, replica: Replica, model: str, response: aiohttp.ClientResponse, data: bytes
    ) -> str:
        """Book the replica's answer to a load; its result label."""
        if response.status == 200:
            replica.snapshot = with_hot(replica.snapshot, model)  # the long-poll confirms it
            return "ok"
        log.warning("loading %s on %s: %d %s", model, replica.name, response.status, data[:300])
        if response.status == 503:  # no room there now: try elsewhere for a while
            self.refuse(replica, model, until_change=bool(waiting_on(data)))
            return "refused"
        if response.status == 404:  # its configuration lacks the model after all
            replica.snapshot = without_model(replica.snapshot, model)
        else:
            content_type = response.headers.get("Content-Type", "application/json")
            self._failures[model] = LoadFailure(self.clock(), response.status, data, content_type)
        return "failed"

    def refuse(self, replica: Replica, model: str, until_change: bool = False) -> None:
        """Keep loads of ``model`` off ``replica`` for ``refusedCooldownSeconds``, or only
        until its next snapshot where it said which requests hold the room (``until_change``)."""
        replica.refused.add(model)
        if until_change:
            replica.refused_until_change.add(model)

        def forgive() -> None:
            replica.refused.discard(model)
            replica.refused_until_change.discard(model)
            replica.invalidate()
            self.fleet.changes.notify()

        asyncio.get_running_loop().call_later(self.config.refused_cooldown_seconds, forgive)
