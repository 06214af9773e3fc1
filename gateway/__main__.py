"""Entry point: ``python -m tidal.gateway`` / ``tidal-gateway``.

Reads the configuration (exit code 2 at once, naming the field, when it is invalid), then serves
until SIGTERM/SIGINT, draining like the runtime (not ready at once, still serving for
``shutdownDrainSeconds``; a second signal exits at once): :func:`tidal.common.settings.run_process`,
shared with the runtime.  Listen address from ``--host``/``--port`` or ``TIDAL_HOST``/``TIDAL_PORT``
(default ``0.0.0.0:8080``), and for OIP v2 gRPC ``--grpc-port``/``TIDAL_GRPC_PORT`` (default 0:
HTTP only); static replicas from ``--replica URL`` (repeatable), else from
``PUT /v2/tidal/replicas``.  ``--event-loop`` / ``TIDAL_EVENT_LOOP``: ``auto`` (default) runs on
uvloop when it is installed (a faster event loop; optional, not a dependency), ``asyncio`` never
does.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable

from pydantic import ValidationError

from ..common.settings import ConfigError, Serving, run_process
from .config import GatewaySettings, ReplicaRef, load_config, replica_from_url


def start(settings: GatewaySettings) -> Serving | None:
    """The configuration and the replicas read, the event loop chosen; None after
    ``--check-config``."""
    config = load_config(settings.config)
    try:
        replicas: list[ReplicaRef] = [replica_from_url(url) for url in settings.replica]
    except ValidationError as exc:
        raise ConfigError(f"invalid --replica: {exc.errors()[0]['msg']}") from None
    try:
        factory = loop_factory(settings.event_loop)
    except ImportError:
        raise ConfigError("--event-loop uvloop: uvloop is not installed") from None
    if settings.check_config:
        return None
    from .server import serve

    logging.getLogger("tidal.gateway").info(
        "event loop: %s", "uvloop" if factory is not None else "asyncio"
    )

    async def run(stop: asyncio.Event) -> None:
        await serve(config, settings.host, settings.port, replicas, stop, settings.grpc_port)

    return Serving(run, factory)


def main(argv: list[str] | None = None) -> int:
    return run_process("tidal-gateway", GatewaySettings, argv, start)


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
