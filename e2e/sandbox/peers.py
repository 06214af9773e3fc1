"""The real autoscaling peers beside the sandbox: metrics-server (for the Horizontal Pod
Autoscaler's CPU target) and KEDA (its operator and its external-metrics adapter).

Built from the Go module proxy by ``build-peers.sh`` into the cache, and run as host processes
beside the control plane, like etcd and the API server: their images could not be pulled here,
and as processes they run the same code with fewer moving parts (no image builds, no in-cluster
certificates to rotate). The API server reaches them through the aggregation layer
(``SandboxConfig(aggregation=True)``): an APIService names a Service without a selector whose
Endpoints hold the host's address on the real node's bridge, and the API server, started with
aggregator routing, dials that address. Both serve with certificates from the sandbox CA; KEDA's
operator and adapter speak mutual TLS gRPC with one of them, as they do in cluster with the
certificates KEDA would generate.

    peers = Peers.start(sandbox)       # after the sandbox (real node, aggregation) is up
    ...                                # HorizontalPodAutoscalers, ScaledObjects
    peers.stop()
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .binaries import cache_root
from .pki import issue_serving_cert
from .procs import ManagedProcess, free_port
from .wait import wait_for

KEDA_VERSION = os.environ.get("TIDAL_KEDA_VERSION", "v2.21.0")
METRICS_SERVER_VERSION = os.environ.get("TIDAL_METRICS_SERVER_VERSION", "v0.8.0")
BUILD_SCRIPT = Path(__file__).resolve().parent / "build-peers.sh"
KEDA_NS = "keda"
# metrics-server's resolution in its own published manifest (components.yaml); its flag's
# default is 60 s.
METRIC_RESOLUTION = "15s"


@dataclass(frozen=True)
class PeerBinaries:
    keda: Path
    keda_adapter: Path
    keda_crds: Path
    metrics_server: Path

    @classmethod
    def locate(cls) -> PeerBinaries:
        root = cache_root()
        keda = root / f"keda-{KEDA_VERSION}"
        return cls(
            keda=keda / "bin" / "keda",
            keda_adapter=keda / "bin" / "keda-adapter",
            keda_crds=keda / "crds",
            metrics_server=root
            / f"metrics-server-{METRICS_SERVER_VERSION}"
            / "bin"
            / "metrics-server",
        )

    def missing(self) -> list[Path]:
        return [
            p
            for p in (self.keda, self.keda_adapter, self.metrics_server)
            if not os.access(p, os.X_OK)
        ] + ([] if (self.keda_crds / "keda.sh_scaledobjects.yaml").is_file() else [self.keda_crds])


def ensure_peer_binaries() -> PeerBinaries:
    """The peers' binaries, built first when missing (minutes; progress on stderr)."""
    bins = PeerBinaries.locate()
    if bins.missing():
        subprocess.run([shutil.which("bash") or "/bin/bash", str(BUILD_SCRIPT)], check=True)
        if bins.missing():
            raise RuntimeError(f"peer binaries still missing after the build: {bins.missing()}")
    return bins


def aggregated_api(
    group_version: str, namespace: str, service: str, host: str, port: int, ca_bundle: bytes | None
) -> list[dict[str, Any]]:
    """An APIService for ``group_version`` served by a host process at ``host:port``: the
    Service (no selector), its Endpoints (mirrored into an EndpointSlice by the control plane)
    and the APIService. Without ``ca_bundle`` the API server skips verifying the serving
    certificate, as metrics-server's own manifest does."""
    group, version = group_version.split("/")
    tls: dict[str, Any] = (
        {"caBundle": base64.b64encode(ca_bundle).decode()}
        if ca_bundle is not None
        else {"insecureSkipTLSVerify": True}
    )
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": service, "namespace": namespace},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
        },
        {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {"name": service, "namespace": namespace},
            "subsets": [{"addresses": [{"ip": host}], "ports": [{"name": "https", "port": port}]}],
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{version}.{group}"},
            "spec": {
                "group": group,
                "version": version,
                "service": {"name": service, "namespace": namespace, "port": 443},
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
                **tls,
            },
        },
    ]


