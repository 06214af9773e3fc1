"""A real Kubernetes node for the sandbox: containerd + runc + CNI, kubelet, kube-proxy, CoreDNS.

The node joins the sandbox's API server as ``tidal-node-1`` with a ``system:node`` identity
(Node authorization, NodeRestriction); GPUs are advertised as the extended resource
``nvidia.com/gpu`` by patching the node's status (the documented way for extended resources
without a device plugin). Images come from :mod:`tidal.sandbox.images` and are imported into
containerd; nothing is ever pulled (``imagePullPolicy: Never``/``IfNotPresent``).

Network (host-wide, so one real node per machine: a lock in ``/run`` says whose it is):

* a bridge ``tidalnode0`` holding ``10.245.0.1/24`` — made here, not by the CNI plugin, which
  runs with ``isGateway: false`` so it never turns on the global ``ip_forward``; forwarding is
  enabled on this bridge only;
* pods get addresses of ``10.245.0.0/24`` and **no default route** (routes only to the pod and
  service ranges); the API server, Prometheus and kubelet listen on the bridge address;
* the service range ``10.96.0.0/16`` is routed onto the bridge, so a ClusterIP that kube-proxy
  does not translate dies there;
* an nftables table ``tidal_node_guard`` drops any packet from or to the pod or service ranges
  that would leave by another interface, and any forwarding out of the bridge.

Everything the node changes on the host — the bridge and its routes, nftables tables (ours,
kube-proxy's, kubelet's iptables chains such as KUBE-FIREWALL and the iptables tables it made),
mounts under the node's directories, ``kubepods`` cgroups, the sysctls kubelet sets
(``vm.overcommit_memory``, ``kernel.panic``, ``kernel.panic_on_oops``), and paths kubelet and
containerd hard-code (``/var/lib/kubelet``, ``/var/log/containers``, ``/var/lib/cni``) — is
undone by :func:`cleanup_host`, which runs on stop, at exit, and before the next start (so a
killed test run leaves nothing behind for long). The sysctls' original values are saved once,
before kubelet first runs, and restored from that file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from .binaries import K8S_VERSION, cache_root
from .pki import Pki, issue_client_cert
from .procs import ManagedProcess
from .wait import wait_for

log = logging.getLogger("tidal.sandbox.realnode")

NODE_NAME = "tidal-node-1"
BRIDGE = "tidalnode0"
NODE_IP = "10.245.0.1"
POD_CIDR = "10.245.0.0/24"
SERVICE_CIDR = "10.96.0.0/16"
DNS_IP = "10.96.0.10"
CLUSTER_DOMAIN = "cluster.local"
KUBELET_PORT = 10250
# Fixed, short paths: unix sockets under them must stay below 108 bytes, and kubelet hard-codes
# some of its own anyway. State that must not outlive the node lives here; the image store is
# a cache (images survive between runs, containers do not).
RUN_DIR = Path("/run/tidal-node")
STATE_DIR = Path("/var/lib/tidal-node")
LOCK_FILE = Path("/run/tidal-node.lock")
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"  # the tag containerd 2.4 pins as its sandbox image
GUARD_TABLE = "tidal_node_guard"
KUBELET_SYSCTLS = (
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "kernel.panic",
    "kernel.panic_on_oops",
)
HARDCODED_PATHS = (
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/var/lib/cni"),
    Path("/etc/cni"),
    Path("/run/containerd"),
)
GPU_RESOURCE = "nvidia.com/gpu"


class RealNodeError(RuntimeError):
    """The node could not be set up; the message says which part and shows its log."""


@dataclass(frozen=True)
class NodeBinaries:
    """The node's programs (``build-node.sh`` builds them into the cache)."""

    bin: Path
    cni: Path

    @classmethod
    def locate(cls) -> NodeBinaries:
        base = cache_root() / f"node-{K8S_VERSION}"
        return cls(bin=base / "bin", cni=base / "cni")

    def __getitem__(self, name: str) -> Path:
        return self.bin / name

    def missing(self) -> list[str]:
        names = ["kubelet", "kube-proxy", "containerd", "containerd-shim-runc-v2", "ctr", "runc"]
        names += ["coredns", "pause"]
        out = [n for n in names if not os.access(self.bin / n, os.X_OK)]
        return out + [
            f"cni/{n}"
            for n in ("bridge", "host-local", "loopback")
            if not os.access(self.cni / n, os.X_OK)
        ]


