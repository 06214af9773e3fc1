"""The sandbox's object store: a real S3-compatible server (versitygw over a directory).

Users keep engines in an object store (S3, or MinIO, Ceph RGW, ... in their own clusters); the
sandbox runs versitygw, an S3 gateway over a POSIX directory, built from the Go module proxy into
the cache like the control plane (``build-binaries.sh``). It listens on one address the caller
chooses: 127.0.0.1 for tests of the runtime, or an address that the real node's pods reach. Its
root user's keys are made per start; a bucket is a directory under its data directory.

    store = ObjectStore.start(binaries.versitygw, state_dir / "s3")
    store.create_bucket("engines")
    store.put("engines", "mlp/model.onnx", data)
    ...
    store.stop()       # the process and its data directory go
"""

from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .binaries import fresh_dir
from .procs import ManagedProcess, free_port, wait_answering

REGION = "us-east-1"


@dataclass
class ObjectStore:
    """A running versitygw; ``endpoint`` is its URL, ``access_key``/``secret_key`` its root
    user's credentials."""

    process: ManagedProcess
    data_dir: Path
    host: str
    port: int
    access_key: str
    secret_key: str

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @classmethod
    def start(
        cls,
        binary: Path,
        state_dir: Path,
        host: str = "127.0.0.1",
        port: int | None = None,
        timeout: float = 60.0,
    ) -> ObjectStore:
        """Start versitygw serving ``state_dir / "data"`` on ``host:port`` (a free port by
        default) and wait until it answers S3 requests."""
        data = fresh_dir(binary, "versitygw", state_dir / "data")
        port = port or free_port(host)
        access = "tidal" + secrets.token_hex(6)
        secret = secrets.token_hex(20)
        process = ManagedProcess(
            "versitygw",
            [
                str(binary),
                "--access",
                access,
                "--secret",
                secret,
                "--region",
                REGION,
                "--port",
                f"{host}:{port}",
                "posix",
                str(data),
            ],
            state_dir / "versitygw.log",
            env={"PATH": "/usr/bin:/bin"},
        )
        store = cls(process, data, host, port, access, secret)
        wait_answering(process, store.endpoint + "/", timeout)  # unsigned: 403 means it serves
        return store

    # -- S3 calls (obstore, the client the runtime uses) ----------------------------------------

    def client(self, bucket: str) -> Any:
        from obstore.store import S3Store

        return S3Store(
            bucket,
            config={
                "endpoint": self.endpoint,
                "region": REGION,
                "access_key_id": self.access_key,
                "secret_access_key": self.secret_key,
                "virtual_hosted_style_request": False,
            },
            client_options={"allow_http": True},
        )

    def create_bucket(self, bucket: str) -> None:
        """A bucket is a directory of the posix backend; it is listed at once."""
        (self.data_dir / bucket).mkdir(exist_ok=True)

    def put(self, bucket: str, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self.client(bucket), key, data)

    def put_file(self, bucket: str, key: str, path: Path) -> None:
        self.put(bucket, key, path.read_bytes())

    def env(self) -> dict[str, str]:
        """The AWS variables a client of this store needs (the runtime's credentials)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
        }

    def stop(self) -> None:
        self.process.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
