"""The tidal sandbox: a real Kubernetes control plane run as local processes.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are built from the Go module
proxy (``build-binaries.sh``); a node agent stands in for kubelet and a container runtime (it runs
each pod's containers as local processes, each pod on its own loopback address), and Prometheus
from Debian's package scrapes annotated pods through the sandbox API server.

The public entry points are :class:`Sandbox` (start/stop a whole sandbox) and
:func:`tidal.sandbox.wait.wait_for`.
"""

from tidal.sandbox.cluster import Sandbox, SandboxConfig

__all__ = ["Sandbox", "SandboxConfig"]