def ensure_node_binaries() -> NodeBinaries:
    bins = NodeBinaries.locate()
    if bins.missing():
        script = Path(__file__).resolve().parent / "build-node.sh"
        subprocess.run(["bash", str(script)], check=True)
        if bins.missing():
            raise RealNodeError(f"node binaries still missing after the build: {bins.missing()}")
    return bins


# -- host changes and their undoing ------------------------------------------------------------
def _run(
    *argv: str, check: bool = True, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, input=input, check=False)
    if check and result.returncode != 0:
        raise RealNodeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result


def _sysctl_file() -> Path:
    return STATE_DIR / "sysctl-before.json"


def _paths_file() -> Path:
    return STATE_DIR / "paths-before.json"


def record_host_state() -> None:
    """Save what the node will change, once: a crashed run must not overwrite the originals
    with the values kubelet set."""
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    if not _sysctl_file().exists():
        values = {k: _run("sysctl", "-n", k).stdout.strip() for k in KUBELET_SYSCTLS}
        _sysctl_file().write_text(json.dumps(values))
    if not _paths_file().exists():
        _paths_file().write_text(json.dumps({str(p): p.exists() for p in HARDCODED_PATHS}))
    if not _tables_file().exists():
        _tables_file().write_text(json.dumps(_nft_tables()))


def _tables_file() -> Path:
    return STATE_DIR / "nft-tables-before.json"


def _nft_tables() -> list[str]:
    """``family name`` of every nftables table now (iptables-nft's included)."""
    out = _run("nft", "list", "tables", check=False).stdout
    return [line.removeprefix("table ").strip() for line in out.splitlines() if line.strip()]


def _undo_kubelet_iptables() -> list[str]:
    """kubelet's own iptables chains (KUBE-FIREWALL and its jumps from INPUT/OUTPUT, the
    canaries), written through iptables-nft where the host has iptables; then the iptables
    tables that did not exist before the node ran."""
    done: list[str] = []
    for tool in ("iptables", "ip6tables"):
        if shutil.which(tool) is None:
            continue
        for table in ("filter", "nat", "mangle"):
            for chain in ("INPUT", "OUTPUT"):
                while (
                    _run(
                        tool, "-t", table, "-D", chain, "-j", "KUBE-FIREWALL", check=False
                    ).returncode
                    == 0
                ):
                    done.append(f"{tool} -t {table} -D {chain} -j KUBE-FIREWALL")
            for line in _run(tool, "-t", table, "-S", check=False).stdout.splitlines():
                if line.startswith("-N KUBE-"):
                    name = line.split()[1]
                    _run(tool, "-t", table, "-F", name, check=False)
                    if _run(tool, "-t", table, "-X", name, check=False).returncode == 0:
                        done.append(f"{tool} -t {table} -X {name}")
    if _tables_file().exists():
        before = set(json.loads(_tables_file().read_text()))
        for table in _nft_tables():
            family, _, name = table.partition(" ")
            kubelets = family in ("ip", "ip6") and name in ("filter", "nat", "mangle")
            if table not in before and kubelets:
                _run("nft", "delete", "table", family, name, check=False)
                done.append(f"nft table {table}")
        _tables_file().unlink()
    return done


def _kill_node_processes() -> None:
    """Everything started from the node's binaries (kubelet, kube-proxy, containerd, shims)
    and every container process under the node's cgroups."""
    bins = NodeBinaries.locate().bin
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            exe = str((pid_dir / "exe").readlink())
            if exe.startswith(str(bins)):
                os.kill(int(pid_dir.name), signal.SIGKILL)
    for tasks in Path("/sys/fs/cgroup/pids").glob("kubepods/**/tasks"):
        with contextlib.suppress(OSError):
            for pid in tasks.read_text().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)


