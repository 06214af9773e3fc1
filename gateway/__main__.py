"""Entry point: ``python -m tidal.gateway`` / ``tidal-gateway``.

Reads the configuration (exit code 2 at once, naming the field, when it is invalid), then serves
until SIGTERM/SIGINT, draining like the runtime (not ready at once, still serving for
``shutdownDrainSeconds``; a second signal exits at once).  Listen address from
``--host``/``--port`` or ``TIDAL_HOST``/``TIDAL_PORT`` (default ``0.0.0.0:8080``), and for OIP
v2 gRPC ``--grpc-port``/``TIDAL_GRPC_PORT`` (default 0: HTTP only); static
replicas from ``--replica URL`` (repeatable), else from ``PUT /v2/tidal/replicas``.
``--event-loop`` / ``TIDAL_EVENT_LOOP``: ``auto`` (default) runs on uvloop when it is installed
(a faster event loop; optional, not a dependency), ``asyncio`` never does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable

from pydantic import ValidationError

from .config import ConfigError, ReplicaRef, load_config, replica_from_url


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tidal-gateway",
        description="tidal model gateway: routes OIP v2 requests to the replica where the model "
        "is hot",
    )
    parser.add_argument("--config", help="YAML or JSON file (else TIDAL_GATEWAY_CONFIG_JSON)")
    parser.add_argument(
        "--replica",
        action="append",
        default=[],
        metavar="URL",
        help="a runtime replica, e.g. http://10.0.0.5:8080 (repeatable)",
    )
    parser.add_argument("--host", default=os.environ.get("TIDAL_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=None,
        help="also pass OIP v2 gRPC through on this port (else TIDAL_GRPC_PORT; 0: HTTP only)",
    )
    parser.add_argument("--log-level", default=os.environ.get("TIDAL_LOG_LEVEL", "INFO"))
    parser.add_argument(
        "--event-loop",
        choices=["auto", "asyncio", "uvloop"],
        default=os.environ.get("TIDAL_EVENT_LOOP", "auto"),
        help="auto: uvloop when installed",
    )
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
        replicas: list[ReplicaRef] = [replica_from_url(url) for url in args.replica]
        port = args.port if args.port is not None else int(os.environ.get("TIDAL_PORT", "8080"))
        grpc_port = (
            args.grpc_port
            if args.grpc_port is not None
            else int(os.environ.get("TIDAL_GRPC_PORT", "0") or "0")
        )
    except ConfigError as exc:
        print(f"tidal-gateway: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"tidal-gateway: invalid --replica: {exc.errors()[0]['msg']}", file=sys.stderr)
        return 2
    except ValueError:
        print(
            "tidal-gateway: invalid configuration: TIDAL_PORT and TIDAL_GRPC_PORT must be integers",
            file=sys.stderr,
        )
        return 2
    if not 0 <= grpc_port <= 65535:
        print(
            "tidal-gateway: invalid configuration: the gRPC port (--grpc-port, "
            f"TIDAL_GRPC_PORT) must be 0-65535, not {grpc_port}",
            file=sys.stderr,
        )
        return 2
    try:
        factory = loop_factory(args.event_loop)
    except ImportError:
        print("tidal-gateway: --event-loop uvloop: uvloop is not installed", file=sys.stderr)
        return 2
    if args.check_config:
        print("configuration is valid")
        return 0
    from .server import serve

    logging.getLogger("tidal.gateway").info(
        "event loop: %s", "uvloop" if factory is not None else "asyncio"
    )

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
            await serve(config, args.host, port, replicas, stop, grpc_port)

    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(run())
    return 0


def loop_factory(choice: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop factory for ``uvloop`` (ImportError if missing) and ``auto`` (if present)."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


if __name__ == "__main__":
    sys.exit(main())
