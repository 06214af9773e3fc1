"""Fixtures for runtime tests: generated ONNX models and a runtime served on a loopback port.

The server runs in a background thread with its own event loop so that synchronous, real
clients (tritonclient[http], urllib) can talk to it from the test.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tidal.runtime.backends import Backend
from tidal.runtime.config import RuntimeConfig, parse_config
from tidal.runtime.server import RuntimeServer, make_runner
from tidal.sandbox.binaries import Binaries
from tidal.sandbox.objectstore import ObjectStore


class ServedRuntime:
    def __init__(self, config: RuntimeConfig, backend: Backend | None = None) -> None:
        self.config = config
        self._backend = backend
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.server: RuntimeServer | None = None
        self.port = 0
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._started.wait(30):
            raise TimeoutError("runtime did not start")
        if self._error is not None:
            raise self._error

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.server = RuntimeServer(self.config, self._backend)
            runner = make_runner(self.server)  # as the runtime serves, with or without gRPC
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            self._started.set()
            await self._stop.wait()
            await runner.cleanup()

        try:
            asyncio.run(run())
        except BaseException as exc:  # surfaced to the test thread
            self._error = exc
            self._started.set()

    def wait_ready(self, timeout: float = 20.0) -> None:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server is not None and self.server.ready:
                return
            time.sleep(0.01)
        raise TimeoutError(f"runtime not ready: {self.server and self.server.startup_error}")

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://{self.url}/metrics", timeout=10) as response:
            return response.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample in the exposition (0.0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return 0.0

    def call(self, func: Callable[[], Any]) -> Any:
        """Run ``func`` on the server's event loop thread and return its result."""
        assert self._loop is not None
        done = threading.Event()
        box: list[Any] = []

        def runner() -> None:
            box.append(func())
            done.set()

        self._loop.call_soon_threadsafe(runner)
        done.wait(10)
        return box[0]

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)


@pytest.fixture
def serve() -> Iterator[Callable[..., ServedRuntime]]:
    started: list[ServedRuntime] = []

    def start(
        config: dict[str, Any] | RuntimeConfig,
        backend: Backend | None = None,
        *,
        ready: bool = True,
    ) -> ServedRuntime:
        cfg = config if isinstance(config, RuntimeConfig) else parse_config(config)
        runtime = ServedRuntime(cfg, backend)
        started.append(runtime)
        if ready:
            runtime.wait_ready()
        return runtime

    yield start
    for runtime in started:
        runtime.stop()


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from tidal.runtime.modelgen import write_convnet, write_mlp

    root: Path = tmp_path_factory.mktemp("models")
    return {
        "mlp": write_mlp(root / "mlp.onnx", inputs=16, hidden=32, outputs=4, seed=1),
        "mlp_b": write_mlp(root / "mlp_b.onnx", inputs=16, hidden=32, outputs=4, seed=2),
        "conv": write_convnet(root / "conv.onnx", channels=4, size=8, classes=5, seed=3),
    }


def _model_entry(info: Any, name: str, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": name,
        "engines": [{"uri": info.uri, "sha256": info.sha256}],
        "maxBatchSize": 8,
        "warmup": {"batchSizes": [1], "iterations": 1},
    }
    entry.update(extra)
    return entry


@pytest.fixture
def model_entry() -> Callable[..., dict[str, Any]]:
    """Builds one ``models[]`` entry of the configuration for a generated model."""
    return _model_entry


# -- a real S3 server (versitygw, built by `make sandbox-binaries`) ----------------------------


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    store = ObjectStore.start(Binaries.locate().versitygw, tmp_path_factory.mktemp("s3"))
    store.create_bucket("engines")
    yield store
    store.stop()


@pytest.fixture
def aws_env(s3: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
