"""Start and stop a whole sandbox: etcd, the Kubernetes control plane, the node agent, Prometheus.

Every component is a local process with its output in ``<state_dir>/logs``; ports are picked
free at start, so several sandboxes (and CI beside a developer's sandbox) can coexist.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tidal.common import release

from .binaries import K8S_VERSION, Binaries, ensure_binaries
from .pki import FrontProxy, Pki, make_front_proxy, make_pki
from .procs import ManagedProcess, free_port
from .prometheus import write_prometheus_config
from .wait import wait_for

SERVICE_CIDR = "10.96.0.0/16"


@dataclass(frozen=True)
class SandboxConfig:
    """What to start. Defaults suit the test suite: two GPU nodes, Prometheus on."""

    nodes: int = 2
    gpus_per_node: int = 2
    cpu_per_node: str = "16"
    memory_per_node: str = "64Gi"
    fake_nodes: int = 0
    fake_node_pods: int = 1000
    prometheus: bool = True
    scrape_interval: str = "1s"
    state_dir: Path | None = None
    keep_state: bool = False
    extra_pod_path: Sequence[str] = field(default_factory=tuple)
    # A real node (kubelet + containerd + kube-proxy + CoreDNS, realnode.py) with this many
    # nvidia.com/gpu; the project's images are built and imported first. One per machine.
    real_node: bool = False
    real_node_gpus: int = 2
    # The API server's aggregation layer (front-proxy CA and client certificate, aggregator
    # routing to endpoints): what metrics-server and KEDA's metrics adapter need to serve
    # metrics.k8s.io / external.metrics.k8s.io (bench/peers_bench.py). Off for the test suite.
    aggregation: bool = False
    # With the real node: the OCI registry (registry.py) on 127.0.0.1, and the node's containerd
    # pulling the release registry's host (ghcr.io) from it (e2e/test_readme_install.py installs
    # the release from it). On unless TIDAL_SANDBOX_REGISTRY=0 (then test_readme_install pushes
    # to a registry of its own and tags the built images under the release names in the node's
    # containerd). It was off until the cause of ErrImageNeverPull in the scenarios after the
    # install test was found: kubelet's pulled-image records (the kubelet configuration in
    # realnode.py says why).
    registry: bool = field(default_factory=lambda: node_pulls_from_registry())


def node_pulls_from_registry() -> bool:
    """Whether the real node runs with the sandbox's registry mirroring the release registry's
    host: unless ``TIDAL_SANDBOX_REGISTRY=0`` (e2e/README.md)."""
    return os.environ.get("TIDAL_SANDBOX_REGISTRY", "1") != "0"


# Where a release publishes the project's images; the real node has the ones built here instead.
PUBLISHED = release.REGISTRY + "/"
# The object store's in-cluster name on the real node (users' stores have names like it).
OBJECT_STORE_SERVICE = "objectstore"
OBJECT_STORE_PORT = 7070


class SandboxError(RuntimeError):
    """A component failed to start; the message carries the end of its log."""


class Sandbox:
    """A running sandbox. Use as a context manager, or call :meth:`start` and :meth:`stop`."""

    def __init__(self, config: SandboxConfig | None = None) -> None:
        self.config = config or SandboxConfig()
        self.binaries: Binaries | None = None
        self._owns_state = self.config.state_dir is None
        self.state_dir = self.config.state_dir or Path(tempfile.mkdtemp(prefix="tidal-sandbox-"))
        self.log_dir = self.state_dir / "logs"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.pki: Pki | None = None
        self.front_proxy: FrontProxy | None = None
        self.api_port = 0
        self.prometheus_port = 0
        self.processes: list[ManagedProcess] = []
        self.started_seconds: float | None = None
        # Where the API server and Prometheus listen: the real node's bridge address, so its
        # pods reach them (the `kubernetes` Service, a chart's prometheus.url), else loopback.
        self.host = "127.0.0.1"
        self.node: Any = None
        self.images: Any = None
        self.files: Any = None  # a FileServer on the real node's bridge (files.py)
        # The object store (objectstore.py) on the real node's bridge, and its in-cluster URL.
        self.objects: Any = None
        self.objects_url: str | None = None
        # The OCI registry (registry.py) on 127.0.0.1, with the real node: the release
        # registry's host (ghcr.io, tidal.common.release) is pulled from it by containerd.
        self.registry: Any = None

    # -- lifecycle -------------------------------------------------------------------------
    def __enter__(self) -> Sandbox:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Sandbox:
        t0 = time.monotonic()
        try:
            self.binaries = ensure_binaries()
            self.state_dir.mkdir(parents=True, exist_ok=True)
            self.pki = make_pki(self.state_dir / "pki")
            if self.config.aggregation:
                self.front_proxy = make_front_proxy(self.state_dir / "pki")
            if self.config.real_node:
                self._prepare_real_node()
            self._start_etcd()
            self._start_apiserver()
            self._write_kubeconfig()
            self._start_controller_manager()
            self._start_scheduler()
            if self.config.nodes or self.config.fake_nodes:
                self._start_node_agent()
            if self.config.prometheus:
                self._start_prometheus()
            self._wait_cluster_usable()
            if self.node is not None:
                self._start_real_node()
        except BaseException:
            self.stop()
            raise
        self.started_seconds = time.monotonic() - t0
        (self.state_dir / "sandbox.json").write_text(json.dumps(self.describe(), indent=2))
        return self

    def stop(self) -> None:
        """Stop every component, newest first; remove the state unless asked to keep it."""
        if self.files is not None:
            self.files.close()
            self.files = None
        if self.objects is not None:
            self.objects.stop()
            self.objects = None
        if self.node is not None:
            self.node.stop()
            self.node = None
        if self.registry is not None:
            self.registry.stop()
            self.registry = None
        for proc in reversed(self.processes):
            # The node agent stops its pods on SIGTERM, so it gets time to honour grace periods.
            proc.stop(grace=40.0 if proc.name == "node-agent" else 10.0)
        self.processes.clear()
        from .nodeagent import kill_leftovers  # late: `-m nodeagent` imports us

        kill_leftovers(self.state_dir)
        if self._owns_state and not self.config.keep_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def describe(self) -> dict[str, Any]:
        return {
            "kubeconfig": str(self.kubeconfig),
            "apiServer": self.api_url,
            "prometheus": self.prometheus_url if self.config.prometheus else None,
            "logs": str(self.log_dir),
            "pids": {p.name: p.pid for p in self.processes},
            "kubernetesVersion": K8S_VERSION,
            "realNode": self.node is not None,
            "objectStore": self.objects_url,
            "registry": self.registry.host if self.registry else None,
            "images": {k: v.name for k, v in vars(self.images).items()} if self.images else None,
        }

    # -- workloads -------------------------------------------------------------------------
    @property
    def real_node(self) -> bool:
        return self.node is not None

    def engine_uri(self, path: Path | str) -> str:
        """Where a pod reads the host file ``path``: in place (``file://``) under the node agent,
        over HTTP from the host on the real node (:mod:`tidal.sandbox.files`)."""
        if self.files is not None:
            return str(self.files.url(path))
        return Path(path).resolve().as_uri()

    def adapt(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """An InferenceService or ModelBuild as a user of this cluster writes it (a copy; anything
        else is returned as is): on the real node, the runtime image built here for every pool
        (and build) that names none or one of the project's published images (``PUBLISHED``: no
        registry can be reached here), and every ``file://`` engine URI served by
        :meth:`engine_uri`.
        Under the node agent, unchanged: it runs the runtime from this checkout."""
        if self.node is None or manifest.get("kind") not in ("InferenceService", "ModelBuild"):
            return manifest
        doc: dict[str, Any] = json.loads(json.dumps(manifest))
        spec = doc.setdefault("spec", {})
        image = self.images.runtime_cpu.name
        if doc["kind"] == "ModelBuild":
            # Its Jobs run the backend's runtime image, the one built here.
            if str(spec.get("image") or PUBLISHED).startswith(PUBLISHED):
                spec["image"] = image
            return doc
        runtimes = [spec.setdefault("runtime", {})]
        baseline = (spec.get("rollout") or {}).get("baseline") or {}
        if baseline.get("runtime") is not None:
            runtimes.append(baseline["runtime"])
        for runtime in runtimes:
            if not str(runtime.get("image") or PUBLISHED).startswith(PUBLISHED):
                continue  # an image the scenario chose
            runtime["image"] = image

        def serve(node: Any) -> None:
            if isinstance(node, dict):
                for key, value in node.items():
                    if key == "uri" and isinstance(value, str) and value.startswith("file://"):
                        node[key] = self.engine_uri(urllib.request.url2pathname(value[7:]))
                    else:
                        serve(value)
            elif isinstance(node, list):
                for item in node:
                    serve(item)

        serve(spec)
        return doc

    # -- faults ----------------------------------------------------------------------------
    RESTARTABLE = ("etcd", "kube-apiserver", "prometheus")

    def crash(self, name: str) -> float:
        """SIGKILL one control-plane component (``RESTARTABLE``); the wall time it died."""
        self._component(name).kill()
        return time.time()

    def restart(self, name: str, timeout: float = 90.0) -> float:
        """Start a crashed or stopped component again, on its old ports and data; wait until it
        answers its health check; the wall time it did."""
        proc = self._component(name)
        if proc.alive():
            proc.kill()
        self.processes[self.processes.index(proc)] = proc.respawn()
        health = {
            "etcd": lambda: _http_ok(f"{self.etcd_url}/health"),
            "kube-apiserver": self._apiserver_ready,
            "prometheus": lambda: _http_ok(f"{self.prometheus_url}/-/ready"),
        }[name]
        self._wait(health, f"{name} healthy after a restart", timeout)
        return time.time()

    def _component(self, name: str) -> ManagedProcess:
        if name not in self.RESTARTABLE:
            raise ValueError(f"{name} cannot be restarted; one of {', '.join(self.RESTARTABLE)}")
        return next(p for p in self.processes if p.name == name)

    # -- access ----------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        return f"https://{self.host}:{self.api_port}"

    @property
    def prometheus_url(self) -> str:
        return f"http://{self.host}:{self.prometheus_port}"

    @property
    def env(self) -> dict[str, str]:
        """Environment for subprocesses that should talk to this sandbox."""
        env = dict(os.environ)
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["TIDAL_PROMETHEUS_URL"] = self.prometheus_url
        if self.binaries is not None:
            env["PATH"] = f"{self.binaries.kubectl.parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the sandbox's kubectl; raise with its stderr when ``check`` and it fails."""
        assert self.binaries is not None, "sandbox not started"
        argv = [str(self.binaries.kubectl), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(
            argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            raise subprocess.CalledProcessError(
                result.returncode, argv, result.stdout, result.stderr
            )
        return result

    def apply_crds(self, directory: Path) -> None:
        """Apply every CRD in ``directory`` (idempotent) and wait until they are served."""
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(directory))
        self.wait_established("-f", str(directory))

    def wait_established(self, *targets: str, timeout: float = 90.0) -> None:
        """``kubectl wait --for=condition=Established`` on ``targets``, again until it succeeds:
        one call can fail on a passing answer of the API server (CI saw it exit 1 while the
        server's CRD storage was re-initialising after a re-apply)."""

        def established() -> bool:
            done = self.kubectl(
                "wait", "--for=condition=Established", "--timeout=30s", *targets, check=False
            )
            if done.returncode != 0:
                raise RuntimeError(f"kubectl wait exited {done.returncode}: {done.stderr.strip()}")
            return True

        wait_for(
            established, timeout=timeout, interval=1.0, what=f"{' '.join(targets)} Established"
        )

    def api_client(self) -> Any:
        """A ``kubernetes.client.ApiClient`` logged in as the sandbox admin."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(
            config_file=str(self.kubeconfig), client_configuration=configuration
        )
        configuration.connection_pool_maxsize = 32
        return client.ApiClient(configuration)

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """A pod's container log: ``kubectl logs`` on a real node, else the node agent's file."""
        if self.node is not None:
            args = ["logs", "-n", namespace, pod] + ([f"-c={container}"] if container else [])
            return self.kubectl(*args, check=False).stdout
        pods = self.state_dir / "pods"
        matches = sorted(pods.glob(f"{namespace}_{pod}_*/{container or '*'}.log"))
        return "\n".join(p.read_text(errors="replace") for p in matches)

    # -- components ------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        proc = ManagedProcess(name, argv, self.log_dir / f"{name}.log", env=env)
        self.processes.append(proc)

    def _check_alive(self) -> None:
        for proc in self.processes:
            if not proc.alive():
                raise SandboxError(
                    f"{proc.name} exited with {proc.popen.returncode}; log {proc.log_path}:\n"
                    f"{proc.tail()}"
                )

    def _wait(self, fn: Any, what: str, timeout: float) -> Any:
        def probe() -> Any:
            self._check_alive()
            return fn()

        try:
            return wait_for(probe, timeout=timeout, interval=0.1, what=what)
        except SandboxError:
            raise
        except TimeoutError as exc:
            tails = "\n".join(f"--- {p.name}:\n{p.tail(15)}" for p in self.processes)
            raise SandboxError(f"{exc}\n{tails}") from exc

    def _start_etcd(self) -> None:
        assert self.binaries is not None
        client_port, peer_port = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                f"--data-dir={self.state_dir / 'etcd'}",
                "--name=default",
                f"--listen-client-urls={self.etcd_url}",
                f"--advertise-client-urls={self.etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )
        self._wait(lambda: _http_ok(f"{self.etcd_url}/health"), "etcd health", 30)

    def _start_apiserver(self) -> None:
        assert self.binaries is not None and self.pki is not None
        self.api_port = free_port(self.host)
        pki = self.pki
        if self.node is not None:
            # Pods reach the API server through the `kubernetes` Service, whose endpoint is the
            # advertised bridge address; kubelets are authorised by the Node authorizer.
            where = [
                f"--bind-address={self.host}",
                f"--advertise-address={self.host}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={pki.admin_cert}",
                f"--kubelet-client-key={pki.admin_key}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        else:
            where = [
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # The loopback address may not back the `kubernetes` Service endpoints.
                "--endpoint-reconciler-type=none",
                "--authorization-mode=RBAC",
            ]
        self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={self.etcd_url}",
                f"--cert-dir={self.state_dir / 'pki'}",
                f"--tls-cert-file={pki.serving_cert}",
                f"--tls-private-key-file={pki.serving_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--secure-port={self.api_port}",
                *where,
                *self._aggregation_flags(),
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--allow-privileged=true",
                "--max-requests-inflight=1000",
                "--max-mutating-requests-inflight=500",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._wait(self._apiserver_ready, "kube-apiserver /readyz", 90)

    def _aggregation_flags(self) -> list[str]:
        """The API server's flags for the aggregation layer (none unless asked for)."""
        proxy = self.front_proxy
        if proxy is None:
            return []
        return [
            f"--requestheader-client-ca-file={proxy.ca_cert}",
            f"--requestheader-allowed-names={proxy.client_name}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={proxy.client_cert}",
            f"--proxy-client-key-file={proxy.client_key}",
            # Dial the extension server's endpoint (a host process) rather than its ClusterIP.
            "--enable-aggregator-routing=true",
        ]

    def _ssl_context(self) -> ssl.SSLContext:
        assert self.pki is not None
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        ctx.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        return ctx

    def _apiserver_ready(self) -> bool:
        return _http_ok(f"{self.api_url}/readyz", self._ssl_context())

    def _write_kubeconfig(self) -> None:
        assert self.pki is not None

        def b64(path: Path) -> str:
            return base64.b64encode(path.read_bytes()).decode()

        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "tidal-sandbox",
                    "cluster": {
                        "server": self.api_url,
                        "certificate-authority-data": b64(self.pki.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": "tidal-admin",
                    "user": {
                        "client-certificate-data": b64(self.pki.admin_cert),
                        "client-key-data": b64(self.pki.admin_key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "tidal-sandbox",
                    "context": {"cluster": "tidal-sandbox", "user": "tidal-admin"},
                }
            ],
            "current-context": "tidal-sandbox",
        }
        self.kubeconfig.write_text(yaml.safe_dump(doc))
        self.kubeconfig.chmod(0o600)

    def _start_controller_manager(self) -> None:
        assert self.binaries is not None and self.pki is not None
        self._spawn(
            "kube-controller-manager",
            [
                str(self.binaries.kube_controller_manager),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                f"--service-account-private-key-file={self.pki.sa_key}",
                f"--root-ca-file={self.pki.ca_cert}",
                f"--cluster-signing-cert-file={self.pki.ca_cert}",
                f"--cluster-signing-key-file={self.pki.ca_key}",
                "--use-service-account-credentials=false",
                "--kube-api-qps=200",
                "--kube-api-burst=400",
                "--concurrent-deployment-syncs=10",
                "--concurrent-replicaset-syncs=10",
                "--concurrent-service-endpoint-syncs=10",
                "--concurrent-gc-syncs=20",
                "--v=1",
            ],
        )

    def _start_scheduler(self) -> None:
        assert self.binaries is not None
        self._spawn(
            "kube-scheduler",
            [
                str(self.binaries.kube_scheduler),
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--secure-port=0",
                "--v=1",
            ],
        )

    def _prepare_real_node(self) -> None:
        """Node binaries and images (built or reused), then the host's network for the node:
        before the API server, which listens on the bridge address."""
        from .images import build_project_images
        from .realnode import NODE_IP, RealNode, ensure_node_binaries

        bins = ensure_node_binaries()
        self.images = build_project_images(bins.bin)
        assert self.pki is not None
        self.host = NODE_IP
        self.node = RealNode(
            api_url=f"https://{NODE_IP}:0",  # the port is known once the API server runs
            pki=self.pki,
            log_dir=self.log_dir,
            gpus=self.config.real_node_gpus,
        )
        self.node.prepare_host()

    def _start_real_node(self) -> None:
        """containerd with the images, kubelet, kube-proxy; GPUs advertised; cluster DNS and an
        in-cluster name for Prometheus (``http://prometheus.tidal-sandbox:9090``)."""
        from kubernetes import client

        from . import realnode
        from .files import FileServer
        from .objectstore import ObjectStore
        from .registry import Registry

        node = self.node
        node.api_url = self.api_url
        assert self.binaries is not None
        if self.config.registry:
            self.registry = Registry.start(self.binaries.registry, self.state_dir / "registry")
            node.mirrors = {release.REGISTRY.split("/", 1)[0]: self.registry.url}
        node.start(self.images.archives(), self.images.names())
        self.files = FileServer(self.host)
        self.objects = ObjectStore.start(
            self.binaries.versitygw, self.state_dir / "objectstore", host=self.host
        )
        api = client.CoreV1Api(self.api_client())

        def alive() -> None:
            self._check_alive()
            for proc in node.processes.values():
                if not proc.alive():
                    raise SandboxError(f"{proc.name} exited; {proc.log_path}:\n{proc.tail(20)}")

        realnode.wait_node_ready(api, timeout=120, check=alive)
        node.wait_images_visible(api, self.images.names(), timeout=120)
        realnode.advertise_gpus(api, self.config.real_node_gpus)
        manifests = realnode.cluster_dns_manifests(self.images.coredns.name)
        if self.config.prometheus:
            manifests += realnode.external_service_manifests(
                "tidal-sandbox", "prometheus", 9090, self.host, self.prometheus_port
            )
        manifests += realnode.external_service_manifests(
            "tidal-sandbox", OBJECT_STORE_SERVICE, OBJECT_STORE_PORT, self.host, self.objects.port
        )
        self.objects_url = (
            f"http://{OBJECT_STORE_SERVICE}.tidal-sandbox.svc.cluster.local:{OBJECT_STORE_PORT}"
        )
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))
        self.kubectl(
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deployment/coredns",
            "--timeout=120s",
            timeout=150,
        )

    def _start_node_agent(self) -> None:
        c = self.config
        pod_path = [*c.extra_pod_path, str(Path(sys.executable).parent)]
        self._spawn(
            "node-agent",
            [
                sys.executable,
                "-m",
                "tidal.sandbox.nodeagent",
                f"--kubeconfig={self.kubeconfig}",
                f"--state-dir={self.state_dir}",
                f"--nodes={c.nodes}",
                f"--gpus-per-node={c.gpus_per_node}",
                f"--cpu-per-node={c.cpu_per_node}",
                f"--memory-per-node={c.memory_per_node}",
                f"--fake-nodes={c.fake_nodes}",
                f"--fake-node-pods={c.fake_node_pods}",
                f"--pod-path={os.pathsep.join(pod_path)}",
            ],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def _start_prometheus(self) -> None:
        assert self.binaries is not None and self.pki is not None
        self.prometheus_port = free_port(self.host)
        targets = self.state_dir / "prometheus-targets.json"
        self._spawn(
            "pod-discovery",
            [
                sys.executable,
                "-m",
                "tidal.sandbox.podsd",
                f"--kubeconfig={self.kubeconfig}",
                f"--out={targets}",
            ],
        )
        config_path = write_prometheus_config(
            self.state_dir / "prometheus.yml",
            targets_file=targets,
            scrape_interval=self.config.scrape_interval,
        )
        self._spawn(
            "prometheus",
            [
                str(self.binaries.prometheus),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={self.state_dir / 'prometheus-data'}",
                f"--web.listen-address={self.host}:{self.prometheus_port}",
                "--web.enable-lifecycle",
                "--storage.tsdb.retention.time=6h",
                "--log.level=warn",
            ],
        )

    def _wait_cluster_usable(self) -> None:
        from kubernetes import client

        api = client.CoreV1Api(self.api_client())

        def default_sa() -> bool:
            api.read_namespaced_service_account("default", "default")
            return True

        self._wait(default_sa, "the default service account (controller-manager)", 60)
        expected = self.config.nodes + self.config.fake_nodes

        def nodes_schedulable() -> bool:
            nodes = api.list_node().items
            ready = 0
            for n in nodes:
                conditions = (n.status.conditions if n.status else None) or []
                taints = (n.spec.taints if n.spec else None) or []
                if any(c.type == "Ready" and c.status == "True" for c in conditions) and not any(
                    t.key.startswith("node.kubernetes.io/") for t in taints
                ):
                    ready += 1
            return ready == expected

        self._wait(nodes_schedulable, f"{expected} nodes Ready and untainted", 60)
        if self.config.prometheus:
            self._wait(
                lambda: _http_ok(f"{self.prometheus_url}/-/ready"), "Prometheus /-/ready", 30
            )


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False
