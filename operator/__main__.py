"""``tidal-operator``: the operator process (kopf), configured from environment and flags.

Every flag has an environment variable (flags win):

==========================  ===================================  =========================
flag                        environment                          default
==========================  ===================================  =========================
``--namespace NS`` (many)   ``TIDAL_OPERATOR_NAMESPACES`` (a,b)  cluster-wide
``--workers N``             ``TIDAL_OPERATOR_WORKERS``           4
``--resync-seconds S``      ``TIDAL_OPERATOR_RESYNC_SECONDS``    300
``--tick-seconds S``        ``TIDAL_OPERATOR_TICK_SECONDS``      1 (control loop, <= 1)
``--prometheus-url URL``    ``TIDAL_PROMETHEUS_URL``             none: pod scrapes only
``--metrics-port P``        ``TIDAL_OPERATOR_METRICS_PORT``      8081 (0: off)
``--health-port P``         ``TIDAL_OPERATOR_HEALTH_PORT``       8082 (0: off) ``/healthz``
``--bind-address A``        ``TIDAL_OPERATOR_BIND_ADDRESS``      0.0.0.0
``--log-format F``          ``TIDAL_OPERATOR_LOG_FORMAT``        json (json, full, plain)
``--verbose``/``--debug``   ``TIDAL_OPERATOR_LOG_LEVEL``         info
==========================  ===================================  =========================

Credentials: in-cluster service account, else ``KUBECONFIG``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping

import kopf
from prometheus_client import start_http_server

from tidal.operator.shell import handlers


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    return int(env.get(name, "") or default)


def parse_args(argv: list[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tidal-operator", description=__doc__.split("\n\n")[0])
    env_ns = [n for n in env.get("TIDAL_OPERATOR_NAMESPACES", "").split(",") if n.strip()]
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        default=None,
        help="watch only this namespace (repeatable); default: the whole cluster",
    )
    p.add_argument("--workers", type=int, default=_env_int(env, "TIDAL_OPERATOR_WORKERS", 4))
    p.add_argument(
        "--resync-seconds",
        type=float,
        default=float(env.get("TIDAL_OPERATOR_RESYNC_SECONDS", "") or 300),
        help="re-apply every child this often even without events",
    )
    p.add_argument(
        "--tick-seconds",
        type=float,
        default=float(env.get("TIDAL_OPERATOR_TICK_SECONDS", "") or 1.0),
        help="control loop period per InferenceService (at most 1)",
    )
    p.add_argument(
        "--prometheus-url",
        default=env.get("TIDAL_PROMETHEUS_URL", "") or None,
        help="Prometheus for latency, error and cold-start signals; unset: pod scrapes only",
    )
    p.add_argument(
        "--metrics-port", type=int, default=_env_int(env, "TIDAL_OPERATOR_METRICS_PORT", 8081)
    )
    p.add_argument(
        "--health-port", type=int, default=_env_int(env, "TIDAL_OPERATOR_HEALTH_PORT", 8082)
    )
    p.add_argument(
        "--bind-address", default=env.get("TIDAL_OPERATOR_BIND_ADDRESS", "") or "0.0.0.0"
    )
    p.add_argument(
        "--log-format",
        choices=["json", "full", "plain"],
        default=env.get("TIDAL_OPERATOR_LOG_FORMAT", "") or "json",
    )
    level = env.get("TIDAL_OPERATOR_LOG_LEVEL", "info").lower()
    p.add_argument("--verbose", action="store_true", default=level == "verbose")
    p.add_argument("--debug", action="store_true", default=level == "debug")
    args = p.parse_args(argv)
    if args.namespaces is None:
        args.namespaces = env_ns
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, os.environ)
    kopf.configure(
        verbose=args.verbose,
        debug=args.debug,
        log_format={
            "json": kopf.LogFormat.JSON,
            "full": kopf.LogFormat.FULL,
            "plain": kopf.LogFormat.PLAIN,
        }[args.log_format],
    )
    # kopf logs every watch event at debug level; keep its chatter out of info logs.
    logging.getLogger("kopf.objects").setLevel(logging.DEBUG if args.debug else logging.WARNING)
    if not 0 < args.tick_seconds <= 1:
        raise SystemExit("--tick-seconds must be in (0, 1]")
    matchers = (
        'namespace=~"' + "|".join(sorted(set(args.namespaces))) + '"' if args.namespaces else ""
    )
    handlers.configure(
        handlers.OperatorSettings(
            workers=args.workers,
            resync_seconds=args.resync_seconds,
            tick_seconds=args.tick_seconds,
            prometheus_url=args.prometheus_url,
            prometheus_matchers=matchers,
        )
    )
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind_address)
    liveness = (
        f"http://{args.bind_address}:{args.health_port}/healthz" if args.health_port else None
    )
    scope = ", ".join(args.namespaces) if args.namespaces else "all namespaces"
    logging.getLogger("tidal.operator").info("watching %s", scope)
    kopf.run(
        standalone=True,
        clusterwide=not args.namespaces,
        namespaces=args.namespaces,
        liveness_endpoint=liveness,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
