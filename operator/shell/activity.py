"""Traffic coming back to a quiet service, pushed: a long-poll per pod of the runtime's
``GET /v2/tidal/activity`` (the count of infer requests that arrived, over every transport).

A quiet control loop (``core.idle.is_quiet``) ticks on events and a slow timer only. Events of
the API (a pod or spec change) and the activator's held count wake it at once; this watch adds
the last kind: the first request to reach one of its pods answers that pod's parked long-poll,
and the loop is poked and ticks within milliseconds instead of up to ``quiet_tick_seconds``
later. The cost of a quiet service is then one idle connection per pod, renewed every
``wait_seconds``: no CPU in between, no API call.

A pod that cannot answer (an older runtime: 404; unreachable) leaves the service to its slow
timer; the next quiet tick starts the watch again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from . import metrics

log = logging.getLogger(__name__)

# How long one long-poll waits for a request before it is renewed (the runtime's own cap is
# 120 s).
ACTIVITY_WAIT_SECONDS = 60.0


class ActivityWatch:
    """Long-polls of one quiet service's pods; ``on_arrival`` is called once, at the first
    request any of them receives, and the watch then ends."""

    def __init__(
        self,
        name: str,
        urls: frozenset[str],
        on_arrival: Callable[[], None],
        session: Callable[[], aiohttp.ClientSession],
        wait_seconds: float = ACTIVITY_WAIT_SECONDS,
    ) -> None:
        self.urls = urls
        self.on_arrival = on_arrival
        self.session = session
        self.wait_seconds = wait_seconds
        self.woke = False
        self._parked: set[str] = set()
        self.task = asyncio.create_task(self._watch_all(), name=f"activity {name}")

    @property
    def done(self) -> bool:
        return self.task.done()

    @property
    def parked(self) -> bool:
        """Every pod's long-poll is waiting (each read its starting count, none ended): a
        request to any of them wakes the loop."""
        return not self.task.done() and len(self._parked) == len(self.urls)

    def cancel(self) -> None:
        self.task.cancel()

    async def _watch_all(self) -> None:
        await asyncio.gather(*(self._watch(url) for url in sorted(self.urls)))

    async def _watch(self, url: str) -> None:
        session = self.session()
        try:
            seen = await self._arrivals(session, url, None)
            if seen is None:
                return
            self._parked.add(url)
            while not self.woke:
                now = await self._arrivals(session, url, seen)
                if now is None:
                    return
                if now != seen:
                    if not self.woke:
                        self.woke = True
                        metrics.ACTIVITY_WAKES.inc()
                        self.on_arrival()
                    return
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError, TypeError) as exc:
            log.debug("activity of %s: %s", url, exc)
        finally:
            self._parked.discard(url)

    async def _arrivals(
        self, session: aiohttp.ClientSession, url: str, since: int | None
    ) -> int | None:
        """The pod's arrival count (with ``since``: once it differs, or after the wait);
        None when the pod has no such endpoint."""
        params = {} if since is None else {"since": str(since), "wait": str(self.wait_seconds)}
        timeout = aiohttp.ClientTimeout(total=(5.0 if since is None else self.wait_seconds + 10))
        async with session.get(f"{url}/v2/tidal/activity", params=params, timeout=timeout) as r:
            if r.status != 200:
                log.debug("activity of %s: HTTP %d (an older runtime?)", url, r.status)
                return None
            body = await r.json(content_type=None)
        return int(body["arrivals"])


class ActivityWatches:
    """The watches of every quiet service, on a session of their own: parked long-polls must
    not take the scrapes' connections."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    def keep(
        self,
        name: str,
        watch: ActivityWatch | None,
        urls: frozenset[str],
        on_arrival: Callable[[], None],
    ) -> ActivityWatch | None:
        """The watch of ``urls`` (none: no watch): ``watch`` while it watches those pods and
        has not ended, else a new one."""
        if watch is not None and (watch.urls != urls or watch.done or watch.woke):
            watch.cancel()
            watch = None
        if urls and watch is None:
            watch = ActivityWatch(name, urls, on_arrival, self.session)
        return watch

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
