"""The engine cache: which models are resident on the device, loading them on demand.

Owns one :class:`Slot` per configured model and the budget.  Loads run at most
``maxConcurrentLoads`` at a time, in phases (fetch, deserialize, warmup) that are timed into
``tidal_engine_load_seconds``; a backend whose engines report finer phases (``load_phases``,
e.g. the torch backend's deserialize, stage, h2d and profile) has those observed instead of
one ``deserialize``.  A request that waits for a load observes, in
``tidal_transfer_wait_seconds``, how much of its wait overlapped the load's host->device weight
transfer (the ``stage`` and ``h2d`` phases, and ``faults.extraTransferSeconds``); backends
without a device transfer (ONNX Runtime on CPU) observe nothing there.  The budget is the
configured one less ``reserveBytes``, capped by the device's free memory at start when the
backend has a device (:func:`~tidal.runtime.core.engines.plan_cache_budget`).  Which engines to
evict comes from the pure :func:`~tidal.runtime.core.cache.plan_admission`; budget planning and
reservation happen without an ``await`` in between, so concurrent loads cannot overcommit.
Engines with requests queued or running (``refs > 0``) are never evicted.  A failed load
(missing file, checksum mismatch, incompatible or corrupt engine) releases its reservation and
leaves the slot unloaded.  At shutdown :meth:`EngineCache.cancel_loads` cancels the loads under
way and their fetches (a stalled store must not hold the exit up); their waiters get 503.

Fleet additions (the gateway and the operator's placement): a :class:`ChangeFeed` whose
generation bumps on every change of a model's state, of the pins or of a load starting or ending,
so that ``GET /v2/tidal/models`` can long-poll without polling loops; and **pins**
(:meth:`EngineCache.set_pins`): pinned models are loaded in the background (at most
``maxConcurrentLoads - 1`` at once, so an on-demand load always finds a free load slot when
``maxConcurrentLoads > 1``), retried with back-off while they fail, and never evicted to make
room for anything.  The host-warm tier's moves (engines staged off the device, and back) are
:mod:`tidal.runtime.tiers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..common.backoff import Backoff
from ..common.clock import Clock
from .backends import Backend, Engine, TensorSpec, warmup_inputs
from .config import ModelSpec, RuntimeConfig
from .core.cache import CacheEntry, make_policy, plan_admission
from .core.engines import (
    EngineDescriptor,
    EngineSelection,
    plan_cache_budget,
    select_engine,
)
from .errors import (
    EngineLoadError,
    ModelNotFound,
    Overloaded,
    ServingError,
    Unavailable,
)
from .metrics import RuntimeMetrics
from .storage import EngineStore

log = logging.getLogger("tidal.runtime.cache")

READY = "READY"
LOADING = "LOADING"
UNAVAILABLE = "UNAVAILABLE"


@dataclass
class Slot:
    spec: ModelSpec
    state: str = UNAVAILABLE
    engine: Engine | None = None
    size_bytes: int = 0
    last_used: float = 0.0
    loaded_at: float = 0.0
    uses: int = 0
    refs: int = 0
    load_seconds: float = 0.0
    loading: asyncio.Future[None] | None = None
    # The engine file fetched and verified for this model (uri, local path): a host-warm
    # engine. A later load of the same engine skips the fetch and the cold-load fault.
    staged: tuple[str, Path] | None = None
    last_error: str | None = None
    platform: str | None = None
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    first_request_pending: bool = False
    engine_uri: str | None = None
    history: list[str] = field(default_factory=list)
    # Fleet view (GET /v2/tidal/models).
    pinned: bool = False
    outstanding: int = 0  # infer requests received for this model and not yet answered
    requests: int = 0  # infer requests answered, cumulative
    # measured size of the last successful load (kept after eviction), or the size a load was
    # refused for as larger than the whole budget
    last_size_bytes: int = 0
    last_load_seconds: float = 0.0  # wall time of the last successful load, every phase
    # When the current (or last) load moved weights host->device: (start, end) on the cache's
    # clock, for the transfer wait of the requests that waited for it.
    transfers: list[tuple[float, float]] = field(default_factory=list)

    @property
    def fleet_state(self) -> str:
        """READY, LOADING (from the moment a load is started) or UNAVAILABLE."""
        if self.state == READY:
            return READY
        return LOADING if self.loading is not None else self.state


# Back-off of a pinned model whose background load failed: first retry, ceiling (seconds).
PIN_RETRY = Backoff(first_seconds=1.0, max_seconds=30.0)


class ChangeFeed:
    """A generation counter that waiters can block on until it moves (no polling)."""

    def __init__(self) -> None:
        self.generation = 0
        self._moved: asyncio.Event | None = None
        self.closed = False

    def bump(self) -> None:
        self.generation += 1
        if self._moved is not None:
            self._moved.set()
            self._moved = None

    def close(self) -> None:
        """Release every waiter now and from now on (the server is shutting down)."""
        self.closed = True
        self.bump()

    async def wait_past(self, since: int, wait_seconds: float) -> None:
        """Return once the generation differs from ``since``, or after ``wait_seconds``.

        "Differs", not "exceeds": a client that remembers a generation from before this process
        restarted (counting from 0 again) gets an answer at once instead of waiting.
        """
        if self.generation != since or self.closed or wait_seconds <= 0:
            return
        if self._moved is None:
            self._moved = asyncio.Event()
        moved = self._moved
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(moved.wait(), wait_seconds)


class EngineCache:
    def __init__(
        self,
        config: RuntimeConfig,
        backend: Backend,
        store: EngineStore,
        metrics: RuntimeMetrics,
        clock: Clock,
    ) -> None:
        self.config = config
        self.backend = backend
        self.store = store
        self.metrics = metrics
        self.clock = clock
        self.policy = make_policy(config.memory.eviction_policy)
        memory = backend.device_memory()
        # What the backend holds whatever is loaded (the torch backend: its streams' cuBLAS
        # workspaces and allocator slack) comes out of the configured budget: the budget bounds
        # everything the runtime adds on the device, not only the engines.
        self.overhead_bytes = int(getattr(backend, "overhead_bytes", 0) or 0)
        self.budget_plan = plan_cache_budget(
            max(0, config.memory.engine_cache_budget_bytes - self.overhead_bytes),
            config.memory.reserve_bytes,
            None if memory is None else memory.total_bytes - memory.used_bytes,
        )
        self.budget = self.budget_plan.bytes
        if self.budget_plan.reason != "configured":
            log.warning("engine cache budget %dB: %s", self.budget, self.budget_plan.reason)
        self.slots = {m.name: Slot(m) for m in config.models}
        self._loads = asyncio.Semaphore(config.max_concurrent_loads)
        self._load_pool = ThreadPoolExecutor(
            max_workers=config.max_concurrent_loads, thread_name_prefix="tidal-load"
        )
        self.changes = ChangeFeed()
        self._pin_loads = asyncio.Semaphore(max(1, config.max_concurrent_loads - 1))
        # Models whose load holds a load slot now (the rest of the accepted loads wait for one).
        self._running: set[str] = set()
        # Engines in use whose requests hold the room a refused load needs (`release`).
        self._room_waiters: set[str] = set()
        self._pin_tasks: dict[str, asyncio.Task[None]] = {}
        self._pin_retry: dict[str, asyncio.TimerHandle] = {}
        metrics.gpu_memory.labels("budget").set(self.budget)
        for name in self.slots:
            metrics.model_ready.labels(name).set(0)
        # "device": engines load onto the device and serve; "host": a host-warm standby — its
        # engines are fetched, verified and staged in host memory, none is on the device, and
        # requests are refused until it is promoted (:meth:`to_device`).
        self.tier = "device"
        self.last_tier_change: dict[str, Any] = {}
        # When the last request took an engine, and the token of a move to the host tier in
        # progress (None when there is none, or a promotion called it off).
        self.last_acquired = float("-inf")
        self.leaving: object | None = None
        self.closing = False  # shutting down: loads under way cancelled, no new ones
        self.publish()

    def slot(self, name: str) -> Slot:
        try:
            return self.slots[name]
        except KeyError:
            raise ModelNotFound(f"unknown model {name!r}") from None

    # -- requests -----------------------------------------------------------------------------

    async def acquire(self, name: str) -> tuple[Engine, bool]:
        """Pin the model's engine for one request, loading it if needed; returns (engine, cold)."""
        slot = self.slot(name)
        if self.tier != "device":
            raise Unavailable(
                "this replica is a host-warm standby: its engines are not on the device "
                '(PUT /v2/tidal/tier {"tier": "device"} promotes it)',
                retry_after=1,
            )
        slot.refs += 1
        self.last_acquired = self.clock.monotonic()
        cold = slot.state != READY
        try:
            if cold:
                self.metrics.cache_misses.labels(name).inc()
                waited_from = self.clock.monotonic()
                await self.ensure_loaded(name, on_demand=True)
                self._observe_transfer_wait(slot, waited_from, self.clock.monotonic())
            else:
                self.metrics.cache_hits.labels(name).inc()
        except BaseException:
            self.release(name)
            raise
        slot.last_used = self.clock.monotonic()
        slot.uses += 1
        assert slot.engine is not None
        return slot.engine, cold

    def _observe_transfer_wait(self, slot: Slot, start: float, end: float) -> None:
        """The part of a request's wait for a load spent on the load's weight transfer."""
        if not slot.transfers:
            return  # no device transfer (a CPU backend): no sample rather than a zero
        waited = sum(max(0.0, min(b, end) - max(a, start)) for a, b in slot.transfers)
        self.metrics.transfer_wait.labels(slot.spec.name).observe(waited)

    def release(self, name: str) -> None:
        slot = self.slots[name]
        slot.refs -= 1
        if slot.refs == 0 and name in self._room_waiters:
            # A load was refused for the room this engine's requests held: the long-poll
            # moves now, so that the gateway asks again at once (issue 45).
            self._room_waiters.discard(name)
            self.changes.bump()

    def take_first_request(self, name: str) -> bool:
        """True once after each on-demand load: that request's latency is the cold start."""
        slot = self.slots[name]
        first, slot.first_request_pending = slot.first_request_pending, False
        return first

    # -- loading ------------------------------------------------------------------------------

    async def ensure_loaded(self, name: str, *, on_demand: bool = False) -> None:
        slot = self.slot(name)
        if slot.state == READY:
            return
        if self.closing:
            raise Unavailable("the runtime is shutting down", retry_after=1)
        if slot.loading is None:
            slot.loading = asyncio.ensure_future(self._load(slot, on_demand))
            self.changes.bump()
        loading = slot.loading
        try:
            await asyncio.shield(loading)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if loading.cancelled() and self.closing and not (task and task.cancelling()):
                # The load was called off by the shutdown, not this waiter: a 503 to answer.
                raise Unavailable(
                    f"model {name!r}: its load was cancelled, the runtime is shutting down",
                    retry_after=1,
                ) from None
            raise

    async def phase(
        self, slot: Slot, phase: str | None, func: Any, *args: Any, observe: bool = True
    ) -> Any:
        started = self.clock.monotonic()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._load_pool, func, *args)
        finally:
            elapsed = self.clock.monotonic() - started
            slot.load_seconds += elapsed
            if observe:
                self.metrics.engine_load.labels(slot.spec.name, phase).observe(elapsed)

    async def _deserialize(self, slot: Slot, *args: Any) -> Engine:
        """backend.load, observed as its own phases when the engine reports them."""
        started = self.clock.monotonic()
        try:
            engine: Engine = await self.phase(
                slot, "deserialize", self.backend.load, *args, observe=False
            )
        except BaseException:
            self.metrics.engine_load.labels(slot.spec.name, "deserialize").observe(
                self.clock.monotonic() - started
            )
            raise
        ended = self.clock.monotonic()
        phases = getattr(engine, "load_phases", None)
        if not phases:
            phases = {"deserialize": ended - started}
        for phase, seconds in phases.items():
            self.metrics.engine_load.labels(slot.spec.name, phase).observe(seconds)
        # The torch backend stages and copies the weights last, then profiles and captures its
        # graphs: the transfer ends `profile` + `graphs` seconds before backend.load returned.
        transfer = phases.get("stage", 0.0) + phases.get("h2d", 0.0)
        if transfer > 0:
            end = ended - phases.get("profile", 0.0) - phases.get("graphs", 0.0)
            slot.transfers.append((end - transfer, end))
        return engine

    async def _slow_transfer(self, slot: Slot) -> None:
        """``faults.extraTransferSeconds``: a slow or contended host->device path."""
        seconds = self.config.faults.extra_transfer_seconds
        if not seconds:
            return
        started = self.clock.monotonic()
        await asyncio.sleep(seconds)
        ended = self.clock.monotonic()
        slot.load_seconds += ended - started
        slot.transfers.append((started, ended))
        self.metrics.engine_load.labels(slot.spec.name, "h2d").observe(ended - started)

    def _entries(self, exclude: str) -> list[CacheEntry]:
        return [
            CacheEntry(
                name=s.spec.name,
                size_bytes=s.size_bytes,
                last_used=s.last_used,
                loaded_at=s.loaded_at,
                uses=s.uses,
                in_use=s.refs > 0 or s.state == LOADING,
                load_seconds=s.load_seconds,
                pinned=s.pinned,
            )
            for s in self.slots.values()
            if s.spec.name != exclude and s.state in (READY, LOADING)
        ]

    def _reserve(self, slot: Slot, nbytes: int) -> None:
        """Make room for ``nbytes`` by evicting, then account them to ``slot`` (no await)."""
        plan = plan_admission(
            self._entries(slot.spec.name), nbytes, self.budget, self.policy, self.clock.monotonic()
        )
        slot.history.append(plan.reason)
        if not plan.admit:
            if plan.reason.startswith("too-large"):
                # Its size is known now, even though it never loads: the operator reports it
                # too large from this (``lastSizeBytes``), never from a guess.
                slot.last_size_bytes = max(slot.last_size_bytes, nbytes)
                raise EngineLoadError(f"model {slot.spec.name!r}: {plan.reason}")
            if plan.waiting_on:  # room once their requests end: say so when they do
                self._room_waiters.update(plan.waiting_on)
            raise Overloaded(
                f"model {slot.spec.name!r} cannot load now: {plan.reason}",
                retry_after=1,
                waiting_on=plan.waiting_on,
            )
        for victim in plan.evict:
            self._evict(self.slots[victim], reason=plan.reason)
        slot.size_bytes = nbytes
        self.publish()

    async def _load(self, slot: Slot, on_demand: bool) -> None:
        spec = slot.spec
        engine: Engine | None = None
        try:
            async with self._loads:
                self._running.add(spec.name)
                self.changes.bump()  # the load queue moved (GET /v2/tidal/models reports it)
                slot.load_seconds = 0.0
                slot.transfers = []
                load_started = self.clock.monotonic()
                chosen, sha, selection = self.choose(spec)
                staged = slot.staged is not None and slot.staged[0] == chosen.uri
                if slot.staged is not None and staged:
                    path = slot.staged[1]
                else:
                    path = await self.phase(slot, "fetch", self.store.fetch, chosen.uri, sha)
                    slot.staged = (chosen.uri, path)
                self.metrics.cache_bytes.labels("host").set(self.store.host_bytes())
                estimate = self.backend.estimate_bytes(path, chosen)
                if slot.engine_uri == chosen.uri:
                    # Reloading an engine measured before: reserve what it really took (weights,
                    # I/O, workspace, graphs), so the load itself never runs past the budget.
                    estimate = max(estimate, slot.last_size_bytes)
                self._reserve(slot, estimate)
                slot.state = LOADING
                self.changes.bump()
                available = self.budget - sum(e.size_bytes for e in self._entries(spec.name))
                engine = await self._deserialize(slot, path, chosen, spec, available)
                if engine.size_bytes > estimate:
                    self._reserve(slot, engine.size_bytes)
                slot.size_bytes = engine.size_bytes
                await self._slow_transfer(slot)
                await self.phase(slot, "warmup", self._warm_up, engine, spec)
                if self.config.faults.extra_warmup_seconds and not staged:
                    # The emulated cold cost (a large engine's deserialize and first runs): a
                    # host-warm engine has paid it already.
                    await asyncio.sleep(self.config.faults.extra_warmup_seconds)
                self._mark_ready(slot, engine, chosen.uri, load_started, on_demand)
                log.info("loaded %s from %s (%s)", spec.name, chosen.uri, selection.reason)
        except BaseException as exc:
            if engine is not None and slot.engine is not engine:
                engine.close()
            slot.state = UNAVAILABLE
            slot.engine = None
            slot.size_bytes = 0
            slot.last_error = str(exc)
            log.warning("loading %s failed: %s", spec.name, exc)
            if isinstance(exc, ServingError | asyncio.CancelledError):
                raise
            raise EngineLoadError(f"model {spec.name!r} failed to load: {exc}") from exc
        finally:
            slot.loading = None
            self._running.discard(spec.name)
            self.publish()
            self.changes.bump()

    def _mark_ready(
        self, slot: Slot, engine: Engine, uri: str, load_started: float, on_demand: bool
    ) -> None:
        """A load finished: ``engine`` serves the slot's model from now on."""
        slot.engine = engine
        slot.engine_uri = uri
        slot.platform = engine.platform
        slot.inputs, slot.outputs = engine.inputs, engine.outputs
        slot.state = READY
        slot.loaded_at = slot.last_used = self.clock.monotonic()
        slot.last_error = None
        slot.first_request_pending = on_demand
        slot.last_size_bytes = slot.size_bytes
        slot.last_load_seconds = slot.loaded_at - load_started
        self.metrics.model_ready.labels(slot.spec.name).set(1)

    def choose(self, spec: ModelSpec) -> tuple[EngineDescriptor, str | None, EngineSelection]:
        """The engine of ``spec`` this backend runs, its sha256, and why it was chosen."""
        # Names were validated with the configuration; describing them cannot fail.
        descriptors = [e.descriptor() for e in spec.engines]
        selection = select_engine(descriptors, self.backend.target(spec))
        if selection.chosen is None:
            raise EngineLoadError(f"model {spec.name!r}: {selection.reason}")
        chosen = selection.chosen
        return chosen, next(e.sha256 for e in spec.engines if e.uri == chosen.uri), selection

    def _warm_up(self, engine: Engine, spec: ModelSpec) -> None:
        for batch_size in spec.warmup.batch_sizes:
            inputs = warmup_inputs(engine, batch_size)
            for _ in range(spec.warmup.iterations):
                engine.infer(inputs)

    def _evict(self, slot: Slot, reason: str) -> None:
        log.info("evicting %s (%s)", slot.spec.name, reason)
        self.take_off(slot)
        self.metrics.cache_evictions.labels(slot.spec.name).inc()
        self.changes.bump()

    async def unload(self, name: str) -> None:
        slot = self.slot(name)
        if slot.loading is not None:
            await asyncio.shield(slot.loading)
        if slot.refs > 0:
            raise Overloaded(f"model {name!r} has requests in flight; retry", retry_after=1)
        self.take_off(slot)
        self.publish()
        self.changes.bump()

    def take_off(self, slot: Slot) -> None:
        """Close the slot's engine (if any): the model is no longer on the device."""
        if slot.engine is not None:
            slot.engine.close()
        slot.engine = None
        slot.state = UNAVAILABLE
        slot.size_bytes = 0
        self.metrics.model_ready.labels(slot.spec.name).set(0)

    # -- pins (fleet placement) ---------------------------------------------------------------

    def set_pins(self, names: list[str]) -> tuple[list[str], dict[str, str]]:
        """Make ``names`` the whole pinned set (level-triggered); returns (pinned, rejected).

        Every name must be configured (the caller checks).  A model is rejected, and not pinned,
        when its last measured size alone exceeds the budget, or when it would take the pinned
        models' known sizes together past the budget (earlier names win).  A model never loaded
        has no known size yet and is accepted; if it then cannot fit, its background load fails
        and says why in ``lastError``.  Models left out are unpinned, not unloaded.
        """
        accepted: list[str] = []
        rejected: dict[str, str] = {}
        total = 0
        for name in dict.fromkeys(names):
            size = self.slots[name].last_size_bytes
            if size > self.budget:
                rejected[name] = f"too-large: {size}B exceeds the cache budget of {self.budget}B"
            elif total + size > self.budget:
                rejected[name] = (
                    f"no-room: the models pinned before it need {total}B of the "
                    f"{self.budget}B budget, it needs {size}B more"
                )
            else:
                accepted.append(name)
                total += size
        wanted = set(accepted)
        changed = False
        for name, slot in self.slots.items():
            if slot.pinned != (name in wanted):
                slot.pinned = name in wanted
                changed = True
            if not slot.pinned and name in self._pin_retry:
                self._pin_retry.pop(name).cancel()
        if changed:
            self.changes.bump()
        for name in accepted:
            self._schedule_pin(name)
        return accepted, rejected

    def pins_loading(self) -> list[str]:
        """Pinned models that are not resident yet (loading, queued to load, or retrying)."""
        return [n for n, s in self.slots.items() if s.pinned and s.state != READY]

    def _schedule_pin(self, name: str, delay: float = PIN_RETRY.first_seconds) -> None:
        """Start the background load of a pinned model unless it is resident or under way."""
        slot = self.slots[name]
        if not slot.pinned or slot.state == READY or name in self._pin_tasks:
            return
        if name in self._pin_retry:
            self._pin_retry.pop(name).cancel()
        self._pin_tasks[name] = asyncio.create_task(
            self._load_pinned(name, delay), name=f"pin-{name}"
        )

    async def _load_pinned(self, name: str, delay: float) -> None:
        slot = self.slots[name]
        failed = False
        try:
            async with self._pin_loads:
                if slot.pinned:
                    await self.ensure_loaded(name, on_demand=False)
        except ServingError as exc:
            log.warning("pinned model %s did not load (retry in %.0f s): %s", name, delay, exc)
            failed = True
        finally:
            self._pin_tasks.pop(name, None)
        if failed and slot.pinned:
            self._pin_retry[name] = asyncio.get_running_loop().call_later(
                delay, self._schedule_pin, name, PIN_RETRY.after(delay)
            )

    def publish(self) -> None:
        resident = sum(s.size_bytes for s in self.slots.values() if s.state in (READY, LOADING))
        self.metrics.cache_bytes.labels("gpu").set(resident)
        memory = self.backend.device_memory()
        if memory is not None:
            self.metrics.gpu_memory.labels("total").set(memory.total_bytes)
            self.metrics.gpu_memory.labels("used").set(memory.used_bytes)

    def resident_bytes(self) -> int:
        return sum(s.size_bytes for s in self.slots.values() if s.state in (READY, LOADING))

    def pending_loads(self) -> dict[str, int]:
        """Loads accepted whose bytes are not in :meth:`resident_bytes` yet (queued for a load
        slot, or fetching): each model's expected bytes, its last measured size (0: unknown).

        A gateway that subtracted only ``residentBytes`` from the budget saw the same free bytes
        for every load of a burst and sent them all here (issue 30)."""
        return {
            name: s.last_size_bytes
            for name, s in self.slots.items()
            if s.loading is not None and s.state not in (READY, LOADING)
        }

    def load_queue(self) -> int:
        """Loads accepted and waiting for one of the ``maxConcurrentLoads`` load slots."""
        return sum(
            1 for n, s in self.slots.items() if s.loading is not None and n not in self._running
        )

    def cancel_loads(self) -> None:
        """Shutting down: cancel the fetches and loads under way and start none (those waiting
        for them get 503), so that a stalled store cannot hold the exit up."""
        self.closing = True
        self.store.close()
        for task in self._pin_tasks.values():
            task.cancel()
        for slot in self.slots.values():
            if slot.loading is not None:
                slot.loading.cancel()

    def close(self) -> None:
        self.changes.close()
        for timer in self._pin_retry.values():
            timer.cancel()
        for task in self._pin_tasks.values():
            task.cancel()
        for slot in self.slots.values():
            if slot.engine is not None:
                slot.engine.close()
                slot.engine = None
        self._load_pool.shutdown(wait=False, cancel_futures=True)
