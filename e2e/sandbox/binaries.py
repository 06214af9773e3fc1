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
REGISTRY_VERSION = os.environ.get("TIDAL_REGISTRY_VERSION", "v3.1.2")
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
    registry: Path  # the OCI registry, CNCF distribution (e2e/sandbox/registry.py)

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
            registry=root / f"registry-{REGISTRY_VERSION}" / "bin" / "registry",
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


def fresh_dir(binary: Path, name: str, directory: Path) -> Path:
    """``directory`` emptied and made, after checking that ``name``'s ``binary`` is built."""
    if not binary.is_file():
        raise RuntimeError(
            f"{name} is not built at {binary}: run `make sandbox-binaries` "
            "(bash e2e/sandbox/build-binaries.sh)"
        )
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    return directory
