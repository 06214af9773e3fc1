"""pytest fixtures for tests and end-to-end scenarios: one sandbox (real control plane + node
agent + Prometheus) per test run and a fresh namespace per test.

Loaded by the repository's top-level ``conftest.py``. Tests that use the sandbox are marked
``sandbox`` automatically, so ``pytest -m "not sandbox"`` runs only the fast ones.
Set ``TIDAL_KEEP_SANDBOX=1`` to keep the sandbox's state (logs, pod logs) after the run."""

from __future__ import annotations

import os
import re
import signal
import threading
import uuid
from collections.abc import Iterator

import pytest

from tidal.sandbox import Sandbox, SandboxConfig
from tidal.sandbox.wait import wait_for


def pytest_configure(config: pytest.Config) -> None:
    """A SIGTERM (a CI time limit, ``kill``) ends the run like Ctrl-C, so fixtures tear down:
    sandboxes stop their processes and the real node undoes its host changes."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, interrupt)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "sandbox" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.sandbox)


@pytest.fixture(scope="session")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    keep = os.environ.get("TIDAL_KEEP_SANDBOX") == "1"
    state = tmp_path_factory.mktemp("sandbox") if keep else None
    config = SandboxConfig(nodes=2, gpus_per_node=2, fake_nodes=1, state_dir=state, keep_state=keep)
    with Sandbox(config) as sb:
        yield sb


@pytest.fixture
def namespace(sandbox: Sandbox, request: pytest.FixtureRequest) -> Iterator[str]:
    from kubernetes import client

    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    # 10 hex digits: with 5, two of a parametrized test's ~140 cases (same 40-character base)
    # collided about once in a hundred runs, the second meeting the first's terminating namespace.
    name = f"{base}-{uuid.uuid4().hex[:10]}"
    api = client.CoreV1Api(sandbox.api_client())
    api.create_namespace({"metadata": {"name": name, "labels": {"tidal.dev/test": "true"}}})
    wait_for(
        lambda: api.read_namespaced_service_account("default", name),
        timeout=30,
        what=f"default service account in {name}",
    )
    yield name
    api.delete_namespace(name)