@dataclass
class Peers:
    """metrics-server, KEDA's operator and KEDA's adapter, running beside a sandbox."""

    sandbox: Any
    binaries: PeerBinaries
    processes: list[ManagedProcess] = field(default_factory=list)

    @classmethod
    def start(cls, sandbox: Any, host: str | None = None, timeout: float = 180.0) -> Peers:
        """Start them and wait until both metrics APIs are Available. ``host``: the address
        they listen on and the APIServices route to (default: the sandbox's, the real node's
        bridge; an Endpoints address may not be a loopback one)."""
        if sandbox.front_proxy is None:
            raise RuntimeError("the peers need SandboxConfig(aggregation=True)")
        peers = cls(sandbox, ensure_peer_binaries())
        try:
            peers._start(host or sandbox.host, timeout)
        except BaseException:
            peers.stop()
            raise
        return peers

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        log = self.sandbox.log_dir / f"{name}.log"
        self.processes.append(ManagedProcess(name, argv, log, env={**os.environ, **env}))

    def _start(self, host: str, timeout: float) -> None:
        sb, bins = self.sandbox, self.binaries
        kubeconfig = str(sb.kubeconfig)
        state = sb.state_dir / "peers"
        certs = state / "certs"
        # One certificate serves the adapter's API and both ends of KEDA's gRPC (KEDA reads
        # tls.crt, tls.key and ca.crt from its --cert-dir).
        crt, key = issue_serving_cert(
            sb.pki,
            certs,
            "keda",
            [
                host,
                "127.0.0.1",
                "localhost",
                f"keda-operator.{KEDA_NS}.svc",
                f"keda-metrics-apiserver.{KEDA_NS}.svc",
            ],
        )
        crt.rename(certs / "tls.crt")
        key.rename(certs / "tls.key")
        shutil.copy(sb.pki.ca_cert, certs / "ca.crt")

        sb.kubectl("create", "namespace", KEDA_NS)
        sb.kubectl("apply", "--server-side", "-f", str(bins.keda_crds))

        ms_port = free_port(host)
        self._spawn(
            "metrics-server",
            [
                str(bins.metrics_server),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--bind-address={host}",
                f"--secure-port={ms_port}",
                f"--cert-dir={state / 'metrics-server-certs'}",
                # kubelet's serving certificate is self-signed on the sandbox's node
                "--kubelet-insecure-tls",
                "--kubelet-preferred-address-types=InternalIP",
                "--kubelet-use-node-status-port",
                f"--metric-resolution={METRIC_RESOLUTION}",
            ],
            {},
        )
        keda_env = {
            "KUBECONFIG": kubeconfig,
            "WATCH_NAMESPACE": "",
            "POD_NAMESPACE": KEDA_NS,
            "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NS,
        }
        grpc_port = free_port("127.0.0.1")
        self._spawn(
            "keda-operator",
            [
                str(bins.keda),
                f"--metrics-bind-address=127.0.0.1:{free_port('127.0.0.1')}",
                f"--health-probe-bind-address=127.0.0.1:{free_port('127.0.0.1')}",
                f"--metrics-service-bind-address=127.0.0.1:{grpc_port}",
                f"--cert-dir={certs}",
                f"--ca-dir={certs}",
                "--enable-cert-rotation=false",
                "--leader-elect=false",
                "--zap-log-level=info",
            ],
            keda_env,
        )
        adapter_port = free_port(host)
        self._spawn(
            "keda-adapter",
            [
                str(bins.keda_adapter),
                f"--bind-address={host}",
                f"--secure-port={adapter_port}",
                f"--cert-dir={certs}",
                f"--tls-cert-file={certs / 'tls.crt'}",
                f"--tls-private-key-file={certs / 'tls.key'}",
                f"--client-ca-file={certs / 'ca.crt'}",
                f"--lister-kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                f"--metrics-service-address=127.0.0.1:{grpc_port}",
                f"--port={free_port('127.0.0.1')}",
                "--zap-log-level=info",
            ],
            keda_env,
        )
        docs = [
            *aggregated_api(
                "metrics.k8s.io/v1beta1", "kube-system", "metrics-server", host, ms_port, None
            ),
            *aggregated_api(
                "external.metrics.k8s.io/v1beta1",
                KEDA_NS,
                "keda-metrics-apiserver",
                host,
                adapter_port,
                sb.pki.ca_cert.read_bytes(),
            ),
        ]
        sb.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))

        def available() -> bool:
            self.check_alive()
            out = sb.kubectl(
                "get",
                "apiservice",
                "v1beta1.metrics.k8s.io",
                "v1beta1.external.metrics.k8s.io",
                "-o",
                "jsonpath={.items[*].status.conditions[?(@.type=='Available')].status}",
                check=False,
            )
            return bool(str(out.stdout).split() == ["True", "True"])

        wait_for(
            available, timeout=timeout, interval=1.0, what="both metrics APIServices Available"
        )

    def check_alive(self) -> None:
        for p in self.processes:
            if not p.alive():
                raise RuntimeError(f"{p.name} exited:\n{p.tail(30)}")

    def stop(self) -> None:
        """SIGTERM each process, newest first (their logs stay in the sandbox's log dir)."""
        for p in reversed(self.processes):
            p.stop()
        self.processes.clear()
