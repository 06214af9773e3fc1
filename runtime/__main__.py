"""Entry point: ``python -m tidal.runtime`` / ``tidal-runtime``.

Reads the configuration (exit code 2 at once, naming the field, when it is invalid), then serves
until SIGTERM/SIGINT (:func:`tidal.common.settings.run_process`, shared with the gateway).
Listen address from ``--host``/``--port`` or ``TIDAL_HOST``/``TIDAL_PORT`` (HTTP, default 8080)
and ``--grpc-port``/``TIDAL_GRPC_PORT`` (gRPC, default 8081; 0: HTTP only).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time

from ..common.contract import RUNTIME_GRPC_PORT
from ..common.settings import ConfigError, Serving, run_process
from .config import RuntimeSettings, load_config

DEFAULT_GRPC_PORT = RUNTIME_GRPC_PORT


def start(settings: RuntimeSettings) -> Serving | None:
    """The configuration read and the backend started (fail fast: exit 2 when it cannot start
    at all); None after ``--check-config``."""
    config = load_config(settings.config)
    if settings.check_config:
        return None
    try:
        from .backends import make_backend

        backend = make_backend(config)
    except Exception as exc:
        raise ConfigError(f"backend {config.backend!r} cannot start: {exc}") from None
    # CPython's default GIL switch interval (5 ms) is kept. 0.2 ms was set here when every batch
    # went to a worker thread; fast batches now run on the event loop, and side by side (issue
    # 13, bench/results/servers-switchinterval-2026-12-03.txt) 0.2 ms did not help gRPC and cost
    # light-model HTTP throughput (from ~7 % to half, on a noisy machine); batches on the
    # worker thread (the batch model) showed no consistent difference.
    # The default gRPC port is taken when free; one asked for (flag or variable) must be bound.
    grpc_asked = settings.grpc_port is not None
    grpc_port = DEFAULT_GRPC_PORT if settings.grpc_port is None else settings.grpc_port
    host, port = settings.host, settings.port

    async def serve(stop: asyncio.Event) -> None:
        if grpc_port:
            from . import grpc_server

            await grpc_server.serve(
                config, host, port, grpc_port, backend, stop, grpc_optional=not grpc_asked
            )
        else:
            from .server import serve

            await serve(config, host, port, backend, stop)

    return Serving(serve)


def main(argv: list[str] | None = None) -> int:
    code = run_process("tidal-runtime", RuntimeSettings, argv, start)
    if code == 0:
        exit_past_stuck_workers(0)
    return code


# Worker threads of the engine loads (tidal.runtime.enginecache) and of ranged S3 reads
# (tidal.runtime.storage), and how long the exit waits for them once the server has stopped.
WORKER_PREFIXES = ("tidal-load", "tidal-s3")
WORKER_JOIN_SECONDS = 2.0


def exit_past_stuck_workers(code: int) -> None:
    """Exit now with ``code`` when a load's worker thread is still blocked after the shutdown.

    The shutdown cancels fetches (tidal.runtime.storage), but a read blocked inside the S3
    client (or a store that never sends its headers) only ends with its own timeouts, minutes
    on a stalled store, and the interpreter would wait for that thread before exiting: past the
    pod's grace period, into a SIGKILL. Nothing is left to save by then (the partial files were
    removed by the cancel), so such threads are left behind."""
    deadline = time.monotonic() + WORKER_JOIN_SECONDS
    workers = [t for t in threading.enumerate() if t.name.startswith(WORKER_PREFIXES)]
    for thread in workers:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in workers if t.is_alive()]
    if stuck:
        logging.getLogger("tidal.runtime").warning(
            "exiting past %d load worker(s) still blocked in a store: %s", len(stuck), stuck
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
