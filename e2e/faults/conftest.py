"""Fault scenarios: a sandbox of their own for the ones that kill control-plane components (a
crash there would disturb every other test of the run), and the e2e helpers on the path."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # e2e/scenario.py

from tidal.sandbox.cluster import Sandbox, SandboxConfig
from tidal.sandbox.wait import wait_for


@pytest.fixture(scope="module")
def private_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    """One GPU node and Prometheus, for this module alone."""
    config = SandboxConfig(nodes=1, gpus_per_node=2, state_dir=tmp_path_factory.mktemp("faults"))
    with Sandbox(config) as sb:
        yield sb


@pytest.fixture
def private_namespace(private_sandbox: Sandbox) -> Iterator[str]:
    from kubernetes import client

    name = f"faults-{uuid.uuid4().hex[:6]}"
    api = client.CoreV1Api(private_sandbox.api_client())
    api.create_namespace({"metadata": {"name": name}})
    wait_for(
        lambda: api.read_namespaced_service_account("default", name),
        timeout=30,
        what=f"default service account in {name}",
    )
    yield name