def cleanup_host() -> list[str]:
    """Undo every host change a real node made (idempotent); what was undone, for the log."""
    done: list[str] = []
    _kill_node_processes()
    # Mounts under the node's directories, deepest first (pod volumes, netns, overlay rootfs).
    mounts = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            target = line.split()[1].replace("\\040", " ")
            if target.startswith((str(RUN_DIR), str(STATE_DIR), str(_containerd_root()))):
                mounts.append(target)
    for target in sorted(mounts, key=len, reverse=True):
        if _run("umount", target, check=False).returncode != 0:
            _run("umount", "-l", target, check=False)
        done.append(f"umount {target}")
    for controller in Path("/sys/fs/cgroup").iterdir():
        kubepods = controller / "kubepods"
        if kubepods.is_dir():
            for d in sorted(
                (p for p in kubepods.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
            ):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                kubepods.rmdir()
                done.append(f"cgroup {kubepods}")
    for family, table in (("inet", GUARD_TABLE), ("ip", "kube-proxy"), ("ip6", "kube-proxy")):
        if _run("nft", "delete", "table", family, table, check=False).returncode == 0:
            done.append(f"nft table {family} {table}")
    done += _undo_kubelet_iptables()
    if _run("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        for line in _run(
            "ip", "-o", "link", "show", "master", BRIDGE, check=False
        ).stdout.splitlines():
            veth = line.split(": ")[1].split("@")[0]
            _run("ip", "link", "del", veth, check=False)
        _run("ip", "link", "del", BRIDGE, check=False)
        done.append(f"bridge {BRIDGE} and its routes")
    if _sysctl_file().exists():
        for key, value in json.loads(_sysctl_file().read_text()).items():
            if _run("sysctl", "-n", key, check=False).stdout.strip() != value:
                _run("sysctl", "-qw", f"{key}={value}", check=False)
                done.append(f"sysctl {key}={value}")
        _sysctl_file().unlink()
    if _paths_file().exists():
        for path, existed in json.loads(_paths_file().read_text()).items():
            if not existed and Path(path).exists():
                shutil.rmtree(path, ignore_errors=True)
                done.append(f"rm {path}")
        _paths_file().unlink()
    for d in (RUN_DIR, STATE_DIR):
        shutil.rmtree(d, ignore_errors=True)
    return done


def _containerd_root() -> Path:
    return cache_root() / "node-images" / "containerd"


def net_up() -> None:
    """The bridge, the service route and the guard table (see the module docstring)."""
    if _run("ip", "link", "show", BRIDGE, check=False).returncode != 0:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
    _run("sysctl", "-qw", f"net.ipv4.conf.{BRIDGE}.forwarding=1")
    _run("ip", "route", "replace", SERVICE_CIDR, "dev", BRIDGE, "src", NODE_IP)
    _run(
        "nft",
        "-f",
        "-",
        input=f"""
table inet {GUARD_TABLE} {{
  chain forward {{
    type filter hook forward priority -10; policy accept;
    iifname "{BRIDGE}" oifname != "{BRIDGE}" counter reject with icmpx type admin-prohibited
  }}
  chain postrouting {{
    type filter hook postrouting priority 100; policy accept;
    oifname != {{ "{BRIDGE}", "lo" }} ip daddr {{ {SERVICE_CIDR}, {POD_CIDR} }} counter drop
    oifname != {{ "{BRIDGE}", "lo" }} ip saddr {POD_CIDR} counter drop
  }}
}}
""",
    )


def _wait_bridge_gone_of_foreign_owner() -> None:
    """The bridge address must be ours: a node-agent sandbox or anything else holding
    10.245.0.1 would receive the API server's traffic."""
    out = _run("ip", "-o", "addr", "show", "to", f"{NODE_IP}/32", check=False).stdout
    for line in out.splitlines():
        dev = line.split()[1]
        if dev != BRIDGE:
            raise RealNodeError(f"{NODE_IP} is already held by {dev}; the real node needs it")


# -- the node ------------------------------------------------------------------------------------
class RealNode:
    """One real node joined to a running sandbox control plane."""

    def __init__(
        self,
        *,
        api_url: str,
        pki: Pki,
        log_dir: Path,
        gpus: int = 2,
        cpu_reserved: str = "200m",
        lock_timeout: float = 2400.0,
    ) -> None:
        self.api_url = api_url
        self.pki = pki
        self.log_dir = log_dir
        self.gpus = gpus
        self.cpu_reserved = cpu_reserved
        self.lock_timeout = lock_timeout
        self.bins = NodeBinaries.locate()
        self.etc = STATE_DIR / "etc"
        self.processes: dict[str, ManagedProcess] = {}
        self._lock: IO[str] | None = None
        self._holds_lock = False  # the host (bridge, cgroups, kubelet paths) is ours to change
        # Registry host -> the endpoint containerd pulls its images from instead (hosts.toml),
        # e.g. {"ghcr.io": "http://127.0.0.1:5000"}: set before start().
        self.mirrors: dict[str, str] = {}

    # lifecycle ---------------------------------------------------------------------------
    def prepare_host(self) -> None:
        """Take the machine-wide lock, clear what a killed run left, bring the network up.
        Called before the API server starts: it listens on the bridge address."""
        self.bins = ensure_node_binaries()
        LOCK_FILE.parent.mkdir(parents=True, exist_ok=True)
        self._lock = open(LOCK_FILE, "a+")  # noqa: SIM115 - held for the node's lifetime
        lock = self._lock

        def locked() -> bool:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        if not locked():
            # One real node per machine (its bridge, cgroups and kubelet paths are host-wide):
            # a second sandbox waits its turn, e.g. two test runs side by side.
            log.warning("another real sandbox node runs on this machine; waiting for it")
            try:
                wait_for(
                    locked,
                    timeout=self.lock_timeout,
                    interval=2.0,
                    what=f"the real node's lock {LOCK_FILE}",
                )
            except TimeoutError:
                lock.close()
                self._lock = None
                raise RealNodeError(
                    f"another real sandbox node has run on this machine for over "
                    f"{self.lock_timeout:.0f} s ({LOCK_FILE} is locked); one at a time"
                ) from None
        self._holds_lock = True
        leftovers = cleanup_host()
        if leftovers:
            log.warning("cleared what a previous real node left: %s", "; ".join(leftovers))
        _wait_bridge_gone_of_foreign_owner()
        record_host_state()
        net_up()

    def start(self, images: list[Path], names: list[str] | None = None) -> None:
        """containerd, the images, kubelet (node Ready, GPUs advertised), kube-proxy.

        ``names`` are the references the archives hold: the node's containerd keeps no other
        image (its root is cached between runs and would otherwise grow by two images a
        build). Call :meth:`wait_images_visible` once kubelet is up."""
        for d in (RUN_DIR, STATE_DIR / "kubelet", self.etc, self.etc / "net.d", _containerd_root()):
            d.mkdir(parents=True, exist_ok=True)
        self._write_configs()
        self._start(
            "containerd", [str(self.bins["containerd"]), f"--config={self.etc / 'containerd.toml'}"]
        )
        self._wait(lambda: self.ctr("version").returncode == 0, "containerd answers", 60)
        if names is not None:
            self.remove_stale_containers()
            self.remove_images_except(names)
        for archive in images:
            self.import_image(archive)
        self._start_kubelet()
        self._start(
            "kube-proxy",
            [str(self.bins["kube-proxy"]), f"--config={self.etc / 'kube-proxy.yaml'}", "--v=1"],
        )

    def stop(self) -> None:
        for name in ("kube-proxy", "kubelet", "containerd"):
            proc = self.processes.pop(name, None)
            if proc is not None:
                proc.stop(grace=20.0)
        if self._holds_lock:
            # Only the holder: a sandbox stopped while it waited for the lock (a second test
            # run, ended early) must not take the bridge from under the node that runs.
            undone = cleanup_host()
            log.info("real node cleaned up: %s", "; ".join(undone))
            self._holds_lock = False
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def restart_kubelet(self) -> None:
        """Stop kubelet (SIGTERM, as a service manager would) and start it again; containers
        keep running under containerd meanwhile."""
        proc = self.processes.pop("kubelet")
        proc.stop(grace=20.0)
        self._start_kubelet(register=False)

    # parts ---------------------------------------------------------------------------------
    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        sock = RUN_DIR / "containerd.sock"
        return _run(str(self.bins["ctr"]), f"--address={sock}", "-n", "k8s.io", *args, check=False)

    def import_image(self, archive: Path) -> None:
        done = self.ctr("images", "import", "--no-unpack=false", str(archive))
        if done.returncode != 0:
            raise RealNodeError(f"ctr images import {archive}: {done.stderr.strip()}")

    def remove_stale_containers(self) -> list[str]:
        """Remove the containers, sandboxes and leases an earlier run left in the cached root:
        their pods went with that run's cluster, and they would keep old images' snapshots
        (hundreds of MB each) from being collected."""
        gone: list[str] = []
        for kind in ("containers", "sandboxes", "leases"):
            ids = self.ctr(kind, "ls", "-q").stdout.split()
            if ids:
                done = self.ctr(kind, "rm", *ids)
                if done.returncode != 0:
                    log.warning("ctr %s rm: %s", kind, done.stderr.strip())
                gone += ids
        return gone

    def image_digests(self) -> dict[str, str]:
        """Every image reference in containerd and the digest it points to."""
        done = self.ctr("images", "ls")
        if done.returncode != 0:
            raise RealNodeError(f"ctr images ls: {done.stderr.strip()}")
        rows = [line.split() for line in done.stdout.splitlines()[1:]]
        return {row[0]: row[2] for row in rows if len(row) >= 3}

    def image_names(self) -> list[str]:
        return sorted(self.image_digests())

    def remove_images_except(self, keep: list[str]) -> list[str]:
        """Remove every image reference that is neither in ``keep`` nor the CRI's by-id
        reference (``sha256:…``) of one of them; containerd then collects their content and
        snapshots (``--sync``: before the imports)."""
        stale = stale_image_refs(self.image_digests(), keep)
        if stale:
            done = self.ctr("images", "rm", "--sync", *stale)
            if done.returncode != 0:
                log.warning("ctr images rm: %s", done.stderr.strip())
        return stale

    def wait_images_visible(self, core_api: Any, names: list[str], timeout: float) -> None:
        """Every imported image listed by kubelet (the CRI's view, in the node's
        ``status.images``), or a :class:`RealNodeError` saying which is missing and what
        containerd holds.

        An image kubelet does not list is labelled ``io.cri-containerd.pinned`` (at once, then
        every 10 s while it is missing): the label's ``ImageUpdate`` event reaches the CRI
        plugin's image cache even where the import's ``ImageCreate`` did not (an import that
        finishes while the plugin subscribes to events at start-up is in containerd but not in
        the CRI's cache, and every pod using it is ``ErrImageNeverPull``), and a pinned image
        is one kubelet's image GC never removes (which the kubelet configuration turns off
        anyway: the images are imported, never pulled)."""
        last_label = [-1e9]

        def visible() -> bool:
            node = core_api.read_node(NODE_NAME)
            listed = {n for img in (node.status.images or []) for n in (img.names or [])}
            missing = [n for n in names if n not in listed]
            if missing and time.monotonic() - last_label[0] > 10.0:
                last_label[0] = time.monotonic()
                for name in missing:
                    self.ctr("images", "label", name, "io.cri-containerd.pinned=pinned")
            return not missing

        def describe() -> str:
            node = core_api.read_node(NODE_NAME)
            listed = sorted({n for img in (node.status.images or []) for n in (img.names or [])})
            return f"wanted {names}; kubelet lists {listed}; containerd holds {self.image_names()}"

        self._wait_described(visible, "every imported image listed by kubelet", timeout, describe)

    def _start(self, name: str, argv: list[str]) -> None:
        env = {
            "PATH": f"{self.bins.bin}:{self.bins.cni}:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": str(STATE_DIR),
        }
        self.processes[name] = ManagedProcess(name, argv, self.log_dir / f"{name}.log", env=env)

    def _start_kubelet(self, register: bool = True) -> None:
        self._start(
            "kubelet",
            [
                str(self.bins["kubelet"]),
                f"--config={self.etc / 'kubelet.yaml'}",
                f"--kubeconfig={self.etc / 'kubelet.kubeconfig'}",
                f"--root-dir={STATE_DIR / 'kubelet'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={NODE_IP}",
                "--node-labels=tidal.dev/real-node=true",
                "--v=1",
            ],
        )

    def _wait(self, fn: Any, what: str, timeout: float) -> Any:
        return self._wait_described(fn, what, timeout, None)

    def _wait_described(self, fn: Any, what: str, timeout: float, describe: Any) -> Any:
        def probe() -> Any:
            for proc in self.processes.values():
                if not proc.alive():
                    raise RealNodeError(f"{proc.name} exited; {proc.log_path}:\n{proc.tail(20)}")
            return fn()

        try:
            return wait_for(probe, timeout=timeout, interval=0.2, what=what, describe=describe)
        except TimeoutError as exc:
            tails = "\n".join(f"--- {p.name}:\n{p.tail(15)}" for p in self.processes.values())
            raise RealNodeError(f"{exc}\n{tails}") from exc

    def _kubeconfig(self, path: Path, cert: Path, key: Path) -> Path:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "sandbox",
                    "cluster": {
                        "server": self.api_url,
                        "certificate-authority": str(self.pki.ca_cert),
                    },
                }
            ],
            "users": [
                {"name": "u", "user": {"client-certificate": str(cert), "client-key": str(key)}}
            ],
            "contexts": [{"name": "c", "context": {"cluster": "sandbox", "user": "u"}}],
            "current-context": "c",
        }
        path.write_text(yaml.safe_dump(doc))
        return path

    def _registry_config(self) -> str:
        """The CRI images plugin's hosts directory, when some registry host is mirrored."""
        if not self.mirrors:
            return ""
        return (
            "    [plugins.'io.containerd.cri.v1.images'.registry]\n"
            f'      config_path = "{self.etc / "certs.d"}"\n'
        )

    def _write_configs(self) -> None:
        pki_dir = self.etc / "pki"
        node_cert = issue_client_cert(self.pki, pki_dir, f"system:node:{NODE_NAME}", "system:nodes")
        proxy_cert = issue_client_cert(self.pki, pki_dir, "system:kube-proxy", "")
        self._kubeconfig(self.etc / "kubelet.kubeconfig", *node_cert)
        self._kubeconfig(self.etc / "kube-proxy.kubeconfig", *proxy_cert)
        cni_bin, run = self.bins.cni, RUN_DIR
        (self.etc / "containerd.toml").write_text(
            f"""version = 3
root = "{_containerd_root()}"
state = "{run}/containerd"
[grpc]
  address = "{run}/containerd.sock"
[ttrpc]
  address = "{run}/containerd.sock.ttrpc"
[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "{STATE_DIR}/opt"
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = "{run}/s"
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{PAUSE_IMAGE}"
{self._registry_config()}  [plugins.'io.containerd.cri.v1.runtime']
    netns_mounts_under_state_dir = true
    # These machines drop CAP_SYS_RESOURCE: oom_score_adj may only go up.
    restrict_oom_score_adj = true
    tolerate_missing_hugetlb_controller = true
    disable_hugetlb_controller = true
    cdi_spec_dirs = ["{STATE_DIR}/cdi"]
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "{self.bins["runc"]}"
          Root = "{run}/runc"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["{cni_bin}"]
      conf_dir = "{self.etc / "net.d"}"
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
"""
        )
        write_hosts(self.etc / "certs.d", self.mirrors)
        conflist = {
            "cniVersion": "1.0.0",
            "name": "tidal-node",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": BRIDGE,
                    "isGateway": False,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(STATE_DIR / "ipam"),
                        "ranges": [
                            [
                                {
                                    "subnet": POD_CIDR,
                                    "rangeStart": "10.245.0.10",
                                    "rangeEnd": "10.245.0.250",
                                    "gateway": NODE_IP,
                                }
                            ]
                        ],
                        # No default route: pods reach the pod and service ranges only.
                        "routes": [{"dst": SERVICE_CIDR, "gw": NODE_IP}],
                    },
                }
            ],
        }
        (self.etc / "net.d" / "10-tidal-node.conflist").write_text(json.dumps(conflist, indent=1))
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # cgroup v1 host without systemd: kubelet >= 1.35 refuses v1 unless told otherwise.
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "containerRuntimeEndpoint": f"unix://{RUN_DIR}/containerd.sock",
            "address": NODE_IP,
            "port": KUBELET_PORT,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": 10248,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": True},
                "x509": {"clientCAFile": str(self.pki.ca_cert)},
            },
            "authorization": {"mode": "Webhook"},
            "clusterDNS": [DNS_IP],
            "clusterDomain": CLUSTER_DOMAIN,
            # No host resolver for pods: the cluster zone only, nothing forwarded off the machine.
            "resolvConf": "",
            "failSwapOn": False,
            "podLogsDir": str(STATE_DIR / "pod-logs"),
            "volumePluginDir": str(STATE_DIR / "volume-plugins"),
            "serializeImagePulls": False,
            "registerNode": True,
            "maxPods": 60,
            "systemReserved": {"cpu": self.cpu_reserved},
            "evictionHard": {
                "memory.available": "100Mi",
                "nodefs.available": "0%",
                "nodefs.inodesFree": "0%",
                "imagefs.available": "0%",
            },
            # The node's disk is the host's, shared with everything else on it: kubelet must
            # neither collect images (they are imported, never pulled) nor evict pods over what
            # other programs use. kind's nodes do the same.
            "imageGCHighThresholdPercent": 100,
            # One image runs here under two names: imported as localhost/tidal/… (pods with
            # imagePullPolicy Never) and pulled from the sandbox's registry under its release
            # name (ghcr.io/…, the install test). Kubelet's default policy since 1.35
            # (KubeletEnsureSecretPulledImages, NeverVerifyPreloadedImages) keeps a record of
            # each image id it pulled, with the names it pulled it as; an image with such a
            # record asked for under any other name must be pulled again to check credentials,
            # which imagePullPolicy Never refuses as "not present" (ErrImageNeverPull): every
            # scenario after the install test failed so. The records outlive the run
            # (<root-dir>/image_manager). This node has no pull secret: nothing to verify.
            "imagePullCredentialsVerificationPolicy": "NeverVerify",
            "nodeStatusMaxImages": -1,
            "shutdownGracePeriod": "0s",
            "syncFrequency": "5s",
            "nodeStatusUpdateFrequency": "5s",
        }
        (self.etc / "kubelet.yaml").write_text(yaml.safe_dump(kubelet))
        proxy = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.etc / "kube-proxy.kubeconfig")},
            "mode": "nftables",
            "hostnameOverride": NODE_NAME,
            "clusterCIDR": POD_CIDR,
            "healthzBindAddress": "127.0.0.1:10656",
            "metricsBindAddress": "127.0.0.1:10649",
            # Leave the host's conntrack sysctls alone (0: do not touch).
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
            "nodePortAddresses": [f"{NODE_IP}/32"],
        }
        (self.etc / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy))


