"""Leader election on a ``coordination.k8s.io/v1`` Lease, so several operator processes can run
for one scope (the whole cluster, or a shard of namespaces) with exactly one reconciling.

The election itself is the Kubernetes client's own (``kubernetes.leaderelection`` with its
``LeaseLock``: optimistic concurrency on the Lease's resourceVersion, a candidate takes over
only after observing the holder's record unchanged for ``leaseDurationSeconds``). This module
adds what an operator process needs around it:

* :meth:`Leadership.acquire` blocks until this process leads (before kopf starts: a follower
  runs no watch, no handler and no control loop, so two processes never write the same
  objects); meanwhile a follower answers its liveness endpoint itself;
* :meth:`Leadership.start_renewing` renews in a thread and, when a renewal has failed for
  ``renew_seconds`` (the API server unreachable, or another holder), calls ``on_lost`` — the
  process then exits at once, as controller-runtime's managers do: work that might overlap a
  new leader's must stop, and Kubernetes restarts the container as a follower;
* :meth:`Leadership.release` empties the Lease's holder on a clean shutdown, so a follower takes
  over within one retry period instead of waiting out the lease.
"""

from __future__ import annotations

import http.server
import logging
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.leaderelection import electionconfig, leaderelection
from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

from . import metrics

log = logging.getLogger("tidal.operator.leader")
# The client's election logs every retry at info ("yet to finish lease_duration, ..."); the
# transitions worth seeing are logged here.
logging.getLogger("leaderelection").setLevel(logging.WARNING)


def default_identity() -> str:
    """``<hostname>_<random>``: unique per process even when pods share a hostname."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class LeaseSettings:
    name: str
    namespace: str
    identity: str = field(default_factory=default_identity)
    lease_seconds: int = 15
    renew_seconds: int = 10
    retry_seconds: int = 2

    def __post_init__(self) -> None:
        # The client's own rules (it would sys.exit on them): checked here with a clear error.
        if self.renew_seconds <= 1.2 * self.retry_seconds or self.retry_seconds < 1:
            raise ValueError("need retry_seconds >= 1 and renew_seconds > 1.2 x retry_seconds")
        if self.lease_seconds <= self.renew_seconds:
            raise ValueError("lease_seconds must be greater than renew_seconds")

    @classmethod
    def for_lease(cls, name: str, namespace: str, lease_seconds: int) -> LeaseSettings:
        """Renewal and retry periods derived from the lease (2/3 and 2/15 of it, as
        client-go's defaults 15 / 10 / 2 s)."""
        lease = max(int(lease_seconds), 4)
        renew = max(lease * 2 // 3, 3)
        retry = max(lease * 2 // 15, 1)
        return cls(name, namespace, lease_seconds=lease, renew_seconds=renew, retry_seconds=retry)


class Leadership:
    """One candidate for one Lease (see the module's docstring)."""

    def __init__(self, settings: LeaseSettings) -> None:
        self.settings = settings
        self._lock = LeaseLock(settings.name, settings.namespace, settings.identity)  # type: ignore[no-untyped-call]
        self._election = leaderelection.LeaderElection(  # type: ignore[no-untyped-call]
            electionconfig.Config(  # type: ignore[no-untyped-call]
                self._lock,
                lease_duration=settings.lease_seconds,
                renew_deadline=settings.renew_seconds,
                retry_period=settings.retry_seconds,
                onstarted_leading=lambda: None,
                onstopped_leading=lambda: None,
            )
        )
        self._renewer: threading.Thread | None = None
        self._stopping = threading.Event()

    @property
    def where(self) -> str:
        return f"Lease {self.settings.namespace}/{self.settings.name}"

    def acquire(self) -> None:
        """Block until this process holds the Lease."""
        metrics.LEADER.set(0)
        holder = self.holder()
        if holder and holder != self.settings.identity:
            log.info("%s is held by %s: waiting as a follower", self.where, holder)
        self._election.acquire()  # type: ignore[no-untyped-call]
        metrics.LEADER.set(1)
        metrics.LEADER_TRANSITIONS.inc()
        log.info("leading: %s acquired by %s", self.where, self.settings.identity)

    def start_renewing(self, on_lost: Callable[[], None]) -> None:
        """Renew in a daemon thread; ``on_lost`` runs there when the Lease is lost."""

        def run() -> None:
            # Returns when a renewal failed for renew_seconds, or once `release` stops it.
            self._election.renew_loop(self._stopping)  # type: ignore[no-untyped-call]
            if self._stopping.is_set():
                return
            metrics.LEADER.set(0)
            log.critical(
                "leadership lost: %s not renewed within %d s; stopping",
                self.where,
                self.settings.renew_seconds,
            )
            on_lost()

        self._renewer = threading.Thread(target=run, name="lease-renewal", daemon=True)
        self._renewer.start()

    def holder(self) -> str | None:
        try:
            lease = client.CoordinationV1Api().read_namespaced_lease(
                self.settings.name, self.settings.namespace
            )
        except ApiException:
            return None
        return lease.spec.holder_identity if lease.spec is not None else None

    def release(self) -> None:
        """Give the Lease up (clean shutdown): the holder is emptied if it is still us."""
        self._stopping.set()
        if self._renewer is not None:  # a renewal in flight must not re-take it after us
            self._renewer.join(self.settings.retry_seconds + self.settings.renew_seconds)
        api = client.CoordinationV1Api()
        try:
            lease = api.read_namespaced_lease(self.settings.name, self.settings.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.settings.identity:
                return
            lease.spec.holder_identity = None
            api.replace_namespaced_lease(self.settings.name, self.settings.namespace, lease)
            metrics.LEADER.set(0)
            log.info("released %s", self.where)
        except ApiException as exc:
            log.warning("could not release %s: %s", self.where, exc.reason)


class FollowerHealth:
    """``/healthz`` for a follower (kopf's endpoint starts only once it leads), on the port
    kopf takes over afterwards: a waiting operator is alive, not failing its probe."""

    def __init__(self, host: str, port: int) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                ok = self.path.split("?")[0] == "/healthz"
                body = b'{"follower": true}' if ok else b"not found"
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = http.server.ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="follower-health", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)
