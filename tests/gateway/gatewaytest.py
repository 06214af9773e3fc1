"""Helpers of the gateway tests: real runtime processes and a real gateway on loopback ports.

Runtimes run as their own processes (``python -m tidal.runtime``) so that a test can kill one
mid-request; the gateway runs in a background thread with its own event loop, so that a test
can read its state, while synchronous real clients (tritonclient[http], urllib) talk to it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tidal.common.http import JsonErrorRunner
from tidal.gateway.config import GatewayConfig, ReplicaRef
from tidal.gateway.grpc_proxy import start_grpc
from tidal.gateway.server import Gateway


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """One request; returns (status, headers, JSON body or None)."""
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            raw, status, got = response.read(), response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        raw, status, got = exc.read(), exc.code, dict(exc.headers)
    try:
        return status, got, json.loads(raw) if raw else None
    except ValueError:
        return status, got, raw


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout} s")
        time.sleep(0.01)


class RuntimeProcess:
    """``python -m tidal.runtime`` on a loopback port, named like a pod (POD_NAME)."""

    def __init__(self, name: str, config: dict[str, Any]) -> None:
        self.name = name
        self.port = free_port()
        self.grpc_port = free_port()
        env = {
            **os.environ,
            "TIDAL_RUNTIME_CONFIG_JSON": json.dumps({"shutdownDrainSeconds": 0, **config}),
            "TIDAL_HOST": "127.0.0.1",
            "TIDAL_PORT": str(self.port),
            "TIDAL_GRPC_PORT": str(self.grpc_port),
            "TIDAL_LOG_LEVEL": "WARNING",
            "POD_NAME": name,
        }
        self.process = subprocess.Popen([sys.executable, "-m", "tidal.runtime"], env=env)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ref(self) -> ReplicaRef:
        return ReplicaRef(name=self.name, url=self.url)

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"runtime {self.name} exited with {self.process.returncode}")
            try:
                return http("GET", f"{self.url}/v2/health/ready")[0] == 200
            except OSError:
                return False

        wait_for(ready, timeout, f"runtime {self.name} ready")

    def fleet(self) -> dict[str, Any]:
        status, _, body = http("GET", f"{self.url}/v2/tidal/models")
        assert status == 200, body
        return body  # type: ignore[no-any-return]

    def state(self, model: str) -> str:
        return str(self.fleet()["models"][model]["state"])

    def answered(self, model: str) -> int:
        return int(self.fleet()["models"][model]["requests"])

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


class ServedGateway:
    """A :class:`Gateway` served on a loopback port from a background thread."""

    def __init__(
        self, config: dict[str, Any], replicas: list[ReplicaRef], grpc: bool = False
    ) -> None:
        self.config = GatewayConfig.model_validate(config)
        self.gateway = Gateway(self.config, replicas)
        self.port = 0
        self.grpc = grpc
        self.grpc_port = 0  # with grpc: where tidal.gateway.grpc_proxy listens
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)
        self._thread.start()
        if not self._started.wait(30):
            raise TimeoutError("gateway did not start")
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            runner = JsonErrorRunner(
                self.gateway.build_app(), access_log=None, auto_decompress=False
            )
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            server = proxy = None
            if self.grpc:
                server, proxy = await start_grpc(self.gateway, "127.0.0.1", 0)
                self.grpc_port = proxy.port
            self._started.set()
            await self._stop.wait()
            self.gateway.start_draining()  # as the process does on SIGTERM: holds end
            await self.gateway.holds_answered(self.config.shutdown_drain_seconds + 10)
            if server is not None and proxy is not None:
                await server.stop(1.0)
                await proxy.close()
            await runner.cleanup()

        try:
            asyncio.run(run())
        except BaseException as exc:  # surfaced to the test thread
            self._error = exc
            self._started.set()

    @property
    def address(self) -> str:
        """host:port, as tritonclient wants it."""
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def call(self, func: Callable[[], Any]) -> Any:
        """Run ``func`` on the gateway's event loop and return its result."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(_as_coroutine(func), self._loop).result(10)

    def replicas(self) -> dict[str, dict[str, Any]]:
        status, _, body = http("GET", f"{self.url}/v2/tidal/replicas")
        assert status == 200
        return {r["name"]: r for r in body["replicas"]}

    def hot_on(self, model: str) -> list[str]:
        return sorted(n for n, r in self.replicas().items() if r["healthy"] and model in r["hot"])

    def metric(self, name: str, **labels: str) -> float:
        """One sample of the exposition (0.0 when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(
                    sample.labels.get(k) == v for k, v in labels.items()
                ):
                    return float(sample.value)
        return 0.0

    def infer(self, model: str, body: bytes | None = None, **headers: str) -> Any:
        return http("POST", f"{self.url}/v2/models/{model}/infer", body or INFER_BODY, headers)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(20)


async def _as_coroutine(func: Callable[[], Any]) -> Any:
    return func()


INFER_BODY = json.dumps(
    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16], "data": [0.5] * 16}]}
).encode()
