"""The sandbox's OCI registry: CNCF distribution (``registry``), built like the control plane.

A user's cluster pulls tidal's images and chart from a registry; the sandbox runs a real one,
built from the Go module proxy into the cache (``build-binaries.sh``), on 127.0.0.1 only, over
plain HTTP, with its storage under the sandbox's state directory (gone on stop). The release
script (:mod:`tidal.sandbox.release`) pushes to it; the real node's containerd pulls from it
through a hosts.toml mirror (:meth:`tidal.sandbox.realnode.RealNode.start`).

    reg = Registry.start(binaries.registry, state_dir / "registry")
    reg.host                 # "127.0.0.1:PORT", the push and pull address
    reg.stop()               # the process and its storage go
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from .binaries import fresh_dir
from .procs import ManagedProcess, free_port, wait_answering


def config_yaml(storage: Path, address: str) -> str:
    """distribution's configuration: filesystem storage, deletes allowed, no auth, HTTP on
    ``address``; its debug server off (it would take a second port)."""
    return json.dumps(
        {
            "version": 0.1,
            "log": {"level": "info", "formatter": "text"},
            "storage": {
                "filesystem": {"rootdirectory": str(storage)},
                "delete": {"enabled": True},
                "redirect": {"disable": True},
            },
            "http": {"addr": address, "headers": {"X-Content-Type-Options": ["nosniff"]}},
        },
        indent=1,
    )  # JSON is YAML: distribution reads it as its YAML configuration


@dataclass
class Registry:
    """A running distribution registry; ``host`` is its ``127.0.0.1:PORT``."""

    process: ManagedProcess
    storage: Path
    port: int

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    @classmethod
    def start(
        cls, binary: Path, state_dir: Path, port: int | None = None, timeout: float = 60.0
    ) -> Registry:
        """Start the registry on 127.0.0.1 (a free port by default), storage under
        ``state_dir / "storage"``, and wait until ``/v2/`` answers."""
        storage = fresh_dir(binary, "the registry", state_dir / "storage")
        port = port or free_port("127.0.0.1")
        config = state_dir / "config.yml"
        config.write_text(config_yaml(storage, f"127.0.0.1:{port}"))
        process = ManagedProcess(
            "registry",
            [str(binary), "serve", str(config)],
            state_dir / "registry.log",
            env={"PATH": "/usr/bin:/bin"},
        )
        registry = cls(process, storage, port)
        wait_answering(process, registry.url + "/v2/", timeout)
        return registry

    def tags(self, repository: str) -> list[str]:
        """The tags of ``repository`` (empty when it holds none)."""
        try:
            with urllib.request.urlopen(f"{self.url}/v2/{repository}/tags/list", timeout=10) as a:
                return list(json.load(a).get("tags") or [])
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.storage, ignore_errors=True)
