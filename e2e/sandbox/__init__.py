"""The tidal sandbox: a real Kubernetes control plane run as local processes.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler are built from the Go module
proxy (``build-binaries.sh``); pods run on a real node (kubelet, containerd, kube-proxy and
CoreDNS with the project's images, ``realnode.py``: the end-to-end scenarios' node) or under
the node agent (each pod's containers as local processes: ``tests/``, fake nodes, the
control-plane fault sandbox); Prometheus from Debian's package scrapes annotated pods.

The public entry points are :class:`Sandbox` (start/stop a whole sandbox) and
:func:`tidal.sandbox.wait.wait_for`.
"""

from .cluster import Sandbox, SandboxConfig

__all__ = ["Sandbox", "SandboxConfig"]