def stale_image_refs(refs: dict[str, str], keep: list[str]) -> list[str]:
    """The references (``ctr images ls``: reference -> manifest digest) that are neither in
    ``keep`` nor another name of a kept image's own: its CRI by-id (``sha256:…``) or repo digest
    (``<repository>@sha256:…``). A reference of another repository with a kept image's digest is
    stale: the release names a previous run pulled or tagged (``ghcr.io/…:0.1.0``) hold the same
    archive's digest, and must not meet the next run's node."""
    kept = {refs[name] for name in keep if name in refs}
    repositories = {
        name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name for name in keep
    }

    def own(ref: str, digest: str) -> bool:
        if digest not in kept:
            return False
        return ref.startswith("sha256:") or ref.split("@", 1)[0] in repositories

    return [ref for ref, digest in refs.items() if ref not in keep and not own(ref, digest)]


def hosts_toml(endpoint: str) -> str:
    """containerd's hosts.toml sending every pull of one registry host to ``endpoint`` (plain
    HTTP for an ``http://`` endpoint), and nowhere else."""
    return f'server = "{endpoint}"\n\n[host."{endpoint}"]\n  capabilities = ["pull", "resolve"]\n'


def write_hosts(certs_d: Path, mirrors: dict[str, str]) -> None:
    """``certs.d/<host>/hosts.toml`` for each mirrored host; no other host's directory."""
    shutil.rmtree(certs_d, ignore_errors=True)
    for host, endpoint in mirrors.items():
        (certs_d / host).mkdir(parents=True)
        (certs_d / host / "hosts.toml").write_text(hosts_toml(endpoint))
    certs_d.mkdir(parents=True, exist_ok=True)


