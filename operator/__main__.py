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
``--leader-elect``          ``TIDAL_OPERATOR_LEADER_ELECT``      off (true/false)
``--lease-name N``          ``TIDAL_OPERATOR_LEASE_NAME``        tidal-operator[-<scope hash>]
``--lease-namespace NS``    ``POD_NAMESPACE``                    first watched, else default
``--lease-seconds S``       ``TIDAL_OPERATOR_LEASE_SECONDS``     15
==========================  ===================================  =========================

``--runtime-image BACKEND=IMAGE`` (many; ``TIDAL_OPERATOR_RUNTIME_IMAGES``, ``b=ref,b=ref``): the
runtime image of an InferenceService pool that names none (``spec.runtime.image``), per backend;
default: this release's published images, ``tidal-runtime-cpu`` for onnxruntime and
``tidal-runtime`` for tensorrt (``tidal.common.release``). The chart sets it from
``runtimeImages``.

Scale to zero (``minReplicas: 0``): ``--wake-margin-seconds S``
(``TIDAL_OPERATOR_WAKE_MARGIN_SECONDS``, default 30): a service at zero is woken this long,
plus its measured time-to-routable, before its forecast demand returns.
``--forecast-period-seconds S`` (``TIDAL_OPERATOR_FORECAST_PERIOD_SECONDS``, default 86400, at
least 60): the cycle its demand forecast learns, a day; a shorter one compresses the day (a
demo, or a test of the wake before the morning rise that lasts minutes).

Credentials: in-cluster service account, else ``KUBECONFIG``.

``--quiet-tick-seconds S`` (``TIDAL_OPERATOR_QUIET_TICK_SECONDS``, default 5): the period of a
service with nothing going on, which is also ticked at once on any watch event of it or its
children, a request held at its gateway, and the first request to reach one of its pods; at
most ``--tick-seconds`` ticks every service every tick. ``--watched-quiet-tick-seconds S``
(``TIDAL_OPERATOR_WATCHED_QUIET_TICK_SECONDS``, default 60): the period of a quiet service whose
every pod has that long-poll parked and that has no idle timer towards zero to keep
(``minReplicas`` >= 1): nothing can change for it unseen.

With ``--leader-elect`` several processes may run for one scope (the whole cluster, or the same
``--namespace`` set: a shard): they elect one leader through a ``coordination.k8s.io`` Lease
(named after the scope, so each shard elects its own), the others wait without watching or
writing anything, and one takes over within ``--lease-seconds`` of the leader's failure (at
once when it shuts down cleanly: the Lease is released). A leader that cannot renew exits.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import kopf
from prometheus_client import start_http_server

from .core.images import DEFAULT_RUNTIME_IMAGES, parse_runtime_images
from .shell import handlers
from .shell.controller import ZERO_FORECAST_MIN_PERIOD
from .shell.leader import (
    FollowerHealth,
    Leadership,
    LeaseSettings,
    default_identity,
)


@dataclass(frozen=True)
class _Flag:
    """A flag whose default its environment variable sets (a flag given wins)."""

    flag: str
    env: str
    type: Callable[[str], Any] = str
    default: Any = None
    help: str | None = None
    choices: tuple[str, ...] | None = None


_E = "TIDAL_OPERATOR_"
_FLAGS = (
    _Flag("--workers", _E + "WORKERS", int, 4),
    _Flag(
        "--resync-seconds", _E + "RESYNC_SECONDS", float, 300.0,
        "compare every child with what it should be this often, spread over the period "
        "(writes only what drifted)",
    ),
    _Flag(
        "--tick-seconds", _E + "TICK_SECONDS", float, 1.0,
        "control loop period per InferenceService (at most 1)",
    ),
    _Flag(
        "--quiet-tick-seconds", _E + "QUIET_TICK_SECONDS", float, 5.0,
        "period of a service with nothing going on (also ticked on its watch events); "
        "at most --tick-seconds: every service every tick",
    ),
    _Flag(
        "--watched-quiet-tick-seconds", _E + "WATCHED_QUIET_TICK_SECONDS", float, 60.0,
        "period of a quiet service whose every pod wakes it at its first request (the "
        "activity long-poll parked) and that has no idle timer towards zero",
    ),
    _Flag(
        "--wake-margin-seconds", _E + "WAKE_MARGIN_SECONDS", float, 30.0,
        "a service at zero wakes this long plus its time-to-routable before its forecast demand",
    ),
    _Flag(
        "--forecast-period-seconds", _E + "FORECAST_PERIOD_SECONDS", float, 86400.0,
        "the demand cycle a scale-to-zero service's forecast learns (a day; shorter "
        "compresses it)",
    ),
    _Flag(
        "--prometheus-url", "TIDAL_PROMETHEUS_URL",
        help="Prometheus for latency, error and cold-start signals; unset: pod scrapes only",
    ),
    _Flag("--metrics-port", _E + "METRICS_PORT", int, 8081),
    _Flag("--health-port", _E + "HEALTH_PORT", int, 8082),
    _Flag("--bind-address", _E + "BIND_ADDRESS", default="0.0.0.0"),
    _Flag("--log-format", _E + "LOG_FORMAT", default="json", choices=("json", "full", "plain")),
    _Flag("--lease-name", _E + "LEASE_NAME"),
    _Flag("--lease-namespace", "POD_NAMESPACE"),
    _Flag("--lease-seconds", _E + "LEASE_SECONDS", int, 15),
)  # fmt: skip


