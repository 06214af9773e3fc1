"""Where the sandbox's binaries live, and building them when they are missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

K8S_VERSION = os.environ.get("TIDAL_K8S_VERSION", "v1.37.2")
ETCD_VERSION = os.environ.get("TIDAL_ETCD_VERSION", "v3.6.16")
VERSITYGW_VERSION = os.environ.get("TIDAL_VERSITYGW_VERSION", "v1.8.0")
BUILD_SCRIPT = Path(__file__).resolve().parent / "build-binaries.sh"


def cache_root() -> Path:
    return Path(os.environ.get("TIDAL_CACHE", Path.home() / ".cache" / "tidal"))


@dataclass(frozen=True)
class Binaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubectl: Path
    prometheus: Path
    versitygw: Path  # the object store (e2e/sandbox/objectstore.py)

    @classmethod
    def locate(cls) -> Binaries:
        root = cache_root()
        k8s = root / f"k8s-{K8S_VERSION}" / "bin"
        return cls(
            etcd=root / f"etcd-{ETCD_VERSION}" / "bin" / "etcd",
            kube_apiserver=k8s / "kube-apiserver",
            kube_controller_manager=k8s / "kube-controller-manager",
            kube_scheduler=k8s / "kube-scheduler",
            kubectl=k8s / "kubectl",
            prometheus=root / "prometheus" / "usr" / "bin" / "prometheus",
            versitygw=root / f"versitygw-{VERSITYGW_VERSION}" / "bin" / "versitygw",
        )

    def missing(self) -> list[Path]:
        return [p for p in vars(self).values() if not os.access(p, os.X_OK)]


def ensure_binaries() -> Binaries:
    """Return the binaries, building the missing ones first (progress goes to stderr)."""
    bins = Binaries.locate()
    if bins.missing():
        bash = shutil.which("bash") or "/bin/bash"
        subprocess.run([bash, str(BUILD_SCRIPT)], check=True)
        still = bins.missing()
        if still:
            raise RuntimeError(f"sandbox binaries still missing after the build: {still}")
    return bins
