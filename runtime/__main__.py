"""Entry point: ``python -m tidal.runtime`` / ``tidal-runtime``.

Reads the configuration (exit code 2 at once, naming the field, when it is invalid), then serves
until SIGTERM/SIGINT.  Listen address from ``--host``/``--port`` or ``TIDAL_HOST``/``TIDAL_PORT``
(HTTP, default 8080) and ``--grpc-port``/``TIDAL_GRPC_PORT`` (gRPC, default 8081; 0: HTTP only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
import time

from tidal.common.contract import (
    ENV_GRPC_PORT,
    ENV_HOST,
    ENV_LOG_LEVEL,
    ENV_PORT,
    RUNTIME_GRPC_PORT,
    RUNTIME_HTTP_PORT,
)

from .config import ConfigError, load_config

DEFAULT_GRPC_PORT = RUNTIME_GRPC_PORT


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tidal-runtime", description="tidal inference runtime (Open Inference Protocol v2)"
    )
    parser.add_argument("--config", help="YAML or JSON file (else TIDAL_RUNTIME_CONFIG[_JSON])")
    parser.add_argument("--host", default=os.environ.get(ENV_HOST, "0.0.0.0"))
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help=f"OIP v2 gRPC port (else TIDAL_GRPC_PORT, else {DEFAULT_GRPC_PORT}); 0: no gRPC",
    )
    parser.add_argument("--log-level", default=os.environ.get(ENV_LOG_LEVEL, "INFO"))
    parser.add_argument(
        "--check-config", action="store_true", help="validate the configuration and exit"
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = load_config(args.config)
        port = (
            args.port
            if args.port is not None
            else int(os.environ.get(ENV_PORT, str(RUNTIME_HTTP_PORT)))
        )
    except ConfigError as exc:
        print(f"tidal-runtime: {exc}", file=sys.stderr)
        return 2
    except ValueError:
        print(
            "tidal-runtime: invalid configuration: TIDAL_PORT must be an integer", file=sys.stderr
        )
        return 2
    # The default gRPC port is taken when free; one asked for (flag or variable) must be bound.
    grpc_text = os.environ.get(ENV_GRPC_PORT, "")
    grpc_asked = args.grpc_port is not None or bool(grpc_text)
    try:
        grpc_port = (
            args.grpc_port if args.grpc_port is not None else int(grpc_text or DEFAULT_GRPC_PORT)
        )
    except ValueError:
        grpc_port = -1
    if not 0 <= grpc_port <= 65535:
        print(
            "tidal-runtime: invalid configuration: the gRPC port (--grpc-port, "
            "TIDAL_GRPC_PORT) must be an integer in 0..65535",
            file=sys.stderr,
        )
        return 2
    if args.check_config:
        print("configuration is valid")
        return 0
    try:
        from .backends import make_backend

        backend = make_backend(config)  # fail fast (exit 2) when the backend cannot start at all
    except Exception as exc:
        print(f"tidal-runtime: backend {config.backend!r} cannot start: {exc}", file=sys.stderr)
        return 2
    # CPython's default GIL switch interval (5 ms) is kept. 0.2 ms was set here when every batch
    # went to a worker thread; fast batches now run on the event loop, and side by side (issue
    # 13, bench/results/servers-switchinterval-2026-12-03.txt) 0.2 ms did not help gRPC and cost
    # light-model HTTP throughput (from ~7 % to half, on a noisy machine); batches on the
    # worker thread (the batch model) showed no consistent difference.

    async def run() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        stop = asyncio.Event()

        def on_signal() -> None:
            if stop.is_set():  # a second signal: stop draining, exit now
                task.cancel()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        with contextlib.suppress(asyncio.CancelledError):
            if grpc_port:
                from . import grpc_server

                await grpc_server.serve(
                    config, args.host, port, grpc_port, backend, stop, grpc_optional=not grpc_asked
                )
            else:
                from .server import serve

                await serve(config, args.host, port, backend, stop)

    try:
        asyncio.run(run())
    except OSError as exc:  # a port that cannot be bound
        print(f"tidal-runtime: {exc}", file=sys.stderr)
        return 2
    exit_past_stuck_workers(0)
    return 0


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