def advertise_gpus(core_api: Any, gpus: int) -> None:
    """``nvidia.com/gpu`` on the node's capacity (a status patch, as for any extended resource
    without a device plugin); done again after a kubelet restart."""
    patch = [{"op": "add", "path": "/status/capacity/nvidia.com~1gpu", "value": str(gpus)}]
    core_api.patch_node_status(NODE_NAME, patch)


def wait_node_ready(core_api: Any, timeout: float, check: Any = None) -> None:
    def ready() -> bool:
        if check is not None:
            check()
        node = core_api.read_node(NODE_NAME)
        conditions = (node.status.conditions if node.status else None) or []
        taints = (node.spec.taints if node.spec else None) or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions) and not any(
            t.key.startswith("node.kubernetes.io/") for t in taints
        )

    wait_for(ready, timeout=timeout, interval=0.3, what=f"node {NODE_NAME} Ready and untainted")


def cluster_dns_manifests(image: str) -> list[dict[str, Any]]:
    """CoreDNS for the cluster zone only, forwarding nothing, at ``DNS_IP`` (kubelet's
    clusterDNS): the RBAC it needs, its Corefile, a Deployment and the ``kube-dns`` Service."""
    labels = {"k8s-app": "kube-dns"}
    corefile = (
        ".:53 {\n    errors\n    health :8080\n    ready :8181\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        "        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n        ttl 5\n    }\n"
        "    cache 5\n    loadbalance\n}\n"
    )
    meta = {"namespace": "kube-system"}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "coredns", **meta}},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "coredns", **meta},
            "data": {"Corefile": corefile},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "coredns", **meta, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "priorityClassName": "system-cluster-critical",
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"},
                            # Port 53 without a capability.
                            "sysctls": [
                                {"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}
                            ],
                        },
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image,
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"containerPort": 53, "protocol": "UDP", "name": "dns"},
                                    {"containerPort": 53, "protocol": "TCP", "name": "dns-tcp"},
                                ],
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 1,
                                },
                                "livenessProbe": {
                                    "httpGet": {"path": "/health", "port": 8080},
                                    "periodSeconds": 10,
                                },
                                "resources": {
                                    "requests": {"cpu": "50m", "memory": "32Mi"},
                                    "limits": {"memory": "128Mi"},
                                },
                                "securityContext": {
                                    "readOnlyRootFilesystem": True,
                                    "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]},
                                },
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", **meta, "labels": labels},
            "spec": {
                "clusterIP": DNS_IP,
                "selector": labels,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        },
    ]


def external_service_manifests(
    namespace: str, name: str, port: int, address: str, target_port: int
) -> list[dict[str, Any]]:
    """A Service without selector and its EndpointSlice: an in-cluster name for a process the
    sandbox runs on the host's bridge address (Prometheus)."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"ports": [{"name": "http", "port": port, "targetPort": target_port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{name}-host",
                "namespace": namespace,
                "labels": {"kubernetes.io/service-name": name},
            },
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": target_port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        },
    ]
