"""Pod networking for the sandbox node agent, the way a CNI plugin does it.

The API server refuses loopback addresses in EndpointSlices, so pods cannot simply share
127.0.0.0/8. Instead each sandbox owns a bridge ``tidal<k>`` holding the gateway address of its
own /20 out of ``10.244.0.0/16``; each pod gets a network namespace with a veth pair into that
bridge and one address of the /20. These addresses exist only inside this machine: the
namespaces and the bridge are made by the sandbox itself and removed when it stops (a stale set
left by a killed sandbox is found by its unlocked lock file and removed at the next start).

Needs root (CAP_NET_ADMIN), as CI and the development machines have.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import subprocess
import threading
from pathlib import Path
from typing import IO

POD_SUPERNET = ipaddress.ip_network("10.244.0.0/16")
SUBNET_PREFIX = 20
LOCK_DIR = Path("/run/tidal-sandbox")


class PodNetworkError(RuntimeError):
    """Pod networking could not be set up (not root, or ``ip`` missing)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise PodNetworkError("the sandbox needs iproute2's `ip` command") from exc
    if check and result.returncode != 0:
        raise PodNetworkError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _remove_subnet(k: int) -> None:
    """Whatever a dead owner of subnet ``k`` left behind: its pods' namespaces, its bridge, and
    any route into the subnet (e.g. a killed benchmark's routes through its own namespace,
    more specific than the bridge's, which would take a new bridge's traffic)."""
    for ns in _ip("netns", "list", check=False).stdout.split("\n"):
        name = ns.split(" ")[0]
        if name.startswith(f"tidal{k}-"):
            _ip("netns", "del", name, check=False)
    _ip("link", "del", f"tidal{k}", check=False)
    subnet = list(POD_SUPERNET.subnets(new_prefix=SUBNET_PREFIX))[k]
    for line in _ip("route", "show", "root", str(subnet), check=False).stdout.splitlines():
        if line.split():
            _ip("route", "del", line.split()[0], check=False)


class PodNetwork:
    """One sandbox's bridge, subnet and per-pod namespaces."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock_file: IO[str] | None = None
        self.index = -1
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""
        self._hosts: list[str] = []
        self._next = 0
        self._free: list[str] = []

    def setup(self) -> None:
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        subnets = list(POD_SUPERNET.subnets(new_prefix=SUBNET_PREFIX))
        for k in range(len(subnets)):
            lock = open(LOCK_DIR / f"net-{k}.lock", "w")  # noqa: SIM115 - held while we run
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                continue  # another live sandbox owns this subnet
            _remove_subnet(k)  # whatever a dead sandbox left behind
            self._lock_file, self.index = lock, k
            break
        else:
            raise PodNetworkError("all sandbox pod subnets are in use")
        self.subnet = ipaddress.IPv4Network(subnets[self.index])
        hosts = [str(h) for h in self.subnet.hosts()]
        self.gateway, self._hosts = hosts[0], hosts[1:]
        bridge = f"tidal{self.index}"
        _ip("link", "add", bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/{SUBNET_PREFIX}", "dev", bridge)
        _ip("link", "set", bridge, "up")

    def _take(self) -> str:
        with self._lock:
            if self._free:
                return self._free.pop(0)
            if self._next >= len(self._hosts):
                raise PodNetworkError(f"pod subnet {self.subnet} is exhausted")
            self._next += 1
            return self._hosts[self._next - 1]

    def address_only(self) -> str:
        """An address with no namespace behind it (for pods on fake nodes)."""
        return self._take()

    def release_address(self, ip: str) -> None:
        with self._lock:
            self._free.append(ip)

    def attach(self) -> tuple[str, str]:
        """Create a namespace with one address for a pod; return (namespace, address)."""
        ip = self._take()
        n = int(ipaddress.ip_address(ip)) - int(ipaddress.ip_address(self.gateway))
        ns, host_if = f"tidal{self.index}-{n}", f"tv{self.index}-{n}"
        try:
            _ip("netns", "del", ns, check=False)
            _ip("netns", "add", ns)
            _ip("link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _ip("link", "set", host_if, "master", f"tidal{self.index}", "up")
            _ip("-n", ns, "addr", "add", f"{ip}/{SUBNET_PREFIX}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "route", "add", "default", "via", self.gateway)
        except PodNetworkError:
            _ip("netns", "del", ns, check=False)
            self.release_address(ip)
            raise
        return ns, ip

    def detach(self, ns: str, ip: str) -> None:
        _ip("netns", "del", ns, check=False)  # takes the veth pair with it
        self.release_address(ip)

    def teardown(self) -> None:
        if self.index >= 0:
            _remove_subnet(self.index)
        if self._lock_file is not None:
            with contextlib.suppress(OSError):
                self._lock_file.close()


def enter(ns: str, argv: list[str]) -> list[str]:
    """``argv`` run inside the pod's network namespace."""
    return ["nsenter", f"--net=/run/netns/{ns}", "--", *argv]