def parse_args(argv: list[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tidal-operator", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        default=None,
        help="watch only this namespace (repeatable); default: the whole cluster",
    )
    for f in _FLAGS:
        raw = env.get(f.env, "")
        default = f.type(raw) if raw else f.default
        p.add_argument(f.flag, type=f.type, default=default, help=f.help, choices=f.choices)
    p.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=env.get(_E + "LEADER_ELECT", "").lower() in ("1", "true", "yes"),
        help="elect one leader among the processes of this scope through a Lease",
    )
    p.add_argument(
        "--runtime-image",
        dest="runtime_images",
        action="append",
        metavar="BACKEND=IMAGE",
        default=None,
        help="the runtime image of a pool that names none, per backend (many)",
    )
    level = env.get(_E + "LOG_LEVEL", "info").lower()
    p.add_argument("--verbose", action="store_true", default=level == "verbose")
    p.add_argument("--debug", action="store_true", default=level == "debug")
    args = p.parse_args(argv)
    if args.namespaces is None:
        args.namespaces = [n for n in env.get(_E + "NAMESPACES", "").split(",") if n.strip()]
    if args.lease_name is None:
        args.lease_name = lease_name(args.namespaces)
    if args.lease_namespace is None:
        args.lease_namespace = args.namespaces[0] if args.namespaces else "default"
    if args.runtime_images is None:
        given = env.get(_E + "RUNTIME_IMAGES", "")
        args.runtime_images = [item for item in given.split(",") if item.strip()]
    try:
        args.runtime_images = {
            **DEFAULT_RUNTIME_IMAGES,
            **parse_runtime_images(args.runtime_images),
        }
    except ValueError as exc:
        p.error(f"--runtime-image {exc}")
    if args.lease_seconds < 4:
        p.error("--lease-seconds must be at least 4")
    if not args.resync_seconds > 0:
        p.error("--resync-seconds must be greater than 0")
    if not (math.isfinite(args.wake_margin_seconds) and args.wake_margin_seconds >= 0):
        p.error("--wake-margin-seconds must be a finite number >= 0")
    if not (
        math.isfinite(args.forecast_period_seconds)
        and args.forecast_period_seconds >= ZERO_FORECAST_MIN_PERIOD
    ):
        p.error(f"--forecast-period-seconds must be at least {ZERO_FORECAST_MIN_PERIOD:.0f}")
    return args


def lease_name(namespaces: list[str]) -> str:
    """One Lease per scope: processes watching the same namespaces elect one leader."""
    if not namespaces:
        return "tidal-operator"
    scope = ",".join(sorted({n.strip() for n in namespaces}))
    return "tidal-operator-" + hashlib.sha256(scope.encode()).hexdigest()[:10]


def _lead(args: argparse.Namespace) -> Leadership:
    """Wait until this process leads its scope (answering /healthz meanwhile); then keep the
    Lease renewed. Returns the Leadership, to release on a clean exit."""
    from kubernetes import client

    from .shell.kube import load_client_config

    client.Configuration.set_default(load_client_config())
    leadership = Leadership(
        LeaseSettings.for_lease(args.lease_name, args.lease_namespace, args.lease_seconds)
    )
    health = FollowerHealth(args.bind_address, args.health_port) if args.health_port else None
    try:
        leadership.acquire()
    finally:
        if health is not None:
            health.close()

    def lost() -> None:
        logging.shutdown()
        os._exit(70)  # work that might overlap the new leader's must stop now

    leadership.start_renewing(lost)
    return leadership


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
            quiet_tick_seconds=args.quiet_tick_seconds,
            watched_quiet_tick_seconds=args.watched_quiet_tick_seconds,
            wake_margin_seconds=args.wake_margin_seconds,
            forecast_period_seconds=args.forecast_period_seconds,
            prometheus_url=args.prometheus_url,
            prometheus_matchers=matchers,
            runtime_images=args.runtime_images,
        )
    )
    if args.metrics_port:
        start_http_server(args.metrics_port, addr=args.bind_address)
    liveness = (
        f"http://{args.bind_address}:{args.health_port}/healthz" if args.health_port else None
    )
    scope = ", ".join(args.namespaces) if args.namespaces else "all namespaces"
    leadership = _lead(args) if args.leader_elect else None
    logging.getLogger("tidal.operator").info("watching %s", scope)
    try:
        kopf.run(
            # Given, not detected: kopf's detection reads the user name, and the images' numeric
            # user (65532) has no passwd entry: getpwuid() raised and the operator pod crashed.
            identity=cast(Any, default_identity()),  # kopf's Identity: NewType(str), not exported
            standalone=True,
            clusterwide=not args.namespaces,
            namespaces=args.namespaces,
            liveness_endpoint=liveness,
        )
    finally:
        if leadership is not None:
            leadership.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
