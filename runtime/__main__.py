"""Entry point: ``python -m tidal.runtime`` / ``tidal-runtime``.

Reads the configuration (exit code 2 at once, naming the field, when it is invalid), then serves
until SIGTERM/SIGINT.  Listen address from ``--host``/``--port`` or ``TIDAL_HOST``/``TIDAL_PORT``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys

from tidal.runtime.config import ConfigError, load_config

SWITCH_INTERVAL_S = 0.0002


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tidal-runtime", description="tidal inference runtime (Open Inference Protocol v2)"
    )
    parser.add_argument("--config", help="YAML or JSON file (else TIDAL_RUNTIME_CONFIG[_JSON])")
    parser.add_argument("--host", default=os.environ.get("TIDAL_HOST", "0.0.0.0"))
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--log-level", default=os.environ.get("TIDAL_LOG_LEVEL", "INFO"))
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
        port = args.port if args.port is not None else int(os.environ.get("TIDAL_PORT", "8080"))
    except ConfigError as exc:
        print(f"tidal-runtime: {exc}", file=sys.stderr)
        return 2
    except ValueError:
        print(
            "tidal-runtime: invalid configuration: TIDAL_PORT must be an integer", file=sys.stderr
        )
        return 2
    if args.check_config:
        print("configuration is valid")
        return 0
    try:
        from tidal.runtime.backends import make_backend

        backend = make_backend(config)  # fail fast (exit 2) when the backend cannot start at all
    except Exception as exc:
        print(f"tidal-runtime: backend {config.backend!r} cannot start: {exc}", file=sys.stderr)
        return 2
    from tidal.runtime.server import serve

    # The event loop hands batches to worker threads; with CPython's default 5 ms switch
    # interval a thread waiting for the GIL can stall a request by milliseconds.
    sys.setswitchinterval(SWITCH_INTERVAL_S)

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
            await serve(config, args.host, port, backend, stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
